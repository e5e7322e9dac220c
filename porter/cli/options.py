"""How a command takes its options (:mod:`porter.optspec` declares them, each once): an options class's fields as
one request object, the Slurm settings, and what the build commands print."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from porter.ccache import CacheRequest
from porter.cli import emit_json
from porter.errors import CheckFailed, PartialSuccess, PorterError
from porter.log import Logger
from porter.optspec import (OPTION, F, Spec, account_option, arch_option, dir_option, no_cache_option, opt,
                            partition_option, shard_option, slurm_option, time_option, toolchain_option, wait_option)
from porter.run import RecordingRunner, Runner, make_env, plan_lines
from porter.toolchain.profile import Toolchain, load_toolchain

BUILDERS: dict[str, tuple[click.Command, str]] = {}
"""Component -> the command that builds it and its group (``porter build --request`` runs it)."""


def builds(component: str, group: click.Group) -> Callable[[click.Command], click.Command]:
    """Mark a command (put above ``@GROUP.command``) as the one that builds ``component`` from a request."""
    def decorate(cmd: click.Command) -> click.Command:
        BUILDERS[component] = (cmd, str(group.name))
        return cmd
    return decorate


def options(cls: type[Any], *, rest: str = "") -> Callable[[F], F]:
    """Put right below ``@GROUP.command``: every option the fields of ``cls`` declare, in field order (before the
    command's other options), and the function gets them as one ``cls`` (:func:`into`)."""
    def decorate(f: F) -> F:
        f = into(cls, rest=rest)(f)
        for fld in reversed(dataclasses.fields(cls)):
            for spec in reversed(fld.metadata.get(OPTION, ())):
                f = spec.option(fld.name)(f)
        return f
    return decorate


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document to stdout.")


def runner_for(log: Logger, record: bool, echo: bool = True) -> Runner:
    """A command's runner: with --dry-run a recording one (the library then plans, records and writes nothing)."""
    return RecordingRunner(log, echo) if record else Runner(log, echo)


def allowed(value: str | None) -> list[str]:
    """``--allow-wave32 A,B`` as a list of names."""
    return [n.strip() for n in (value or "").split(",") if n.strip()]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheChoice:
    """The compiler cache: ccache keyed to the toolchain, on by default when found where the compiler runs."""

    no_cache: bool = no_cache_option.field(help="Compile without ccache.")
    cache_dir: Path | None = opt("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                                 envvar="PORTER_CCACHE_DIR",
                                 help="ccache folder (default: ccache/ under porter's cache, inside the chroot for "
                                      "chroot profiles).")
    cache_remote: str = opt("--cache-remote", default="", metavar="URL", envvar="PORTER_CACHE_REMOTE",
                            help="ccache remote storage shared by many nodes or CI: file:///shared/dir or "
                                 "redis://host.")

    def cache(self) -> CacheRequest:
        return CacheRequest(enabled=not self.no_cache, dir=self.cache_dir.resolve() if self.cache_dir else None,
                            remote=self.cache_remote)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolchainChoice:
    """``--toolchain`` plus the overrides that sit on top of file/env/preset: the base of a building command's
    options."""

    toolchain_ref: str | None = toolchain_option.field()
    archs: tuple[str, ...] = arch_option.field()
    cpu_isa: str | None = opt("--cpu-isa", default=None, help="Override the host ISA (-march value).")

    def toolchain(self) -> Toolchain:
        archs = tuple(a for spec in self.archs for a in spec.split(",") if a)
        return load_toolchain(self.toolchain_ref, overrides={"archs": archs, "cpu_isa": self.cpu_isa})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardChoice:
    """A build split into shards: one shard here (``--shard``), or all of them as Slurm jobs (``--shards N
    --slurm``, with :func:`slurm_options`)."""

    shard: str | None = shard_option.field(help="Compile only shard I of N of the build's compile steps into the "
                                                "(shared) build folder, and stop: N such runs (a Slurm job array) then "
                                                "one run with --link-only (--report-only for --compile-only) equal one "
                                                "local build.")
    shards: int | None = opt("--shards", type=click.IntRange(min=1), default=None, metavar="N",
                             help="With --slurm: submit a job array of N tasks, each running this build with --shard "
                                  "I/N into the shared build folder, then one job after them (afterok) that links the "
                                  "wheel into -o (--compile-only: reports every unit).")
    use_slurm: bool = slurm_option.field(help="Submit the build as Slurm jobs (with --shards N) instead of building "
                                              "here.")
    shards_dir: Path | None = dir_option.field(help="With --slurm: the folder for the job scripts, results and logs, "
                                                   "on a filesystem every node sees (default: shards/<build> in "
                                                   "porter's cache, which must be shared too).")
    wait: bool = wait_option.field()
    time_limit: str | None = None
    """--time (:func:`slurm_options`)."""
    slurm: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The other Slurm settings (--partition, --account, ...)."""


def slurm_options(*, task: str = "cell", final: str = "index") -> Callable[[F], F]:
    """What each Slurm job asks for (:class:`porter.cluster.slurm.sbatch.SlurmSettings`), from the command line or
    ``PORTER_SLURM_*``. ``task``: what one array task runs (a cell, a shard); ``final``: the job after them
    (the index, the link), whose time limit is ``--<final>-time``."""
    every = {"partition": partition_option.but(help="Partition of every job."), "account": account_option,
             "qos": Spec(("--qos",), dict(default=None, help="QOS of every job.")),
             "time_limit": time_option.but(help=f"Time limit of each {task} task (2:00:00)."),
             "cpus_per_task": Spec(("--cpus-per-task",), dict(type=click.IntRange(min=1), default=None,
                                                             help=f"CPUs of each {task} task.")),
             "mem": Spec(("--mem",), dict(default=None, help=f"Memory of each {task} task (16G).")),
             "max_parallel": Spec(("--max-parallel",), dict(
                 type=click.IntRange(min=1), default=None,
                 help=f"At most this many {task}s at once (the array's %N; default "
                      + ("8" if task == "cell" else f"every {task}") + ")."))}

    def decorate(f: F) -> F:
        opts = [*(spec.but(envvar=f"PORTER_SLURM_{name.removesuffix('_limit').upper()}", show_envvar=True).option(name)
                  for name, spec in every.items()),  # each also from PORTER_SLURM_<NAME> (--time: PORTER_SLURM_TIME)
                click.option(f"--{final}-time", "index_time", default=None, help=f"Time limit of the {final} job."),
                click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="OPTION",
                             help="One more sbatch option for every job (repeat): --constraint=nvme.")]
        for opt in reversed(opts):
            f = opt(f)
        return f
    return decorate


SLURM_PARAMS = ("partition", "account", "qos", "time_limit", "cpus_per_task", "mem", "max_parallel", "index_time",
                "sbatch_args")
"""What :func:`slurm_options` parse: how the jobs are submitted, never part of the build they run."""


def into(request: type[Any], *, rest: str = "") -> Callable[[F], F]:
    """Gather a command's options into one frozen request object: click's keyword arguments named like the
    ``request`` dataclass's fields become that object, passed on as ``req``; what the command function takes
    itself (``as_json``, say) is passed as it is; with ``rest``, the others go into that field as a dict
    (the Slurm settings). Put it right above the function, below every click decorator."""
    names = {f.name for f in dataclasses.fields(request)}

    def decorate(f: F) -> F:
        own = set(inspect.signature(f).parameters)

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            fields = {k: kwargs.pop(k) for k in list(kwargs) if k in names and k not in own}
            if rest:
                fields[rest] = {k: kwargs.pop(k) for k in list(kwargs) if k not in own}
            return f(*args, req=request(**fields), **kwargs)

        return wrapper  # type: ignore[return-value]
    return decorate


def parse_shard(text: str | None) -> tuple[int, int] | None:
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


def path_or_name(value: str) -> str:
    """A file or folder the jobs must find from anywhere: made absolute; a preset name or spec as it is."""
    return str(Path(value).resolve()) if Path(value).exists() else value


def sharded(req: Any, *, final: str) -> bool:
    """Whether a build submits its shards as Slurm jobs (``--shards N --slurm``), by the rules every sharded build
    keeps; ``final``: the job after the shards (``link``, ``report``), whose ``--FINAL-only`` such jobs run."""
    if req.shards is None and not req.use_slurm:  # then none of its options may be typed (PORTER_SLURM_* may be set)
        ctx = click.get_current_context()
        typed = {p.name: p.opts[-1] for p in ctx.command.params
                 if p.name and ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE}
        given = [typed[p] for p in ("wait", "shards_dir", "time_limit", *req.slurm) if p in typed]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only with --shards N --slurm")
        return False
    if req.shards is None or not req.use_slurm:
        raise click.UsageError(f"--shards N and --slurm go together: N array tasks, then a {final} job; to build "
                               "here, drop both")
    if req.shard is not None or getattr(req, f"{final}_only"):
        raise click.UsageError(f"--shards submits the shards and the {final} job itself; --shard I/N and "
                               f"--{final}-only are what those jobs run")
    return True


def submit_shards(log: Logger, component: str, req: Any, planner: Callable[[Runner], Any], *, last: dict[str, Any],
                  as_json: bool, says: str) -> None:
    """``--shards N --slurm``: the running command's build as a request every job runs, submitted through
    :mod:`porter.cluster.slurm.shards`. ``planner``: the build's facts from a dry run of it (given the submission's
    runner: a real one may unpack the source into the shared cache first); ``says``: the last job, in words, ``{}``
    standing for its id."""
    from porter.cluster.request import RUNNER_OWNS, BuildRequest
    from porter.cluster.slurm import shards as sh
    from porter.cluster.slurm.sbatch import SlurmSettings
    from porter.fs import cache_dir

    env = make_env()
    settings = SlurmSettings(max_parallel=req.shards).merged({**req.slurm, "time": req.time_limit})
    # the build as a request its jobs run (porter.cluster.request): every option the user gave (on the command line
    # or through the environment: frozen now), paths made absolute, the jobs' own compile jobs, and ``last`` for the
    # run after every shard; how to submit is left out
    ctx = click.get_current_context()
    skip = {*RUNNER_OWNS, *SLURM_PARAMS, *last, "wheelhouse", "link_only", "report_only"}
    given = {k: v for k, v in ctx.params.items() if k not in skip and v is not None
             and ctx.get_parameter_source(k) not in (ParameterSource.DEFAULT, None)}
    toolchain_ref = req.toolchain_ref or env.get("PORTER_TOOLCHAIN")
    jobs = req.jobs or settings.cpus_per_task
    given.update(source=path_or_name(req.source), **({"toolchain_ref": path_or_name(toolchain_ref)} if toolchain_ref
                                                     else {}), **({"jobs": jobs} if jobs else {}))
    if isinstance(given.get("cache_dir"), Path):
        given["cache_dir"] = given["cache_dir"].resolve()
    build = BuildRequest(component, given, last={k: v for k, v in last.items() if v})
    shard_req = sh.ShardRequest(build=build, shards=req.shards, wheelhouse=req.wheelhouse.resolve(),
                                dir=req.shards_dir.resolve() if req.shards_dir else Path(),
                                cache=cache_dir().resolve(), python=sys.executable)
    runner = runner_for(log, req.dry_run, echo=not req.dry_run)
    run = sh.submit_build(shard_req, lambda: planner(runner), settings=settings, runner=runner, env=env,
                          dir_given=req.shards_dir is not None, wait=req.wait, log=log)
    sub = run.submission or {}
    show_submitted(log, run, run.status, as_json=as_json, describe=sh.describe, outcome=sh.outcome,
                   jobs=f"array job {sub.get('array_job')} ({run.request.shards} shard(s)), "
                        + says.format(sub.get("link_job")), tip=f"porter ops status {run.request.dir}")


def show_submitted(log: Logger, run: Any, done: dict[str, Any] | None, *, as_json: bool,
                   describe: Callable[[dict[str, Any]], list[str]],
                   outcome: Callable[[dict[str, Any]], PorterError | None], jobs: str, tip: str) -> None:
    """What a Slurm submission (a sharded build, a matrix) says: the JSON, the dry run's plan, ``done`` (its status
    or report after --wait) in words, or the ``jobs`` submitted and a ``tip``; then the failure ``done`` records."""
    if as_json:
        emit_json(run.to_dict())
    elif run.dry_run is not None:
        click.echo("\n".join(run.dry_run))
    elif done is not None:
        click.echo("\n".join(describe(done)))
    else:
        click.echo(jobs)
        log.tip(tip)
    if done is not None:
        raise_failure(outcome(done))


def raise_failure(err: PorterError | None) -> None:
    """A finished run's failure (a sharded build's, a matrix's), as the command's error and exit code."""
    if err is not None:
        raise err


def show_compiled(what: str, compiled: list[dict[str, Any]], archs: list[str], costs: Any = None) -> None:
    """A compile-only build's table as every build command prints it: per op (kernel) its verdict per arch, its
    seconds and peak memory, and its first error; then the costs it measured."""
    width = max([28, *(len(r["name"]) for r in compiled)])
    col = max([9, *(len(v) for r in compiled for v in r["archs"].values())])
    click.echo(f"# compiled, not linked: {what}")
    click.echo(f"  {'op':<{width}} " + " ".join(f"{a:<{col}}" for a in archs) + "  seconds  peak MiB")
    for rec in compiled:
        peak = max((t.get("peak_rss_mib", 0) for t in rec["tus"]), default=0)
        click.echo(f"  {rec['name']:<{width}} " + " ".join(f"{rec['archs'].get(a, '-'):<{col}}" for a in archs)
                   + f"  {rec['seconds']:7.1f}  {peak:8.0f}" + (f"  {rec['error']}" if rec["error"] else ""))
    if costs:
        click.echo(f"# measured costs: {costs}")


def compile_failures(compiled: list[dict[str, Any]], where: str, tc: Toolchain, *, what: str = "op",
                     leave: str = "") -> None:
    """A compile-only build's failures: nothing compiled (exit 1), or some ops (kernels) did not (exit 3: the
    others did), each named with its archs and the compiler's first error; ``leave``: how to leave one out."""
    from ops_prebuild.build import OpResult, failures

    failed = [OpResult(r["name"], "failed", log=r.get("log", ""), error=r["error"]) for r in compiled
              if r["status"] == "failed"]
    if not failed:
        return
    text = failures(failed, where, tc, {r["name"]: [a for a, v in r["archs"].items() if v == "failed"]
                                        for r in compiled})
    if len(failed) == len(compiled):
        raise CheckFailed(f"no {what} compiled " + text,
                          hint=f"fix the first error of each {what} (its file and line are named)"
                               + (f", or leave it out {leave}" if leave else ""))
    raise PartialSuccess(f"{len(failed)} of {len(compiled)} {what}(s) failed to compile " + text,
                         hint=f"the other {what}s compiled; fix the first error of each (its file and line are named)")


def left_out(failed: list[Any]) -> None:
    """A wheel that shipped without the ops that failed (exit 3), each named."""
    if failed:
        raise PartialSuccess(f"{len(failed)} op(s) failed and were left out of the wheel: "
                             + ", ".join(o.name for o in failed),
                             hint="the other ops shipped; read the failed ops' logs")


def show_plan(header: str, plan: Any, refusal: Any) -> None:
    """A dry run's plan as every build command prints it (:func:`porter.run.plan_lines`), with its build folder."""
    click.echo("\n".join(plan_lines(f"{header}, build dir {plan.build_dir}", plan.notes, plan.env,
                                    [step.argv for step in plan.steps], refusal.message if refusal else None)))
