"""FlashAttention's ck-rocm7 patch with ROCm 7.2's clang (the sid chroot): a composable_kernel header of the
pre-ROCm-7 shape fails to compile there ("constexpr function never produces a constant expression"), and the
patched copy compiles for CDNA (gfx90a, gfx942, gfx950: 64 lanes) and RDNA (gfx1100: 32 lanes), each checked by a
static_assert in the unit. Device code compiled only: no GPU here, nothing runs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ops_prebuild.source import Source, build_sets, patched_source
from tests.conftest import FIXTURES

pytestmark = [pytest.mark.integration, pytest.mark.rocm7]

UNIT = "csrc/flash_attn_ck/tile_shape.hip"
INCLUDE = "csrc/composable_kernel/include"


def _compile(rocm7: Path, tree: Path, arch: str) -> subprocess.CompletedProcess[str]:
    inside = "/" + str(tree.relative_to(rocm7))
    return subprocess.run(["chroot", str(rocm7), "clang++-22", "-x", "hip", "-std=c++17", f"--offload-arch={arch}",
                           "--cuda-device-only", "-c", "-I", f"{inside}/{INCLUDE}", f"{inside}/{UNIT}",
                           "-o", f"{inside}/{arch}.o"], capture_output=True, text=True)


def test_the_patched_header_compiles_for_every_arch_where_the_original_cannot(rocm7: Path) -> None:
    work = rocm7 / "tmp" / f"porter-ck-rocm7-{id(rocm7)}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        tree = work / "fa"
        shutil.copytree(FIXTURES / "flash-attn-ck-pre-rocm7", tree)
        before = _compile(rocm7, tree, "gfx942")
        assert before.returncode != 0 and "never produces a constant expression" in before.stderr, before.stderr[-2000:]
        patched = patched_source(Source("flash-attn", "2.6.3", tree, str(tree)),
                                 build_sets("flash-attn", "rocm", tree), work / "cache").source.tree
        for arch in ("gfx90a", "gfx942", "gfx950", "gfx1100"):
            got = _compile(rocm7, patched, arch)
            assert got.returncode == 0, f"{arch}: {got.stderr[-2000:]}"
            assert (patched / f"{arch}.o").stat().st_size > 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
