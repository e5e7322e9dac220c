"""Options shared by several commands: defined once, same name, same meaning everywhere."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from porter.ccache import CacheRequest
from porter.toolchain.profile import Toolchain, load_toolchain

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document to stdout.")

dry_run_option = click.option(
    "--dry-run", is_flag=True,
    help="Print the complete plan (every command, its environment) and what a real run here would refuse, "
         "then exit 0. Writes nothing: no cache, no tree, no output.")

python_option = click.option(
    "--python", "python", default=None, metavar="PATH", envvar="PORTER_PYTHON", show_envvar=True,
    help="The build python (its torch is what is built against), as the toolchain's launcher sees it "
         "(inside its chroot or container). Default: the profile's 'python', else porter's own python on the host.")

wheelhouse_option = click.option(
    "-o", "--wheelhouse", "wheelhouse", type=click.Path(file_okay=False, path_type=Path),
    default=Path("wheelhouse"), show_default=True, help="Wheelhouse folder for the wheel and its manifest.")

jobs_option = click.option(
    "-j", "--jobs", type=click.IntRange(min=1), default=None,
    help="Parallel compile jobs (default: from cores and free memory).")


def cache_options(f: F) -> F:
    """The compiler cache: ccache keyed to the toolchain, on by default when found where the compiler runs."""
    f = click.option("--cache-remote", default="", metavar="URL", envvar="PORTER_CACHE_REMOTE",
                     help="ccache remote storage shared by many nodes or CI: file:///shared/dir or redis://host.")(f)
    f = click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     envvar="PORTER_CCACHE_DIR",
                     help="ccache folder (default: ccache/ under porter's cache, inside the chroot for chroot "
                          "profiles).")(f)
    f = click.option("--no-cache", is_flag=True, help="Compile without ccache.")(f)
    return f


def cache_request(no_cache: bool, cache_dir: Path | None, cache_remote: str) -> CacheRequest:
    return CacheRequest(enabled=not no_cache, dir=cache_dir.resolve() if cache_dir else None, remote=cache_remote)


def toolchain_options(f: F) -> F:
    """``--toolchain`` plus the CLI overrides that sit on top of file/env/preset."""
    f = click.option("--cpu-isa", default=None, help="Override the host ISA (-march value).")(f)
    f = click.option("--arch", "archs", multiple=True,
                     help="Override the target archs (repeat or comma-separate): gfx90a, gfx942, sm_90.")(f)
    f = click.option("-t", "--toolchain", "toolchain_ref", default=None, metavar="NAME|FILE",
                     help="Toolchain preset name or TOML file (default: $PORTER_TOOLCHAIN, else 'cpu').")(f)
    return f


def resolve_toolchain(toolchain_ref: str | None, archs: tuple[str, ...] = (), cpu_isa: str | None = None) -> Toolchain:
    split = tuple(a for spec in archs for a in spec.split(",") if a)
    return load_toolchain(toolchain_ref, overrides={"archs": split, "cpu_isa": cpu_isa})
