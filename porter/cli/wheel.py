"""porter wheel apex | flash-attn: an upstream tree -> a verified wheel labelled for a toolchain."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from porter.cli import emit_json
from porter.cli.options import (BUILDERS, ShardChoice, ToolchainChoice, allowed, builds, compile_failures, json_option,
                                left_out, options, parse_shard, runner_for, sharded, show_compiled, show_plan,
                                slurm_options, submit_shards)
from porter.log import Logger
from porter.optspec import (allow_wave32_option, compile_only_option, dry_run_option, opt, source_option,
                            wheelhouse_option)
from porter.toolchain.profile import Toolchain
from porter.wheels import WheelRequest, build_wheel
from porter.wheels.base import ApexChoices, CkChoices, WheelChoices

class DriverGroup(click.Group):
    """``porter wheel``: its own commands, and one for every other component that brings a setup.py driver (an
    installed plugin's): the same build, compile-only and shards, with the options every project shares."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._drivers(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        drivers = self._drivers(ctx)
        return found or (driver_command(cmd_name, drivers[cmd_name].title) if cmd_name in drivers else None)

    def _drivers(self, ctx: click.Context) -> dict[str, Any]:
        """The drivers no command of another group builds (``porter ops build`` builds DeepSpeed's)."""
        from porter.components import wheel_drivers

        root = ctx.find_root().command
        assert isinstance(root, click.Group)
        for name in root.list_commands(ctx):  # importing each command module registers what it builds
            if name != self.name:
                root.get_command(ctx, name)
        return {n: d for n, d in wheel_drivers().items() if BUILDERS.get(n, (None, "wheel"))[1] == "wheel"}


@click.group(cls=DriverGroup)
def wheel() -> None:
    """Build ROCm wheels of apex and FlashAttention for a toolchain profile.

    \b
    Each build: detect the upstream version and build regime, compute env and args from the profile,
    (patch), run pip wheel on a copy of the tree, verify (extension modules, code objects per arch),
    label (+rocm6.2.gfx942), and write <wheel>.porter.json beside the wheel.
    --compile-only: no setup.py; porter hipifies the tree's kernel sources and compiles every TU for every
    arch of a rocm profile with its own planner, reports per op and arch, and records each TU's measured
    time and peak memory, from which later builds of the project size MAX_JOBS.
    """


@dataclass(frozen=True, kw_only=True)
class _Where(ToolchainChoice):
    source: str = source_option.field(help="The project's tree or sdist.")
    wheelhouse: Path = wheelhouse_option.field()


@dataclass(frozen=True, kw_only=True)
class WheelOptions(WheelChoices, _Where):
    """``porter wheel PROJECT``'s options every project shares: each field declares its own (see ``--help``); those
    the build request has too are :class:`~porter.wheels.base.WheelChoices`' (after the source and wheelhouse)."""

    compile_only: bool = compile_only_option.field(
                             help="Compile every translation unit for every arch of the (rocm) profile with porter's "
                                  "planner and report per op and arch; no setup.py, nothing linked or packaged. Each "
                                  "TU's time and peak memory are recorded for later MAX_JOBS choices.")
    no_torch_check: bool = opt("--no-torch-check", is_flag=True,
                               help="Do not refuse a build python whose torch is not a ROCm build (upstream then "
                                    "fails late if it needs one).")
    dry_run: bool = dry_run_option.field()
    allow_wave32: str | None = allow_wave32_option.field()

    def request(self, tc: Toolchain) -> WheelRequest:
        """Each field of :class:`WheelRequest` this options class has by its name (those of the choices classes they
        share: python, jobs, patch_set; apex's ops, regime; flash-attn's backend, units...), the others from the
        options that say them."""
        takes = {f.name for f in dataclasses.fields(WheelRequest)} - {"source", "allow_wave32"}  # (typed otherwise)
        same = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in takes}
        return WheelRequest(source=Path(self.source), toolchain=tc, output=self.wheelhouse.resolve(),
                            torch_check=not self.no_torch_check, allow_wave32=tuple(allowed(self.allow_wave32)), **same)


@dataclass(frozen=True, kw_only=True)
class ApexOptions(ApexChoices, WheelOptions):
    source: str = source_option.field(metavar="DIR|SDIST", help="ROCm apex tree (a checkout) or sdist.")


@dataclass(frozen=True, kw_only=True)
class ShardedWheelOptions(ShardChoice, WheelOptions):
    """A wheel build whose --compile-only can be split into shards (here, or as Slurm jobs)."""

    report_only: bool = opt("--report-only", is_flag=True,
                            help="--compile-only, after the shards: compile nothing, refuse if an object is missing, "
                                 "and report every unit the shards compiled.")


@dataclass(frozen=True, kw_only=True)
class FlashAttnOptions(CkChoices, ShardedWheelOptions):
    source: str = source_option.field(metavar="DIR|SDIST|flash-attn==X", help="flash-attention tree, sdist .tar.gz, "
                                      "or a version to download from the package index.")


def _run(log: Logger, name: str, req: WheelOptions, as_json: bool, *, shard: tuple[int, int] | None = None,
         report_only: bool = False) -> None:
    from porter.components import wheel_drivers

    drivers = wheel_drivers()
    request = req.request(req.toolchain())
    request = dataclasses.replace(request, engine=dataclasses.replace(request.engine, shard=shard,
                                                                      link_only=report_only))
    if not req.compile_only and (request.units or request.instances is not None or request.sample is not None):
        raise click.UsageError("--units, --sample and --instances select what --compile-only compiles; "
                               "add --compile-only")
    if not req.compile_only and request.drop_flags:
        raise click.UsageError("--drop-flag changes what --compile-only compiles; the linked build runs "
                               "upstream's setup.py with its own flags")
    if req.compile_only:
        if req.patch_set is not None:
            raise click.UsageError("--patch-set applies to a wheel build; --compile-only compiles the tree "
                                   "with only the sets porter applies to every build of its kind (flash-attn/ck-rocm7)")
        from porter.wheels.compile import compile_only as run_compile_only

        res = run_compile_only(drivers[name], req.source, request, runner=runner_for(log, req.dry_run, log.verbose),
                               log=log, others=drivers)
        if as_json:  # the report (JSON), the plan (dry run), or a table per op and arch
            emit_json(res.to_dict())
        elif res.dry_run:
            show_plan(f"{res.project} {res.version}, {len(res.plan.objects)} op(s), {res.selected_units} of "
                      f"{res.total_units} TU(s), toolchain {res.toolchain}, {res.jobs} job(s) "
                      f"({res.wheel_plan.per_job_bytes / (1 << 30):.2g} GiB per job, {res.wheel_plan.per_job_source})",
                      res.plan, res.refusal)
        else:
            tc = res.plan.toolchain
            show_compiled(f"{len(res.compiled)} op(s), {res.selected_units} of {res.total_units} TU(s) of "
                          f"{res.project} {res.version} for {', '.join(tc.arch_names)} with {res.toolchain}",
                          res.compiled, list(tc.arch_names), res.costs)
        if not res.dry_run:
            compile_failures(res.compiled, f"{res.project} {res.version}", res.plan.toolchain)
        return
    result = build_wheel(drivers[name], req.source, request, runner=runner_for(log, req.dry_run),
                         log=log, others=drivers)
    if as_json:
        emit_json(result.to_dict())
    elif req.dry_run:
        if result.engine is not None:  # what the engine compiles and links, then what setup.py builds
            show_plan(f"{result.engine.project} {result.engine.version}, {len(result.engine.plan.objects)} op(s) "
                      f"compiled and linked by porter's engine", result.engine.plan, None)
        click.echo(result.describe())
    else:
        click.echo(str(result.wheel))
    left_out(result.failed)


@builds("apex", wheel)
@wheel.command("apex")
@options(ApexOptions)
@json_option
@click.pass_obj
def apex_cmd(log: Logger, /, req: ApexOptions, as_json: bool) -> None:
    """Prebuild ROCm apex ops into a wheel (PYTORCH_ROCM_ARCH from the profile)."""
    _run(log, "apex", req, as_json)


@builds("flash-attn", wheel)
@wheel.command("flash-attn")
@options(FlashAttnOptions, rest="slurm")
@slurm_options(task="shard", final="report")
@json_option
@click.pass_obj
def flash_attn_cmd(log: Logger, /, req: FlashAttnOptions, as_json: bool) -> None:
    """Build FlashAttention 2 for ROCm (GPU_ARCHS from the profile, checked against the tree's list).

    With --compile-only --shards N --slurm the compile runs as Slurm jobs: N array tasks (--shard I/N) into one
    shared build folder, then one job that reports every unit."""
    _build(log, "flash-attn", req, as_json)


def driver_command(name: str, title: str) -> click.Command:
    """``porter wheel NAME`` for a component whose driver porter has no command of its own for."""

    @click.command(name, help=f"Build {title} into a wheel with its setup.py driver, or --compile-only its kernels "
                              "(--shards N --slurm: as Slurm jobs).")
    @options(ShardedWheelOptions, rest="slurm")
    @slurm_options(task="shard", final="report")
    @json_option
    @click.pass_obj
    def cmd(log: Logger, /, req: ShardedWheelOptions, as_json: bool) -> None:
        _build(log, name, req, as_json)

    BUILDERS.setdefault(name, (cmd, "wheel"))
    return cmd


def _build(log: Logger, name: str, req: ShardedWheelOptions, as_json: bool) -> None:
    """A wheel build, its compile-only, one shard of it, or all its shards as Slurm jobs."""
    shard = parse_shard(req.shard)
    if (shard is not None or req.report_only or req.shards is not None) and not req.compile_only:
        raise click.UsageError("--shard, --shards and --report-only split a --compile-only build; the linked build "
                               "runs upstream's setup.py, which porter does not shard")
    if sharded(req, final="report"):
        _submit_shards(log, name, req, as_json)
        return
    if shard is not None and req.report_only:
        raise click.UsageError("--shard compiles one part; --report-only is the run after every part")
    _run(log, name, req, as_json, shard=shard, report_only=req.report_only)


def _submit_shards(log: Logger, name: str, req: ShardedWheelOptions, as_json: bool) -> None:
    """--compile-only --shards N --slurm: this build as a request every job runs; the report job reports it."""
    request = req.request(req.toolchain())

    def planner(_: object) -> Any:
        from porter.cluster.slurm.shards import BuildFacts
        from porter.components import wheel_drivers
        from porter.wheels.compile import compile_only

        drivers = wheel_drivers()
        return BuildFacts.of(compile_only(drivers[name], req.source, request, others=drivers,
                                          runner=runner_for(log, True, log.verbose), log=log))

    submit_shards(log, name, req, planner, last={"report_only": True}, as_json=as_json, says="report job {}")
