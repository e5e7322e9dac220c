"""The one AOT engine's run: a catalogue's ops -> hipify -> one ninja plan -> compile / compile-only / link ->
per op and per arch results (:func:`compile_catalogue`). DeepSpeed's ops (``porter ops build``), Megatron's fused
kernels (``porter port``) and the setup.py projects' compile-only (``porter wheel --compile-only``) all run here."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from porter import torch_hip_view as hip_view
from porter.ccache import CacheRequest, CompilerCache, hit_sources, planned_cache, read_stats, setup_cache
from porter.codeobjects import read_code_objects, registers_device_code
from porter.errors import CheckFailed, ConfigError, PorterError, first_error
from porter.executor import Executor
from porter.fs import atomic_write_text, cache_dir, remove_stale_outputs, sha256_file
from porter.locks import hold
from porter.log import NINJA_STATUS, Logger
from porter.optspec import opt
from porter.resources import default_jobs
from porter.run import Runner
from porter.toolchain.archs import HOST_ONLY
from porter.toolchain.check import ready
from porter.toolchain.profile import Toolchain, toolchain_env
from ops_prebuild.catalogue import Catalogue, OpSpec
from ops_prebuild.hipify_step import hipify_sources
from ops_prebuild.measure import SUFFIX as COST_SUFFIX
from ops_prebuild.plan import CCACHE_STATS, Plan, Step, make_plan

@dataclass
class OpResult:
    name: str
    status: str            # built | cached | failed
    seconds: float = 0.0
    log: str = ""
    so: str = ""
    sha256: str = ""
    error: str = ""
    """The compiler's first error line (failed ops)."""


@dataclass
class BuildResult:
    plan: Plan
    catalogue: Catalogue
    ops: list[OpResult] = field(default_factory=list)
    jobs: int = 0
    seconds: float = 0.0
    refusal: PorterError | None = None
    """Dry run only: why a real run here would be refused before any work."""
    compiled: list[dict[str, Any]] = field(default_factory=list)
    """--compile-only: per op, per arch, per translation unit (:func:`compile_report`)."""
    hip_view: str = ""
    """--compile-only without a ROCm torch: the torch HIP header view the compiles used."""
    ccache: CompilerCache | None = None
    cache_stats: dict[str, int] = field(default_factory=dict)
    """ccache hits / misses / uncacheable of this build's compiles."""
    shard: dict[str, Any] = field(default_factory=dict)
    """--shard I/N: which shard ran and the objects it compiled."""
    source_patches: tuple[str, ...] = ()
    """The shipped sets (``set: patch, ...``) applied to porter's copy of the source for this toolchain kind."""

    @property
    def failed(self) -> list[OpResult]:
        return [o for o in self.ops if o.status == "failed"]

    @property
    def excluded(self) -> list[dict[str, str]]:
        """The ops of the catalogue not built because the tree's own builders declare them incompatible with this
        toolchain (DeepSpeed's ``is_compatible``), each with the builder's own reason: never dropped in silence."""
        return [{"name": o.name, "reason": o.reason} for o in self.catalogue.ops
                if not o.compatible and o.name not in self.plan.objects]

    def to_dict(self) -> dict[str, Any]:
        return {"wheel": None, "manifest": None,  # the flow after the engine packages them (porter.wheels)
                "jobs": self.jobs, "seconds": round(self.seconds, 2),
                "ops": [o.__dict__ for o in self.ops], "excluded": self.excluded, "plan": self.plan.to_dict(),
                "refusal": self.refusal.message if self.refusal else None,
                "source_patches": list(self.source_patches),
                "cache": {**self.ccache.to_dict(), **self.cache_stats} if self.ccache else None,
                **({"shard": self.shard} if self.shard else {}),
                **({"compile_only": True, "linked": False, "note": "compiled, not linked: no ROCm torch to link "
                    "against here" if self.hip_view else "compiled, not linked", "hip_view": self.hip_view or None,
                    "compiled": self.compiled} if self.plan.compile_only else {})}


def key(*parts: Any) -> str:
    """A short digest of ``parts`` (JSON), for naming a build's folder."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class EngineChoices:
    """How the engine runs a build, as ``porter ops build`` takes it: each field declares its option. (With
    ``compile_only``, ``link_only`` is the run after the shards that links nothing either and reports every unit
    the shards compiled: the wheel commands' --report-only.)"""

    link_only: bool = opt("--link-only", is_flag=True,
                          help="After the shards: compile nothing, refuse if an object is missing, link and package.")
    pch: bool = opt("--pch/--no-pch", default=False, show_default=True,
                    help="Host units (GCC) that differ only in their op's name share one precompiled torch header, "
                         "made once per build. It pays with many units per job (about 4 or more); for the three CPU "
                         "ops on 2 cores it costs more than it saves (docs/ops.md).")


@dataclass(frozen=True, kw_only=True)
class EngineRun(EngineChoices):
    """How the engine runs a build (the same for every catalogue)."""

    jobs: int | None = None
    compile_only: bool = False
    """Compile every unit for every arch, link nothing (no torch of the profile's kind needed)."""
    compiler_cache: CacheRequest = CacheRequest()
    shard: tuple[int, int] | None = None
    """(i, n): compile only shard i of n of the compile steps into the shared build folder, and stop."""
    debug: str = "full"
    """Debug info of the compiles: ``full`` (the builders' own ``-g``), ``lines``, ``none``."""

    def __post_init__(self) -> None:
        if self.shard is not None and self.link_only:
            raise ConfigError("--shard compiles one part of a build; --link-only is the run after the shards",
                              hint="run the shards first, then one --link-only run")



def compile_catalogue(cat: Catalogue, tc: Toolchain, selected: list[OpSpec], build_dir: Path, *, python: str,
                      py_ex: Executor, runner: Runner, log: Logger, cache: Path, how: EngineRun = EngineRun(),
                      compiler_version: str = "", refused: PorterError | None = None,
                      source_patches: tuple[str, ...] = (), hipify: Sequence[str] | None = None,
                      torch_view: bool | None = None, hipify_from: Path | None = None,
                      notes: Sequence[str] = (), on_shard_setup: Callable[[], None] | None = None) -> BuildResult:
    """The engine: any catalogue's selected ops -> hipify (rocm) -> one ninja plan -> compile (all, one shard, or
    none with ``link_only``) -> link unless ``compile_only`` -> per op result and, compile-only, per op x arch
    report. The build folder is held under a lock while it is set up (the shards of one build then compile at
    once, each with its own ninja file); what was built is recorded with its sha256, and anything that no longer
    matches is built again. A dry run (a recording ``runner``) plans, writes nothing and returns with ``refusal`` set
    instead of raising. The caller owns what comes before (its source, catalogue and checks) and after (its wheel).

    ``hipify``: the ops whose CUDA sources the engine hipifies on a rocm profile (into a copy under the build
    folder; default: every device op; ``()``: the sources are HIP already). ``torch_view``: a compile-only run
    without a ROCm torch sees torch's headers through a generated HIP view (default: when an op was hipified
    here). ``hipify_from``: where hipify reads the sources when they are not at ``cat.source.tree`` yet (a dry
    run's copy). ``notes`` go first in the plan's notes. ``on_shard_setup``: called once a shard run lets go of
    the build folder's lock, for the caller's own locks."""
    compile_only, compiler_cache, shard, link_only = how.compile_only, how.compiler_cache, how.shard, how.link_only
    start = time.monotonic()
    with ExitStack() as stack:
        if not runner.dry:  # two builds of one target take turns from here on (hipify rewrites build_dir/hip); the
            # shards of one build only while they set up
            lock = stack.enter_context(hold(build_dir, f"building {cat.source.project} {cat.source.version} for "
                                            f"{tc.name}", say=log.info))
        to_hipify = [o for o in selected if o.device and (hipify is None or o.name in hipify)] if tc.hip else []
        quiet = replace(runner, echo=log.verbose)
        hip_map = None
        if to_hipify:  # a copy of the ops' sources, hipified with torch's hipify in the build python
            with log.step(f"hipifying {len(to_hipify)} op(s)' CUDA sources (a copy; the tree is untouched)"):
                hip_map = hipify_sources(hipify_from or cat.source.tree, to_hipify, build_dir / "hip",
                                         python=python, runner=quiet, executor=py_ex)
        emulated = tc.kind == "emulated" and any(o.device for o in selected)
        wants_view = (bool(to_hipify) if torch_view is None else torch_view) and compile_only and tc.kind == "rocm"
        view = _torch_view(cat, cache, python, quiet, py_ex, log, emulated=emulated) if wants_view or emulated else ()
        # --compile-only measures each unit's time and memory (what later plans' jobs are sized by): a
        # cache hit would record a copy, not a compile, so those runs never go through the cache
        ccache = (planned_cache if runner.dry else setup_cache)(
            tc, work=cache_dir(), compiler_version_text=compiler_version, log=log,
            enabled=compiler_cache.enabled and not compile_only, cache_dir=compiler_cache.dir,
            remote="" if compile_only else compiler_cache.remote)
        plan = make_plan(cat, tc, selected, build_dir, sources=hip_map, stage=not runner.dry,
                         compile_only=compile_only, extra_includes=view, cache=ccache, pch=how.pch, debug=how.debug)
        plan.notes[:] = [*notes, *plan.notes, *_notes(cat, view, source_patches, emulated, not runner.dry)]
        # the memory one compile job may take: nvcc/hipcc device units ~3 GiB, host C++ units ~1 GiB
        per_job = 3 << 30 if any(o.device for o in selected) and tc.kind != "cpu" else 1 << 30
        n_jobs = how.jobs or default_jobs(per_job, spare=1)  # one spare: no core idles while the last units compile
        result = BuildResult(plan, cat, jobs=n_jobs, refusal=refused, ccache=ccache, source_patches=source_patches,
                             hip_view=str(view[0]) if view else "")
        if runner.dry:  # the plan, and what a real run here would refuse (the toolchain's root not ready, ...)
            result.refusal = result.refusal or ready(tc, runner, log, compiler=False)[1]
            result.seconds = time.monotonic() - start
            return result
        _write_build_dir(plan, build_dir, log)
        stats, part, tag = build_dir / CCACHE_STATS, None, ""
        if shard is not None:
            part, tag = plan.shard(*shard), f"shard-{shard[0]}-of-{shard[1]}"
            stats = _shard_files(plan, part, tag, build_dir, log, cached=ccache is not None)
            lock.release()  # each shard has its own ninja file, ninja log and stats: they compile at once
            if on_shard_setup is not None:
                on_shard_setup()
            # ... but one shard's ninja state is one shard's: the same shard of another array on this build folder
            # (a resubmission, another user's job) waits, then finds its objects built
            stack.enter_context(hold(build_dir.parent / f"{build_dir.name}.{tag}",
                                     f"compiling shard {shard[0]} of {shard[1]}", say=log.info))
        elif link_only:
            part, tag = _links_only(plan, build_dir, log, compile_only=compile_only), "link"
        else:
            _say_discarded(log, build_dir, check_outputs(build_dir, [s.output for s in plan.steps]))
        stats.unlink(missing_ok=True)
        targets = [s.output for s in part or () if s.kind == "compile"] if shard is not None else None
        result.ops = run_ninja(plan, n_jobs, runner=runner, log=log, targets=targets, tag=tag,
                               times=unit_times_path(cat.source.project, cat.source.version, tc),
                               stats=stats if ccache is not None else None)
        _record(result, build_dir, plan, shard, targets, stats, log)
        if compile_only and shard is None:
            result.compiled = compile_report(plan, result.ops)
        result.seconds = time.monotonic() - start
        return result


def _notes(cat: Catalogue, view: tuple[Path, ...], source_patches: Sequence[str], emulated: bool,
           built: bool) -> list[str]:
    """What the plan says of torch's HIP view and of porter's patched copy of the source."""
    notes = [f"torch {cat.torch.version} is a {cat.torch.kind} build: its headers are seen through a generated HIP "
             f"view ({view[0]}); objects are compiled, never linked"] if view and not emulated else []
    if source_patches:
        notes.append(f"{'built' if built else 'a real run builds'} from porter's patched copy of the source: "
                     f"{'; '.join(source_patches)}")
    return notes


def _shard_files(plan: Plan, part: list[Step], tag: str, build_dir: Path, log: Logger, *,
                 cached: bool) -> Path:
    """A shard's own ninja file (:func:`run_ninja` finds it, and its ninja log, by ``tag``) and cache stats (its
    objects checked: the other shards' may be half-written by their compilers right now)."""
    atomic_write_text(build_dir / f"build.{tag}.ninja", plan.ninja(part, builddir=f".ninja-{tag}", publish=True))
    stats = build_dir / f"ccache-stats.{tag}.log"
    if cached:
        plan.env["CCACHE_STATSLOG"] = plan.toolchain.executor.inside(stats)
    _say_discarded(log, build_dir, check_outputs(build_dir, [s.output for s in part if s.kind == "compile"]))
    return stats


def _torch_view(cat: Catalogue, cache: Path, python: str, runner: Runner, py_ex: Executor, log: Logger, *,
                emulated: bool) -> tuple[Path, ...]:
    """torch's headers as a HIP build sees them, generated, when torch is not a ROCm build (none otherwise)."""
    if not hip_view.needed(cat.torch):
        return ()
    with log.step(f"a HIP view of torch {cat.torch.version}'s headers" + (" (compile checks only)" if not emulated
                                                                            else "")):
        return (hip_view.view_dir(cat.torch, cache) if runner.dry else  # a dry run: named, not made
                hip_view.make_view(cat.torch, cache, python=python, runner=runner, executor=py_ex),)


def _write_build_dir(plan: Plan, build_dir: Path, log: Logger) -> None:
    """The build folder as the plan needs it: killed compiles' leftovers gone, the plan's files (an unchanged one
    keeps its time) and build.ninja."""
    left = remove_stale_outputs(build_dir)  # the private files of compiles killed mid-write
    if left:
        log.info(f"removed {len(left)} half-written output(s) of killed compiles, e.g. {left[0].name}")
    for path, text in plan.files.items():
        if not Path(path).is_file() or Path(path).read_text() != text:
            atomic_write_text(path, text)  # its folder made too
    atomic_write_text(build_dir / "build.ninja", plan.ninja())


def _links_only(plan: Plan, build_dir: Path, log: Logger, *, compile_only: bool) -> list[Step]:
    """The run after every shard: refuses when an object is missing (a damaged one is a missing one: the shard that
    compiled it runs again); its ninja file links only."""
    _say_discarded(log, build_dir, check_outputs(build_dir, [s.output for s in plan.steps]), again=False)
    compiles = [s.output for s in plan.steps if s.kind == "compile"]
    missing = [o for o in compiles if not Path(o).is_file()]
    if missing:
        raise CheckFailed(f"{len(missing)} object(s) are missing, e.g. {missing[0]} "
                          f"(compile step {compiles.index(missing[0])} of {len(compiles)})",
                          hint="a shard did not finish: rerun it (--shard I/N), then "
                               + ("--report-only" if compile_only else "--link-only"))
    part = plan.links()
    atomic_write_text(build_dir / "build.link.ninja", plan.ninja(part, builddir=".ninja-link"))
    return part


def _record(result: BuildResult, build_dir: Path, plan: Plan, shard: tuple[int, int] | None,
            targets: list[str] | None, stats: Path, log: Logger) -> None:
    """What was built, recorded with its sha256 (a shard adds its own objects, in turn with the others), and the
    compiler cache's numbers."""
    if shard is None:
        record_outputs(build_dir, [s.output for s in plan.steps])
    else:
        with hold(build_dir, f"recording shard {shard[0]} of {shard[1]}'s objects", say=log.info):
            record_outputs(build_dir, targets or [], merge=True)
        result.shard = {"index": shard[0], "count": shard[1], "objects": targets or []}
    if result.ccache is not None:
        result.cache_stats = read_stats(stats)
        if shard is None:
            log.info(f"compiler cache: {result.cache_stats['hits']} hit(s), {result.cache_stats['misses']} miss(es)"
                     f" ({result.ccache.dir})")


def _say_discarded(log: Logger, build_dir: Path, discarded: list[str], *, again: bool = True) -> None:
    if discarded:
        log.warn(f"{len(discarded)} built file(s) in {build_dir} no longer match what porter recorded when it "
                 f"built them (truncated or changed since: a crash, a full disk, another tool): discarded"
                 f"{' and built again' if again else ''}: {', '.join(discarded[:3])}"
                 f"{' ...' if len(discarded) > 3 else ''}")


OUTPUTS_RECORD = "porter-outputs.json"
"""In a build folder: each file porter built there (objects, modules) with its size and sha256, written after a
run; the next run discards what no longer matches (ninja would take a truncated object with a new time as up to
date) and builds it again."""


def record_outputs(build_dir: Path, outputs: list[str], *, merge: bool = False) -> None:
    """Record ``outputs`` (those there are); ``merge`` keeps the record's other entries (a shard's objects)."""
    rec: dict[str, dict[str, Any]] = {}
    if merge:
        with suppress(OSError, ValueError):  # none yet, or unreadable: this shard's alone
            old = json.loads((build_dir / OUTPUTS_RECORD).read_text())
            rec = old if isinstance(old, dict) else {}
    for out in outputs:
        path = Path(out)
        if path.is_file():
            rec[os.path.relpath(path, build_dir)] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
        else:
            rec.pop(os.path.relpath(path, build_dir), None)
    atomic_write_text(build_dir / OUTPUTS_RECORD, json.dumps(rec, indent=1, sort_keys=True) + "\n")


def check_outputs(build_dir: Path, outputs: list[str]) -> list[str]:
    """Remove those of ``outputs`` whose size or sha256 changed since they were recorded; return them (relative
    paths). A garbled record cannot vouch for anything: it is removed with every output of ``outputs`` there is."""
    path = build_dir / OUTPUTS_RECORD
    try:
        rec = json.loads(path.read_text())
        if not (isinstance(rec, dict) and all(isinstance(v, dict) and isinstance(v.get("size"), int)
                                              and isinstance(v.get("sha256"), str) for v in rec.values())):
            raise ValueError("not a record of outputs")
    except FileNotFoundError:
        return []
    except (ValueError, OSError):
        gone = [os.path.relpath(o, build_dir) for o in outputs if Path(o).is_file()]
        for o in outputs:
            Path(o).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        return [f"{OUTPUTS_RECORD} (unreadable)", *gone]
    bad: list[str] = []
    for rel in sorted(rec.keys() & {os.path.relpath(o, build_dir) for o in outputs}):
        out, want = build_dir / rel, rec[rel]
        try:
            if out.stat().st_size == want["size"] and sha256_file(out) == want["sha256"]:
                continue
        except FileNotFoundError:
            continue  # missing: ninja builds it again by itself
        out.unlink(missing_ok=True)
        bad.append(rel)
    if bad:
        atomic_write_text(path, json.dumps({k: v for k, v in rec.items() if k not in bad}, indent=1,
                                           sort_keys=True) + "\n")
    return bad


UNIT_TIMES = "porter.unit-times/1"
GUESS_SECONDS_PER_KIB = 0.5
"""A unit no build has measured yet: this much per KiB of its source (per arch for device code), for the ETA."""


def unit_times_path(project: str, version: str, tc: Toolchain) -> Path:
    """Where the wall time of each unit of this project, version and compiler line is kept (porter's cache)."""
    return cache_dir() / "costs" / f"{project}-{version}-{tc.compiler_line}.times.json"


def _unit_key(plan: Plan, output: str) -> str:
    """A unit's key in the times file: the archs it is compiled for and its path in the build folder."""
    tc = plan.toolchain
    archs = ",".join(tc.arch_names) if tc.kind != "cpu" else tc.cpu_isa or "cpu"
    return f"{archs}|{os.path.relpath(output, plan.build_dir)}"


def _read_times(path: Path) -> dict[str, float]:
    try:
        doc = json.loads(path.read_text())
        units = doc.get("units") if isinstance(doc, dict) and doc.get("schema") == UNIT_TIMES else None
        return {str(k): float(v) for k, v in units.items()} if isinstance(units, dict) else {}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}  # none yet, or unreadable: the ETA falls back to estimates


def expected_times(plan: Plan, steps: list[Step], path: Path) -> tuple[dict[str, float], list[str], list[str]]:
    """Per ninja description of each step: its measured time, else a guess from its source's size (listed), and
    which of the guessed ones are compiles (a link's guess is a nominal second: it has no source to size)."""
    known = _read_times(path)
    expected: dict[str, float] = {}
    guessed: list[str] = []
    compiles: list[str] = []
    for st in steps:
        desc = f"{st.kind.upper()} {st.op or 'shared'}: {os.path.basename(st.output)}"
        seconds = known.get(_unit_key(plan, st.output))
        if seconds is None:
            try:
                size = Path(st.inputs[0]).stat().st_size if st.kind != "link" else 0
            except (OSError, IndexError):
                size = 0
            device = 1 if HOST_ONLY in st.argv else \
                sum(a.startswith(("--offload-arch=", "-gencode")) for a in st.argv) or 1
            seconds = max(1.0, size / 1024 * GUESS_SECONDS_PER_KIB * device)
            guessed.append(desc)
            if st.kind != "link":
                compiles.append(desc)
        expected[desc] = seconds
    return expected, guessed, compiles


def record_times(plan: Plan, entries: list[list[str]], path: Path, cached: Collection[str] = ()) -> None:
    """Merge this run's unit times (ninja's log: start and end in ms, output) into ``path``, in turn with others.
    ``cached``: the sources the compiler cache answered (:func:`porter.ccache.hit_sources`); a unit compiled from
    one of them took a copy's time, not a compile's, and is left out (else the next cold build's ETA is low)."""
    # each step's source as its compiler sees it, after -c (what ccache's stats log names)
    copied = {s.output for s in plan.steps if s.kind != "link" and "-c" in s.argv[:-1]
              and os.path.normpath(s.argv[s.argv.index("-c") + 1]) in cached}
    finished = [e for e in entries if len(e) >= 4 and e[0].isdigit() and e[1].isdigit()]
    times = {_unit_key(plan, out): (int(e[1]) - int(e[0])) / 1000.0
             for e in finished if (out := str(plan.build_dir / e[3])) not in copied}  # an absolute e[3] as it is
    if not times:
        return
    with hold(path, "recording unit times"):
        units = _read_times(path)
        units.update(times)
        atomic_write_text(path, json.dumps({"schema": UNIT_TIMES, "units": dict(sorted(units.items()))}, indent=1)
                          + "\n")


def run_ninja(plan: Plan, jobs: int, *, runner: Runner, log: Logger, times: Path, targets: list[str] | None = None,
              tag: str = "", stats: Path | None = None) -> list[OpResult]:
    """One ninja run over the plan (or only ``targets``: a shard's objects) in the plan's environment; per-op results.

    With ``targets`` an op's status says whether its part of the shard compiled: "compiled" (or
    "cached"), "failed", or "elsewhere" when no object of it is in the shard. ``times``: the unit times file
    (:func:`unit_times_path`) the ETA is read from and this run's times are added to; ``stats``: the compiler
    cache's stats log of this run, whose hits are not added as times; ``tag``: a part's (a shard's, the links') own
    ninja file and log folder, named as :func:`_shard_files` and :func:`_links_only` write them."""
    import ninja  # the PyPI package ships the binary

    ninja_bin = str(Path(ninja.BIN_DIR) / "ninja")
    ninja_file, ninja_dir = (f"build.{tag}.ninja", f".ninja-{tag}") if tag else ("build.ninja", "")
    ninja_log = plan.build_dir / ninja_dir / ".ninja_log"
    before = ninja_log.read_text().splitlines() if ninja_log.is_file() else []
    with log.step(f"compiling {len(plan.objects)} op(s) in one ninja graph with {jobs} job(s)"
                  + (" (compile only: no link)" if plan.compile_only else "")) as step:
        chosen = [st for st in plan.steps if targets is None or st.output in targets]
        expected, guessed, compiles = expected_times(plan, chosen, times)
        step.expect(expected, jobs, guessed, paced=compiles)
        pending = [st for st in chosen if not Path(st.output).exists()]
        if pending:  # an estimate from the start (ninja says where it is once a unit has finished)
            step.progress(0, len(pending))
        res = runner.run([ninja_bin, "-C", str(plan.build_dir), "-f", ninja_file, "-k", "0", "-j", str(jobs)],
                         env={**toolchain_env(plan.toolchain, plan.env), "NINJA_STATUS": NINJA_STATUS},
                         timeout=4 * 3600, check=False, on_line=step.ninja_line)
    after = ninja_log.read_text().splitlines() if ninja_log.is_file() else []
    new = [l.split("\t") for l in after[len(before) if len(after) >= len(before) else 0:] if not l.startswith("#")]
    where = plan.toolchain.executor.inside(plan.build_dir)  # ninja's folder, where each compile runs
    record_times(plan, new, times, hit_sources(stats, where) if stats is not None else set())
    blocks = _failure_blocks(res.output)
    shared = str(plan.build_dir / "pch") + os.sep  # a failed precompiled header fails the ops that read it
    inputs = {s.output: s.inputs for s in plan.steps}
    results = []
    linked = targets is None and not plan.compile_only  # a shard links nothing
    for op in plan.objects:
        so = plan.outputs.get(op, "") if linked else ""
        odir = str(plan.build_dir / op) + os.sep
        entries = [e for e in new if len(e) >= 4 and str(plan.build_dir / e[3]).startswith(odir)]  # absolute: as is
        seconds = sum(int(e[1]) - int(e[0]) for e in entries) / 1000.0
        own = [b for b in blocks if odir in b.partition("\n")[0]  # the FAILED: line names the output
               or (shared in b.partition("\n")[0] and any(shared in i for o in plan.objects[op]
                                                           for i in inputs.get(o, ())))]
        log_path = plan.build_dir / op / (f"build.{tag}.log" if targets is not None else "build.log")
        mine = [o for o in plan.objects[op] if targets is None or o in targets]
        if targets is not None and not mine:
            results.append(OpResult(op, "elsewhere"))
            continue
        text = "\n".join(own) if own else "\n".join(l for l in res.output.splitlines() if odir in l)
        atomic_write_text(log_path, text + "\n")
        ok = (Path(so).is_file() if linked else all(Path(o).is_file() for o in mine)) and not own
        status = "failed" if not ok else ("built" if linked else "compiled") if entries else "cached"
        results.append(OpResult(op, status, seconds, str(log_path), so if ok else "",
                                sha256_file(so) if ok and so else "", first_error(text) if not ok else ""))
    return results


def compile_report(plan: Plan, results: list[OpResult]) -> list[dict[str, Any]]:
    """Per op: status, first error, per-arch verdict; per translation unit: time, peak memory and the
    code objects found in its object file (porter's ELF reader). A unit compiled in parts (its host part and one
    device part per arch, see :func:`ops_prebuild.plan.make_plan`) is one entry: its parts' times added, their peak
    the highest, ``objects`` naming each arch's; an arch whose part failed fails alone."""
    by_name = {r.name: r for r in results}
    out: list[dict[str, Any]] = []
    for op, objs in plan.objects.items():
        r = by_name[op]
        units: dict[str, list[Step]] = {}
        for step in (s for s in plan.steps if s.op == op and s.kind == "compile"):
            units.setdefault(step.inputs[0], []).append(step)
        tus: list[dict[str, Any]] = []
        device_archs: list[set[str]] = []
        whole = True  # every step that is not one arch's device part compiled
        for source, steps in units.items():
            tu: dict[str, Any] = {"source": source, "object": steps[0].output}
            costs = [json.loads(c.read_text()) for c in (Path(f"{st.output}{COST_SUFFIX}") for st in steps)
                     if c.is_file()]
            if costs:
                tu.update(seconds=round(sum(c["seconds"] for c in costs), 3),
                          peak_rss_mib=round(max(c["peak_rss_kib"] for c in costs) / 1024, 1),
                          returncode=next((c["returncode"] for c in costs if c["returncode"]), 0))
            parts = {st.arch: st.output for st in steps if st.arch}
            made = Path(steps[0].output).is_file()  # the unit's one step, or its host part
            whole = whole and made
            if parts:
                tu["objects"] = parts
                if made and not registers_device_code(steps[0].output):
                    tu["host_only"] = True  # no kernel in it (host wrappers): nothing to hold per arch
                else:
                    found = {o.target: o.arch for a, path in parts.items() if Path(path).is_file()
                             for o in read_code_objects(path) if o.arch == a}
                    tu["code_objects"] = sorted(found)
                    device_archs.append(set(found.values()))
            else:
                device = any(a.startswith(("--offload-arch=", "-gencode")) for a in steps[0].argv)
                if device and made:
                    objects = read_code_objects(steps[0].output)
                    tu["code_objects"] = sorted({o.target for o in objects})
                    if objects:
                        device_archs.append({o.arch for o in objects})
                    else:  # a device compile of a unit with no kernel in it (host wrappers): nothing to hold per arch
                        tu["host_only"] = True
            tus.append(tu)
        ok = r.status != "failed"
        # an op compiled in parts whose failures are all in some archs' device parts: the other archs compiled
        by_arch = plan.compile_only and whole and any("objects" in tu for tu in tus)
        if ok and not device_archs:  # host code only: cpu_adam in a ROCm build, or units with no kernel at all
            archs = {a: "host-only" for a in plan.toolchain.arch_names}
        else:
            archs = {a: "compiled" if (ok or by_arch) and all(a in d for d in device_archs) else "failed"
                     for a in plan.toolchain.arch_names}
        out.append({"name": op, "status": r.status, "error": r.error, "log": r.log, "archs": archs, "tus": tus,
                    "seconds": round(r.seconds, 2)})
    return out


def failures(failed: list[OpResult], where: str, tc: Toolchain,
             archs: Mapping[str, Sequence[str]] | None = None) -> str:
    """Per failed op: the tree, the op, the archs it failed for (``archs``: per op, where a compile-only build
    knows them arch by arch; else every arch of the profile), the compiler's first error on a line of its own (it
    names the file and line, and :func:`porter.errors.first_error` of a log holding this finds it), then where its
    full log is."""
    every = ", ".join(tc.arch_names) or tc.cpu_isa
    lines = [f"  {o.name} ({', '.join((archs or {}).get(o.name) or ()) or every}):\n    {o.error or 'failed'}"
             + (f"\n    full log: {o.log}" if o.log else "") for o in failed]
    return f"in {where} with {tc.name}:\n" + "\n".join(lines)


_FAILED_EDGE = re.compile(r"^FAILED: .*?(?=\n(?:FAILED: |\[\d+/\d+\] |ninja: )|\n?\Z)", re.M | re.S)


def _failure_blocks(output: str) -> list[str]:
    """Split ninja's output into one block per failed edge (FAILED: line up to the next status line)."""
    return _FAILED_EDGE.findall(output)
