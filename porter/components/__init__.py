"""Everything porter knows about one upstream project, behind one Protocol, picked from a registry.

A component recognises its trees (and their version and build regime), names the distributions it
installs as, its patch sets, the command that builds it, which of its modules are host-only, and
how verify checks an installed copy beyond what every component gets (files, sha256, code objects,
imports with no compiler). Adding a project is one module here plus one line in :data:`REGISTRY`.

Builds: ``deepspeed`` is built by :mod:`ops_prebuild` (``porter ops build``), ``megatron-deepspeed``
by :mod:`porter.port`, ``apex`` and ``flash-attn`` by :mod:`porter.wheels` with the driver their
module defines (``driver``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from porter.errors import ConfigError

if TYPE_CHECKING:
    from porter.artifacts.manifest import Manifest
    from porter.install.env import InstalledDist
    from porter.wheels.base import WheelDriver


@dataclass(frozen=True)
class Recognised:
    """A tree a component recognised."""

    component: str
    version: str
    root: Path
    regime: str = ""


@dataclass
class InstalledCheck:
    """What a component adds to verify for one installed distribution."""

    problems: list[tuple[str, str, str, str]] = field(default_factory=list)
    """(where, check, expected, found)."""
    loader_ops: list[str] = field(default_factory=list)
    """Ops to load through the project's own loader in the import probe (DeepSpeed's OpBuilder)."""
    import_env: dict[str, str] = field(default_factory=dict)
    """Environment the import probe needs (DS_ACCELERATOR=cpu for a CPU build)."""
    facts: dict[str, object] = field(default_factory=dict)
    """Reported as is (DeepSpeed: installed_ops)."""


class Component(Protocol):
    name: str
    """Registry key and the manifest's ``component``."""
    title: str
    dists: tuple[str, ...]
    """Distribution names (canonical) it installs as."""
    patch_project: str
    """Its folder under ``patches/`` ('' when it has none)."""
    build_command: str
    """The porter command that builds it (named in messages)."""

    def recognise(self, tree: Path) -> Recognised | None:
        """The tree's version and regime, or None when it is not this project's."""
        ...

    def check_installed(self, dist: InstalledDist, manifest: Manifest | None, kind: str) -> InstalledCheck:
        """Component-specific checks of an installed copy (no subprocess)."""
        ...


def _registry() -> dict[str, Component]:
    from porter.components.apex import APEX
    from porter.components.deepspeed import DEEPSPEED
    from porter.components.flash_attn import FLASH_ATTN
    from porter.components.megatron import MEGATRON

    found: tuple[Component, ...] = (DEEPSPEED, MEGATRON, APEX, FLASH_ATTN)
    return {c.name: c for c in found}


REGISTRY: Mapping[str, Component] = _registry()


def get(name: str) -> Component:
    comp = REGISTRY.get(name)
    if comp is None:
        close = difflib.get_close_matches(name, REGISTRY, n=2)
        raise ConfigError(f"no component named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                          hint=f"known: {', '.join(sorted(REGISTRY))}")
    return comp


def for_dist(project: str) -> Component | None:
    """The component a distribution (canonical name) belongs to."""
    return next((c for c in REGISTRY.values() if project in c.dists), None)


def all_dists() -> tuple[str, ...]:
    return tuple(d for c in REGISTRY.values() for d in c.dists)


def recognise(tree: Path) -> Recognised | None:
    """Which component a tree belongs to (the first that recognises it)."""
    for comp in REGISTRY.values():
        try:
            found = comp.recognise(tree)
        except ConfigError:
            found = None
        if found is not None:
            return found
    return None


def wheel_drivers() -> dict[str, WheelDriver]:
    """The setup.py build interfaces of the components built by ``porter wheel`` (apex, flash-attn)."""
    return {c.name: getattr(c, "driver") for c in REGISTRY.values() if hasattr(c, "driver")}


def get_driver(name: str) -> WheelDriver:
    drivers = wheel_drivers()
    if name not in drivers:
        close = difflib.get_close_matches(name, drivers, n=2)
        raise ConfigError(f"no wheel driver named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                          hint=f"known: {', '.join(sorted(drivers))}")
    return drivers[name]
