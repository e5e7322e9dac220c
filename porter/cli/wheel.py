"""porter wheel apex | flash-attn: an upstream tree -> a verified wheel labelled for a toolchain."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from porter.cli import emit_json
from porter.cli.options import (dry_run_option, jobs_option, json_option, python_option,
                                resolve_toolchain, toolchain_options, wheelhouse_option)
from porter.errors import refusal_line
from porter.log import Logger
from porter.run import Runner
from porter.wheels import WheelRequest, build_wheel


@click.group()
def wheel() -> None:
    """Build ROCm wheels of apex and FlashAttention for a toolchain profile.

    \b
    Each build: detect the upstream version and build regime, compute env and args from the profile,
    (patch), run pip wheel on a copy of the tree, verify (extension modules, code objects per arch),
    label (+rocm6.2.gfx942), and write <wheel>.porter.json beside the wheel.
    """


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    f = dry_run_option(f)
    f = json_option(f)
    f = click.option("--no-torch-check", "no_torch_check", is_flag=True,
                     help="Do not refuse a build python whose torch is not a ROCm build "
                          "(upstream then fails late if it needs one).")(f)
    f = click.option("--patch-set", default=None, metavar="PROJECT[/NAME]|FILE",
                     help="Patch set to apply to the work copy before building (the source is never changed).")(f)
    f = jobs_option(f)
    f = python_option(f)
    f = wheelhouse_option(f)
    f = toolchain_options(f)
    return f


def _run(log: Logger, name: str, source: str, toolchain_ref: str | None, archs: tuple[str, ...],
         cpu_isa: str | None, wheelhouse: Path, python: str | None, jobs: int | None, patch_set: str | None,
         no_torch_check: bool, as_json: bool, dry_run: bool, **extra: Any) -> None:
    tc = resolve_toolchain(toolchain_ref, archs, cpu_isa)
    from porter.components import wheel_drivers

    drivers = wheel_drivers()
    request = WheelRequest(source=Path(source), toolchain=tc, output=wheelhouse.resolve(), python=python, jobs=jobs,
                           patch_set=patch_set, torch_check=not no_torch_check, **extra)
    result = build_wheel(drivers[name], source, request, runner=Runner(log, echo=not dry_run),
                         log=log, dry_run=dry_run, others=drivers)
    if as_json:
        emit_json(result.to_dict())
    elif dry_run:
        click.echo(result.describe())
    else:
        click.echo(str(result.wheel))


@wheel.command("apex")
@click.option("--source", required=True, metavar="DIR|SDIST", help="ROCm apex tree (a checkout) or sdist.")
@click.option("--ops", multiple=True, metavar="OPS",
              help="Ops to prebuild: names (amp_C, fused_adam_cuda), groups (cpp, cuda) or all; repeat or "
                   "comma-separate. Default: all the profile can build (cpp only for a cpu profile).")
@click.option("--regime", type=click.Choice(["env", "flags"]), default=None,
              help="Force the build regime instead of reading it from the tree (APEX_BUILD_* env or "
                   "--cpp_ext/--cuda_ext flags).")
@_common
@click.pass_obj
def apex_cmd(log: Logger, /, source: str, ops: tuple[str, ...], regime: str | None, **kw: Any) -> None:
    """Prebuild ROCm apex ops into a wheel (PYTORCH_ROCM_ARCH from the profile)."""
    _run(log, "apex", source, ops=ops, regime=regime, **kw)


@wheel.command("flash-attn")
@click.option("--source", required=True, metavar="DIR|SDIST|flash-attn==X",
              help="flash-attention tree, sdist .tar.gz, or a version to download from the package index.")
@click.option("--backend", type=click.Choice(["ck", "triton"]), default="ck", show_default=True,
              help="ck: compile the composable_kernel extension; triton: pure-Python wheel, JIT at run time.")
@_common
@click.pass_obj
def flash_attn_cmd(log: Logger, /, source: str, backend: str, **kw: Any) -> None:
    """Build FlashAttention 2 for ROCm (GPU_ARCHS from the profile, checked against the tree's list)."""
    _run(log, "flash-attn", source, backend=backend, **kw)
