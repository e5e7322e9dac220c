"""The engine behind ``porter wheel``: an upstream setup.py tree -> a verified, labelled wheel.

``build_wheel(driver, source, request, runner=Runner(log))`` is the whole library API; the drivers
(each project's build interface) live with their components (:mod:`porter.components.apex`,
:mod:`porter.components.flash_attn`) and are found through :data:`porter.components.REGISTRY`.
"""

from __future__ import annotations

from porter.wheels.base import Machine, WheelRequest
from porter.wheels.engine import build_wheel

__all__ = ["Machine", "WheelRequest", "build_wheel"]
