"""``porter wheel apex|flash-attn --compile-only``: every translation unit compiled for every arch, no setup.py.

    resolve source -> detect -> plan (selection, MAX_JOBS) -> work copy -> driver's kernel ops (FA: the
    tree's own CK generator) -> hipify (CUDA sources) -> torch HIP view -> one ninja graph (porter's
    planner, compile only) -> per op x arch report -> measured costs recorded

The driver knows the project (which sources, flags and include dirs the tree's own build declares);
this flow is the same for every driver and runs on the AOT engine of ``porter ops build --compile-only``
(:func:`ops_prebuild.build.compile_catalogue`), so the report has the same shape: per op, status, per-arch
verdict, and per TU its time, peak memory and the code objects in its object file. Nothing is linked.
Each TU's time and peak memory are merged into the project's measured-costs file
(:mod:`porter.wheels.costs`), which later plans of the same project read to size MAX_JOBS.

The work copy lives where the toolchain's programs see it (under the chroot's work root for a chroot
profile), keyed to the source and the toolchain, so a second run compiles only what changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from porter.errors import CheckFailed, ConfigError, NothingToDo, PorterError, stop_note
from porter.executor import build_python
from porter.fs import cache_dir, owned_temp
from porter.locks import hold
from porter.patching import resolve_sets
from porter.log import Logger, quiet_logger
from porter.run import Runner
from porter.toolchain.check import checked_compiler, ready
from porter.toolchain.profile import Toolchain
from porter.torch_facts import TorchInfo, build_torch, need_for
from porter.wheels import costs as costs_mod
from porter.hipify import wave64
from porter.wheels.base import (LEAVE, Assessed, BuildPlan, DeviceSources, KernelContext, KernelSet, Machine,
                                SourceInfo, WheelDriver, WheelRequest)
from porter.wheels.source import detect, resolve_source
from ops_prebuild.build import BuildResult, OpResult, compile_catalogue, key
from ops_prebuild.catalogue import Catalogue, OpSpec
from ops_prebuild.plan import Plan
from ops_prebuild.source import Patched, Source, build_copy

@dataclass
class CompileOnlyResult:
    project: str
    version: str
    toolchain: str
    plan: Plan
    wheel_plan: BuildPlan
    ops: list[OpResult] = field(default_factory=list)
    compiled: list[dict[str, Any]] = field(default_factory=list)
    jobs: int = 0
    seconds: float = 0.0
    hip_view: str = ""
    dry_run: bool = False
    refusal: PorterError | None = None
    wave64: dict[str, Any] | None = None
    """A 64-lane target: the state of each warp-size-32 finding (:mod:`porter.hipify.wave64`)."""
    selected_units: int = 0
    total_units: int = 0
    costs: str = ""
    """The measured-costs file this run added to (empty: nothing measured)."""
    measured: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    shard: dict[str, Any] = field(default_factory=dict)
    """--shard I/N: which shard ran and the objects it compiled."""
    linked: bool = False
    """The ops were linked into modules (a wheel build's engine step), not only compiled."""
    engine: BuildResult | None = None
    """The engine's own result (its catalogue, plan, compiler cache)."""
    patched: Patched | None = None
    """The copy of the source the ops were compiled from, and the patches applied to it."""

    @property
    def failed(self) -> list[OpResult]:
        return [o for o in self.ops if o.status == "failed"]

    def to_dict(self) -> dict[str, Any]:
        return {"project": self.project, "version": self.version, "toolchain": self.toolchain,
                "dry_run": self.dry_run, "jobs": self.jobs, "seconds": round(self.seconds, 2),
                "per_job_bytes": self.wheel_plan.per_job_bytes, "per_job_source": self.wheel_plan.per_job_source,
                "units": {"selected": self.selected_units, "total": self.total_units},
                "ops": [o.__dict__ for o in self.ops], "plan": self.plan.to_dict(), "notes": self.notes,
                "refusal": self.refusal.message if self.refusal else None, "wave64": self.wave64,
                "compile_only": not self.linked, "linked": self.linked,
                "note": "compiled and linked" if self.linked
                        else "compiled, not linked: no ROCm torch to link against here" if self.hip_view
                        else "compiled, not linked",
                "hip_view": self.hip_view or None, "compiled": self.compiled,
                "costs": self.costs or None, "measured": self.measured, **({"shard": self.shard} if self.shard else {})}


def compile_only(driver: WheelDriver, source: str, request: WheelRequest, *, runner: Runner,
                 log: Logger | None = None, machine: Machine | None = None,
                 others: Mapping[str, WheelDriver] | None = None, torch_info: TorchInfo | None = None,
                 costs_root: Path | None = None, link: bool = False,
                 on_ready: Callable[[Patched, TorchInfo], None] | None = None,
                 found: tuple[Path, SourceInfo] | None = None) -> CompileOnlyResult:
    """The engine's part of every build (module docstring): source -> patched copy -> the driver's ops -> wave-64
    step -> the engine. A dry run (a recording ``runner``) plans everything (the CK generator and hipify run into
    temp folders, as they decide the TUs), compiles nothing and writes nothing.

    ``link``: the engine's part of a wheel build (:func:`porter.wheels.engine.build_wheel` of a driver whose ops the
    engine builds): any profile kind, the build python's torch must be of the profile's kind, every op is linked
    into its module (``OpResult.so``) and nothing is measured (the compiler cache may answer); the patch set the
    request asks for is applied to the copy too. ``request.engine``: the compiler cache, precompiled header and
    debug info; with ``shard=(i, n)`` only shard i of n of the units is compiled into the shared build folder (a
    Slurm array task), and a ``link_only`` run afterwards compiles nothing, refuses when an object is missing
    (naming its shard) and links, or reports every unit. ``costs_root``: where measured costs are read and merged
    (default: porter's cache). ``on_ready``: called with the patched copy and the build torch once a real build
    is sure to start, before the engine compiles (a wheel build starts its Python side there). ``found``: the
    source already read (its folder and what it is; ``request.sources`` says where it came from)."""
    log = log or quiet_logger()
    tc = request.toolchain
    _gpu_only(tc, link)
    compiler_version, not_ready = ready(tc, runner, log, compiler=not link)  # a link checks it for device ops
    ex = tc.executor
    py_ex, python = build_python(ex, tc.python, request.python)
    machine, start = machine or Machine.current(), time.monotonic()
    work_root = ex.work_dir(cache_dir(), make=not runner.dry)
    with ExitStack() as stack:
        # scratch files (an unpacked sdist, the generator's output) where the build python sees them
        tmp = stack.enter_context(owned_temp(_made(work_root / "tmp") if py_ex.kind != "host" else None,
                                             "porter-compile-"))
        root, info, request, patched = _patched_source(driver, source, request, found, work_root, runner, log,
                                                       scratch=tmp if runner.dry else None, others=others, link=link)
        if request.measured is None:
            request = replace(request, measured=costs_mod.load(driver.name, info.version, tc, costs_root))
        wplan = driver.plan(info, request, machine)
        torch, refused = build_torch(python, py_ex, runner, known=torch_info, what=f"linking {info.project} "
                                     f"{info.version}'s ops for {tc.name}",
                                     need=need_for(tc.kind) if link and request.torch_check else None)
        base = work_root / "wheels" / (f"{driver.name}-{info.version}-{tc.name}-" + key(
            request.sources.get("sdist_sha256") or info.origin or str(root), patched.applied, tc.to_dict(),
            torch.version, torch.python_tag, *(["linked"] if link else [])))
        # two runs of the same target take turns, from the work copy on (shards: until set up)
        base_lock = None if runner.dry else stack.enter_context(
            hold(base, f"compiling {driver.title} {info.version} for {tc.name}", say=log.info))
        tree = base / "src"
        ctx = KernelContext(source=root if runner.dry else patched.source.tree,  # a dry run writes no patched copy
                            tree=tmp / "tree" if runner.dry else tree, plan_tree=tree, toolchain=tc, python=python,
                            py_ex=py_ex, runner=runner.real(echo=log.verbose), log=log, scratch=_made(tmp / "scratch"),
                            torch=torch)
        kset = _kernel_set(driver, info, request, ctx, log)
        lanes, stop = wave64_step(driver, info, wplan, request, patched, log, kset.ops)
        if stop and not runner.dry:
            raise stop
        if link and not runner.dry and tc.kind != "cpu" and any(o.device for o in kset.ops):
            compiler_version = checked_compiler(tc, log)  # a wheel of host-only ops needs no device compiler
        cat = Catalogue(source=Source(info.project, info.version, tree, source), torch=torch, accelerator="cuda",
                        ops=kset.declared or kset.ops, feature_probes=kset.probes)
        if on_ready is not None and not runner.dry and not (refused or not_ready):
            on_ready(patched, torch)
        notes = [*wplan.notes, *kset.notes, *(f"{n}: not planned: {why}" for n, why in kset.unplanned),
                 *(lanes.allowed_notes() if lanes else []), *([stop_note(stop.message)] if stop else [])]
        built = compile_catalogue(cat, tc, list(kset.ops), base / "build", python=python, py_ex=py_ex, runner=runner,
                                  log=log, cache=work_root, compiler_version=compiler_version,
                                  how=replace(request.engine, jobs=wplan.jobs, compile_only=not link),
                                  refused=refused or not_ready, source_patches=patched.applied,
                                  hipify=tuple(kset.hipify), torch_view=kset.torch_view, hipify_from=ctx.tree,
                                  notes=notes, on_shard_setup=base_lock.release if base_lock is not None else None)
        result = _result(info, tc, built, wplan, kset, stop=stop, lanes=lanes)
        result.dry_run, result.engine, result.patched = runner.dry, built, patched
        if runner.dry or request.engine.shard is not None:  # a shard's units are reported by the run after all
            result.seconds = time.monotonic() - start
            return result
    return _finish(result, kset, driver.name, request, costs_root, log, start=start, link=link)


def _patched_source(driver: WheelDriver, source: str, request: WheelRequest, found: tuple[Path, SourceInfo] | None,
                    work_root: Path, runner: Runner, log: Logger, *, scratch: Path | None,
                    others: Mapping[str, WheelDriver] | None,
                    link: bool) -> tuple[Path, SourceInfo, WheelRequest, Patched]:
    """The source read (unless ``found``: the request then says where it came from), what it is, the request with
    its provenance, and porter's patched copy of it (a wheel build's also with the patch set the request asks for)."""
    if found is None:
        with log.step(f"reading {driver.title} source {source}"):
            root, provenance = resolve_source(source, driver, work_root, runner, scratch)
            info = detect(driver, root, others or {})
        request = replace(request, sources={**provenance, **request.sources})
    else:
        root, info = found
    asked = resolve_sets(request.patch_set) if link and request.patch_set else []
    return root, info, request, build_copy(Source(info.project, info.version, root, str(source)),
                                           request.toolchain.kind, work_root, runner, log, asked=asked)


def _finish(result: CompileOnlyResult, kset: KernelSet, project: str, request: WheelRequest, costs_root: Path | None,
            log: Logger, *, start: float, link: bool) -> CompileOnlyResult:
    """A whole run's report: the ops porter could not plan as failed, the costs measured (a compile-only run's).
    What failed is its caller's to say (:func:`porter.cli.options.compile_failures`; a wheel leaves them out)."""
    for name, why in kset.unplanned:  # per-op isolation from the first step: reported, not fatal
        result.ops.append(OpResult(name, "failed", error=why))
        result.compiled.append({"name": name, "status": "failed", "error": why, "log": "", "tus": [],
                                "archs": {a: "failed" for a in request.toolchain.arch_names}, "seconds": 0.0})
    result.linked = link
    if not link:
        _record_costs(result, project, request, costs_root, log)
    result.seconds = time.monotonic() - start
    return result


def _gpu_only(tc: Toolchain, link: bool) -> None:
    """A compile-only build needs a GPU profile (a wheel build's link takes any kind)."""
    if tc.kind == "cpu" and not link:
        raise ConfigError(f"--compile-only compiles GPU code for every arch of a rocm or cuda profile; toolchain "
                          f"{tc.name} is a cpu profile",
                          hint="pick a GPU profile (-t debian-rocm7, -t mi300x, -t cuda-h100, ...), or drop "
                               "--compile-only")


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _result(info: SourceInfo, tc: Toolchain, built: Any, wplan: BuildPlan, kset: KernelSet, *,
            stop: PorterError | None, lanes: wave64.Wave64 | None) -> CompileOnlyResult:
    units = sum(len(o.sources) for o in kset.ops)
    return CompileOnlyResult(info.project, info.version, tc.name, built.plan, wplan, jobs=wplan.jobs,
                             hip_view=built.hip_view, selected_units=units,
                             total_units=kset.total_units or units, notes=list(built.plan.notes),
                             refusal=built.refusal or stop, ops=built.ops, compiled=built.compiled,
                             wave64=lanes.to_dict() if lanes else None, shard=built.shard)


def wave64_step(driver: WheelDriver, info: SourceInfo, plan: BuildPlan, request: WheelRequest, patched: Patched,
                log: Logger, ops: Sequence[OpSpec] = ()) -> tuple[wave64.Wave64 | None, CheckFailed | None]:
    """A 64-lane wheel build's wave-64 step on the source (each file as porter's ``patched`` copy has it):
    the device sources the driver names (:class:`DeviceSources`), else those of the device ``ops`` it compiles;
    None: another target, or no device op. A driver that assessed its code itself (:class:`Assessed`) has its own.
    With the stop a refused finding makes (raised in a real run)."""
    if request.toolchain.wavefront != 64:
        return None, None
    if isinstance(driver, Assessed):
        lanes = driver.lanes
    else:
        device = driver.device_sources(info, plan, request) if isinstance(driver, DeviceSources) else {
            o.name: (o.sources, o.include_paths) for o in ops if o.device}
        by = "; ".join(a.split(":")[0] for a in patched.applied)
        lanes = wave64.gate(driver.name, info.tree, patched.after, by, device, request.allow_wave32, log) \
            if device else None
    return lanes, lanes.error(f"{info.project} {info.version} for {request.toolchain.name}", LEAVE) if lanes else None


def _kernel_set(driver: WheelDriver, info: SourceInfo, request: WheelRequest, ctx: KernelContext,
                log: Logger) -> KernelSet:
    """The driver's translation units; none at all is an error (no op could be planned, or none is selected)."""
    with log.step(f"reading the translation units of {info.project} {info.version} from the tree"):
        kset = driver.kernel_ops(info, request, ctx)
    if not kset.ops:
        if kset.unplanned:
            raise ConfigError(f"{info.project} {info.version}: no selected op can be planned: "
                              + "; ".join(why for _, why in kset.unplanned),
                              hint="name the ops' sources in a patch set, or pick other ops with --ops")
        raise NothingToDo(f"nothing to compile: no translation unit of {info.project} {info.version} is selected",
                          hint="widen --units / --instances, or drop them")
    for name, why in kset.unplanned:
        log.warn(f"{name}: not planned: {why}")
    return kset


def _record_costs(result: CompileOnlyResult, project: str, request: WheelRequest, costs_root: Path | None,
                  log: Logger) -> None:
    """Each compiled unit's time and peak memory, kept for later MAX_JOBS choices (not when upstream's flags were
    changed)."""
    tc = request.toolchain
    # a unit's name in the costs file: the op, and the source's file name when the op has several TUs
    measured = [(rec["name"] if len(rec["tus"]) == 1 else f"{rec['name']}/{Path(tu['source']).name}",
                 float(tu["seconds"]), int(tu["peak_rss_mib"] * 1024))
                for rec in result.compiled for tu in rec["tus"]
                if tu.get("returncode") == 0 and "peak_rss_mib" in tu and rec["status"] != "failed"]
    if request.drop_flags:  # not upstream's compile: its times and memory must not size a real build's jobs
        log.info("compile costs not recorded: upstream's flags were changed "
                 f"(--drop-flag {' '.join(request.drop_flags)})")
        measured = []
    path = costs_mod.record(project, result.version, tc, measured, costs_root)
    if path is not None:
        result.costs = str(path)
        if (after := costs_mod.load(project, result.version, tc, costs_root)) is not None:
            result.measured = after.to_dict()
            log.info(f"measured compile costs: {after.describe()}")


__all__ = ["CompileOnlyResult", "KernelContext", "compile_only"]
