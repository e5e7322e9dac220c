"""Run *inside the build python* (the one with the target torch), with a DeepSpeed tree on sys.path.

Reads the op catalogue from the tree itself (``op_builder.all_ops.ALL_OPS``) so new DeepSpeed
releases need no porter change, and prints one JSON document after a marker line. Arch and
wavefront come from porter (argv), never from rocminfo: for ROCm, the builders' class-level caches
are filled with the profile's values before any builder method runs.

argv: TREE KIND [ROCM_MAJOR.MINOR ARCHS WAVEFRONT]; ROCM_HOME in the environment
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import sys
import traceback
from typing import Any

from porter.probes.protocol import emit  # porter: concatenated
from porter.probes.torch_facts import torch_info  # porter: concatenated


def _loads_first(cls: type, op_of: dict[str, str], name: str) -> list[str]:
    """The other ops an op's own ``load()`` loads before itself (0.19.8: async_io and gds load pin_memory, whose
    .so holds the pinned-tensor manager they resolve): the builder classes its override names."""
    for klass in cls.__mro__:
        if "load" in vars(klass) and klass.__module__.rpartition(".")[2] != "builder":  # an op's own, not the base's
            try:
                text = inspect.getsource(vars(klass)["load"])
            except (OSError, TypeError):
                return []
            return sorted({op_of[c] for c in re.findall(r"\b(\w+Builder)\b", text) if op_of.get(c, name) != name})
    return []


def main() -> None:
    tree, kind = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tree)
    os.chdir(tree)
    # A tree patched with deepspeed/no-jit answers feature probes False, unasked, under a PORTER_NO_JIT=1 of the
    # caller's shell; what is recorded must be the build host's real answer, so this process (the probe's own, gone
    # when it exits) asks the compiler.
    os.environ["PORTER_FEATURE_PROBES"] = "compile"
    out: dict[str, Any] = {"torch": None, "ops": [], "errors": []}
    with contextlib.redirect_stdout(io.StringIO()):  # the tree's own prints are noise here
        try:
            import torch  # noqa: F401
        except ImportError as exc:
            out["errors"].append(f"torch not importable: {exc}")
            emit(out)
            return
        out["torch"] = torch_info()
        from op_builder.builder import OpBuilder, CUDAOpBuilder  # the tree's own builder
        if kind == "rocm":
            major, minor = sys.argv[3].split(".")[:2]
            OpBuilder._is_rocm_pytorch = True
            OpBuilder._rocm_version = (int(major), int(minor))
            OpBuilder._rocm_gpu_arch = sys.argv[4]
            OpBuilder._rocm_wavefront_size = sys.argv[5]
            # the builders join torch's ROCM_HOME with 'lib' (TorchCPUOpBuilder: cpu_adam and its kin on ROCm); a
            # CPU torch leaves it None, and those ops would look unbuildable here when they are not on a node
            import torch.utils.cpp_extension as cpp_ext
            if getattr(cpp_ext, "ROCM_HOME", None) is None and os.environ.get("ROCM_HOME"):
                cpp_ext.ROCM_HOME = os.environ["ROCM_HOME"]
        try:
            from op_builder.all_ops import ALL_OPS, accelerator_name
        except Exception:
            out["errors"].append("cannot read the op catalogue: " + traceback.format_exc(limit=3))
            emit(out)
            return
        out["accelerator"] = accelerator_name
        # the answers of load-time feature probes (has_function compiles a test program), recorded here at build
        # time so that an installation can answer them on a node with no compiler (deepspeed/no-jit)
        probes: dict[str, bool] = {}
        real_has_function = getattr(OpBuilder, "has_function", None)
        if real_has_function is not None:
            def recording(self: Any, funcname: str, libraries: Any, *args: Any, **kwargs: Any) -> bool:
                answer = bool(real_has_function(self, funcname, libraries, *args, **kwargs))
                probes[f"{funcname}:{','.join(libraries)}"] = answer
                return answer

            OpBuilder.has_function = recording
        out["feature_probes"] = probes
        op_of = {type(b).__name__: name for name, b in ALL_OPS.items()}
        for name, b in sorted(ALL_OPS.items()):
            entry: dict[str, Any] = {"name": name, "class": type(b).__name__,
                                     "build_var": getattr(b, "BUILD_VAR", ""), "device": isinstance(b, CUDAOpBuilder)}
            for field, call in (("module", b.absolute_name), ("sources", b.sources),
                                ("include_paths", b.include_paths)):
                try:
                    entry[field] = call()
                except Exception as exc:
                    entry[field] = None
                    entry.setdefault("probe_errors", []).append(f"{field}: {exc}")
            try:
                with contextlib.redirect_stdout(io.StringIO()) as said:
                    entry["compatible"] = bool(b.is_compatible(True))
                entry["reason"] = (b.error_log or said.getvalue().strip()) if not entry["compatible"] else ""
            except Exception as exc:
                entry["compatible"], entry["reason"] = False, f"is_compatible() raised: {exc}"
            for field, call in (("cxx_args", b.cxx_args), ("nvcc_args", b.nvcc_args),
                                ("extra_ldflags", b.extra_ldflags),
                                ("libraries", getattr(b, "libraries_args", lambda: []))):
                try:
                    entry[field] = [a for a in call() if a]
                except Exception as exc:
                    entry[field] = []
                    entry.setdefault("probe_errors", []).append(f"{field}: {exc}")
            entry["bf16"] = bool(getattr(b, "enable_bf16", False))
            entry["loads"] = _loads_first(type(b), op_of, name)
            out["ops"].append(entry)
    emit(out)


main()
