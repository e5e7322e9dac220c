"""The job porter launch write produces, run for real on the one-node Slurm with a CPU stand-in for training:
two ranks (torch.distributed, gloo) started by srun, ranks and world size from Slurm's env, an all-reduce,
exit 0; the preflight runs first on the node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm

SITE = """\
description = "this machine as a site: 2 CPU 'devices', no GPUs (a stand-in for the launch test)"
source = "written by tests/integration/test_launch_slurm.py"
[node]
gpus = 2
device_memory_gib = 16
arch = "gfx942"
cores = {cores}
cores_per_gcd = 1
local_dir = "{local}"
[runtime]
master_port = {port}
[runtime.env]
GLOO_SOCKET_IFNAME = "lo"
MASTER_ADDR = "127.0.0.1"
HSA_FORCE_FINE_GRAIN_PCIE = "1"
[scheduler]
time = "10:00"
request_gpus = false
"""

# Reads what Megatron-DeepSpeed would: its layout arguments and the rank env the job exports from Slurm's.
STANDIN = """\
import argparse, os, sys, torch, torch.distributed as dist
ap = argparse.ArgumentParser(allow_abbrev=False)
ap.add_argument("--tensor-model-parallel-size", type=int)
ap.add_argument("--pipeline-model-parallel-size", type=int)
ap.add_argument("--deepspeed_config")
ap.add_argument("--out")
args, _ = ap.parse_known_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert rank == int(os.environ["SLURM_PROCID"]) and world == int(os.environ["SLURM_NTASKS"])
assert world % (args.tensor_model_parallel_size * args.pipeline_model_parallel_size) == 0
assert os.path.isdir(os.environ["MIOPEN_USER_DB_PATH"]) and os.environ["HSA_FORCE_FINE_GRAIN_PCIE"] == "1"
dist.init_process_group("gloo", init_method="env://")
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(f"rank {rank}/{world} local {os.environ['LOCAL_RANK']} all-reduce {t.item()}", flush=True)
with open(f"{args.out}/rank{rank}.json", "w") as f:
    f.write('{"rank": %d, "world": %d, "sum": %s}' % (rank, world, t.item()))
dist.destroy_process_group()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_written_job_runs_two_gloo_ranks_after_the_preflight(slurm: SlurmCluster, torch_venv: Path,
                                                           tmp_path: Path) -> None:
    local = tmp_path / "node-local"
    local.mkdir()
    site = tmp_path / "here.toml"
    site.write_text(SITE.format(cores=max(2, slurm.cpus), local=local, port=_free_port()))
    (tmp_path / "standin.py").write_text(STANDIN)
    out = tmp_path / "out"
    out.mkdir()
    job = tmp_path / "job"
    res = subprocess.run([sys.executable, "-m", "porter", "launch", "write", "--site", str(site), "--layers", "2",
                          "--hidden", "64", "--heads", "2", "--seq", "128", "--vocab", "1024", "--nodes", "1",
                          "--tp", "2", "--python", str(torch_venv), "--entry", str(tmp_path / "standin.py"),
                          "--preflight-skip", "ops", "--preflight-skip", "archs", "-o", str(job), "--json",
                          "--", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["plan"]["tp"], doc["plan"]["pp"], doc["plan"]["dp"]) == (2, 1, 1)
    log = tmp_path / "job.log"
    run = subprocess.run(["sbatch", "--wait", "--parsable", f"--output={log}", str(job / "job.sbatch")],
                         capture_output=True, text=True, timeout=300, env={**os.environ, **slurm.env},
                         cwd=tmp_path)
    text = log.read_text() if log.exists() else ""
    assert run.returncode == 0, run.stderr + text
    ranks = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")), key=lambda d: d["rank"])
    assert ranks == [{"rank": 0, "world": 2, "sum": 3.0}, {"rank": 1, "world": 2, "sum": 3.0}]
    # the preflight ran first, on the node, and passed the checks that apply here
    pre = text.index("preflight ok for site here")
    assert pre < text.index("all-reduce 3.0")
    assert ": ok      env:" in text and ": ok      miopen:" in text and "skipped plugin" in text.replace("  ", " ")
    assert list(local.glob("*-miopen-*")), "MIOpen's DB folder was made on node-local storage"


def test_a_failing_preflight_stops_the_job_before_any_rank(slurm: SlurmCluster, torch_venv: Path,
                                                           tmp_path: Path) -> None:
    site = tmp_path / "here.toml"
    # MIOpen's DB under a file: the folder cannot be made, so the preflight fails and no rank starts
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    site.write_text(SITE.format(cores=max(2, slurm.cpus), local=blocker, port=_free_port()))
    (tmp_path / "standin.py").write_text(STANDIN)
    res = subprocess.run([sys.executable, "-m", "porter", "launch", "write", "--site", str(site), "--layers", "2",
                          "--hidden", "64", "--heads", "2", "--nodes", "1", "--python", str(torch_venv),
                          "--entry", str(tmp_path / "standin.py"), "--preflight-skip", "ops", "--preflight-skip",
                          "archs", "--preflight-skip", "miopen", "-o", str(tmp_path / "job"), "--", "--out",
                          str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    script = tmp_path / "job" / "job.sbatch"
    # take the mkdir away so the preflight, not mkdir, is what finds the folder missing
    script.write_text(script.read_text().replace("--skip miopen", "").replace(
        'mkdir -p "$MIOPEN_USER_DB_PATH"', "true"))
    log = tmp_path / "job.log"
    run = subprocess.run(["sbatch", "--wait", f"--output={log}", str(script)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, **slurm.env}, cwd=tmp_path)
    text = log.read_text()
    assert run.returncode != 0, text
    assert "preflight FAILED for site here" in text and "miopen" in text
    assert "all-reduce" not in text and not list(tmp_path.glob("rank*.json"))
