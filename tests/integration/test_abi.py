"""porter install reads each wheel's shared objects (ELF) before installing and refuses one that would not load
on the node: a DeepSpeed op compiled in Debian sid's userspace (GCC 16: it needs CXXABI_1.3.15) against this
host's older libstdc++ (Debian 12, GCC 12); the same wheel passes against sid's and trixie's userspaces, and a
wheel built here passes against sid's. All dry runs: the check comes before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_install import cpu_so, wheelhouse  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.rocm7, pytest.mark.slow]


def porter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True, timeout=900)


def test_a_wheel_from_a_newer_userspace_is_refused_before_install(rocm7: Path, trixie: Path, deepspeed_sdist: Path,
                                                                  wheelhouse: Path, tmp_path: Path) -> None:  # noqa: F811
    profile = tmp_path / "sid-cpu.toml"
    profile.write_text(f'kind = "cpu"\ndescription = "sid\'s GCC, in the ROCm 7.2 chroot"\ncompiler = "g++"\n'
                       f'cxx = "g++"\ncpu_isa = "x86-64-v2"\nlauncher = ["chroot", "{rocm7}"]\n')
    wh = tmp_path / "sid-wheels"
    res = porter("ops", "build", "--source", str(deepspeed_sdist), "-t", str(profile), "--ops", "cpu_lion",
                 "-o", str(wh))
    assert res.returncode == 0, res.stderr[-3000:]
    (whl,) = wh.glob("deepspeed-*.whl")
    refused = porter("install", str(wh), "--python", sys.executable, "--dry-run")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert f"{whl.name}: deepspeed/ops/lion/cpu_lion_op" in refused.stderr
    assert "needs CXXABI_1.3.15 from libstdc++.so.6; this host's" in refused.stderr
    assert "has up to CXXABI_1.3.13" in refused.stderr and "TIP:" in refused.stderr
    assert "pip" not in refused.stdout  # refused before the pip command
    for root in (rocm7, trixie):  # sid's own userspace, and trixie's (GCC 14 has CXXABI_1.3.15)
        ok = porter("install", str(wh), "--python", sys.executable, "--node-root", str(root), "--dry-run", "--json")
        assert ok.returncode == 0, ok.stderr[-3000:]
        assert [w["wheel"] for w in json.loads(ok.stdout)["installed"]] == []  # a dry run installs nothing
    # the reverse: a wheel compiled here loads in sid's newer userspace
    back = porter("install", str(wheelhouse), "--python", sys.executable, "--node-root", str(rocm7), "--dry-run")
    assert back.returncode == 0 and "would install deepspeed" in back.stdout, back.stderr[-3000:]
