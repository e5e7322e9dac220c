"""`porter toolchain check` with the real compilers."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porter.codeobjects import archs_in
from tests.conftest import require


def porter(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True,
                          env={**os.environ, "HIP_PLATFORM": "amd", **(env or {})}, timeout=900)


@pytest.mark.rocm
def test_debian_rocm_passes_with_gfx90a_and_gfx908_inside(hipcc: str, tmp_path: Path) -> None:
    res = porter("toolchain", "check", "debian-rocm", "--json", "--keep", str(tmp_path))
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ok"] and [a["arch"] for a in doc["archs"]] == ["gfx90a", "gfx908"]
    so = tmp_path / "libporter_check.so"
    assert archs_in(so) == ["gfx908", "gfx90a"]
    # cross-check porter's ELF reader against ROCm's own tool
    listing = subprocess.run(["roc-obj-ls", str(so)], capture_output=True, text=True).stdout
    assert "gfx90a" in listing and "gfx908" in listing


@pytest.mark.rocm
def test_gfx942_on_debian_hip_523_fails_fast_naming_arch_and_version(hipcc: str) -> None:
    start = time.monotonic()
    res = porter("toolchain", "check", "debian-rocm", "--arch", "gfx942")
    elapsed = time.monotonic() - start
    assert res.returncode == 1
    assert "gfx942" in res.stderr and "5.2.21153" in res.stderr
    assert "invalid target ID 'gfx942'" in res.stdout  # the compiler's own message
    assert elapsed < 60


@pytest.mark.trixie
def test_trixie_rocm_57_compiles_mi250x_and_mi300x(trixie: Path) -> None:
    res = porter("toolchain", "check", "debian-trixie-rocm", "--json", env={"PORTER_TRIXIE_ROOT": str(trixie)})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["compiler"]["version"].startswith("5.7.")
    assert sorted(c["target"] for c in doc["code_objects"]) == ["gfx90a", "gfx942"]


@pytest.mark.cuda
def test_cuda_h100_profile_with_nvcc(tmp_path: Path) -> None:
    require("nvcc", shutil.which("nvcc") is not None, "install the CUDA toolkit")
    res = porter("toolchain", "check", "cuda-h100", "--keep", str(tmp_path))
    assert res.returncode == 0, res.stderr + res.stdout
    assert archs_in(tmp_path / "libporter_check.so") == ["sm_90"]


def test_cpu_profile_and_a_bad_isa() -> None:
    assert porter("toolchain", "check", "cpu").returncode == 0
    res = porter("toolchain", "check", "cpu", env={"PORTER_CPU_ISA": "x86-64-v9"})
    assert res.returncode == 1 and "x86-64-v9" in res.stdout


def test_detect_proposes_but_writes_only_when_asked(hipcc: str, tmp_path: Path) -> None:
    out = tmp_path / "site.toml"
    res = porter("toolchain", "detect", "--json", "-o", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["programs"]["hipcc"]["version"].startswith("5.2.")
    assert doc["programs"]["g++"]["version"].split(".")[0].isdigit()
    assert doc["gpus"] == [] and any("no GPU visible" in n for n in doc["notes"])
    assert doc["proposal"]["kind"] == "rocm"
    # the written proposal is a valid profile that loads (and would be used only when passed)
    show = porter("toolchain", "show", str(out), "--json")
    assert show.returncode == 0, show.stderr
    assert json.loads(show.stdout)["kind"] == "rocm"
