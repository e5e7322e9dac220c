"""porter ops list | build: DeepSpeed ops compiled ahead of time into a wheel (no JIT on compute nodes)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from porter.cli import emit_json
from porter.cli.options import (cache_options, cache_request, dry_run_option, jobs_option, json_option,
                                python_option, resolve_toolchain,
                                toolchain_options, wheelhouse_option)
from porter.errors import CheckFailed, PartialSuccess
from porter.errors import refusal_line
from porter.log import Logger
from porter.run import Runner

source_option = click.option(
    "--source", "source", required=True, metavar="SRC",
    help="DeepSpeed sdist (.tar.gz), unpacked source folder, or deepspeed==VERSION (fetched from PyPI).")


@click.group()
def ops() -> None:
    """Ahead-of-time DeepSpeed ops: list what a tree offers, build them into one wheel."""


@ops.command("list")
@source_option
@toolchain_options
@python_option
@json_option
@click.pass_obj
def list_cmd(log: Logger, source: str, toolchain_ref: str | None, archs: tuple[str, ...], cpu_isa: str | None,
             python: str | None, as_json: bool) -> None:
    """Every op of the tree (read from its own op_builder), its sources, and whether this toolchain can
    build it, and if not, why."""
    from ops_prebuild.catalogue import read_catalogue
    from ops_prebuild.source import resolve_source
    from porter.executor import build_python
    from porter.fs import cache_dir

    tc = resolve_toolchain(toolchain_ref, archs, cpu_isa)
    runner = Runner(log, echo=log.verbose)
    py_ex, py = build_python(tc.executor, tc.python, python)
    src = resolve_source(source, runner=runner, cache=tc.executor.work_dir(cache_dir()))
    cat = read_catalogue(src, tc, python=py, runner=runner, executor=py_ex)
    rows: list[dict[str, Any]] = [{"name": o.name, "compatible": o.compatible, "reason": o.reason, "device": o.device,
             "module": o.module, "build_var": o.build_var, "sources": list(o.sources)} for o in cat.ops]
    if as_json:
        emit_json({"source": {"project": src.project, "version": src.version, "tree": str(src.tree)},
                   "toolchain": tc.name, "torch": cat.torch.version, "accelerator": cat.accelerator, "ops": rows})
        return
    click.echo(f"DeepSpeed {src.version} ops for toolchain {tc.name} (torch {cat.torch.version}, "
               f"accelerator {cat.accelerator}):")
    for r in rows:
        mark = "yes" if r["compatible"] else "no "
        click.echo(f"  {r['name']:<26} {mark} {len(r['sources']):>3} sources"
                   + (f"  ({r['reason'][:110]})" if r["reason"] else ""))


@ops.command("build")
@source_option
@toolchain_options
@click.option("--ops", "op_names", default=None, metavar="A,B", help="Ops to build, comma-separated.")
@click.option("--all-compatible", is_flag=True, help="Build every op this toolchain can build.")
@wheelhouse_option
@jobs_option
@dry_run_option
@click.option("--compile-only", is_flag=True,
              help="Compile every translation unit of the selected ops for every arch of the (rocm or cuda) "
                   "profile, through the same ninja graph, and report per op and arch: compiled or the first "
                   "error, code objects per object file, time and peak memory per unit. Nothing is linked or "
                   "packaged. Without a ROCm torch, a HIP view of the build python's torch headers stands in.")
@click.option("--with-deps", is_flag=True,
              help="Also download the wheel's runtime dependencies (all but torch) into the wheelhouse, "
                   "for offline installs on compute nodes.")
@click.option("--shard", default=None, metavar="I/N",
              help="Compile only shard I of N of the plan's compile steps into the (shared) build folder, and "
                   "stop: N such runs (e.g. a Slurm job array) then one --link-only run equal one local build.")
@click.option("--link-only", is_flag=True,
              help="After the shards: compile nothing, refuse if an object is missing, link and package.")
@cache_options
@python_option
@json_option
@click.pass_obj
def build_cmd(log: Logger, source: str, toolchain_ref: str | None, archs: tuple[str, ...], cpu_isa: str | None,
              op_names: str | None, all_compatible: bool, wheelhouse: Path, jobs: int | None, dry_run: bool,
              compile_only: bool, with_deps: bool, shard: str | None, link_only: bool, no_cache: bool,
              cache_dir: Path | None, cache_remote: str, python: str | None, as_json: bool) -> None:
    """Compile the selected ops in one ninja graph and package one DeepSpeed wheel in which they are
    prebuilt (installed_ops), plus a manifest. An op that fails is reported and left out (exit 3)."""
    from ops_prebuild.build import build_ops

    if op_names and all_compatible:
        raise click.UsageError("--ops and --all-compatible exclude each other")
    tc = resolve_toolchain(toolchain_ref, archs, cpu_isa)
    names = [n.strip() for n in op_names.split(",") if n.strip()] if op_names else None
    if compile_only and with_deps:
        raise click.UsageError("--with-deps downloads a wheel's dependencies; --compile-only makes no wheel")
    result = build_ops(source, tc, ops=names, all_compatible=all_compatible, wheelhouse=wheelhouse, jobs=jobs,
                       dry_run=dry_run, python=python, with_deps=with_deps, log=log, compile_only=compile_only,
                       compiler_cache=cache_request(no_cache, cache_dir, cache_remote), shard=_shard(shard),
                       link_only=link_only)
    if as_json:
        emit_json(result.to_dict())
    elif dry_run:
        plan = result.plan
        click.echo(f"# plan: {len(plan.outputs)} op(s), toolchain {tc.name}, {result.jobs} job(s), "
                   f"build dir {plan.build_dir}")
        for note in plan.notes:
            click.echo(f"# note: {note}")
        if plan.env:
            click.echo("# env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())))
        for step in plan.steps:
            click.echo(shlex.join(step.argv))
        if result.refusal is not None:
            click.echo(refusal_line(result.refusal.message))
    elif result.shard:
        click.echo(f"shard {result.shard['index']}/{result.shard['count']}: "
                   f"{len(result.shard['objects'])} object(s) in {result.plan.build_dir}")
    elif compile_only:
        names = list(tc.arch_names)
        click.echo(f"# compiled, not linked: {len(result.compiled)} op(s) for {', '.join(names)} with {tc.name}")
        click.echo(f"  {'op':<28} " + " ".join(f"{a:<9}" for a in names) + "  seconds  peak MiB")
        for rec in result.compiled:
            peak = max((t.get("peak_rss_mib", 0) for t in rec["tus"]), default=0)
            click.echo(f"  {rec['name']:<28} " + " ".join(f"{rec['archs'][a]:<9}" for a in names)
                       + f"  {rec['seconds']:7.1f}  {peak:8.0f}" + (f"  {rec['error']}" if rec["error"] else ""))
    else:
        for o in result.ops:
            click.echo(f"  {o.name:<22} {o.status:<7} {o.seconds:6.1f}s  {o.log if o.status == 'failed' else ''}")
        click.echo(f"wheel: {result.wheel}")
        click.echo(f"manifest: {result.manifest}")
    if result.cache_stats and not as_json:
        click.echo(f"compiler cache: {result.cache_stats['hits']} hit(s), {result.cache_stats['misses']} miss(es)")
    if compile_only and not dry_run and result.failed and len(result.failed) == len(result.ops):
        raise CheckFailed(f"no op compiled ({', '.join(o.name for o in result.failed)} failed)",
                          hint="the first error of each op is in the report; its full log is in 'log'")
    if result.failed:
        raise PartialSuccess(f"{len(result.failed)} op(s) failed"
                             + (" to compile: " if compile_only else " and were left out of the wheel: ")
                             + ", ".join(o.name for o in result.failed),
                             hint="the other ops " + ("compiled" if compile_only else "shipped")
                                  + "; read the failed ops' logs")


def _shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not I/N (e.g. 0/4)", param_hint="--shard") from None
    if count < 1 or not 0 <= index < count:
        raise click.BadParameter(f"shard {index}/{count} does not exist: I runs from 0 to N-1",
                                 param_hint="--shard")
    return index, count
