"""porter ops build --shards 2 --slurm through a real one-node Slurm (the session's cluster): two array tasks
compile cpu_lion's two TUs into the shared build folder, the link job waits on afterok, and its wheel is the
wheel a local build of the same op writes, byte for byte. The DeepSpeed builds here have small op sources
(``small_ops_sdist``): what is tested is the array, the shared folder and the link job; that shards of the real
sources link to a local build's bytes is tests/integration/test_shards.py's first test."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.integration.conftest import run_porter, slow_cpu_profile
from tests.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _scontrol(cluster: SlurmCluster, job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                          env={**cluster.env}, check=False).stdout


def test_two_shards_on_slurm_then_the_link_job_equal_a_local_build(slurm: SlurmCluster, deepspeed_small_sdist: Path,
                                                                   tmp_path: Path) -> None:
    env = {**slurm.env, "PORTER_CACHE_DIR": str(tmp_path / "cache")}
    base = ("ops", "build", "--source", str(deepspeed_small_sdist), "-t", "cpu", "--ops", "cpu_lion")
    d = tmp_path / "shared"
    res = run_porter(*base, "--shards", "2", "--slurm", "--dir", str(d), "-o", str(tmp_path / "a"),
                     "--cpus-per-task", "1", "--time", "20:00", "--json", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["shards"] == 2 and doc["compile_steps"] == 2 and doc["wheelhouse"] == str(tmp_path / "a")
    assert doc["scripts"]["shard"] == str(d / "jobs" / "shard.sh")
    # the link job was submitted after the array, depending on it (whatever state Slurm shows it in by now); that
    # Slurm held it back until both shards had finished is checked below, from the results' times
    assert f"--dependency=afterok:{doc['array_job']}" in doc["submission"]["link_argv"], doc["submission"]
    assert f"JobId={doc['link_job']} " in _scontrol(slurm, doc["link_job"])
    assert "--hold" in doc["submission"]["array_argv"] and "--array=0-1%2" in doc["submission"]["array_argv"]
    deadline = time.monotonic() + 600
    while not (d / "results" / "link.exit").exists():
        if time.monotonic() > deadline:
            logs = "".join(p.read_text()[-1500:] for p in sorted((d / "logs").glob("*.log")))
            pytest.fail(f"no link result after 600 s\n{logs}")
        time.sleep(1)
    st = run_porter("ops", "status", str(d), "--json", env=env)
    assert st.returncode == 0, st.stderr[-2000:]
    status = json.loads(st.stdout)
    assert status["state"] == "finished" and [t["status"] for t in status["tasks"]] == ["done", "done"]
    assert [t["objects"] for t in status["tasks"]] == [1, 1]  # one TU per shard
    assert (d / "logs" / "shard-0.log").is_file() and (d / "logs" / "shard-1.log").is_file()  # array tasks ran
    # the link ran after both shards had recorded their exit codes
    assert max((d / "results" / f"shard-{i}.exit").stat().st_mtime for i in (0, 1)) \
        <= (d / "results" / "link.json").stat().st_mtime
    wheel = Path(status["link"]["wheel"])
    assert wheel.parent == tmp_path / "a" and wheel.is_file()
    # the same build here, in one run, from scratch: an empty build folder and an empty compiler cache of
    # its own (--no-cache would give other bytes: ccache's base dir makes the debug info's paths relative)
    shutil.rmtree(doc["build_dir"])
    local = run_porter(*base, "--cache-dir", str(tmp_path / "ccache-local"), "-o", str(tmp_path / "b"), "--json",
                       env=env)
    assert local.returncode == 0, local.stderr[-3000:]
    ldoc = json.loads(local.stdout)
    assert ldoc["cache"]["misses"] >= 2 and ldoc["cache"]["hits"] == 0  # compiled, not taken from the shards
    other = Path(ldoc["wheel"])
    assert other.name == wheel.name and _digest(other) == _digest(wheel)


@pytest.mark.rocm7
def test_flash_attn_compile_only_in_two_shards_on_slurm(slurm: SlurmCluster, rocm7: Path, tmp_path: Path) -> None:
    """FlashAttention's CK compile-only as a job array: two CK instances, one per shard, compiled for gfx942 in the
    ROCm 7.2 chroot into one shared build folder; the job after them reports both units compiled. The instances
    are the CK-shaped fixture's (made by its stand-in of the tree's generator): what is tested is the array, the
    shared folder and the report; that real CK instances compile is test_wheels_compile's (two of the sdist)."""
    env = {**slurm.env, "PORTER_CACHE_DIR": str(tmp_path / "cache"), "PORTER_ROCM7_ROOT": str(rocm7)}
    d = tmp_path / "shared"
    res = run_porter("wheel", "flash-attn", "--source", str(FIXTURES / "flash-attn-ck-frontend"), "-t",
                     "debian-rocm7", "--arch", "gfx942", "--compile-only", "--units", "fmha_*_fixture", "--instances",
                     "2", "--drop-flag=-amdgpu-early-inline-all", "--shards", "2", "--slurm", "--dir", str(d), "-o",
                     str(tmp_path / "w"), "--cpus-per-task", "1", "--time", "30:00", "--wait", "--json", env=env,
                     timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:] + "".join(p.read_text()[-2000:]
                                                             for p in sorted((d / "logs").glob("*.log")))
    doc = json.loads(res.stdout)
    assert doc["shards"] == 2 and doc["compile_steps"] == 2 and doc["status"]["state"] == "finished"
    assert [t["objects"] for t in doc["status"]["tasks"]] == [1, 1]
    assert "--shard" in (d / "jobs" / "shard.sh").read_text()
    assert "--last" in (d / "jobs" / "link.sh").read_text()
    build = json.loads((d / "request.json").read_text())  # what every job ran
    assert build["options"]["compile_only"] is True and build["last"] == {"report_only": True}
    report = json.loads((d / "results" / "link.json").read_text())
    assert report["compile_only"] is True and not report.get("shard")
    units = [tu for op in report["compiled"] for tu in op["tus"]]
    assert len(units) == 2 and all(op["archs"] == {"gfx942": "compiled"} for op in report["compiled"])
    # each unit was compiled by an array task; the report job compiled nothing
    shard_objects = [json.loads((d / "results" / f"shard-{i}.json").read_text())["shard"]["objects"] for i in (0, 1)]
    assert sorted(len(o) for o in shard_objects) == [1, 1] and shard_objects[0] != shard_objects[1]
    assert all(Path(o).is_file() for objs in shard_objects for o in objs)
    assert [op["status"] for op in report["ops"]] == ["cached"] * len(report["ops"])


def test_a_shard_task_requeued_mid_compile_resumes_and_the_link_follows(slurm: SlurmCluster,
                                                                        deepspeed_small_sdist: Path,
                                                                        tmp_path: Path) -> None:
    """Issue 22: Slurm requeues an array task (preemption, a node failure, 'scontrol requeue'): the task is
    killed mid-compile and started again. Its rerun takes the shard's lock again, compiles what is missing and
    records its objects; the link job, held by afterok until then, links them into the wheel. (Each compile waits
    30 s until the requeue: the window it lands in.)"""
    env = {**slurm.env, "PORTER_CACHE_DIR": str(tmp_path / "cache")}
    profile, marks = slow_cpu_profile(tmp_path / "bin")
    (marks / "compile").write_text("30")
    base = ("ops", "build", "--source", str(deepspeed_small_sdist), "-t", str(profile), "--ops", "cpu_lion",
            "--no-cache")
    d = tmp_path / "shared"
    res = run_porter(*base, "--shards", "2", "--slurm", "--dir", str(d), "-o", str(tmp_path / "a"),
                     "--cpus-per-task", "1", "--time", "20:00", "--json", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    task = f"{doc['array_job']}_0"
    log0 = d / "logs" / "shard-0.log"
    deadline = time.monotonic() + 600
    while "COMPILE" not in (log0.read_text() if log0.is_file() else "") and "compiling" not in \
            (log0.read_text() if log0.is_file() else ""):
        assert time.monotonic() < deadline, "shard 0 never started compiling"
        time.sleep(0.5)
    requeue = subprocess.run(["scontrol", "requeue", task], capture_output=True, text=True, env={**os.environ,
                                                                                               **slurm.env})
    (marks / "compile").unlink()
    assert requeue.returncode == 0, requeue.stderr
    deadline = time.monotonic() + 900
    while not (d / "results" / "link.exit").exists():
        if time.monotonic() > deadline:
            logs = "".join(p.read_text()[-1500:] for p in sorted((d / "logs").glob("*.log")))
            pytest.fail(f"no link result after 900 s\n{logs}\n{_scontrol(slurm, task)}")
        time.sleep(1)
    assert (d / "results" / "link.exit").read_text().strip() == "0", (d / "logs" / "link.log").read_text()[-3000:]
    assert "Restarts=1 " in _scontrol(slurm, task), _scontrol(slurm, task)  # it was killed and ran again
    st = run_porter("ops", "status", str(d), "--json", env=env)
    assert st.returncode == 0, st.stderr[-2000:]
    status = json.loads(st.stdout)
    assert status["state"] == "finished" and [t["status"] for t in status["tasks"]] == ["done", "done"]
    (wheel,) = (tmp_path / "a").glob("*.whl")
    assert Path(status["link"]["wheel"]) == wheel  # (that shards link to a local build's bytes: the test above)
