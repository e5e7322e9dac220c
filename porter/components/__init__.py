"""Everything porter knows about one upstream project, behind one Protocol, picked from a registry.

A component recognises its trees (and their version and build regime), names the distributions it
installs as, its patch sets, the command that builds it, which of its modules are host-only, and
how verify checks an installed copy beyond what every component gets (files, sha256, code objects,
imports with no compiler). Adding a project is one package here plus one line in :data:`BUILTIN`; a project
defined elsewhere (a site's own, a test's) joins with :func:`register`.

Builds: ``deepspeed``'s ops and ``megatron-deepspeed``'s fused kernels run on the AOT engine (:mod:`ops_prebuild`)
from their own packages here; ``apex`` and ``flash-attn`` are built by :mod:`porter.wheels` with the driver their
package defines (``driver``); ``netplugin`` builds the RCCL network plugin with autotools.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ops_prebuild.source import Source
from porter.components.base import Component, InstalledCheck
from porter.errors import ConfigError

if TYPE_CHECKING:
    from porter.wheels.base import WheelDriver


BUILTIN: tuple[tuple[str, str], ...] = (
    ("porter.components.deepspeed", "DEEPSPEED"),
    ("porter.components.megatron", "MEGATRON"),
    ("porter.components.apex", "APEX"),
    ("porter.components.flash_attn", "FLASH_ATTN"),
    ("porter.components.netplugin", "NETPLUGIN"),
)
"""The components porter ships, in the order recognition tries them: (module, attribute), imported on first use."""

_ADDED: dict[str, Component] = {}
_T = TypeVar("_T")


ENTRY_POINTS = "porter.components"
"""The entry-point group through which an installed distribution adds components (``name = "module:ATTRIBUTE"``)."""


@functools.cache
def registry() -> Mapping[str, Component]:
    """The components, by name: :data:`BUILTIN` (imported on first use, not when this package is imported), those
    installed distributions add (:data:`ENTRY_POINTS`), then those added with :func:`register`."""
    from importlib.metadata import entry_points

    found = [getattr(importlib.import_module(mod), attr) for mod, attr in BUILTIN]
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            found.append(ep.load())
        except Exception as exc:  # a plugin that does not import: say which, and what it raised
            raise ConfigError(f"the component {ep.name!r} ({ep.value}, from the installed distribution "
                              f"{ep.dist.name if ep.dist else '?'}) does not load: {type(exc).__name__}: {exc}",
                              hint="fix or uninstall that distribution") from None
    return {**{c.name: c for c in found}, **_ADDED}


def register(component: Component) -> None:
    """Add a component (or replace one of the same name) to the registry."""
    _ADDED[component.name] = component
    registry.cache_clear()


def unregister(name: str) -> None:
    _ADDED.pop(name, None)
    registry.cache_clear()


def __getattr__(name: str) -> object:
    if name == "REGISTRY":  # the mapping, for callers that read it as a constant
        return registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _named(what: str, name: str, table: Mapping[str, _T]) -> _T:
    if name not in table:
        close = difflib.get_close_matches(name, table, n=2)
        raise ConfigError(f"no {what} named {name!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                          hint=f"known: {', '.join(sorted(table))}")
    return table[name]


def get(name: str) -> Component:
    return _named("component", name, registry())


def for_dist(project: str) -> Component | None:
    """The component a distribution (canonical name) belongs to."""
    return next((c for c in registry().values() if project in c.dists), None)


def all_dists() -> tuple[str, ...]:
    return tuple(d for c in registry().values() for d in c.dists)


def recognise(tree: Path) -> Source | None:
    """Which component a tree belongs to (the first that recognises it)."""
    for comp in registry().values():
        with contextlib.suppress(ConfigError):
            if (found := comp.recognise(tree)) is not None:
                return found
    return None


def wheel_drivers() -> dict[str, WheelDriver]:
    """The setup.py build interfaces of the components built by ``porter wheel`` (apex, flash-attn)."""
    return {c.name: getattr(c, "driver") for c in registry().values() if hasattr(c, "driver")}


def get_driver(name: str) -> WheelDriver:
    return _named("wheel driver", name, wheel_drivers())


__all__ = ["Component", "InstalledCheck", "Source", "all_dists", "for_dist", "get", "get_driver", "recognise",
           "register", "registry", "unregister", "wheel_drivers"]
