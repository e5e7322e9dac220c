"""The engine behind ``porter wheel``: an upstream setup.py tree -> a verified, labelled wheel.

``build_wheel(driver, source, request, runner=Runner(log))`` is the whole library API; the drivers
(each project's build interface) live with their components (:mod:`porter.components.apex`,
:mod:`porter.components.flash_attn`) and are found through :data:`porter.components.REGISTRY`.
"""

from __future__ import annotations

from ops_prebuild.catalogue import OpSpec
from porter.wheels.base import BuildPlan, Expectation, Machine, SourceInfo, WheelDriver, WheelRequest
from porter.wheels.engine import WheelResult, build_wheel

__all__ = ["BuildPlan", "Expectation", "Machine", "OpSpec", "SourceInfo", "WheelDriver", "WheelRequest",
           "WheelResult", "build_wheel"]
