"""ROCm 7.2 from Debian experimental (the sid chroot made by ``make chroot-rocm7``): MI355X's gfx950.

The chroot tier follows the trixie one: skipped when the chroot is absent, a failure under
PORTER_REQUIRE_ALL=1 (CI). hipcc 7 reads /proc/self/exe, so a chroot without /proc counts as absent
(``make chroot-rocm7`` mounts it, also when the chroot already exists).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porter.codeobjects import archs_in

pytestmark = [pytest.mark.integration, pytest.mark.rocm7]

ROCM7_ARCHS = ["gfx90a", "gfx942", "gfx950"]


def porter(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True,
                          env={**os.environ, "HIP_PLATFORM": "amd", **(env or {})}, timeout=900)


def test_rocm72_compiles_mi250x_mi300x_and_mi355x_into_one_object(rocm7: Path, tmp_path: Path) -> None:
    res = porter("toolchain", "check", "debian-rocm7", "--json", "--keep", str(tmp_path),
                 env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr + res.stdout
    doc = json.loads(res.stdout)
    assert doc["ok"] and doc["version_problem"] is None
    assert doc["compiler"]["version"].startswith("7.2.")
    assert [a["arch"] for a in doc["archs"]] == ROCM7_ARCHS and all(a["ok"] for a in doc["archs"])
    assert sorted(c["target"] for c in doc["code_objects"]) == ROCM7_ARCHS
    assert doc["missing"] == []
    # the kept shared object, read again by porter's own ELF reader
    assert archs_in(tmp_path / "libporter_check.so") == ROCM7_ARCHS


@pytest.mark.trixie
def test_gfx950_on_trixie_rocm57_fails_fast_naming_the_arch(trixie: Path) -> None:  # fixture: tests/conftest.py
    start = time.monotonic()
    res = porter("toolchain", "check", "debian-trixie-rocm", "--arch", "gfx950", "--json",
                 env={"PORTER_TRIXIE_ROOT": str(trixie)})
    elapsed = time.monotonic() - start
    assert res.returncode == 1, res.stderr + res.stdout
    doc = json.loads(res.stdout)
    assert not doc["ok"] and doc["compiler"]["version"].startswith("5.7.")
    [arch] = doc["archs"]
    assert arch["arch"] == "gfx950" and not arch["ok"]
    assert "gfx950" in arch["message"]  # clang 17's own "invalid target ID 'gfx950'"
    assert doc["code_objects"] == [] and doc["shared_object"] is None
    assert elapsed < 60
