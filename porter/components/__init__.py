"""Everything porter knows about one upstream project, behind one Protocol, picked from a registry.

A component recognises its trees (and their version and build regime), names the distributions it
installs as, its patch sets, the command that builds it, which of its modules are host-only, and
how verify checks an installed copy beyond what every component gets (files, sha256, code objects,
imports with no compiler). Adding a project is one module here plus one line in :func:`registry`.

Builds: ``deepspeed`` is built by :mod:`ops_prebuild` (``porter ops build``), ``megatron-deepspeed``
by :mod:`porter.port`, ``apex`` and ``flash-attn`` by :mod:`porter.wheels` with the driver their
module defines (``driver``).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from porter.components.base import Component, InstalledCheck, Recognised
from porter.errors import ConfigError

if TYPE_CHECKING:
    from porter.wheels.base import WheelDriver


@functools.cache
def registry() -> Mapping[str, Component]:
    """The components, by name (imported on first use, not when this package is imported)."""
    from porter.components.apex import APEX
    from porter.components.deepspeed import DEEPSPEED
    from porter.components.flash_attn import FLASH_ATTN
    from porter.components.megatron import MEGATRON

    found: tuple[Component, ...] = (DEEPSPEED, MEGATRON, APEX, FLASH_ATTN)
    return {c.name: c for c in found}


def __getattr__(name: str) -> object:
    if name == "REGISTRY":  # the mapping, for callers that read it as a constant
        return registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get(name: str) -> Component:
    comp = registry().get(name)
    if comp is None:
        close = difflib.get_close_matches(name, registry(), n=2)
        raise ConfigError(f"no component named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                          hint=f"known: {', '.join(sorted(registry()))}")
    return comp


def for_dist(project: str) -> Component | None:
    """The component a distribution (canonical name) belongs to."""
    return next((c for c in registry().values() if project in c.dists), None)


def all_dists() -> tuple[str, ...]:
    return tuple(d for c in registry().values() for d in c.dists)


def recognise(tree: Path) -> Recognised | None:
    """Which component a tree belongs to (the first that recognises it)."""
    for comp in registry().values():
        try:
            found = comp.recognise(tree)
        except ConfigError:
            found = None
        if found is not None:
            return found
    return None


def wheel_drivers() -> dict[str, WheelDriver]:
    """The setup.py build interfaces of the components built by ``porter wheel`` (apex, flash-attn)."""
    return {c.name: getattr(c, "driver") for c in registry().values() if hasattr(c, "driver")}


def get_driver(name: str) -> WheelDriver:
    drivers = wheel_drivers()
    if name not in drivers:
        close = difflib.get_close_matches(name, drivers, n=2)
        raise ConfigError(f"no wheel driver named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                          hint=f"known: {', '.join(sorted(drivers))}")
    return drivers[name]


__all__ = ["Component", "InstalledCheck", "Recognised", "all_dists", "for_dist", "get", "get_driver", "recognise",
           "registry", "wheel_drivers"]
