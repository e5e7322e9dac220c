"""The arch table: AMD gfx targets (wavefront size, products) and CUDA ``sm_XX`` targets.

Wavefront sizes are facts of the ISA: CDNA (gfx9xx data-center parts) runs 64-wide waves, RDNA
(gfx10xx/11xx/12xx) 32-wide. A build bakes one wavefront size in, so a profile may not mix them.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from porter.errors import ConfigError


HOST_ONLY = "--offload-host-only"
"""clang's flag for a HIP unit's host part alone: no device code, whatever its ``--offload-arch`` flags say."""
DEVICE_ONLY = "--offload-device-only"
"""clang's flag for a HIP unit's device code alone (with one ``--offload-arch``: that arch's offload bundle)."""


@dataclass(frozen=True)
class GpuArch:
    name: str                 # gfx90a, sm_90, wave64
    vendor: str               # amd | nvidia | emulated
    wavefront: int            # 64 or 32 (warp size 32 for NVIDIA)
    products: tuple[str, ...]
    features: tuple[str, ...] = ()   # target features this arch accepts (xnack, sramecc)


_AMD: dict[str, tuple[int, tuple[str, ...], tuple[str, ...]]] = {
    "gfx900": (64, ("Radeon Instinct MI25", "Vega 10"), ("xnack",)),
    "gfx906": (64, ("Radeon Instinct MI50", "MI60", "Radeon VII"), ("xnack", "sramecc")),
    "gfx908": (64, ("Instinct MI100",), ("xnack", "sramecc")),
    "gfx90a": (64, ("Instinct MI250X", "MI250", "MI210"), ("xnack", "sramecc")),
    "gfx940": (64, ("Instinct MI300 (early)",), ("xnack", "sramecc")),
    "gfx941": (64, ("Instinct MI300 (early)",), ("xnack", "sramecc")),
    "gfx942": (64, ("Instinct MI300X", "MI300A", "MI325X"), ("xnack", "sramecc")),
    "gfx950": (64, ("Instinct MI350X", "MI355X"), ("xnack", "sramecc")),
    "gfx1030": (32, ("Radeon PRO W6800", "RX 6800/6900"), ()),
    "gfx1100": (32, ("Radeon PRO W7900", "RX 7900"), ()),
    "gfx1101": (32, ("Radeon PRO W7800", "RX 7800"), ()),
    "gfx1102": (32, ("RX 7600",), ()),
    "gfx1200": (32, ("RX 9060",), ()),
    "gfx1201": (32, ("RX 9070",), ()),
}

_CUDA: dict[str, tuple[str, ...]] = {
    "sm_70": ("V100",), "sm_75": ("T4",), "sm_80": ("A100",), "sm_86": ("A10", "RTX 30xx"),
    "sm_89": ("L40", "RTX 40xx"), "sm_90": ("H100", "H200"), "sm_90a": ("H100 (arch-specific)",),
    "sm_100": ("B200",), "sm_100a": ("B200 (arch-specific)",), "sm_120": ("RTX 50xx",),
}

# AMD targets with bf16 in hardware (CDNA2 and later, RDNA3 and later): DeepSpeed gates its bf16 kernels
# on -DBF16_AVAILABLE, which it passes only on CUDA (compute capability 8+); porter passes it on ROCm
# when every arch of the profile is here.
BF16_AMD = frozenset({"gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1102",
                      "gfx1200", "gfx1201"})

# porter's emulated HIP target (porter/emulate): hipified kernels run on the CPU with wavefronts of this many lanes
_EMULATED: dict[str, tuple[int, tuple[str, ...]]] = {
    "wave64": (64, ("emulated on the CPU, 64-lane wavefronts as on CDNA (gfx90a, gfx942, gfx950)",)),
    "wave32": (32, ("emulated on the CPU, 32-lane wavefronts as on RDNA and NVIDIA warps",)),
}

ARCHS: dict[str, GpuArch] = {
    **{n: GpuArch(n, "amd", w, p, f) for n, (w, p, f) in _AMD.items()},
    **{n: GpuArch(n, "nvidia", 32, p) for n, p in _CUDA.items()},
    **{n: GpuArch(n, "emulated", w, p) for n, (w, p) in _EMULATED.items()},
}

_FEATURE = re.compile(r"^(xnack|sramecc)([+-])$")


@dataclass(frozen=True)
class Target:
    """One requested target: an arch plus optional feature settings (``gfx90a:xnack-``)."""

    arch: GpuArch
    features: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        return ":".join((self.arch.name, *self.features))

    @property
    def name(self) -> str:
        return self.arch.name


def parse_target(spec: str) -> Target:
    """Parse ``gfx90a``, ``gfx90a:xnack-:sramecc+``, ``sm_90`` (``9.0`` and ``90`` also accepted)."""
    text = spec.strip()
    if re.fullmatch(r"\d+\.\d+a?", text):            # TORCH_CUDA_ARCH_LIST style: 9.0 -> sm_90
        text = "sm_" + text.replace(".", "")
    elif re.fullmatch(r"\d{2,3}a?", text):
        text = "sm_" + text
    name, *features = text.split(":")
    if (arch := ARCHS.get(name.lower())) is None:
        close = difflib.get_close_matches(name.lower(), ARCHS, n=3, cutoff=0.6)
        raise ConfigError(f"unknown GPU arch {spec!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                          hint="run 'porter toolchain list --archs' for the known archs")
    seen: set[str] = set()
    for feat in features:
        if not (m := _FEATURE.match(feat)):
            raise ConfigError(f"bad target feature {feat!r} in {spec!r}",
                              hint="features are xnack+/xnack-/sramecc+/sramecc-, e.g. gfx90a:xnack-")
        if m.group(1) not in arch.features:
            raise ConfigError(f"{arch.name} has no {m.group(1)} feature (in {spec!r})",
                              hint=f"{arch.name} accepts: {', '.join(arch.features) or 'no features'}")
        if m.group(1) in seen:
            raise ConfigError(f"feature {m.group(1)} given twice in {spec!r}")
        seen.add(m.group(1))
    return Target(arch, tuple(features))


def wavefront_of(targets: tuple[Target, ...]) -> int:
    """The single wavefront size of a set of AMD targets; mixing wave32 and wave64 is an error."""
    sizes = {t.arch.wavefront for t in targets}
    if len(sizes) > 1:
        wave64 = [t.spec for t in targets if t.arch.wavefront == 64]
        wave32 = [t.spec for t in targets if t.arch.wavefront == 32]
        raise ConfigError(
            f"wave64 archs ({', '.join(wave64)}) and wave32 archs ({', '.join(wave32)}) mixed in one profile: "
            "a build bakes one wavefront size into the kernels (DeepSpeed's hw_warp_size, ROCM_WAVEFRONT_SIZE)",
            hint="make one profile per wavefront size")
    return sizes.pop() if sizes else 64
