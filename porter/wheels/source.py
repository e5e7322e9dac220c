"""A wheel build's source: a tree, an sdist or ``name==version`` made a folder (:func:`resolve_source`), and which
driver's project it is (:func:`detect`). Both the setup.py flow (:mod:`porter.wheels.engine`) and the engine's
(:mod:`porter.wheels.compile`) start here."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from porter.errors import ConfigError
from porter.run import Runner
from porter.wheels.base import SourceInfo, WheelDriver
from ops_prebuild.source import Download, cached_tree, fetch_tree


def resolve_source(source: str, driver: WheelDriver, cache: Path, runner: Runner,
                   scratch: Path | None = None) -> tuple[Path, dict[str, str]]:
    """A directory as is; an sdist (.tar.gz) unpacked once into ``cache``; ``name==version`` downloaded first
    (its setup.py's metadata prepared with the build python's torch, and ``driver.sdist_env``). With ``scratch`` (a
    dry run's), what the cache holds is read, and what it lacks is unpacked or downloaded into ``scratch``."""
    found = cached_tree(source, cache, driver.name) if scratch is not None else None
    return found or fetch_tree(source, cache=scratch or cache, runner=runner.real(), name=driver.name,
                               download=Download(False, tuple(driver.sdist_env.items())),
                               hint="pass a source directory, an sdist .tar.gz, or name==version to download one")


def detect(driver: WheelDriver, root: Path, others: Mapping[str, WheelDriver]) -> SourceInfo:
    if (info := driver.detect(root)) is not None:
        return info
    for name, other in others.items():
        try:  # (a tree another driver recognises but finds unusable is not named as its)
            theirs = name != driver.name and other.detect(root) is not None
        except ConfigError:
            theirs = False
        if theirs:
            raise ConfigError(f"{root} is a {other.title} tree, not {driver.title}",
                              hint=f"run 'porter wheel {name} --source {root}'")
    raise ConfigError(f"{root} is not a {driver.title} source tree (nor "
                      + " or ".join(o.title for n, o in sorted(others.items()) if n != driver.name) + ")",
                      hint=f"point --source at the top of a {driver.title} checkout or sdist")
