"""Megatron-DeepSpeed: ported by :mod:`.port` (``porter port megatron-deepspeed``).

What porter knows about the tree: its fused kernels (``megatron/fused_kernels``, each a ``.cpp`` binding
+ ``.cu`` kernel pair that Megatron JIT-builds on rank 0 and imports as a top-level module), the device
flags Megatron's own loader passes, its patch sets, and the distribution the prebuilt kernels ship as.

Two generations of ``megatron/fused_kernels/`` are in use, and a tree is recognised by what both have
(the masked and the upper-triangular scaled softmax):

- the current one (microsoft/Megatron-DeepSpeed since 2023): three scaled softmax kernels, built when
  ``--masked-softmax-fusion`` is on;
- the older one (BLOOM-era trees, bigscience-workshop/Megatron-DeepSpeed, and site ports of it): the masked
  and upper-triangular softmax, no ``scaled_softmax.cpp``, and a mixed-precision fused layer norm
  (``layer_norm_cuda.cpp`` + ``layer_norm_cuda_kernel.cu``) that its loader builds at every start-up.

:func:`kernels` lists the ones a tree has; a kernel is built when both its files are there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from porter.components import jit
from ops_prebuild.source import Source
from porter.components.base import Component

KERNEL_DIR = "megatron/fused_kernels"
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
class Kernel:
    """One fused kernel Megatron JIT-builds at start-up."""

    module: str
    """The top-level module Megatron imports (``cpp_extension.load(name=...)``)."""
    sources: tuple[str, ...]
    """File names in :data:`KERNEL_DIR`: the binding, then the device code."""
    cuda_flags: tuple[str, ...]
    rocm_flags: tuple[str, ...]


def _softmax(name: str) -> Kernel:
    return Kernel(f"{name}_cuda", (f"{name}.cpp", f"{name}_cuda.cu"), CUDA_FLAGS, ROCM_FLAGS)


KNOWN_KERNELS: tuple[Kernel, ...] = (
    _softmax("scaled_upper_triang_masked_softmax"),
    _softmax("scaled_masked_softmax"),
    _softmax("scaled_softmax"),
    # the older generation's fused layer norm: its loader adds -maxrregcount=50 (nvcc only); no ROCm branch
    Kernel("fused_mix_prec_layer_norm_cuda", ("layer_norm_cuda.cpp", "layer_norm_cuda_kernel.cu"),
           ("-O3", "--use_fast_math", "-maxrregcount=50"), ("-O3",)),
)
COMMON = ("scaled_upper_triang_masked_softmax_cuda", "scaled_masked_softmax_cuda")
"""The kernels both generations have: a tree without them is not a Megatron-DeepSpeed tree."""


def kernels(tree: Path) -> tuple[Kernel, ...]:
    """The fused kernels this tree has: those whose device code is there, each with the files of it that are."""
    folder = tree / KERNEL_DIR
    return tuple(replace(k, sources=tuple(f for f in k.sources if (folder / f).is_file()))
                 for k in KNOWN_KERNELS if (folder / k.sources[-1]).is_file())


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
             tuple(k.module for k in KNOWN_KERNELS)),
    JitGuard("make", "megatron/data/dataset_utils.py", "porter: the prebuilt helpers, never make",
             "dataset-helpers-prebuilt", (HELPERS_MODULE,)),
)


def is_tree(tree: Path) -> bool:
    """A Megatron-DeepSpeed tree of either generation: its fused kernels' loader and the kernels both have."""
    return (tree / KERNEL_DIR / "__init__.py").is_file() and set(COMMON) <= {k.module for k in kernels(tree)}


class MegatronComponent(Component, jit.NoSites):
    name = "megatron-deepspeed"
    title = "Megatron-DeepSpeed"
    dists: tuple[str, ...] = (DIST,)
    def resolve(self, raw: jit.Raw, at: jit.At, ctx: jit.Audit) -> jit.Site | None:
        """(JitSites) A start-up compile site its port guards (:data:`JIT_GUARDS`): covered by the installed prebuilt modules,
        guarded without them, or compiling when the tree is not ported."""
        guard = next((g for g in JIT_GUARDS if g.kind == raw.kind and at.rel.endswith(g.file)), None)
        if guard is None:
            return None
        modules = guard.modules
        # the fused kernels' loader loads the kernels whose sources sit beside it (each generation has its own)
        if at.path is not None and guard.file == f"{KERNEL_DIR}/__init__.py":
            modules = tuple(k.module for k in KNOWN_KERNELS if (at.path.parent / k.sources[-1]).is_file()) or modules
        if guard.marker not in at.text:
            return at.site(raw, "compiles", f"not patched: 'porter port {self.name}' applies {guard.patch}, which "
                                            f"imports the prebuilt {', '.join(modules)} instead")
        have = ctx.target.modules if ctx.target else {}
        missing = [m for m in modules if m not in have]
        if not missing:
            return at.site(raw, "covered", f"porter's {guard.patch} imports the prebuilt module(s), installed from "
                                           f"{', '.join(sorted({have[m] for m in modules}))}", ", ".join(modules))
        return at.site(raw, "guarded", f"porter's {guard.patch} imports {', '.join(missing)} instead of compiling, but "
                                       f"{ctx.python} has no such module: start-up stops with an error naming 'porter "
                                       f"port {self.name}'; install the wheel it builds", ", ".join(modules))

    def recognise(self, tree: Path) -> Source | None:
        """A tree of either generation, with its MAJOR.MINOR.PATCH from megatron/core/package_info.py ('' when the
        tree has no such file)."""
        if not is_tree(tree):
            return None
        info = tree / PACKAGE_INFO
        text = info.read_text(errors="replace") if info.is_file() else ""
        parts = [re.search(rf"^{k}\s*=\s*(\d+)", text, re.M) for k in ("MAJOR", "MINOR", "PATCH")]
        return Source(self.name, ".".join(m.group(1) for m in parts if m) if all(parts) else "", tree)


MEGATRON = MegatronComponent()
