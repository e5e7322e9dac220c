"""``porter port megatron-deepspeed``: one command from an upstream tree to a ROCm-ready tree.

Steps, in order: check everything (tree, output, toolchain root, the build python's torch), copy
the tree beside OUT (unless in place), hipify the fused kernels (ROCm profiles), apply the
``megatron-deepspeed/rocm`` patch set (:mod:`porter.patching`: text edits only), build the fused
kernels on the one build flow (:class:`KernelBuild`: the AOT engine, with the compiler checked first) and
package one wheel (``megatron-fused-kernels``, top-level modules as Megatron imports them) with its manifest; then OUT
appears by one rename. A torch of another kind than the profile's is refused before any work (a dry
run prints the plan and the refusal); ``--no-kernels`` ports the tree without building the kernels.

The same wheel carries Megatron's dataset index helpers (``megatron/data/helpers.cpp``, a host-only
pybind11 module that upstream builds with ``make`` at start-up) as ``megatron_fused_kernels.helpers``;
a cpu profile builds only those. Each patch reports its own state (applied, not needed here, already
applied, skipped by ``--skip``, failed): a fork without a patch's problem is not a failed port.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from porter.artifacts import labels
from porter.artifacts.labels import with_label
from porter.artifacts.manifest import ExtensionEntry, publish
from porter.artifacts.wheelfile import Payload, WheelSpec, write_wheel
from porter.components.megatron import (DIST, HELPERS_FLAGS, HELPERS_MODULE, HELPERS_SOURCE, KERNEL_DIR,
                                        PACKAGE_INFO, PATCH_PROJECT, is_tree, kernels)
from porter.errors import CheckFailed, ConfigError
from porter.hipify import wave64
from porter.hipify.engine import HipifyReport, group_findings, hipify_tree
from porter.hipify.scan import Finding
from porter.executor import build_python
from porter.fs import ensure_writable_dir
from porter.log import Logger, quiet_logger
from porter.patching.engine import Plan as PatchPlan
from porter.run import Runner
from porter.toolchain.check import ready
from porter.toolchain.profile import Toolchain
from porter.torch_facts import TorchInfo, build_torch, need_for
from porter.wheels.base import (BuildPlan, Expectation, KernelContext, KernelSet, Machine, SourceInfo, WheelRequest,
                                choose_jobs, per_job)
from porter.wheels.compile import CompileOnlyResult, compile_only
from ops_prebuild.build import OpResult, failures
from ops_prebuild.catalogue import OpSpec
from ops_prebuild.source import git_commit

from porter.port import Patches, PortResult, destination, patch_sets, staged

HELPERS_OP = "helpers"


def prebuilt_ops(tc: Toolchain, tree: Path) -> list[OpSpec]:
    """What the wheel carries for this profile and tree, as ops_prebuild OpSpecs: the fused kernels of the tree's
    generation (GPU profiles; :func:`porter.components.megatron.kernels`) as top-level modules, with the device flags
    Megatron's own loader passes for the profile's kind, and the dataset helpers (every profile, when the tree has
    ``megatron/data/helpers.cpp``).

    No -std for the kernels: the planner adds the C++ standard the build torch's headers need. The helpers are
    host-only: the profile's host compiler with torch's bundled pybind11 headers. The planner links every op against
    torch's libraries, which re-export some libstdc++ symbols: ``-Wl,--as-needed -lstdc++`` first makes the helpers
    depend on libstdc++ alone, so they import without torch."""
    includes: tuple[str, ...] = (KERNEL_DIR,)
    if tc.kind == "cuda" and tc.root:  # the .cpp halves include cuda_fp16.h, compiled by the host compiler
        includes += (f"{tc.root}/include",)
    gencode = tuple(f"-gencode=arch=compute_{t.name[3:]},code={t.name}" for t in tc.targets)
    ops = [OpSpec(name=k.module, builder="megatron.fused_kernels", module=k.module,
                  sources=tuple(f"{KERNEL_DIR}/{f}" for f in k.sources), include_paths=includes, device=True,
                  cxx_args=("-O3",), nvcc_args=k.rocm_flags if tc.hip else (*k.cuda_flags, *gencode))
           for k in kernels(tree)] if tc.gpu else []
    if (tree / HELPERS_SOURCE).is_file():
        ops.append(OpSpec(name=HELPERS_OP, builder="megatron.data", module=HELPERS_MODULE, sources=(HELPERS_SOURCE,),
                          cxx_args=HELPERS_FLAGS, extra_ldflags=("-Wl,--as-needed", "-lstdc++")))
    return ops


def _version_notes(tree: Path, plan: PatchPlan) -> list[str]:
    notes = [n for sp in plan.sets for n in sp.notes]
    if not (tree / PACKAGE_INFO).is_file():  # said once, naming the file a fork lacks (not the kernels folder)
        notes = [n for n in notes if not n.startswith(f"no {PATCH_PROJECT} version found")]
        notes.insert(0, f"the tree has no {PACKAGE_INFO}, so its Megatron version is unknown: each patch decides "
                        "by the problem it fixes (needed_if) whether it is needed, and the wheel is versioned 0")
    return list(dict.fromkeys(notes))


def port_megatron(tree: str | os.PathLike[str], tc: Toolchain, *, out: str | os.PathLike[str] | None = None,
                  in_place: bool = False, wheelhouse: str | os.PathLike[str] | None = None, python: str | None = None,
                  jobs: int | None = None, kernels: bool = True, compile_only: bool = False, log: Logger | None = None,
                  target_version: str | None = None, sets: Sequence[str] = (), skip: Sequence[str] = (),
                  runner: Runner | None = None, allow_wave32: Sequence[str] = ()) -> PortResult:
    """Port the tree (hipify, patch), then build its kernels. For a 64-lane target every warp-size-32 finding in a
    kernel gets a state (:mod:`porter.hipify.wave64`); a refused one stops the port before any compile, unless its
    kernel is in ``allow_wave32`` (or that holds ``all``). A recording ``runner`` is a dry run: the port is checked
    and planned, nothing is written."""
    log = log or quiet_logger()
    runner = runner or Runner(log)
    # the tree (resolved), what the profile can build of it, and options that contradict each other: ConfigErrors
    src = Path(tree)
    if not src.is_dir():
        raise ConfigError(f"tree not found: {src}", hint="pass the top folder of a Megatron-DeepSpeed checkout")
    src = src.resolve()
    if not is_tree(src):
        raise ConfigError(f"{src} is not a Megatron-DeepSpeed tree: no {KERNEL_DIR}/__init__.py beside the masked "
                          "and upper-triangular scaled softmax kernels (what both generations of Megatron-DeepSpeed "
                          "have)", hint="pass the top folder of a Megatron-DeepSpeed checkout")
    if not tc.gpu and kernels and not (src / HELPERS_SOURCE).is_file():
        raise ConfigError(f"toolchain {tc.name} is a {tc.kind} profile; the fused kernels are GPU code and {src} "
                          f"has no {HELPERS_SOURCE} (the host-only part a {tc.kind} profile builds)",
                          hint="pass a rocm profile (frontier, lumi-g, mi300x, debian-rocm, ...) or a cuda one, "
                               "or --no-kernels to port the tree only")
    if compile_only and tc.kind not in ("rocm", "cuda"):
        raise ConfigError(f"--compile-only compiles GPU code for every arch; {tc.name} is a {tc.kind} profile",
                          hint="pass a rocm or cuda profile, or drop --compile-only")
    if compile_only and not kernels:
        raise ConfigError("--compile-only compiles the kernels; --no-kernels skips them", hint="drop one of them")
    dest = destination(src, Path(out) if out is not None else None, in_place, tc.name)  # TREE-<profile> by default
    patches = patch_sets(sets, skip, project=PATCH_PROJECT, target_version=target_version)
    py_ex, build_py = build_python(tc.executor, tc.python, python)
    torch_info: TorchInfo | None = None
    if kernels and not runner.dry and not compile_only:
        if wheelhouse is None:
            raise ConfigError("building the fused kernels needs --wheelhouse DIR",
                              hint="pass --wheelhouse ./wheelhouse, or --no-kernels to port the tree only")
        ensure_writable_dir(Path(wheelhouse), what="wheelhouse")
    result = PortResult(src, dest, tc.name, "", kernels=kernels, compile_only=compile_only)
    if kernels:  # the torch rule first (bad input, exit 2), the patches, then the toolchain's root (its compiler:
        # when the kernels build)
        torch_info, result.refusal = build_torch(build_py, py_ex, runner,
                                                 need=None if compile_only else need_for(tc.kind),
                                                 what=f"building Megatron's fused kernels for {tc.name}")
    patches.take(src, result, notes=functools.partial(_version_notes, src))  # before any compile or copy
    if kernels:
        result.refusal = result.refusal or ready(tc, runner, log, compiler=False)[1]
    if runner.dry:
        if torch_info is not None:
            result.plan = KernelBuild(result.version, src, compile_only=compile_only).build(
                src, tc, torch_info, runner, log, python=python, jobs=jobs).plan
        return result
    if result.refusal is not None:
        raise result.refusal
    with staged(src, dest, in_place, log) as work:
        return _port_into(work, result, tc, patches, torch_info, wheelhouse, jobs, log, runner, python=python,
                          allow=allow_wave32)


def _port_into(work: Path, result: PortResult, tc: Toolchain, patches: Patches, torch_info: TorchInfo | None,
               wheelhouse: str | os.PathLike[str] | None, jobs: int | None, log: Logger, runner: Runner, *,
               python: str | None = None, allow: Sequence[str] = ()) -> PortResult:
    src, compile_only = result.source, result.compile_only
    report = None
    if tc.hip:
        with log.step(f"hipifying {KERNEL_DIR}"):
            report = hipify_tree(work / KERNEL_DIR, in_place=True, log=log, use_cache=False)
        result.hipified = [f"{KERNEL_DIR}/{f.path}" for f in report.written]
    done = patches.take(work, result, log, functools.partial(_version_notes, src))
    fixed = _report_findings(work, report, done, result, log, assessed=torch_info is not None and
                             tc.wavefront == 64) if report is not None else {}
    if torch_info is None:
        return result
    lanes = _wave64(work, tc, report, fixed, allow) if report is not None and tc.wavefront == 64 else None
    if lanes is not None:
        result.wave64 = lanes.to_dict()
        lanes.say(log, "the kernels")
        stop = lanes.error(f"the fused kernels of {src.name} for {tc.name}",
                           leave="apply the shipped patches that fix such code (no --skip of them)")
        if stop is not None:
            raise stop
    built = KernelBuild(result.version, src, compile_only=compile_only, lanes=lanes).build(
        work, tc, torch_info, runner, log, python=python, jobs=jobs)
    result.plan, ops, failed = built.plan, built.ops, built.failed
    result.built = [o.__dict__ for o in ops]
    if compile_only:
        result.compiled = built.compiled
        if len(failed) == len(ops):
            raise CheckFailed("no fused kernel compiled " + failures(failed, f"the tree {src}", tc),
                              hint="fix the first error of each kernel (its file and line are named) in the tree, "
                                   "or report it with the tree's commit")
        return result
    if failed:
        raise CheckFailed(f"fused kernel(s) failed to build: {', '.join(o.name for o in failed)}; "
                          "no wheel was written and the output folder was left as it was",
                          hint=f"read the logs: {', '.join(o.log for o in failed)}")
    assert wheelhouse is not None
    with log.step("packaging the fused kernels"):
        result.wheel, result.manifest = package_kernels(
            ops, tc, torch_info, result.version, Path(wheelhouse), source=str(src),
            specs={o.name: o for o in prebuilt_ops(tc, work)}, patches=done.records(), wave64=result.wave64)
    return result


def _report_findings(work: Path, report: HipifyReport, plan: PatchPlan, result: PortResult,
                     log: Logger, *, assessed: bool = False) -> dict[Finding, str]:
    """hipify's findings, each with its state once the patches are applied: a warp-size-32 assumption that a shipped
    patch removed is *fixed* by it (the kernel folder is scanned again, when a patch edited a file with one); the
    rest are to review, or, when the kernels are built for a 64-lane target (``assessed``), get their state from
    :func:`_wave64`. Returns the fixed ones, with the patch."""
    by_file = {r.file: f"{r.set}:{r.patch}" for sp in plan.sets for r in sp.results if r.status == "applied" and r.file}
    fixed: dict[str, list[Finding]] = {}
    if any(f"{KERNEL_DIR}/{f.path}" in by_file for f in report.warp32):
        after = hipify_tree(work / KERNEL_DIR, in_place=True, check=True, log=quiet_logger(), use_cache=False)
        left = {(f.path, f.identifier) for f in after.warp32}
        for f in report.warp32:
            patch = by_file.get(f"{KERNEL_DIR}/{f.path}")
            if patch is not None and (f.path, f.identifier) not in left:
                fixed.setdefault(patch, []).append(f)
    by_finding = {f: patch for patch, fs in fixed.items() for f in fs}
    for patch, fs in fixed.items():
        files = ", ".join(sorted({f"{KERNEL_DIR}/{f.path}" for f in fs}))
        log.info(f"hipify: {files}: {len(fs)} warp-size-32 assumption(s) fixed by porter's patch {patch}")
    groups = group_findings(report.unsupported, [f for f in report.warp32 if f not in by_finding], report.verdicts)
    result.hipify_groups = [{**g.to_dict(), "name": f"{KERNEL_DIR}/{g.name}"} for g in groups]
    result.hipify_groups += [{"name": f"{KERNEL_DIR}/{f.path}", "state": "fixed", "by": patch, **f.to_dict()}
                             for patch, fs in fixed.items() for f in fs]
    for g in groups:  # one line per group, not one per finding
        if assessed and not g.unsupported:
            continue
        counts = [f"{len(g.unsupported)} CUDA API use(s) without a HIP equivalent"] if g.unsupported else []
        counts += [f"{len(g.warp32)} warp-size-32 assumption(s)"] if g.warp32 and not assessed else []
        log.warn(f"hipify: {KERNEL_DIR}/{g.name}: {', '.join(counts)}: {g.verdict} "
                 f"(porter hipify {KERNEL_DIR} --json lists each)")
    return by_finding


def _wave64(work: Path, tc: Toolchain, report: HipifyReport, fixed: Mapping[Finding, str],
            allow: Sequence[str]) -> wave64.Wave64:
    """The state of each warp-size-32 finding in the kernels a 64-lane build compiles (paths from the tree's root)."""
    def rooted(f: Finding) -> Finding:
        return dataclasses.replace(f, path=f"{KERNEL_DIR}/{f.path}")

    ops = {o.name: (o.sources, o.include_paths) for o in prebuilt_ops(tc, work) if o.device}
    return wave64.judge(PATCH_PROJECT, work, [rooted(f) for f in report.warp32],
                        {rooted(f): by for f, by in fixed.items()}, ops, allow)


PER_JOB = 6 << 30
"""Memory per compile job of a fused kernel, until a compile-only port has measured it."""


class KernelBuild:
    """(WheelDriver, Assessed) The port's kernels on the one build flow (:func:`porter.wheels.compile.compile_only`):
    the fused kernels and the dataset helpers of the ported tree, compiled and linked by the AOT engine in a build
    folder of porter's cache keyed to the source tree, where the toolchain's compiler sees them. The port hipified
    and patched the tree and assessed it for a 64-lane target (:func:`_wave64`, which knows the findings porter's
    patches fixed) before; there is no setup.py: the wheel is porter's own (:func:`package_kernels`)."""

    name = PATCH_PROJECT
    title = "Megatron-DeepSpeed"
    sdist_env: Mapping[str, str] = {}

    def __init__(self, version: str, origin: Path, *, compile_only: bool = False,
                 lanes: wave64.Wave64 | None = None) -> None:
        self.version, self.origin, self.compile_only, self.lanes = version or "0", origin, compile_only, lanes

    def detect(self, root: Path) -> SourceInfo:
        return SourceInfo(PATCH_PROJECT, self.version, root, str(self.origin))

    def plan(self, info: SourceInfo, request: WheelRequest, machine: Machine) -> BuildPlan:
        """The jobs: as many as cores and memory allow, each sized from what compile-only ports measured (else a
        guess), unless asked."""
        size, how, note = per_job(PER_JOB, request)
        return BuildPlan(project=info.project, version=info.version, regime="aot", backend=None,
                         label=labels.make(request.toolchain), pip_args=(), env={}, needs_torch=None,
                         jobs=choose_jobs(size, machine, request.jobs), per_job_bytes=size, per_job_source=how,
                         notes=(note,) if note else (), expect=Expectation(), setup_py=False)

    def kernel_ops(self, info: SourceInfo, request: WheelRequest, ctx: KernelContext) -> KernelSet:
        """What the wheel carries (:func:`prebuilt_ops`; a compile-only run: the GPU code alone), HIP already."""
        ops = [o for o in prebuilt_ops(request.toolchain, ctx.source) if o.device or not self.compile_only]
        for rel in sorted({KERNEL_DIR if o.device else HELPERS_SOURCE for o in ops}):
            ctx.copy(rel)
        return KernelSet(ops=tuple(ops), torch_view=True)

    def build(self, tree: Path, tc: Toolchain, torch_info: TorchInfo, runner: Runner, log: Logger, *,
              python: str | None, jobs: int | None) -> CompileOnlyResult:
        """The kernels of ``tree`` (the ported copy, or in a dry run the source) built, or planned."""
        request = WheelRequest(source=tree, toolchain=tc, output=tree, python=python, jobs=jobs)
        return compile_only(self, str(self.origin), request, runner=runner, log=log, torch_info=torch_info,
                            link=not self.compile_only, found=(tree, self.detect(tree)))


_PACKAGE_INIT = b'"""Modules prebuilt by porter for Megatron-DeepSpeed (the dataset index helpers)."""\n'


def package_kernels(ops: list[OpResult], tc: Toolchain, torch_info: TorchInfo, version: str, wheelhouse: Path, *,
                    source: str, specs: Mapping[str, OpSpec] | None = None,
                    patches: Sequence[dict[str, Any]] | None = None,
                    wave64: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """One wheel with the fused kernels (top-level modules, as Megatron imports them) and the dataset helpers
    (``megatron_fused_kernels.helpers``, host-only), and its porter manifest beside it. ``patches``: those the port
    applied (:meth:`porter.patching.engine.Plan.records`; None: not known, and the manifest says so)."""
    full_version = with_label(version or "0", labels.make(tc))
    entries: list[ExtensionEntry] = []
    files: dict[str, Payload] = {}
    for o in ops:
        spec = (specs or {}).get(o.name)
        module = spec.module if spec is not None else o.name
        arc = "/".join([*module.split(".")[:-1], Path(o.so).name])
        files[arc] = Path(o.so)
        entry: ExtensionEntry = {"module": module, "path": arc, "sha256": o.sha256, "op": o.name,
                                 "archs": list(tc.arch_names) if spec is None or spec.device else []}
        if spec is not None and not spec.device:
            entry["host_only"] = True
            if package := "/".join(module.split(".")[:-1]):
                files[f"{package}/__init__.py"] = _PACKAGE_INIT
        entries.append(entry)
    sources: dict[str, Any] = {"origin": source, "version": version}
    if commit := git_commit(Path(source)):
        sources["git_commit"] = commit
    if patches is not None:
        sources["patches"] = list(patches)
    dest, mpath, _ = publish(
        wheelhouse, lambda tmp, data: write_wheel(tmp, WheelSpec(DIST, full_version, torch_info.wheel_tag),
                                                  {**files, "{dist_info}/porter.json": data},
                                                  summary="Megatron-DeepSpeed fused softmax kernels, prebuilt by porter"),
        extra={"wave64": wave64} if wave64 else None,
        component="megatron-deepspeed", version=full_version, tc=tc, torch=torch_info,
        python_tag=torch_info.python_tag, sources=sources, extensions=entries,
        ops=[{"name": o.name, "status": o.status, "seconds": round(o.seconds, 2), "log": o.log} for o in ops])
    return dest, mpath
