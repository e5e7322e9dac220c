"""What every component is: the Protocol the registry holds, and what recognising a tree and checking an installed
copy give back. Components import this module, never the registry (``porter.components``), so no component
import goes through a half-built package."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ops_prebuild.source import Source

if TYPE_CHECKING:
    from porter.artifacts.manifest import Manifest
    from porter.install.env import InstalledDist
    from porter.wheels.base import WheelDriver


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


@runtime_checkable
class MatrixBuild(Protocol):
    """A component a build matrix (``porter matrix``) can build into a wheel of a release (``porter build
    --request`` runs each cell, with the command that builds it)."""

    fetches: bool
    """A release can be given as ``NAME==VERSION`` (its sdist is downloaded)."""
    takes_ops: bool
    """Its build takes a selection of ops (``ops``)."""


class Component(Protocol):
    name: str
    """Registry key and the manifest's ``component``."""
    title: str
    dists: tuple[str, ...]
    """Distribution names (canonical) it installs as."""

    def recognise(self, tree: Path) -> Source | None:
        """The tree's version and regime, or None when it is not this project's."""
        ...

    def check_installed(self, dist: InstalledDist, manifest: Manifest | None, kind: str) -> InstalledCheck:
        """Component-specific checks of an installed copy (no subprocess); by default, none."""
        return InstalledCheck()


class FromDriver(Component):
    """What a component built by a wheel driver answers by default: a tree is its when the driver detects it, and an
    installed copy has no checks of its own. A component inherits it and overrides what it knows."""

    driver: WheelDriver

    def recognise(self, tree: Path) -> Source | None:
        info = self.driver.detect(tree)
        return Source(self.name, info.version, tree, regime=info.regime) if info else None
