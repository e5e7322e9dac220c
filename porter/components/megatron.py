"""Megatron-DeepSpeed: ported by :mod:`porter.port` (``porter port megatron-deepspeed``).

What porter knows about the tree: its fused softmax kernels (``megatron/fused_kernels``, each a
``<name>.cpp`` + ``<name>_cuda.cu`` pair that Megatron JIT-builds on rank 0 and imports as the
top-level module ``<name>_cuda``), the device flags Megatron's own loader passes, its patch sets,
and the distribution the prebuilt kernels ship as.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from porter.components import InstalledCheck, Recognised

if TYPE_CHECKING:
    from porter.artifacts.manifest import Manifest
    from porter.install.env import InstalledDist

KERNEL_DIR = "megatron/fused_kernels"
KERNELS = ("scaled_upper_triang_masked_softmax", "scaled_masked_softmax", "scaled_softmax")
DIST = "megatron-fused-kernels"
PACKAGE_INFO = "megatron/core/package_info.py"
PATCH_PROJECT = "megatron-deepspeed"
# Megatron's dataset index helpers: a host-only pybind11 module (PYBIND11_MODULE(helpers, ...)) that upstream
# builds with make at start-up (megatron/data/dataset_utils.py: compile_helper()) and imports as
# megatron.data.helpers. porter ships it in the fused-kernels wheel under this name (the extension's
# init function is named after the last component, so the module keeps its own name).
HELPERS_SOURCE = "megatron/data/helpers.cpp"
HELPERS_MODULE = "megatron_fused_kernels.helpers"
HELPERS_FLAGS = ("-O3", "-Wall", "-std=c++17")

# Device-code flags Megatron's own loader passes (facts read from upstream's fused_kernels/__init__.py).
ROCM_FLAGS = ("-O3", "-D__HIP_NO_HALF_OPERATORS__=1", "-D__HIP_NO_HALF_CONVERSIONS__=1")
CUDA_FLAGS = ("-O3", "--use_fast_math", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "--expt-relaxed-constexpr", "--expt-extended-lambda")


@dataclass(frozen=True)
class JitGuard:
    """A start-up compile site in Megatron that a patch of megatron-deepspeed/rocm turns into an import of
    porter's prebuilt modules (the audit asks these)."""

    kind: str       # the audit's kind of site: torch-jit | make
    file: str       # where the site is
    marker: str     # a line the patch leaves there
    patch: str
    modules: tuple[str, ...]


JIT_GUARDS: tuple[JitGuard, ...] = (
    JitGuard("torch-jit", f"{KERNEL_DIR}/__init__.py", "_porter_load_prebuilt", "fused-kernels-prebuilt",
             tuple(f"{k}_cuda" for k in KERNELS)),
    JitGuard("make", "megatron/data/dataset_utils.py", "porter: the prebuilt helpers, never make",
             "dataset-helpers-prebuilt", (HELPERS_MODULE,)),
)


def is_tree(tree: Path) -> bool:
    return (tree / KERNEL_DIR / "__init__.py").is_file() and all(
        (tree / KERNEL_DIR / f"{k}_cuda.cu").is_file() for k in KERNELS)


def tree_version(tree: Path) -> str:
    """MAJOR.MINOR.PATCH from megatron/core/package_info.py; '' when the tree has no such file."""
    info = tree / PACKAGE_INFO
    if not info.is_file():
        return ""
    text = info.read_text(errors="replace")
    parts = [re.search(rf"^{k}\s*=\s*(\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts if m) if all(parts) else ""


class MegatronComponent:
    name = "megatron-deepspeed"
    title = "Megatron-DeepSpeed"
    dists: tuple[str, ...] = (DIST,)
    patch_project = PATCH_PROJECT
    build_command = "porter port megatron-deepspeed"

    def recognise(self, tree: Path) -> Recognised | None:
        return Recognised(self.name, tree_version(tree), tree) if is_tree(tree) else None

    def check_installed(self, dist: InstalledDist, manifest: Manifest | None, kind: str) -> InstalledCheck:
        return InstalledCheck()


MEGATRON = MegatronComponent()
