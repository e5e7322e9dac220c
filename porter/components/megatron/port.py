"""``porter port megatron-deepspeed``: one command from an upstream tree to a ROCm-ready tree.

Steps, in order: check everything (tree, output, toolchain root, the build python's torch), copy
the tree beside OUT (unless in place), hipify the fused kernels (ROCm profiles), apply the
``megatron-deepspeed/rocm`` patch set (:mod:`porter.patching`: text edits only), plan the fused
kernels as one catalogue on the AOT engine (:mod:`ops_prebuild`), compile them and package one wheel
(``megatron-fused-kernels``, top-level modules as Megatron imports them) with its manifest; then OUT
appears by one rename. A torch of another kind than the profile's is refused before any work (a dry
run prints the plan and the refusal); ``--no-kernels`` ports the tree without building the kernels.

The same wheel carries Megatron's dataset index helpers (``megatron/data/helpers.cpp``, a host-only
pybind11 module that upstream builds with ``make`` at start-up) as ``megatron_fused_kernels.helpers``;
a cpu profile builds only those. Each patch reports its own state (applied, not needed here, already
applied, skipped by ``--skip``, failed): a fork without a patch's problem is not a failed port.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from porter import __version__
from porter.artifacts import labels
from porter.artifacts.labels import with_label
from porter.artifacts.manifest import ExtensionEntry, publish
from porter.artifacts.wheelfile import Payload, WheelSpec, write_wheel
from porter.components.megatron import (DIST, HELPERS_MODULE, HELPERS_SOURCE, KERNEL_DIR, PACKAGE_INFO,
                                        PATCH_PROJECT, is_tree, kernels)
from porter import faults
from porter import torch_hip_view as hip_view
from porter.errors import CheckFailed, ConfigError, PorterError
from porter.hipify import wave64
from porter.hipify.engine import HipifyReport
from porter.hipify.scan import Finding
from porter.executor import HOST, Executor, build_python
from porter.fs import atomic_write_json, cache_dir, ensure_writable_dir, files_digest, owned_temp_dir, publish_dir
from porter.locks import hold
from porter.log import Logger, quiet_logger
from porter.patching import apply
from porter.patching.model import PatchSet
from porter.patching.engine import Plan as PatchPlan
from porter.run import Runner
from porter.toolchain.check import ready
from porter.toolchain.profile import Toolchain
from porter.torch_facts import TorchInfo, build_torch, need_for
from ops_prebuild.build import EngineRun, OpResult, compile_catalogue, failures
from ops_prebuild.catalogue import Catalogue, OpSpec
from ops_prebuild.plan import Plan, make_plan
from ops_prebuild.source import Source, git_commit

from porter.port import PORT_RECORD, PortResult, check_patches, destination, patch_sets, summarize
HELPERS_OP = "helpers"


def check_tree(tree: Path) -> Path:
    if not tree.is_dir():
        raise ConfigError(f"tree not found: {tree}", hint="pass the top folder of a Megatron-DeepSpeed checkout")
    tree = tree.resolve()
    if not is_tree(tree):
        raise ConfigError(f"{tree} is not a Megatron-DeepSpeed tree: no {KERNEL_DIR}/__init__.py beside the masked "
                          "and upper-triangular scaled softmax kernels (what both generations of Megatron-DeepSpeed "
                          "have)", hint="pass the top folder of a Megatron-DeepSpeed checkout")
    return tree


def output_dir(tree: Path, out: Path | None, in_place: bool, toolchain: Toolchain) -> Path:
    """Where the ported tree goes: TREE itself (in place), or OUT (default TREE-<profile>), checked."""
    return destination(check_tree(tree), out, in_place, toolchain.name)


def prepare_tree(tree: Path, out: Path | None, in_place: bool, toolchain: Toolchain) -> Path:
    """Copy TREE to OUT (atomically) and return it; in place: TREE. A re-run reuses its own port."""
    dest = output_dir(tree, out, in_place, toolchain)
    if in_place or dest.exists():
        return dest
    ensure_writable_dir(dest.parent, what="parent folder of the ported tree", create=True)
    tmp = owned_temp_dir(dest.parent, f".{dest.name}.")
    try:
        shutil.copytree(tree.resolve(), tmp / "t", symlinks=True)
        atomic_write_json(tmp / "t" / PORT_RECORD, {"source": str(tree.resolve()), "porter_version": __version__})
        os.replace(tmp / "t", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def kernel_ops(tc: Toolchain, tree: Path) -> list[OpSpec]:
    """The tree's fused kernels (its generation's: :func:`porter.components.megatron.kernels`) as ops_prebuild
    OpSpecs (top-level modules), with the device flags Megatron's own loader passes for the profile's kind.

    No -std here: the planner adds the C++ standard the build torch's headers need.
    """
    includes: tuple[str, ...] = (KERNEL_DIR,)
    if tc.kind == "cuda" and tc.root:  # the .cpp halves include cuda_fp16.h, compiled by the host compiler
        includes += (f"{tc.root}/include",)
    gencode = tuple(f"-gencode=arch=compute_{t.name[3:]},code={t.name}" for t in tc.targets)
    return [OpSpec(name=k.module, builder="megatron.fused_kernels", build_var="", module=k.module,
                   sources=tuple(f"{KERNEL_DIR}/{f}" for f in k.sources), include_paths=includes,
                   device=True, compatible=True, cxx_args=("-O3",),
                   nvcc_args=k.rocm_flags if tc.hip else (*k.cuda_flags, *gencode))
            for k in kernels(tree)]


def helpers_op(tc: Toolchain) -> OpSpec:
    """Megatron's dataset helpers as a host-only OpSpec: the profile's host compiler with torch's bundled pybind11
    headers. The planner links every op against torch's libraries, which re-export some libstdc++ symbols:
    ``-Wl,--as-needed -lstdc++`` first makes the module depend on libstdc++ alone, so it imports without torch."""
    from porter.components.megatron import HELPERS_FLAGS

    return OpSpec(name=HELPERS_OP, builder="megatron.data", build_var="", module=HELPERS_MODULE,
                  sources=(HELPERS_SOURCE,), include_paths=(), device=False, compatible=True, cxx_args=HELPERS_FLAGS,
                  extra_ldflags=("-Wl,--as-needed", "-lstdc++"))


def prebuilt_ops(tc: Toolchain, tree: Path) -> list[OpSpec]:
    """What the wheel carries for this profile and tree: the fused kernels (GPU profiles) and the dataset
    helpers (every profile, when the tree has ``megatron/data/helpers.cpp``)."""
    ops = kernel_ops(tc, tree) if tc.gpu else []
    if (tree / HELPERS_SOURCE).is_file():
        ops.append(helpers_op(tc))
    return ops


def _version_notes(tree: Path, plan: PatchPlan) -> list[str]:
    notes = [n for sp in plan.sets for n in sp.notes]
    if not (tree / PACKAGE_INFO).is_file():  # said once, naming the file a fork lacks (not the kernels folder)
        notes = [n for n in notes if not n.startswith(f"no {PATCH_PROJECT} version found")]
        notes.insert(0, f"the tree has no {PACKAGE_INFO}, so its Megatron version is unknown: each patch decides "
                        "by the problem it fixes (needed_if) whether it is needed, and the wheel is versioned 0")
    return list(dict.fromkeys(notes))


def port_megatron(tree: str | os.PathLike[str], tc: Toolchain, *, out: str | os.PathLike[str] | None = None,
                  in_place: bool = False, wheelhouse: str | os.PathLike[str] | None = None,
                  python: str | None = None, jobs: int | None = None,
                  kernels: bool = True, compile_only: bool = False, target_version: str | None = None,
                  sets: Sequence[str] = (), skip: Sequence[str] = (),
                  log: Logger | None = None, runner: Runner | None = None,
                  allow_wave32: Sequence[str] = ()) -> PortResult:
    """Port the tree (hipify, patch), then build its kernels. For a 64-lane target every warp-size-32 finding in a
    kernel gets a state (:mod:`porter.hipify.wave64`); a refused one stops the port before any compile, unless its
    kernel is in ``allow_wave32`` (or that holds ``all``). A recording ``runner`` is a dry run: the port is checked
    and planned, nothing is written."""
    log = log or quiet_logger()
    runner = runner or Runner(log)
    dry_run = runner.dry
    src = check_tree(Path(tree))
    _check_request(src, tc, kernels=kernels, compile_only=compile_only)
    dest = output_dir(src, Path(out) if out is not None else None, in_place, tc)
    psets, skipped = patch_sets(sets, skip, project=PATCH_PROJECT)
    ex = tc.executor
    py_ex, python = build_python(ex, tc.python, python)
    torch_info: TorchInfo | None = None
    refused: PorterError | None = None
    if kernels and not dry_run and not compile_only:
        if wheelhouse is None:
            raise ConfigError("building the fused kernels needs --wheelhouse DIR",
                              hint="pass --wheelhouse ./wheelhouse, or --no-kernels to port the tree only")
        ensure_writable_dir(Path(wheelhouse), what="wheelhouse")
    if not dry_run and not in_place:
        ensure_writable_dir(dest.parent, what="parent folder of the ported tree", option="--dest", create=True)
    if kernels:  # the torch rule first (bad input, exit 2), the patches, then the toolchain's readiness
        torch_info, refused = build_torch(python, py_ex, runner, need=None if compile_only else need_for(tc.kind),
                                          what=f"building Megatron's fused kernels for {tc.name}")
        if not dry_run:
            check_patches(src, psets, skipped, target_version, dest)  # fail before any compile or copy
        refused = refused or ready(tc, runner, log, compiler=tc.kind in ("rocm", "cuda"))[1]
    if dry_run:
        pp = check_patches(src, psets, skipped, target_version, dest)  # checked against the tree; nothing written
        result = PortResult(src, dest, tc.name, pp.sets[0].version, patched=[c.path for c in pp.changes],
                            patch_results=[r.to_dict() for sp in pp.sets for r in sp.results], kernels=kernels,
                            refusal=refused, compile_only=compile_only, sets=[ps.ref for ps in psets],
                            patches=summarize(pp, skipped), notes=_version_notes(src, pp))
        if torch_info is not None:
            with log.step("planning the fused kernels"):
                view = _view(tc, torch_info) if compile_only else ()
                result.plan = _plan(dest, tc, torch_info, result.version, stage=False, compile_only=compile_only, read=src,
                                    extra_includes=view, name=dest.name)
        return result
    if refused is not None:
        raise refused
    if in_place:
        work = dest
        return _port_into(work, src, dest, tc, psets, skipped, torch_info, wheelhouse, jobs, target_version, log,
                          runner, compile_only=compile_only, python=python, py_ex=py_ex, allow=allow_wave32)
    with log.step("copying the tree"):
        staging = owned_temp_dir(dest.parent, f".{dest.name}.")
    try:
        work = staging / "t"
        shutil.copytree(dest if dest.exists() else src, work, symlinks=True)
        atomic_write_json(work / PORT_RECORD, {"source": str(src), "porter_version": __version__})
        result = _port_into(work, src, dest, tc, psets, skipped, torch_info, wheelhouse, jobs, target_version, log,
                            runner, compile_only=compile_only, python=python, py_ex=py_ex, allow=allow_wave32)
        faults.reached("port")
        publish_dir(work, dest)  # a re-run: the earlier port is swapped out in one step, then removed
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def _check_request(src: Path, tc: Toolchain, *, kernels: bool, compile_only: bool) -> None:
    """What the profile can build of this tree, and options that contradict each other: ConfigErrors."""
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


def _port_into(work: Path, src: Path, dest: Path, tc: Toolchain, psets: list[PatchSet],
               skipped: Mapping[str, Sequence[str]], torch_info: TorchInfo | None,
               wheelhouse: str | os.PathLike[str] | None, jobs: int | None, target_version: str | None,
               log: Logger, runner: Runner, *, compile_only: bool = False, python: str = "",
               py_ex: Executor = HOST, allow: Sequence[str] = ()) -> PortResult:
    result = PortResult(src, dest, tc.name, "", kernels=torch_info is not None, compile_only=compile_only,
                        sets=[ps.ref for ps in psets])
    report = None
    if tc.hip:
        from porter.hipify import engine as hip

        with log.step(f"hipifying {KERNEL_DIR}"):
            report = hip.hipify_tree(work / KERNEL_DIR, in_place=True, log=log, use_cache=False)
        result.hipified = [f"{KERNEL_DIR}/{f.path}" for f in report.written]
    refs = ", ".join(ps.ref for ps in psets)
    with log.step(f"applying {refs}" + (f" (skipping {', '.join(p for v in skipped.values() for p in v)})"
                                        if skipped else "")):
        check_patches(work, psets, skipped, target_version, dest)
        done = apply(work, psets, target_version=target_version)
    result.version = done.plan.sets[0].version
    result.patched = list(done.changed)
    result.patch_results = [r.to_dict() for sp in done.plan.sets for r in sp.results]
    result.patches = summarize(done.plan, skipped)
    result.notes = _version_notes(src, done.plan)
    fixed = _report_findings(work, report, done.plan, result, log, assessed=torch_info is not None and
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
    cat, build_dir = _catalogue(work, tc, torch_info, result.version, stage=True, compile_only=compile_only,
                                name=dest.name)
    from porter.resources import default_jobs

    built = compile_catalogue(cat, tc, list(cat.ops), build_dir, python=python, py_ex=py_ex, runner=runner, log=log,
                              cache=tc.executor.work_dir(cache_dir()),
                              how=EngineRun(jobs=jobs or default_jobs(6 << 30), compile_only=compile_only),
                              hipify=(), torch_view=True,
                              what=f"building the fused kernels of {src.name} for {tc.name}")
    result.plan, ops = built.plan, built.ops
    result.plan.notes.extend(lanes.allowed_notes() if lanes is not None else [])
    result.built = [o.__dict__ for o in ops]
    failed = [o for o in ops if o.status == "failed"]
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
        result.wheel, result.manifest = package_kernels(ops, tc, torch_info, result.version, Path(wheelhouse),
                                                        source=str(src), specs=plan_specs(work, tc),
                                                        patches=done.plan.records(), wave64=result.wave64)
    return result


def _report_findings(work: Path, report: HipifyReport, plan: PatchPlan, result: PortResult,
                     log: Logger, *, assessed: bool = False) -> dict[Finding, str]:
    """hipify's findings, each with its state once the patches are applied: a warp-size-32 assumption that a shipped
    patch removed is *fixed* by it (the kernel folder is scanned again, when a patch edited a file with one); the
    rest are to review, or, when the kernels are built for a 64-lane target (``assessed``), get their state from
    :func:`_wave64`. Returns the fixed ones, with the patch."""
    from porter.hipify import engine as hip

    by_file = {r.file: f"{r.set}:{r.patch}" for sp in plan.sets for r in sp.results if r.status == "applied" and r.file}
    fixed: dict[str, list[Finding]] = {}
    if any(f"{KERNEL_DIR}/{f.path}" in by_file for f in report.warp32):
        after = hip.hipify_tree(work / KERNEL_DIR, in_place=True, check=True, log=quiet_logger(), use_cache=False)
        left = {(f.path, f.identifier) for f in after.warp32}
        for f in report.warp32:
            patch = by_file.get(f"{KERNEL_DIR}/{f.path}")
            if patch is not None and (f.path, f.identifier) not in left:
                fixed.setdefault(patch, []).append(f)
    gone = {(f.path, f.line, f.identifier) for fs in fixed.values() for f in fs}
    for patch, fs in fixed.items():
        files = ", ".join(sorted({f"{KERNEL_DIR}/{f.path}" for f in fs}))
        log.info(f"hipify: {files}: {len(fs)} warp-size-32 assumption(s) fixed by porter's patch {patch}")
    groups = hip.group_findings(report.unsupported, [f for f in report.warp32 if (f.path, f.line, f.identifier)
                                                      not in gone], report.verdicts)
    result.hipify_groups = [{**g.to_dict(), "name": f"{KERNEL_DIR}/{g.name}"} for g in groups]
    result.hipify_groups += [{"name": f"{KERNEL_DIR}/{f.path}", "state": "fixed", "by": patch, **f.to_dict()}
                             for patch, fs in fixed.items() for f in fs]
    for g in groups:  # one line per group, not one per finding
        if assessed and not g.unsupported:
            continue
        counts = ", ".join(c for c in (f"{len(g.unsupported)} CUDA API use(s) without a HIP equivalent"
                                       if g.unsupported else "",
                                       f"{len(g.warp32)} warp-size-32 assumption(s)" if g.warp32 and not assessed
                                       else "") if c)
        log.warn(f"hipify: {KERNEL_DIR}/{g.name}: {counts}: {g.verdict} "
                 f"(porter hipify {KERNEL_DIR} --json lists each)")
    return {f: patch for patch, fs in fixed.items() for f in fs}


def _wave64(work: Path, tc: Toolchain, report: HipifyReport, fixed: Mapping[Finding, str],
            allow: Sequence[str]) -> wave64.Wave64:
    """The state of each warp-size-32 finding in the kernels a 64-lane build compiles (paths from the tree's root)."""
    def rooted(f: Finding) -> Finding:
        return dataclasses.replace(f, path=f"{KERNEL_DIR}/{f.path}")

    left = [rooted(f) for f in report.warp32 if f not in fixed]
    files = {o.name: wave64.files_of(work, o.sources, o.include_paths) for o in prebuilt_ops(tc, work) if o.device}
    return wave64.assess(left, files, wave64.load_ledger(PATCH_PROJECT),
                         fixed={rooted(f): by for f, by in fixed.items()}, allow=allow)


def _view(tc: Toolchain, torch_info: TorchInfo) -> tuple[Path, ...]:
    """The torch HIP view a compile-only ROCm port without a ROCm torch would use, named (else none)."""
    if tc.kind != "rocm" or not hip_view.needed(torch_info):
        return ()
    return (hip_view.view_dir(torch_info, tc.executor.work_dir(cache_dir(), make=False)),)


def _catalogue(work: Path, tc: Toolchain, torch_info: TorchInfo, version: str, *, stage: bool,
               compile_only: bool = False, name: str = "", read: Path | None = None) -> tuple[Catalogue, Path]:
    """The kernels as a catalogue for the engine, and their build folder. On the host it builds in the ported tree
    (``.porter/build``); through a chroot or container, the ported kernel folder is copied under the executor's
    work root (``stage=False`` only names it), so every source and header is where the compiler sees it.
    ``read``: the tree whose kernels are planned when ``work`` is not written yet (a dry run names the port's
    destination)."""
    ex = tc.executor
    tree = work
    if ex.kind == "host":
        build_dir = work / ".porter" / "build" / tc.name
    else:  # named by what is staged: a port of another tree never shares it, one of the same kernels waits
        staged = work if (work / KERNEL_DIR).is_dir() or read is None else read
        root = ex.work_dir(cache_dir(), make=stage) / "port" / \
            f"{name or work.name}-{_kernels_key(staged, tc)}-{tc.name}-{labels.make(tc)}"
        tree, build_dir = root / "src", root / "build"
        if stage:
            _stage(work, tree, tc)
    ops = prebuilt_ops(tc, read if read is not None and not (work / KERNEL_DIR).is_dir() else work)
    if compile_only:  # the GPU compile check; the host-only helpers are not part of it
        ops = [o for o in ops if o.device]
    cat = Catalogue(source=Source("megatron-deepspeed", version or "0", tree, str(work)), torch=torch_info,
                    accelerator="cuda" if tc.kind != "cpu" else "cpu", ops=tuple(ops))
    return cat, build_dir


STAGED = ".porter-staged"


def _kernels_key(tree: Path, tc: Toolchain) -> str:
    """The identity of what a port stages from ``tree``: each kernel file's path and bytes (a dry run names it by
    the source's, which porting then changes)."""
    files = sorted((tree / KERNEL_DIR).rglob("*")) if tc.gpu else []
    return files_digest(tree, (f for f in [*files, tree / HELPERS_SOURCE] if f.is_file()))[:12]


def _stage(work: Path, tree: Path, tc: Toolchain) -> None:
    """The ported kernels (and the helpers' source) copied to ``tree``, where the toolchain's compiler sees them:
    made once, under a lock, and published by rename; a staging that did not finish is made again."""
    if (tree / STAGED).is_file():
        return
    tree.parent.mkdir(parents=True, exist_ok=True)
    with hold(tree, f"staging the kernels of {work.name}"):
        if (tree / STAGED).is_file():  # another port of the same kernels staged them while this one waited
            return
        tmp = owned_temp_dir(tree.parent, ".src-")
        try:
            if tc.gpu:
                shutil.copytree(work / KERNEL_DIR, tmp / KERNEL_DIR)
            if (work / HELPERS_SOURCE).is_file():
                (tmp / HELPERS_SOURCE).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(work / HELPERS_SOURCE, tmp / HELPERS_SOURCE)
            (tmp / STAGED).write_text("")
            shutil.rmtree(tree, ignore_errors=True)  # one that did not finish (no marker): ours, under the lock
            os.replace(tmp, tree)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _plan(work: Path, tc: Toolchain, torch_info: TorchInfo, version: str, *, stage: bool,
          compile_only: bool = False, extra_includes: tuple[Path, ...] = (), name: str = "",
          read: Path | None = None) -> Plan:
    """The kernels' plan, as the engine will run it (a dry run prints it; :func:`_catalogue` says where)."""
    cat, build_dir = _catalogue(work, tc, torch_info, version, stage=stage, compile_only=compile_only, name=name,
                                read=read)
    return make_plan(cat, tc, list(cat.ops), build_dir, stage=stage, compile_only=compile_only,
                     extra_includes=extra_includes)


def plan_specs(tree: Path, tc: Toolchain) -> dict[str, OpSpec]:
    return {o.name: o for o in prebuilt_ops(tc, tree)}


_PACKAGE_INIT = b'"""Modules prebuilt by porter for Megatron-DeepSpeed (the dataset index helpers)."""\n'


def package_kernels(ops: list[OpResult], tc: Toolchain, torch_info: TorchInfo, version: str, wheelhouse: Path, *,
                    source: str, specs: Mapping[str, OpSpec] | None = None,
                    patches: Sequence[dict[str, Any]] | None = None,
                    wave64: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """One wheel with the fused kernels (top-level modules, as Megatron imports them) and the dataset helpers
    (``megatron_fused_kernels.helpers``, host-only), and its porter manifest beside it. ``patches``: those the port
    applied (:meth:`porter.patching.engine.Plan.records`; None: not known, and the manifest says so)."""
    full_version = with_label(version or "0", labels.make(tc))
    tag = torch_info.wheel_tag
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
            package = "/".join(module.split(".")[:-1])
            if package:
                files[f"{package}/__init__.py"] = _PACKAGE_INIT
        entries.append(entry)
    sources: dict[str, Any] = {"origin": source, "version": version}
    commit = git_commit(Path(source))
    if commit:
        sources["git_commit"] = commit
    if patches is not None:
        sources["patches"] = list(patches)
    dest, mpath, _ = publish(
        wheelhouse, lambda tmp, data: write_wheel(tmp, WheelSpec(DIST, full_version, tag),
                                                  {**files, "{dist_info}/porter.json": data},
                                                  summary="Megatron-DeepSpeed fused softmax kernels, prebuilt by porter"),
        extra={"wave64": wave64} if wave64 else None,
        component="megatron-deepspeed", version=full_version, tc=tc, torch=torch_info,
        python_tag=torch_info.python_tag, sources=sources, extensions=entries,
        ops=[{"name": o.name, "status": o.status, "seconds": round(o.seconds, 2), "log": o.log} for o in ops])
    return dest, mpath


__all__ = ["HELPERS_OP", "helpers_op", "kernel_ops", "output_dir", "package_kernels", "port_megatron", "prebuilt_ops",
           "prepare_tree"]
