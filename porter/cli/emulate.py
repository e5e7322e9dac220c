"""porter emulate check: the numeric checks on porter's emulated HIP target (wavefronts of 64 or 32 lanes)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from porter.cli import emit_json
from porter.cli.options import json_option
from porter.emulate.checks import FAMILIES
from porter.errors import CheckFailed
from porter.log import Logger
from porter.optspec import only_option, python_option


@click.group("emulate")
def emulate() -> None:
    """porter's emulated HIP target: the same hipified kernels porter ships, compiled by the host compiler with
    porter's HIP-on-CPU headers and run on the CPU with 64-lane (emulate-wave64) or 32-lane (emulate-wave32)
    wavefronts. Build for it with -t emulate-wave64 (porter port, porter ops build), then check."""


@emulate.command("check")
@click.argument("wheelhouse", type=click.Path(file_okay=False, path_type=Path))
@only_option.but(type=click.Choice(sorted(FAMILIES)), metavar=None,
                 help="Check only this kernel family (repeatable). Default: every family the wheels hold.").option(
    "only")
@python_option
@json_option
@click.pass_obj
def check_cmd(log: Logger, wheelhouse: Path, only: tuple[str, ...], python: str | None, as_json: bool) -> None:
    """Run the numeric checks on the wheels WHEELHOUSE holds for the emulated target: every kernel family porter
    ships (Megatron's scaled, masked and upper-triangular softmax of both generations, the BLOOM-era layer norm,
    DeepSpeed's fused_adam, fused_lamb and fused_lion), against a float32 torch reference on the CPU, at the wave
    size each wheel was built for.

    \b
    One line per kernel family and wave size: its worst check's error and tolerance (porter -v emulate check:
    every check). The checks run in --python (it needs torch; default: porter's own python).
    --json: every check, with kernel, check, wave, max_abs_err, tolerance, ok (and error).
    Exit 1 when a check fails (a wrong result, or a kernel the emulator does not model, named by file and line),
    4 when WHEELHOUSE holds no emulated wheel. What the checks prove and what they cannot: docs/emulate.md.
    """
    from porter.emulate.run import check_wheelhouse

    result = check_wheelhouse(wheelhouse, python=python or sys.executable, only=list(only) or None, log=log)
    if as_json:
        emit_json(result.rows)
    else:
        for w, names in result.wheels.items():
            log.info(f"wave {w}: {', '.join(names)}")
        rows = result.rows if log.verbose else result.summary()
        for r in rows:
            err = "-" if r.get("max_abs_err") is None else f"{r['max_abs_err']:.2e}"
            tol = "-" if r.get("tolerance") is None else f"{r['tolerance']:.1e}"
            what = r["check"] if log.verbose else f"worst of {r['checks']}: {r['check']}"
            line = f"{'ok  ' if r['ok'] else 'FAIL'} {r['kernel']:<44} wave {r['wave']}  max err {err}  " \
                   f"tolerance {tol}  ({what})"
            click.echo(line + (f"\n     {r['error']}" if r.get("error") else ""))
    if not result.ok:
        failed = sorted({f"{r['kernel']} (wave {r['wave']})" for r in result.rows if not r["ok"]})
        raise CheckFailed(f"{len(failed)} kernel famil{'y' if len(failed) == 1 else 'ies'} failed: "
                          f"{', '.join(failed)}",
                          hint="a kernel wrong at wave 64 and right at wave 32 assumes 32-lane warps: see porter "
                               "hipify's warp-size findings for its file, and docs/emulate.md")
