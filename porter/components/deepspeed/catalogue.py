"""DeepSpeed's op catalogue, read from the tree itself by running its own builders in the build python
(:mod:`porter.probes.ds_catalogue`), with DeepSpeed's own reason for each op it leaves out."""

from __future__ import annotations

from typing import Any

from porter.errors import ConfigError, ToolError
from porter.components.op_builder import bf16, profile_simd
from porter.executor import Executor
from porter.probe import run_probe
from porter.run import Runner, make_env
from porter.toolchain.profile import Toolchain
from porter.torch_facts import TorchInfo
from ops_prebuild.catalogue import Catalogue, OpSpec, needing_unbuildable
from ops_prebuild.source import Source

# Catalogue entries that are not ops one can build (DeepSpeed's placeholder for unsupported names).
_PLACEHOLDERS = {"NotImplementedBuilder"}


def _reason(entry: dict[str, Any], tc: Toolchain) -> str:
    if entry["class"] in _PLACEHOLDERS:
        return "a placeholder in DeepSpeed's catalogue, not an op"
    if not entry["compatible"]:  # DeepSpeed's own verdict and words first
        said = " ".join(str(entry.get("reason") or "").split())
        return said[:400] or "DeepSpeed's own is_compatible() says no for this toolchain"
    if entry.get("probe_errors"):
        return "its builder raised when porter asked it (" + "; ".join(entry["probe_errors"])[:300] + ")"
    if not entry.get("module") or not entry.get("sources"):
        return "the builder names no module or no sources"
    return "a GPU op; the cpu profile has no device compiler" if entry["device"] and tc.kind == "cpu" else ""


def read_catalogue(source: Source, tc: Toolchain, *, python: str, runner: Runner,
                   executor: Executor) -> Catalogue:
    """Run the tree's own builders (in ``python``, which must have torch, through ``executor``) and
    turn them into OpSpecs."""
    accelerator = "cpu" if tc.kind == "cpu" else "cuda"  # DeepSpeed's (DS_ACCELERATOR): ROCm builds go through cuda
    env_update: dict[str, str | None] = {"DS_ACCELERATOR": accelerator, "PYTHONDONTWRITEBYTECODE": "1"}
    # the emulated HIP target builds what a ROCm build builds: DeepSpeed's builders answer as for ROCm
    args = [executor.inside(source.tree), "rocm" if tc.hip else tc.kind]
    if tc.hip:
        args += [tc.toolkit_version or "0.0", ";".join(t.spec for t in tc.targets), str(tc.wavefront)]
        # DeepSpeed's builders join ROCM_HOME with 'lib'; a CPU torch leaves it None
        env_update["ROCM_HOME"] = tc.root or "/opt/rocm"
    if tc.kind == "cuda":
        env_update["TORCH_CUDA_ARCH_LIST"] = ";".join(
            f"{t.name[3:-1]}.{t.name[-1]}" if not t.name.endswith("a") else f"{t.name[3:-2]}.{t.name[-2]}a"
            for t in tc.targets)
        if tc.root:
            env_update["CUDA_HOME"] = tc.root
    doc = run_probe("ds_catalogue", args, python=python, runner=runner, executor=executor,
                    env=make_env(env_update), what=f"for the op catalogue of {source.tree}")
    if doc["torch"] is None or "error" in (doc["torch"] or {}):
        raise ConfigError(f"torch is not installed in {python}",
                          hint="install the torch the ops are for into that python (CPU: pip install torch==2.13.0), "
                               "or pass --python")
    if doc["errors"]:
        raise ToolError(f"could not read the op catalogue of {source.tree}: {doc['errors'][0]}")
    torch = TorchInfo.from_doc(doc["torch"])
    ops = []
    for e in doc["ops"]:
        reason = _reason(e, tc)
        ops.append(OpSpec(name=e["name"], builder=e["class"], build_var=e.get("build_var") or "",
                          module=e.get("module") or "", sources=tuple(e.get("sources") or ()),
                          include_paths=tuple(e.get("include_paths") or ()), device=bool(e["device"]),
                          compatible=not reason, reason=reason,
                          cxx_args=profile_simd(tuple(e["cxx_args"]), tc.cpu_isa),
                          nvcc_args=tuple(e["nvcc_args"]), extra_ldflags=tuple(e["extra_ldflags"]),
                          libraries=tuple(e["libraries"]), bf16=bf16(bool(e["device"]), tc, bool(e.get("bf16"))),
                          loads=tuple(e.get("loads") or ())))
    probes = tuple(sorted((str(k), bool(v)) for k, v in (doc.get("feature_probes") or {}).items()))
    return Catalogue(source, torch, doc.get("accelerator", accelerator), needing_unbuildable(ops), probes)
