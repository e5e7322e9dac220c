"""porter toolchain list | show | detect | check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from porter.artifacts import labels
from porter.cli import emit, emit_json
from porter.cli.options import ToolchainChoice, json_option
from porter.errors import CheckFailed
from porter.log import Logger
from porter.fs import atomic_write_text
from porter.optspec import arch_option, output_option
from porter.run import Runner
from porter.toolchain.archs import ARCHS
from porter.toolchain.profile import load_toolchain, preset_names


@click.group()
def toolchain() -> None:
    """Toolchain profiles: what to build with (compiler, ROCm/CUDA version) and for (archs, CPU ISA)."""


@toolchain.command("list")
@click.option("--archs", "show_archs", is_flag=True, help="List the known GPU archs instead of the presets.")
@json_option
def list_cmd(show_archs: bool, as_json: bool) -> None:
    """List the built-in presets (or, with --archs, the arch table)."""
    if show_archs:
        rows: list[dict[str, Any]] = [
            {"arch": a.name, "vendor": a.vendor, "wavefront": a.wavefront, "products": list(a.products),
             "features": list(a.features)} for a in ARCHS.values()]
        emit(as_json, rows, lambda: [f"{r['arch']:<9} {r['vendor']:<7} wave{r['wavefront']:<3} "
                                     f"{', '.join(r['products'])}" for r in rows])
        return
    profiles = [load_toolchain(n) for n in preset_names()]
    emit(as_json, [{**p.to_dict(), "local_label": labels.make(p)} for p in profiles],
         lambda: [f"{p.name:<20} {p.kind:<5} {','.join(p.archs) or '-':<16} {p.description}" for p in profiles])


@toolchain.command("show")
@click.argument("ref", metavar="NAME|FILE")
@json_option
def show_cmd(ref: str, as_json: bool) -> None:
    """Show one resolved profile (preset or file, with PORTER_* env applied)."""
    tc = load_toolchain(ref)
    d = {**tc.to_dict(), "local_label": labels.make(tc)}
    if as_json:
        emit_json(d)
        return
    for key, value in d.items():
        if isinstance(value, list):
            value = " ".join(value) or "-"
        elif isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in value.items()) or "-"
        click.echo(f"{key:<17} {value if value not in ('', None) else '-'}")


@toolchain.command("detect")
@json_option
@output_option.but(type=click.Path(dir_okay=False, path_type=Path),
                   help="Write the proposed profile as TOML to this file.").option("output")
@click.pass_obj
def detect_cmd(log: Logger, as_json: bool, output: Path | None) -> None:
    """Find compilers (ROCM_PATH, HIP_PATH, CUDA_HOME, PATH) and visible GPUs; propose a profile.

    Detection only proposes: builds always use a profile you pass explicitly.
    """
    from porter.toolchain.discover import detect, to_toml

    found = detect(Runner(log, echo=log.verbose))
    if output is not None:
        atomic_write_text(output, to_toml(found["proposal"]))
        log.info(f"wrote proposed profile to {output}; review it, then pass it with --toolchain {output}")
    if as_json:
        emit_json(found)
        return
    for name, prog in found["programs"].items():
        click.echo(f"{name:<11} {prog['version']:<14} {prog['path']}")
    if not found["programs"]:
        click.echo("no compiler found on ROCM_PATH, HIP_PATH, CUDA_HOME or PATH")
    click.echo("GPUs: " + (", ".join(g["arch"] for g in found["gpus"]) or "none visible"))
    for note in found["notes"]:
        click.echo(f"note: {note}")
    if output is None:
        click.echo("\n" + to_toml(found["proposal"]), nl=False)


@toolchain.command("check")
@click.argument("ref", metavar="NAME|FILE")
@arch_option.option("archs")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the linked multi-arch shared object in this folder.")
@json_option
@click.pass_obj
def check_cmd(log: Logger, ref: str, archs: tuple[str, ...], keep: Path | None, as_json: bool) -> None:
    """Compile a small kernel for every target arch with the real compiler, link one multi-arch
    shared object, and list the code objects inside it. Exits 1 if any arch fails."""
    from porter.toolchain.check import ARCH_HINT, check_toolchain

    tc = ToolchainChoice(toolchain_ref=ref, archs=archs).toolchain()
    report = check_toolchain(tc, log=log, keep=keep)
    if as_json:
        emit_json(report.to_dict())
    else:
        c = report.compiler
        click.echo(f"toolchain {tc.name} ({tc.kind}): {c.path} version {c.version}"
                   + (f", wavefront {tc.wavefront}" if tc.wavefront else ""))
        if report.version_problem:
            click.echo(f"  version: FAILED: {report.version_problem}")
        for a in report.archs:
            click.echo(f"  {a.arch:<16} {'ok' if a.ok else 'FAILED'}  ({a.seconds:.1f}s)")
            if not a.ok:
                for line in a.message.splitlines():
                    click.echo(f"      {line}")
        if report.link_error:
            click.echo(f"  link FAILED: {report.link_error}")
        if report.shared_object:
            inside = ", ".join(f"{co.target} ({co.kind})" for co in report.code_objects) or "host-only"
            click.echo(f"  {report.shared_object}: {inside}")
        if report.missing:
            click.echo(f"  missing from the shared object: {', '.join(report.missing)}")
    if not report.ok:
        failed = [a.arch for a in report.archs if not a.ok]
        raise CheckFailed(
            f"toolchain {tc.name}: "
            + (f"{', '.join(failed)} failed with {report.compiler.path} {report.compiler.version}" if failed
               else report.version_problem or report.link_error or "code objects missing"),
            hint=ARCH_HINT if failed else "fix the profile or the toolchain install")
