"""porter's emulated HIP target: hipified kernels compiled by the host compiler and run on the CPU with wavefronts of
32 or 64 lanes, so what a kernel computes on a 64-lane wavefront can be checked with no AMD GPU.

The C++ side is header-only, under ``include/``: ``porter_emu/runtime.h`` (each GPU thread a fiber; wavefronts,
barriers, shuffles, votes, tiles; what it does not model is an error naming the kernel, file and line), the HIP
headers kernels include (``hip/hip_runtime.h``, ``hip_fp16.h``, ``hip_bf16.h``, ``hip_cooperative_groups.h``) and
what a hipified torch extension asks of ATen's and c10's HIP side (streams, guards, device properties), for one
emulated device whose memory is the host's. ``porter_emu/prelude.h`` is taken in before every unit, so the sources
are compiled as porter ships them, unchanged.

The toolchain kind ``emulated`` (presets ``emulate-wave64``, ``emulate-wave32``) builds with it on the same engine,
from the same hipified sources, into CPU modules that install and verify like any other; ``porter emulate check``
runs the numeric checks (:mod:`porter.emulate.checks`) on what it built.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

INCLUDE_DIR = Path(__file__).with_name("include")
"""porter's HIP-on-CPU headers: first on an emulated unit's include path, before torch's HIP view."""
PRELUDE = "porter_emu/prelude.h"

# what hipcc and nvcc take that the host compiler does not (an op's device flags are written for them)
_DEVICE_ONLY_PREFIXES = ("--offload", "--gpu-max", "-fgpu-", "-fno-gpu-", "--amdgpu", "-munsafe-fp-atomics",
                         "-fcuda-", "-fhip-", "-fno-hip-", "--cuda-", "-Xclang", "--hip-", "-mcode-object",
                         "-ffp-contract=fast-honor-pragmas")
_WITH_VALUE = ("-mllvm", "-Xcompiler")


@cache
def revision() -> str:
    """A digest of porter's HIP-on-CPU headers and link step: part of the link step's command, so a build made
    with other headers or another link step is linked again."""
    h = hashlib.sha256()
    for path in sorted([*INCLUDE_DIR.rglob("*.h"), Path(__file__).with_name("shared.py")]):
        h.update(path.relative_to(INCLUDE_DIR.parent).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def device_flags(args: tuple[str, ...] | list[str]) -> list[str]:
    """An op's device-compiler flags, less those only a GPU compiler knows (``-mllvm X``, ``--offload-arch``,
    ``-fgpu-rdc``, ...): what the host compiler is given for the same unit."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in _WITH_VALUE:
            skip = True
            continue
        if a.startswith(_DEVICE_ONLY_PREFIXES):
            continue
        out.append(a)
    return out


def compile_flags(wave: int) -> list[str]:
    """What every unit of an emulated build gets: the wavefront size, porter's headers and the prelude."""
    return [f"-DPORTER_EMU_WAVE={wave}", f"-I{INCLUDE_DIR}", "-include", PRELUDE]
