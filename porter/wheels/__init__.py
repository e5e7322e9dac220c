"""ROCm wheels for apex and FlashAttention: drivers behind one Protocol, picked from a registry.

``build_wheel(get_driver("apex"), source, request, runner=Runner(log))`` is the whole library API;
``porter wheel apex|flash-attn`` is a thin CLI over it.
"""

from __future__ import annotations

import difflib

from porter.errors import ConfigError
from porter.wheels.apex import ApexDriver
from porter.wheels.base import BuildPlan, Expectation, Machine, OpSpec, SourceInfo, WheelDriver, WheelRequest
from porter.wheels.engine import TorchInfo, WheelResult, build_wheel
from porter.wheels.flash_attn import FlashAttnDriver

DRIVERS: dict[str, WheelDriver] = {d.name: d for d in (ApexDriver(), FlashAttnDriver())}


def get_driver(name: str) -> WheelDriver:
    driver = DRIVERS.get(name)
    if driver is None:
        close = difflib.get_close_matches(name, DRIVERS, n=2)
        raise ConfigError(f"no wheel driver named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                          hint=f"known: {', '.join(sorted(DRIVERS))}")
    return driver


__all__ = ["DRIVERS", "BuildPlan", "Expectation", "Machine", "OpSpec", "SourceInfo", "TorchInfo", "WheelDriver",
           "WheelRequest", "WheelResult", "build_wheel", "get_driver"]
