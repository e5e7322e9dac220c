"""Integration fixtures shared across files: the real CPU-op DeepSpeed wheel, built once per worker; CPU torch;
the one-node Slurm cluster (started once per session, stopped after)."""
from __future__ import annotations

import fcntl
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import FIXTURES, require
from tests.slurm_cluster import ClusterUnavailable, SlurmCluster, one_node_slurm

T = TypeVar("T")

CPU_OPS = ("cpu_adam", "cpu_adagrad", "cpu_lion")
SMALL_OPS = FIXTURES / "ds-small-ops"
SLOW_CXX = """#!/bin/sh
# g++, but while {marks}/compile (or {marks}/link) holds a number, a compile (or a link) first leaves a mark
# ({marks}/compile.PID) and sleeps that many seconds: a window to kill porter in, or to watch its progress in,
# that costs no CPU
case " $* " in *" -shared "*) step=link ;; *" -c "*) step=compile ;; *) step=other ;; esac
if [ -s "{marks}/$step" ]; then : > "{marks}/$step.$$"; sleep "$(cat "{marks}/$step")"; fi
exec g++ "$@"
"""


def small_ops_sdist(sdist: Path, dest: Path) -> Path:
    """A copy of the real DeepSpeed ``sdist`` (same name, in ``dest``) whose cpu_adam and cpu_lion sources are
    tests/fixtures/ds-small-ops: every builder, flag and file of the release, with units that compile in a second.
    For the tests of porter's own mechanics (progress, kills, locks, shards); see that folder's README."""
    import re
    import tarfile

    small = re.compile(r"^[^/]+/(?:deepspeed/ops/)?csrc/(?:adam|lion)/cpu_(?:adam|lion)(_impl)?\.cpp$")
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / sdist.name
    with tarfile.open(sdist) as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            m = small.match(member.name)
            if not m:
                dst.addfile(member, src.extractfile(member) if member.isfile() else None)
                continue
            data = (SMALL_OPS / ("impl.cpp" if m.group(1) else "binding.cpp")).read_bytes()
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return out


def slow_cpu_profile(where: Path) -> tuple[Path, Path]:
    """A cpu toolchain profile (in ``where``) whose compiler is g++ behind SLOW_CXX, and its marks folder: write
    a number of seconds to ``marks/"compile"`` (or ``"link"``) to make each compile (or link) wait that long."""
    marks = where / "marks"
    marks.mkdir(parents=True)
    return cpu_profile(where, "slow-g++", SLOW_CXX.format(marks=marks)), marks


def cpu_profile(where: Path, name: str, script: str) -> Path:
    """A cpu toolchain profile (in ``where``) whose compiler is ``script``, written as ``where/name``."""
    cxx = where / name
    cxx.write_text(script)
    cxx.chmod(0o755)
    profile = where / f"{name}.toml"
    profile.write_text(f'kind = "cpu"\ncompiler = "{cxx}"\ncxx = "{cxx}"\ncpu_isa = "x86-64-v2"\n')
    return profile


def wait_for(predicate: Callable[[], T], seconds: float, every: float = 0.2) -> T:
    """Ask ``predicate`` until it answers something true or ``seconds`` pass; its last answer."""
    deadline = time.monotonic() + seconds
    while not (answer := predicate()) and time.monotonic() < deadline:
        time.sleep(every)
    return answer


def sigkill(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc`` (as an out-of-memory kill or a 'kill -9' would) unless it has ended, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def run_porter(*args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="session")
def ccache_remote(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a build that shares one ccache remote storage of this session (porter's
    ``PORTER_CACHE_REMOTE``, as a CI's nodes share one): it takes from there what another build of the session
    compiled, on any pytest-xdist worker, and adds what it compiles. The results are the same, only sooner. Only
    the builds whose test passes it use it: tests that kill, time or count compiles start cold."""
    folder = (xdist_shared_dir(tmp_path_factory) or tmp_path_factory.getbasetemp()) / "ccache-remote"
    folder.mkdir(exist_ok=True)
    return {"PORTER_CACHE_REMOTE": f"file://{folder}"}


@pytest.fixture(scope="session")
def cpu_ops_wheelhouse(tmp_path_factory: pytest.TempPathFactory, deepspeed_sdist: Path,
                       ccache_remote: dict[str, str]) -> Path:
    """`porter ops build` of the three CPU ops of the real DeepSpeed 0.19.8 sdist with the cpu profile, in this
    worker's porter cache (the tests that rebuild it, warm, read that cache).

    With pytest-xdist each worker builds it, one after the other, through the session's ccache remote: the first
    compiles, the next ones take its objects from there."""
    wheelhouse = tmp_path_factory.mktemp("wheelhouse")
    with ExitStack() as stack:
        shared = xdist_shared_dir(tmp_path_factory)
        if shared is not None:
            lock = stack.enter_context((shared / "cpu-ops-wheelhouse.lock").open("w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "--toolchain", "cpu",
                         "--ops", ",".join(CPU_OPS), "-o", str(wheelhouse), "--json", env=ccache_remote)
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    # "cached" when an earlier build of the same target left the objects (ninja rebuilds nothing)
    assert sorted(o["name"] for o in doc["ops"]) == sorted(CPU_OPS)
    assert all(o["status"] in ("built", "cached") for o in doc["ops"]), doc["ops"]
    return wheelhouse


def xdist_shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """A folder of this session that every pytest-xdist worker sees (the controller's temp folder, the parent of
    each worker's own), or None when the tests run in one process."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return tmp_path_factory.getbasetemp().parent


@pytest.fixture(scope="session")
def deepspeed_small_sdist(tmp_path_factory: pytest.TempPathFactory, deepspeed_sdist: Path) -> Path:
    """The real DeepSpeed 0.19.8 sdist with small cpu_adam and cpu_lion sources (:func:`small_ops_sdist`)."""
    return small_ops_sdist(deepspeed_sdist, tmp_path_factory.mktemp("small-ops"))


@pytest.fixture(scope="session")
def torch_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with CPU torch 2.13.0 (pip takes it from local disk); returns its python."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    py = root / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True, capture_output=True)
    return py


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A one-node Slurm on this machine (tests/slurm_cluster.py); skipped (or failed with PORTER_REQUIRE_ALL=1)
    when it cannot be installed or started."""
    root = tmp_path_factory.mktemp("slurm")
    cm = one_node_slurm(root)
    try:
        cluster = cm.__enter__()
    except ClusterUnavailable as exc:
        require("a one-node Slurm cluster", False, str(exc))
        return
    try:
        yield cluster
    finally:
        cm.__exit__(None, None, None)
