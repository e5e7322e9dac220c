"""Options shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from porter.toolchain.profile import Toolchain, load_toolchain

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document to stdout.")


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
