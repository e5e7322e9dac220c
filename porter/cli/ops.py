"""porter ops list | build: DeepSpeed ops compiled ahead of time into a wheel (no JIT on compute nodes)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from porter.cli import emit, emit_json
from porter.cli.options import (CacheChoice, ShardChoice, ToolchainChoice, allowed, builds, compile_failures,
                                json_option, left_out, options, parse_shard, raise_failure, runner_for, sharded,
                                show_compiled, show_plan, slurm_options, submit_shards)
from porter.cluster.slurm import shards as sh
from porter.fs import cache_dir
from porter.log import Logger
from porter.wheels.base import CatalogueChoices
from ops_prebuild.build import EngineChoices
from porter.optspec import (allow_wave32_option, compile_only_option, dry_run_option, jobs_option, ops_option, opt,
                            python_option, source_option, wheelhouse_option)
from porter.run import Runner

SOURCE = source_option.but(help="DeepSpeed sdist (.tar.gz), unpacked source folder, or deepspeed==VERSION (fetched "
                                "from PyPI).")


@click.group()
def ops() -> None:
    """Ahead-of-time DeepSpeed ops: list what a tree offers, build them into one wheel."""


@dataclass(frozen=True, kw_only=True)
class ListOptions(ToolchainChoice):
    """``porter ops list``'s options: each field declares its own (``--help`` says what each is)."""

    source: str = SOURCE.field()
    python: str | None = python_option.field()


@ops.command("list")
@options(ListOptions)
@json_option
@click.pass_obj
def list_cmd(log: Logger, /, req: ListOptions, as_json: bool) -> None:
    """Every op of the tree (read from its own op_builder), its sources, and whether this toolchain can
    build it, and if not, why."""
    from porter.components import wheel_drivers
    from porter.components.deepspeed.build import DRIVER
    from porter.components.deepspeed.catalogue import read_catalogue
    from porter.executor import build_python
    from porter.wheels.source import detect, resolve_source

    tc = req.toolchain()
    runner = Runner(log, echo=log.verbose)
    py_ex, py = build_python(tc.executor, tc.python, req.python)
    root, _ = resolve_source(req.source, DRIVER, tc.executor.work_dir(cache_dir()), runner)
    src = detect(DRIVER, root, wheel_drivers())
    cat = read_catalogue(src, tc, python=py, runner=runner, executor=py_ex)
    keys = ("name", "compatible", "reason", "device", "module", "build_var", "sources", "loads")
    rows: list[dict[str, Any]] = [{k: getattr(o, k) for k in keys} for o in cat.ops]
    if tc.wavefront == 64:  # what a build would do with each op's warp-size-32 findings (the source as given)
        from porter.hipify import wave64

        ops = {o.name: (o.sources, o.include_paths) for o in cat.ops if o.device}
        lanes = wave64.judge(src.project, src.tree, wave64.scan_tree(src.tree), {}, ops, ())
        for r in rows:
            states = [st.state for st in lanes.states if st.op == r["name"]]
            r["wave64"] = {"refused": states.count("refused"), "safe": states.count("safe")}

    def line(r: dict[str, Any]) -> str:
        return (f"  {r['name']:<26} {'yes' if r['compatible'] else 'no '} {len(r['sources']):>3} sources"
                + (f"  (loads {', '.join(r['loads'])} first)" if r["loads"] else "")
                + (f"  [wave 64: refused: {r['wave64']['refused']} unproven warp-size-32 finding(s), "
                   "see --allow-wave32]" if r["compatible"] and r.get("wave64", {}).get("refused") else "")
                + (f"  ({r['reason'][:110]})" if r["reason"] else ""))

    emit(as_json, {"source": {"project": src.project, "version": src.version, "tree": str(src.tree)},
                   "toolchain": tc.name, "torch": cat.torch.version, "accelerator": cat.accelerator, "ops": rows},
         lambda: [f"DeepSpeed {src.version} ops for toolchain {tc.name} (torch {cat.torch.version}, accelerator "
                  f"{cat.accelerator}):", *map(line, rows)])


@dataclass(frozen=True, kw_only=True)
class BuildOptions(CatalogueChoices, EngineChoices, ShardChoice, CacheChoice, ToolchainChoice):
    """``porter ops build``'s options: each field declares its own (``--help`` says what each is)."""

    source: str = SOURCE.field()
    ops: tuple[str, ...] = ops_option.field()
    wheelhouse: Path = wheelhouse_option.field()
    jobs: int | None = jobs_option.field()
    dry_run: bool = dry_run_option.field()
    compile_only: bool = compile_only_option.field(
        help="Compile every translation unit of the selected ops for every arch of the (rocm or cuda) profile, "
             "through the same ninja graph, and report per op and arch: compiled or the first error, code objects "
             "per object file, time and peak memory per unit. Nothing is linked or packaged. Without a ROCm torch, "
             "a HIP view of the build python's torch headers stands in. Every unit is compiled (never taken from "
             "the compiler cache), so its costs are real.")
    with_deps: bool = opt("--with-deps", is_flag=True,
                          help="Also download the wheel's runtime dependencies (all but torch) into the wheelhouse, "
                               "for offline installs on compute nodes.")
    debug_info: str = opt("--debug-info", type=click.Choice(["full", "lines", "none"]), default="lines",
                          show_default=True,
                          help="What the builders' -g becomes: lines (-g1: line tables and function names, so "
                               "backtraces keep file:line; compiles about a quarter faster, wheels a third of the "
                               "size), full (DeepSpeed's own -g, for a debugger's variables and types), none (-g0). "
                               "The code is the same.")
    allow_wave32: str | None = allow_wave32_option.field()
    python: str | None = python_option.field()


@builds("deepspeed", ops)
@ops.command("build")
@options(BuildOptions, rest="slurm")
@slurm_options(task="shard", final="link")
@json_option
@click.pass_obj
def build_cmd(log: Logger, /, req: BuildOptions, as_json: bool) -> None:
    """Compile the selected ops in one ninja graph and package one DeepSpeed wheel in which they are
    prebuilt (installed_ops), plus a manifest. An op that fails is reported and left out (exit 3).

    With --shards N --slurm the build runs as Slurm jobs instead: N array tasks (--shard I/N) and a link
    job after them (porter ops status DIR follows it)."""
    if req.ops and req.all_compatible:
        raise click.UsageError("--ops and --all-compatible exclude each other")
    if req.compile_only and req.with_deps:
        raise click.UsageError("--with-deps downloads a wheel's dependencies; --compile-only makes no wheel")
    if sharded(req, final="link") and req.compile_only:
        raise click.UsageError("--shards splits a build that links a wheel; --compile-only is not sharded")
    if req.shards is not None:
        _submit_shards(log, req, as_json)
        return
    res = _build(req, log, runner_for(log, req.dry_run, log.verbose if req.compile_only else True))
    _show_build(res, req, as_json)
    if req.with_deps and not req.dry_run and res.wheel is not None:
        from porter.components.deepspeed.build import download_dependencies

        with log.step("downloading the wheel's dependencies (all but torch) into the wheelhouse"):
            download_dependencies(res.wheel, req.wheelhouse, python=sys.executable, runner=Runner(log))
    if req.compile_only and not req.dry_run:  # nothing compiled (exit 1), or some ops failed (exit 3)
        compile_failures(res.compiled, f"{res.project} {res.version} ({req.source})", res.plan.toolchain,
                         leave="with --ops ('porter ops list' shows what DeepSpeed itself declares incompatible)")
    else:
        left_out(res.failed)  # some ops failed (exit 3: the others shipped)


def _build(req: BuildOptions, log: Logger, runner: Runner) -> Any:
    """The one build flow with DeepSpeed's driver: compile only, or the wheel (one shard of it, or its link)."""
    from porter.components.deepspeed.build import DRIVER
    from porter.wheels import WheelRequest, build_wheel
    from porter.wheels.compile import compile_only
    from ops_prebuild.build import EngineRun

    tc = req.toolchain()
    request = WheelRequest(source=Path(req.source), toolchain=tc, output=req.wheelhouse, python=req.python,
                           ops=tuple(n.strip() for spec in req.ops for n in spec.split(",") if n.strip()),
                           all_compatible=req.all_compatible, jobs=req.jobs,
                           allow_wave32=tuple(allowed(req.allow_wave32)),
                           engine=EngineRun(compiler_cache=req.cache(), shard=parse_shard(req.shard),
                                            link_only=req.link_only, pch=req.pch, debug=req.debug_info))
    flow = compile_only if req.compile_only else build_wheel
    return flow(DRIVER, req.source, request, runner=runner, log=log)


def _show_build(res: Any, req: BuildOptions, as_json: bool) -> None:
    """What ``ops build`` prints: the JSON document, the plan, the shard, the compile table or the wheel."""
    built = res.engine if req.compile_only else res.engine.engine if res.engine else None
    if as_json:  # the engine's document, with what the flow added (the wheel, the refusal, the compile report)
        done = res.to_dict()
        emit_json({**(built.to_dict() if built else {}), **(done if req.compile_only else {
            k: done[k] for k in ("dry_run", "wheel", "manifest", "refusal", "wave64")})})
    elif built is None:
        pass
    elif req.dry_run:
        show_plan(f"{len(built.plan.objects)} op(s), toolchain {built.plan.toolchain.name}, {built.jobs} job(s)",
                  built.plan, res.refusal)
    elif built.shard:
        click.echo(f"shard {built.shard['index']}/{built.shard['count']}: "
                   f"{len(built.shard['objects'])} object(s) in {built.plan.build_dir}")
    elif req.compile_only:
        tc = built.plan.toolchain
        show_compiled(f"{len(res.compiled)} op(s) for {', '.join(tc.arch_names)} with {tc.name}", res.compiled,
                      list(tc.arch_names), res.costs)
    else:
        for o in built.ops:
            click.echo(f"  {o.name:<22} {o.status:<7} {o.seconds:6.1f}s  {o.log if o.status == 'failed' else ''}")
        click.echo(f"wheel: {res.wheel}")
        click.echo(f"manifest: {res.manifest}")
    if built is not None and not as_json and not req.dry_run and built.excluded:
        click.echo(f"# not built, declared incompatible by {built.catalogue.source.project}'s own builders:")
        for ex in built.excluded:
            click.echo(f"  {ex['name']:<28} {ex['reason'] or '(no reason given)'}")
    if built is not None and built.cache_stats and not as_json:
        click.echo(f"compiler cache: {built.cache_stats['hits']} hit(s), {built.cache_stats['misses']} miss(es)")


def _submit_shards(log: Logger, req: BuildOptions, as_json: bool) -> None:
    """--shards N --slurm: this build as a request every job runs; the link job packages the wheel. A real
    submission first unpacks (or downloads) the source into the shared cache, so the shards all find it there and
    none races another to it."""
    def planner(runner: Runner) -> sh.BuildFacts:
        if not runner.dry:
            from porter.components.deepspeed.build import DRIVER
            from porter.wheels.source import resolve_source

            with log.step("unpacking the source into the shared cache"):
                resolve_source(req.source, DRIVER, req.toolchain().executor.work_dir(cache_dir()),
                               runner.real(echo=log.verbose))
        planned = _build(req, log, runner_for(log, True, echo=log.verbose))
        return replace(sh.BuildFacts.of(planned.engine), refusal=planned.refusal.message if planned.refusal else None)

    submit_shards(log, "deepspeed", req, planner, last={"link_only": True, "with_deps": req.with_deps},
                  as_json=as_json, says=f"link job {{}}; the wheel will land in {req.wheelhouse.resolve()}")


@ops.command("status")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@json_option
def status_cmd(directory: Path, as_json: bool) -> None:
    """A sharded build submitted with --shards N --slurm: each shard and the link job, read from the files
    its jobs wrote in DIRECTORY. Exit 1 once a shard or the link failed, else 0."""
    doc = sh.status(directory)
    emit(as_json, doc, lambda: sh.describe(doc))
    raise_failure(sh.outcome(doc))
