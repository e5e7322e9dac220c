"""``porter port megatron-deepspeed``: one command from an upstream tree to a ROCm-ready tree.

Steps, in order: check everything (tree, output, toolchain root, the build python's torch), copy
the tree beside OUT (unless in place), hipify the fused kernels (ROCm profiles), apply the
``megatron-deepspeed/rocm`` patch set (:mod:`porter.patching`: text edits only), plan the fused
softmax kernels as one ninja graph (:mod:`ops_prebuild`'s planner), compile them and package one wheel
(``megatron-fused-kernels``, top-level modules as Megatron imports them) with its manifest; then OUT
appears by one rename. A torch of another kind than the profile's is refused before any work (a dry
run prints the plan and the refusal); ``--no-kernels`` ports the tree without building the kernels.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from porter import __version__
from porter.artifacts import labels
from porter.artifacts.labels import with_label
from porter.artifacts.manifest import ExtensionEntry, build_manifest, carried, manifest_path, write_beside
from porter.artifacts.wheelfile import Payload, WheelSpec, write_wheel
from porter.components.megatron import CUDA_FLAGS, DIST, KERNEL_DIR, KERNELS, ROCM_FLAGS, is_tree
from porter.errors import CheckFailed, ConfigError, PorterError
from porter import torch_hip_view as hip_view
from porter.executor import HOST, Executor, build_python
from porter.fs import atomic_write_json, atomic_write_text, cache_dir, ensure_writable_dir
from porter.log import Logger, quiet_logger
from porter.patching import PatchFailed, apply
from porter.patching.model import load_shipped
from porter.patching.engine import failure_message, plan as patch_plan
from porter.run import Runner
from porter.toolchain.check import require_toolchain
from porter.toolchain.profile import Toolchain, toolchain_env
from porter.torch_facts import TorchInfo, need_for, probe_torch, refusal
from ops_prebuild.build import OpResult, compile_report, run_ninja
from ops_prebuild.catalogue import Catalogue, OpSpec
from ops_prebuild.plan import Plan, make_plan
from ops_prebuild.source import Source

PORT_RECORD = ".porter/port.json"


@dataclass
class PortResult:
    source: Path
    out: Path
    toolchain: str
    version: str
    hipified: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    patch_results: list[dict[str, Any]] = field(default_factory=list)
    plan: Plan | None = None
    refusal: PorterError | None = None
    """Dry run only: why a real run here would be refused before any work."""
    kernels: bool = True
    compile_only: bool = False
    compiled: list[dict[str, Any]] = field(default_factory=list)
    """--compile-only: per kernel, per arch, per translation unit (compiled, not linked)."""
    built: list[dict[str, Any]] = field(default_factory=list)
    wheel: Path | None = None
    manifest: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": str(self.source), "out": str(self.out), "toolchain": self.toolchain,
                "version": self.version, "hipified": self.hipified, "patched": self.patched,
                "patch_results": self.patch_results, "kernels": self.kernels,
                "refusal": self.refusal.message if self.refusal else None,
                "plan": self.plan.to_dict() if self.plan is not None else None, "built": self.built,
                **({"compile_only": True, "linked": False, "note": "compiled, not linked",
                    "compiled": self.compiled} if self.compile_only else {}),
                "wheel": str(self.wheel) if self.wheel else None,
                "manifest": str(self.manifest) if self.manifest else None}


def check_tree(tree: Path) -> Path:
    if not tree.is_dir():
        raise ConfigError(f"tree not found: {tree}", hint="pass the top folder of a Megatron-DeepSpeed checkout")
    tree = tree.resolve()
    if not is_tree(tree):
        raise ConfigError(f"{tree} is not a Megatron-DeepSpeed tree (no {KERNEL_DIR}/ with the softmax kernels)",
                          hint="pass the top folder of a Megatron-DeepSpeed checkout")
    return tree


def output_dir(tree: Path, out: Path | None, in_place: bool, toolchain: Toolchain) -> Path:
    """Where the ported tree goes: TREE itself (in place), or OUT (default TREE-<profile>), checked."""
    tree = check_tree(tree)
    if in_place:
        if out is not None and out.resolve() != tree:
            raise ConfigError("--in-place and -o exclude each other", hint="drop one of them")
        return tree
    dest = (out if out is not None else tree.with_name(f"{tree.name}-{toolchain.name}")).resolve()
    if dest == tree or dest.is_relative_to(tree):
        raise ConfigError(f"output {dest} is the tree or inside it", hint="put the ported copy next to the tree")
    if dest.exists() and not (dest / PORT_RECORD).is_file():
        raise ConfigError(f"{dest} exists and was not written by porter port",
                          hint="pass a new -o folder, or remove this one")
    return dest


def prepare_tree(tree: Path, out: Path | None, in_place: bool, toolchain: Toolchain) -> Path:
    """Copy TREE to OUT (atomically) and return it; in place: TREE. A re-run reuses its own port."""
    dest = output_dir(tree, out, in_place, toolchain)
    if in_place or dest.exists():
        return dest
    ensure_writable_dir(dest.parent, what="parent folder of the ported tree")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        shutil.copytree(tree.resolve(), tmp / "t", symlinks=True)
        atomic_write_json(tmp / "t" / PORT_RECORD, {"source": str(tree.resolve()), "porter_version": __version__})
        os.replace(tmp / "t", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def kernel_ops(tc: Toolchain) -> list[OpSpec]:
    """The three fused softmax kernels as ops_prebuild OpSpecs (top-level modules).

    No -std here: the planner adds the C++ standard the build torch's headers need.
    """
    includes: tuple[str, ...] = (KERNEL_DIR,)
    if tc.kind == "rocm":
        nvcc: tuple[str, ...] = ROCM_FLAGS
    else:
        gencode = tuple(f"-gencode=arch=compute_{t.name[3:]},code={t.name}" for t in tc.targets)
        nvcc = (*CUDA_FLAGS, *gencode)
        if tc.root:  # the .cpp halves include cuda_fp16.h, compiled by the host compiler
            includes += (f"{tc.root}/include",)
    return [OpSpec(name=f"{k}_cuda", builder="megatron.fused_kernels", build_var="", module=f"{k}_cuda",
                   sources=(f"{KERNEL_DIR}/{k}.cpp", f"{KERNEL_DIR}/{k}_cuda.cu"), include_paths=includes,
                   device=True, compatible=True, cxx_args=("-O3",), nvcc_args=nvcc)
            for k in KERNELS]


def port_megatron(tree: str | os.PathLike[str], tc: Toolchain, *, out: str | os.PathLike[str] | None = None,
                  in_place: bool = False, wheelhouse: str | os.PathLike[str] | None = None,
                  python: str | None = None, jobs: int | None = None, dry_run: bool = False,
                  kernels: bool = True, compile_only: bool = False, target_version: str | None = None,
                  log: Logger | None = None, runner: Runner | None = None) -> PortResult:
    log = log or quiet_logger()
    runner = runner or Runner(log)
    if tc.kind not in ("rocm", "cuda"):
        raise ConfigError(f"toolchain {tc.name} is a {tc.kind} profile; the fused kernels are GPU code",
                          hint="pass a rocm profile (frontier, lumi-g, mi300x, debian-rocm, ...) or a cuda one")
    src = check_tree(Path(tree))
    dest = output_dir(src, Path(out) if out is not None else None, in_place, tc)
    pset = load_shipped("megatron-deepspeed", "rocm")
    ex = tc.executor
    py_ex, python = build_python(ex, tc.python, python)
    torch_info: TorchInfo | None = None
    refused: PorterError | None = None
    if compile_only and not kernels:
        raise ConfigError("--compile-only compiles the kernels; --no-kernels skips them", hint="drop one of them")
    if kernels and not dry_run and not compile_only:
        if wheelhouse is None:
            raise ConfigError("building the fused kernels needs --wheelhouse DIR",
                              hint="pass --wheelhouse ./wheelhouse, or --no-kernels to port the tree only")
        ensure_writable_dir(Path(wheelhouse), what="wheelhouse")
    if not dry_run and not in_place:
        ensure_writable_dir(dest.parent, what="parent folder of the ported tree", option="--dest")
    if kernels and not dry_run:
        ex.preflight()
        with log.step(f"checking {tc.compiler} for {', '.join(t.spec for t in tc.targets)}"):
            require_toolchain(tc, runner=Runner(log, echo=log.verbose), log=log)
    if kernels:
        torch_info = probe_torch(python, Runner(log, echo=log.verbose), executor=py_ex)
        refused = None if compile_only else refusal(need_for(tc.kind), torch_info, python,
                                                    what=f"building Megatron's fused kernels for {tc.name}")
        try:
            ex.preflight()
        except PorterError as exc:
            refused = refused or exc
    if dry_run:
        pp = patch_plan(src, [pset], target_version=target_version)  # checked against the tree; nothing written
        if pp.failed:
            raise PatchFailed(failure_message(pp.failed), pp.failed)
        result = PortResult(src, dest, tc.name, pp.sets[0].version, patched=[c.path for c in pp.changes],
                            patch_results=[r.to_dict() for r in pp.sets[0].results], kernels=kernels,
                            refusal=refused, compile_only=compile_only)
        if torch_info is not None:
            with log.step("planning the fused kernels"):
                view = _view(tc, torch_info, python, py_ex, log, dry_run=True) if compile_only else ()
                result.plan = _plan(dest, tc, torch_info, result.version, stage=False, compile_only=compile_only,
                                    extra_includes=view, name=dest.name)
            if refused is not None:
                result.plan.notes.append(f"a real run here would be refused: {refused.message}")
        return result
    if refused is not None:
        raise refused
    if in_place:
        work = dest
        return _port_into(work, src, dest, tc, pset, torch_info, wheelhouse, jobs, target_version, log, runner,
                          compile_only=compile_only, python=python, py_ex=py_ex)
    with log.step("copying the tree"):
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        work = staging / "t"
        shutil.copytree(dest if dest.exists() else src, work, symlinks=True)
        atomic_write_json(work / PORT_RECORD, {"source": str(src), "porter_version": __version__})
        result = _port_into(work, src, dest, tc, pset, torch_info, wheelhouse, jobs, target_version, log, runner,
                            compile_only=compile_only, python=python, py_ex=py_ex)
        if dest.exists():  # a re-run: the earlier port is replaced in one step
            old = staging / "old"
            os.replace(dest, old)
        os.replace(work, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def _port_into(work: Path, src: Path, dest: Path, tc: Toolchain, pset: Any, torch_info: TorchInfo | None,
               wheelhouse: str | os.PathLike[str] | None, jobs: int | None, target_version: str | None,
               log: Logger, runner: Runner, *, compile_only: bool = False, python: str = "",
               py_ex: Executor = HOST) -> PortResult:
    result = PortResult(src, dest, tc.name, "", kernels=torch_info is not None, compile_only=compile_only)
    if tc.kind == "rocm":
        from porter.hipify import engine as hip

        with log.step(f"hipifying {KERNEL_DIR}"):
            report = hip.hipify_tree(work / KERNEL_DIR, in_place=True, log=log, use_cache=False)
        result.hipified = [f"{KERNEL_DIR}/{f.path}" for f in report.written]
        for finding in report.unsupported:
            log.warn(f"no HIP equivalent: {KERNEL_DIR}/{finding.path}:{finding.line}: {finding.identifier}")
    with log.step(f"applying {pset.ref}"):
        done = apply(work, [pset], target_version=target_version)
    result.version = done.plan.sets[0].version
    result.patched = list(done.changed)
    result.patch_results = [r.to_dict() for r in done.plan.sets[0].results]
    if torch_info is None:
        return result
    with log.step("planning the fused kernels"):
        view = _view(tc, torch_info, python, py_ex, log, dry_run=False) if compile_only else ()
        plan = _plan(work, tc, torch_info, result.version, stage=True, compile_only=compile_only,
                     extra_includes=view, name=dest.name)
    result.plan = plan
    from porter.resources import default_jobs

    plan.build_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(plan.build_dir / "build.ninja", plan.ninja())
    ops = run_ninja(plan, jobs or default_jobs(6 << 30), runner=runner, log=log, env=toolchain_env(tc))
    result.built = [o.__dict__ for o in ops]
    failed = [o for o in ops if o.status == "failed"]
    if compile_only:
        result.compiled = compile_report(plan, ops, tc)
        if len(failed) == len(ops):
            raise CheckFailed(f"no fused kernel compiled ({', '.join(o.name for o in failed)}); first error: "
                              f"{failed[0].error}", hint=f"read the logs: {', '.join(o.log for o in failed)}")
        return result
    if failed:
        raise CheckFailed(f"fused kernel(s) failed to build: {', '.join(o.name for o in failed)}; "
                          "no wheel was written and the output folder was left as it was",
                          hint=f"read the logs: {', '.join(o.log for o in failed)}")
    assert wheelhouse is not None
    with log.step("packaging the fused kernels"):
        result.wheel, result.manifest = package_kernels(ops, tc, torch_info, result.version, Path(wheelhouse),
                                                        source=str(src))
    return result


def _view(tc: Toolchain, torch_info: TorchInfo, python: str, py_ex: Executor, log: Logger, *,
          dry_run: bool) -> tuple[Path, ...]:
    """The torch HIP view for a compile-only ROCm port without a ROCm torch (else none)."""
    if tc.kind != "rocm" or not hip_view.needed(torch_info):
        return ()
    with log.step(f"a HIP view of torch {torch_info.version}'s headers (compile checks only)"):
        return (hip_view.make_view(torch_info, tc.executor.work_dir(cache_dir()), python=python,
                                   runner=Runner(log, echo=log.verbose), executor=py_ex, dry_run=dry_run),)


def _plan(work: Path, tc: Toolchain, torch_info: TorchInfo, version: str, *, stage: bool,
          compile_only: bool = False, extra_includes: tuple[Path, ...] = (), name: str = "") -> Plan:
    """The kernels' plan. On the host it builds in the ported tree (``.porter/build``); through a chroot or
    container, the ported kernel folder is copied under the executor's work root (``stage=False``
    only names it), so every source and header is where the compiler sees it."""
    ex = tc.executor
    tree = work
    if ex.kind == "host":
        build_dir = work / ".porter" / "build" / tc.name
    else:
        root = ex.work_dir(cache_dir()) / "port" / f"{name or work.name}-{tc.name}-{labels.make(tc)}"
        tree, build_dir = root / "src", root / "build"
        if stage:
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(work / KERNEL_DIR, tree / KERNEL_DIR)
    cat = Catalogue(source=Source("megatron-deepspeed", version or "0", tree, str(work)), torch=torch_info,
                    accelerator="cuda", ops=tuple(kernel_ops(tc)))
    return make_plan(cat, tc, list(cat.ops), build_dir, stage=stage, compile_only=compile_only,
                     extra_includes=extra_includes)


def package_kernels(ops: list[OpResult], tc: Toolchain, torch_info: TorchInfo, version: str, wheelhouse: Path, *,
                    source: str) -> tuple[Path, Path]:
    """One wheel with the three top-level extension modules, and its porter manifest beside it."""
    full_version = with_label(version or "0", labels.make(tc))
    tag = f"{torch_info.python_tag}-{torch_info.python_tag}-{torch_info.platform_tag}"
    entries: list[ExtensionEntry] = [{"module": o.name, "path": Path(o.so).name, "sha256": o.sha256, "op": o.name,
                                      "archs": list(tc.arch_names)} for o in ops]
    manifest = build_manifest(
        component="megatron-deepspeed", version=full_version, tc=tc, torch=torch_info,
        python_tag=torch_info.python_tag, sources={"origin": source, "version": version}, extensions=entries,
        ops=[{"name": o.name, "status": o.status, "seconds": round(o.seconds, 2), "log": o.log} for o in ops])
    files: dict[str, Payload] = {Path(o.so).name: Path(o.so) for o in ops}
    files["{dist_info}/porter.json"] = carried(manifest)
    wheelhouse.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".porter-", dir=wheelhouse) as tmpdir:
        tmp = write_wheel(tmpdir, WheelSpec(DIST, full_version, tag), files,
                          summary="Megatron-DeepSpeed fused softmax kernels, prebuilt by porter")
        dest = wheelhouse / tmp.name
        mpath = write_beside(tmp, manifest)
        os.replace(mpath, manifest_path(dest))
        os.replace(tmp, dest)
    return dest, manifest_path(dest)


__all__ = ["PortResult", "kernel_ops", "output_dir", "package_kernels", "port_megatron", "prepare_tree"]
