"""``porter port megatron-deepspeed``: one command from an upstream tree to a ROCm-ready tree.

Steps, in order: copy the tree (unless in place), hipify the fused kernels (ROCm profiles), apply the
``megatron-deepspeed/rocm`` patch set, plan the fused softmax kernels ahead of time as one ninja graph
(ops_prebuild's planner), and, when the build python's torch matches the profile, compile them and
package one wheel (``megatron-fused-kernels``, top-level modules as Megatron imports them) with its
porter manifest into the wheelhouse. With a profile this host cannot build for (ROCm without a ROCm
torch) the tree is still ported and the plan is returned, marked as a plan only, with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from porter import __version__
from porter.errors import CheckFailed, ConfigError, PorterError
from porter.log import Logger, quiet_logger
from porter.manifest import SCHEMA, Manifest, atomic_write_json, manifest_path, sha256_file
from porter.patching.engine import Applied, apply
from porter.patching.model import load_shipped
from porter.run import Runner
from porter.toolchain.profile import Toolchain, toolchain_env
from ops_prebuild.catalogue import probe_torch

KERNEL_DIR = "megatron/fused_kernels"
KERNELS = ("scaled_upper_triang_masked_softmax", "scaled_masked_softmax", "scaled_softmax")
"""Each kernel is ``<name>.cpp`` + ``<name>_cuda.cu``, importable as the top-level module ``<name>_cuda``."""
DIST = "megatron_fused_kernels"
PORT_RECORD = ".porter/port.json"

# Device-code flags Megatron's own loader passes (facts read from upstream's fused_kernels/__init__.py).
ROCM_FLAGS = ("-O3", "-D__HIP_NO_HALF_OPERATORS__=1", "-D__HIP_NO_HALF_CONVERSIONS__=1")
CUDA_FLAGS = ("-O3", "--use_fast_math", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "--expt-relaxed-constexpr", "--expt-extended-lambda")

@dataclass
class PortResult:
    source: Path
    out: Path
    toolchain: str
    version: str
    hipified: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    patch_results: list[dict[str, Any]] = field(default_factory=list)
    plan: Any = None
    plan_only: str = ""
    """Why nothing was compiled (empty when the kernels were built)."""
    built: list[dict[str, Any]] = field(default_factory=list)
    wheel: Path | None = None
    manifest: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": str(self.source), "out": str(self.out), "toolchain": self.toolchain,
                "version": self.version, "hipified": self.hipified, "patched": self.patched,
                "patch_results": self.patch_results, "plan_only": self.plan_only or None,
                "plan": self.plan.to_dict() if self.plan is not None else None, "built": self.built,
                "wheel": str(self.wheel) if self.wheel else None,
                "manifest": str(self.manifest) if self.manifest else None}


def _is_megatron(tree: Path) -> bool:
    return (tree / KERNEL_DIR / "__init__.py").is_file() and all(
        (tree / KERNEL_DIR / f"{k}_cuda.cu").is_file() for k in KERNELS)


def prepare_tree(tree: Path, out: Path | None, in_place: bool, toolchain: Toolchain) -> Path:
    """The tree porter will change: TREE itself (in place), or a copy at OUT (default TREE-<profile>)."""
    if not tree.is_dir():
        raise ConfigError(f"tree not found: {tree}", hint="pass the top folder of a Megatron-DeepSpeed checkout")
    tree = tree.resolve()
    if not _is_megatron(tree):
        raise ConfigError(f"{tree} is not a Megatron-DeepSpeed tree (no {KERNEL_DIR}/ with the softmax kernels)",
                          hint="pass the top folder of a Megatron-DeepSpeed checkout")
    if in_place:
        if out is not None and out.resolve() != tree:
            raise ConfigError("--in-place and -o exclude each other", hint="drop one of them")
        return tree
    dest = (out if out is not None else tree.with_name(f"{tree.name}-{toolchain.name}")).resolve()
    if dest == tree or dest.is_relative_to(tree):
        raise ConfigError(f"output {dest} is the tree or inside it", hint="put the ported copy next to the tree")
    if dest.exists():
        if not (dest / PORT_RECORD).is_file():
            raise ConfigError(f"{dest} exists and was not written by porter port",
                              hint="pass a new -o folder, or remove this one")
        return dest  # a re-run updates the earlier port (hipify and patch are idempotent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        shutil.copytree(tree, tmp / "t", symlinks=True)
        (tmp / "t" / PORT_RECORD).parent.mkdir(exist_ok=True)
        atomic_write_json(tmp / "t" / PORT_RECORD, {"source": str(tree), "porter_version": __version__})
        os.replace(tmp / "t", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def kernel_ops(tc: Toolchain) -> list[Any]:
    """The three fused softmax kernels as ops_prebuild OpSpecs (top-level modules).

    No -std here: the planner adds the C++ standard the build torch's headers need.
    """
    from ops_prebuild.catalogue import OpSpec

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


def plan_only_reason(tc: Toolchain, torch_kind: str, torch_version: str) -> str:
    if tc.kind == "rocm" and torch_kind != "rocm":
        return (f"toolchain {tc.name} builds for ROCm, but torch {torch_version} in the build python is a "
                f"{torch_kind} build: linking a ROCm torch extension needs the ROCm build of torch "
                "(ATen/hip headers, libtorch_hip). The tree is ported; the kernels were planned, not compiled. "
                "Run again with --python pointing at a ROCm torch to build them.")
    if tc.kind == "cuda" and torch_kind != "cuda":
        return (f"toolchain {tc.name} builds for CUDA, but torch {torch_version} in the build python is a "
                f"{torch_kind} build. The tree is ported; the kernels were planned, not compiled.")
    return ""


def port_megatron(tree: str | os.PathLike[str], tc: Toolchain, *, out: str | os.PathLike[str] | None = None,
                  in_place: bool = False, wheelhouse: str | os.PathLike[str] | None = None,
                  python: str | None = None, jobs: int | None = None, dry_run: bool = False,
                  target_version: str | None = None, log: Logger | None = None,
                  runner: Runner | None = None) -> PortResult:
    log = log or quiet_logger()
    runner = runner or Runner(log)
    python = python or os.environ.get("PORTER_PYTHON") or sys.executable
    if tc.kind not in ("rocm", "cuda"):
        raise ConfigError(f"toolchain {tc.name} is a {tc.kind} profile; the fused kernels are GPU code",
                          hint="pass a rocm profile (frontier, lumi-g, mi300x, debian-rocm, ...) or a cuda one")
    src = Path(tree)
    pset = load_shipped("megatron-deepspeed", "rocm")
    if dry_run:
        # nothing is written: the patch set is checked against the tree as it is
        from porter.patching.engine import plan as patch_plan

        if not _is_megatron(src):
            prepare_tree(src, None, True, tc)  # raises the precise error
        work = src.resolve()
        pp = patch_plan(work, [pset], target_version=target_version)
        if pp.failed:
            from porter.patching.engine import PatchFailed, failure_message

            raise PatchFailed(failure_message(pp.failed), pp.failed)
        result = PortResult(work, work if in_place else Path(out or f"{work}-{tc.name}"), tc.name,
                            pp.sets[0].version, patched=[c.path for c in pp.changes],
                            patch_results=[r.to_dict() for r in pp.sets[0].results])
    else:
        with log.step("copying the tree" if not in_place else "porting in place"):
            work = prepare_tree(src, Path(out) if out is not None else None, in_place, tc)
        result = PortResult(src.resolve(), work, tc.name, "")
        if tc.kind == "rocm":
            from porter.hipify import engine as hip

            with log.step(f"hipifying {KERNEL_DIR}"):
                report = hip.hipify_tree(work / KERNEL_DIR, in_place=True, log=log, use_cache=False)
            result.hipified = [f"{KERNEL_DIR}/{f.path}" for f in report.written]
            for finding in report.unsupported:
                log.warn(f"no HIP equivalent: {KERNEL_DIR}/{finding.path}:{finding.line}: {finding.identifier}")
        with log.step(f"applying {pset.ref}"):
            done: Applied = apply(work, [pset], target_version=target_version)
        result.version = done.plan.sets[0].version
        result.patched = list(done.changed)
        result.patch_results = [r.to_dict() for r in done.plan.sets[0].results]

    with log.step("planning the fused kernels"):
        torch_info = probe_torch(python, Runner(log, echo=log.verbose))
        result.plan_only = plan_only_reason(tc, torch_info.kind, torch_info.version)
        plan = _plan(work, tc, torch_info, result.version)
        result.plan = plan
    if dry_run:
        result.plan_only = result.plan_only or "dry run: nothing written, nothing compiled"
        return result
    if result.plan_only:
        return result
    if wheelhouse is None:
        raise ConfigError("building the fused kernels needs --wheelhouse DIR", hint="pass --wheelhouse ./wheelhouse")
    from ops_prebuild.build import check_writable, run_ninja
    from porter.resources import default_jobs

    check_writable(Path(wheelhouse))
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    from porter.manifest import atomic_write_text

    atomic_write_text(plan.build_dir / "build.ninja", plan.ninja())
    ops = run_ninja(plan, jobs or default_jobs(6 << 30), runner=runner, log=log, env=toolchain_env(tc))
    result.built = [o.__dict__ for o in ops]
    failed = [o for o in ops if o.status == "failed"]
    if failed:
        raise CheckFailed(f"fused kernel(s) failed to build: {', '.join(o.name for o in failed)}; "
                          "no wheel was written", hint=f"read the logs: {', '.join(o.log for o in failed)}")
    with log.step("packaging the fused kernels"):
        result.wheel, result.manifest = package_kernels(ops, tc, torch_info, result.version, Path(wheelhouse),
                                                        source=str(result.source))
    return result


def _plan(work: Path, tc: Toolchain, torch_info: Any, version: str) -> Any:
    from ops_prebuild.catalogue import Catalogue
    from ops_prebuild.plan import make_plan
    from ops_prebuild.source import Source

    cat = Catalogue(source=Source("megatron-deepspeed", version or "0", work, str(work)), torch=torch_info,
                    accelerator="cuda", ops=tuple(kernel_ops(tc)))
    build_dir = work / ".porter" / "build" / tc.name
    return make_plan(cat, tc, list(cat.ops), build_dir)


def package_kernels(ops: list[Any], tc: Toolchain, torch_info: Any, version: str, wheelhouse: Path, *,
                    source: str) -> tuple[Path, Path]:
    """One wheel with the three top-level extension modules, and its porter manifest beside it."""
    from wheel.wheelfile import WheelFile

    full_version = f"{version or '0'}+{tc.local_label}"
    tag = f"{torch_info.python_tag}-{torch_info.python_tag}-{torch_info.platform_tag}"
    name = f"{DIST}-{full_version}-{tag}.whl"
    dist_info = f"{DIST}-{full_version}.dist-info"
    manifest: Manifest = {
        "schema": SCHEMA, "porter_version": __version__, "component": "megatron-fused-kernels",
        "version": full_version, "wheel": {}, "python_tag": torch_info.python_tag, "toolchain": tc.to_dict(),
        "target": {"kind": tc.kind, "archs": list(tc.arch_names), "wavefront": tc.wavefront,
                   "cpu_isa": tc.cpu_isa, "toolkit_version": tc.toolkit_version},
        "torch": {"version": torch_info.version, "kind": torch_info.kind, "cuda": torch_info.cuda,
                  "hip": torch_info.hip},
        "sources": {"origin": source, "version": version},
        "extensions": [{"module": o.name, "path": Path(o.so).name, "sha256": o.sha256, "op": o.name,
                        "archs": list(tc.arch_names)} for o in ops],
        "ops": [{"name": o.name, "status": o.status, "seconds": round(o.seconds, 2), "log": o.log} for o in ops],
    }
    metadata = (f"Metadata-Version: 2.1\nName: {DIST.replace('_', '-')}\nVersion: {full_version}\n"
                "Summary: Megatron-DeepSpeed fused softmax kernels, prebuilt by porter\n")
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: porter {__version__}\nRoot-Is-Purelib: false\nTag: {tag}\n"
    with tempfile.TemporaryDirectory(prefix=".porter-", dir=wheelhouse) as tmpdir:
        tmp = Path(tmpdir) / name
        with WheelFile(tmp, "w") as wf:
            for o in ops:
                wf.write(o.so, Path(o.so).name)
            wf.writestr(f"{dist_info}/METADATA", metadata)
            wf.writestr(f"{dist_info}/WHEEL", wheel_meta)
            wf.writestr(f"{dist_info}/porter.json",
                        json.dumps({k: v for k, v in manifest.items() if k != "wheel"}, indent=2, sort_keys=True))
        manifest["wheel"] = {"filename": name, "sha256": sha256_file(tmp)}
        dest = wheelhouse / name
        atomic_write_json(manifest_path(dest), manifest)
        os.replace(tmp, dest)
    return dest, manifest_path(dest)


__all__ = ["PortResult", "kernel_ops", "package_kernels", "plan_only_reason", "port_megatron", "prepare_tree",
           "PorterError"]
