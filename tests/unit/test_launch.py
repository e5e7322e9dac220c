"""The launch planner against known layouts, its refusals, the job it writes, and the preflight's pure checks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from porter.cli import cli
from porter.cluster.site.launch import GIB, MODELS, JobOptions, estimate, model_of, plan, write_job
from porter.cluster.site.preflight import check_env, check_miopen, check_plugin, mount_of
from porter.cluster.site.profiles import load_site, runtime_env
from porter.errors import ConfigError

FRONTIER = load_site("frontier")


def test_1t_as_ornl_ran_it_on_3072_gcds() -> None:
    """arXiv 2312.12705: 1T GPT on 3,072 MI250X GCDs (384 nodes of 8), TP kept within a node, ZeRO-1."""
    p = plan(FRONTIER, MODELS["gpt-1t"], nodes=384, tp=8, pp=64)
    assert (p.world, p.tp, p.pp, p.dp, p.zero_stage) == (3072, 8, 64, 6, 1)
    assert MODELS["gpt-1t"].parameters == pytest.approx(1.008e12, rel=1e-3)
    m = p.memory
    # 2 layers + the embeddings per stage, over TP 8: 2.14B parameters; 4 bytes each (bf16 weights + grads),
    # 12 bytes of fp32 master + Adam m, v sharded over DP 6
    assert m.params == pytest.approx(2.13e9, rel=0.01)
    assert m.weights == m.grads == 2 * m.params and m.optimizer == 12 * m.params // 6
    assert m.fits and 20 * GIB < m.total < 30 * GIB and m.capacity == 64 * GIB


def test_1t_planned_by_itself_keeps_tp_within_the_node() -> None:
    p = plan(FRONTIER, MODELS["gpt-1t"], nodes=384)
    assert p.tp == 8 and p.pp * p.tp * p.dp == 3072 and p.memory.fits
    assert MODELS["gpt-1t"].layers % p.pp == 0


def test_175b_on_1024_gcds_with_tp_8() -> None:
    p = plan(FRONTIER, MODELS["gpt-175b"], nodes=128, tp=8, pp=16)
    assert (p.world, p.dp) == (1024, 8) and p.memory.fits
    assert p.global_batch == 1 * 8 * 64 and p.microbatches == 64  # 4 x PP microbatches by default
    auto = plan(FRONTIER, MODELS["gpt-175b"], nodes=128, tp=8)
    assert auto.pp == 2 and auto.memory.fits  # the smallest pipeline that fits in 64 GB


def test_a_model_that_cannot_fit_is_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError) as err:
        plan(FRONTIER, MODELS["gpt-1t"], nodes=1)
    msg = err.value.message
    assert "gpt-1t (1008.0B parameters) does not fit on 1 node(s) of frontier" in msg
    assert "TP 8 x PP 1 x DP 1" in msg and "GiB of 57.6 usable" in msg and "optimizer" in msg
    with pytest.raises(ConfigError, match="does not fit"):
        plan(FRONTIER, MODELS["gpt-175b"], nodes=4, tp=8, pp=4, global_batch=4)


def test_tp_larger_than_a_node_is_refused_with_the_reason_unless_forced() -> None:
    with pytest.raises(ConfigError) as err:
        plan(FRONTIER, MODELS["gpt-1t"], nodes=384, tp=16, pp=8)
    assert "TP 16 is larger than a node of frontier (8 devices)" in err.value.message
    assert "latency-bound" in err.value.message and "--force-cross-node-tp" in (err.value.hint or "")
    p = plan(FRONTIER, MODELS["gpt-1t"], nodes=384, tp=16, pp=8, force_cross_node_tp=True)
    assert p.tp == 16 and "spans 2 nodes" in p.notes[0]


def test_node_count_not_divisible_by_pp() -> None:
    with pytest.raises(ConfigError) as err:
        plan(FRONTIER, MODELS["gpt-175b"], nodes=3, tp=8, pp=2)
    assert "3 node(s) is not divisible by PP 2" in err.value.message


@pytest.mark.parametrize("kw, words", [
    (dict(nodes=8, tp=3), "TP 3 does not divide a node's 8 devices"),
    (dict(nodes=8, tp=8, pp=5), "PP 5 does not divide the model's 96 layers"),
    (dict(nodes=0), "--nodes must be >= 1"),
    (dict(nodes=8, global_batch=7), "global batch 7 is not divisible"),
])
def test_more_bad_input(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan(FRONTIER, MODELS["gpt-175b"], **kw)


def test_models() -> None:
    assert model_of("gpt-175b").parameters == pytest.approx(174.6e9, rel=1e-3)
    assert model_of(None, layers=2, hidden=64, heads=4).name == "gpt-l2-h64"
    assert model_of("gpt-1.3b", seq=4096).seq == 4096
    with pytest.raises(ConfigError, match="did you mean 'gpt-1t'"):
        model_of("gpt-1tt")
    with pytest.raises(ConfigError, match="--heads"):
        model_of(None, layers=2, hidden=64)
    with pytest.raises(ConfigError, match="not divisible by heads"):
        model_of(None, layers=2, hidden=65, heads=4)


def test_recompute_off_costs_activations() -> None:
    kw = dict(tp=8, pp=16, dp=8, micro=1, microbatches=64, capacity=64 * GIB)
    on = estimate(MODELS["gpt-175b"], recompute=True, **kw)
    off = estimate(MODELS["gpt-175b"], recompute=False, **kw)
    assert off.activations > 5 * on.activations and off.weights == on.weights


def test_write_job(tmp_path: Path) -> None:
    p = plan(FRONTIER, MODELS["gpt-1t"], nodes=384, tp=8, pp=64)
    opts = JobOptions(out_dir=tmp_path / "job", python="/shared/env/bin/python", account="abc123",
                      entry_args=("--train-iters", "10"), broadcast_env="/shared/env.tar.gz")
    w = write_job(p, FRONTIER, opts, porter_python="/shared/porter/bin/python")
    text = w.script.read_text()
    for line in ("#SBATCH --nodes=384", "#SBATCH --ntasks-per-node=8", "#SBATCH --cpus-per-task=7",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --partition=batch", "#SBATCH --account=abc123",
                 "#SBATCH --network=disable_rdzv_get", "#SBATCH --constraint=nvme", 'export FI_CXI_RDZV_PROTO="alt_read"',
                 'export MIOPEN_USER_DB_PATH="${PORTER_LOCAL_DIR}/${USER:-$(id -un)}-miopen-${SLURM_JOB_ID}"',
                 "    module load rccl-net-plugin", "export MASTER_ADDR MASTER_PORT=3442"):
        assert line in text.splitlines(), line
    assert "sbcast --force /shared/env.tar.gz" in text and '"$PORTER_ENV_DIR/bin/python" pretrain_gpt.py' in text
    pre = text.index("porter site preflight frontier")
    assert text.index('mkdir -p "$MIOPEN_USER_DB_PATH"') < pre < text.index("pretrain_gpt.py")
    assert "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 64" in text and "--train-iters 10" in text
    assert "--cpu-bind=mask_cpu:0xfe000000000000," in text and "--gpu-bind=closest" in text
    cfg = json.loads(w.config.read_text())
    assert cfg["zero_optimization"] == {"stage": 1} and cfg["train_batch_size"] == 1536
    assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * p.dp == 1536
    assert json.loads(w.plan.read_text())["dp"] == 6


def test_cli_plan_json_and_refusal() -> None:
    res = CliRunner().invoke(cli, ["-q", "launch", "plan", "--site", "frontier", "--model", "gpt-1t", "--nodes", "384",
                                   "--tp", "8", "--pp", "64", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["tp"], doc["pp"], doc["dp"], doc["memory"]["fits"]) == (8, 64, 6, True)
    res = CliRunner().invoke(cli, ["-q", "launch", "plan", "--site", "frontiers", "--model", "gpt-1t", "--nodes", "1"])
    assert isinstance(res.exception, ConfigError) and res.exception.exit_code == 2
    assert "did you mean 'frontier'" in res.exception.message


# -- the preflight's checks that need no subprocess ---------------------------------------------------

def test_preflight_env() -> None:
    env = {k: v for k, v in runtime_env(FRONTIER).items()}
    assert check_env(FRONTIER, env).status == "ok"
    env["FI_CXI_RDZV_PROTO"] = "default"
    del env["NCCL_SOCKET_IFNAME"]
    c = check_env(FRONTIER, env)
    assert c.failed and "FI_CXI_RDZV_PROTO=default, the site sets alt_read" in c.detail
    assert "NCCL_SOCKET_IFNAME is not set" in c.detail


def test_preflight_miopen_node_local_and_writable(tmp_path: Path) -> None:
    mounts = f"tmpfs / tmpfs rw 0 0\nfs1:/home {tmp_path / 'shared'} nfs4 rw 0 0\n"
    assert mount_of(tmp_path / "shared" / "x", mounts) == (str(tmp_path / "shared"), "nfs4")
    good = {"MIOPEN_USER_DB_PATH": str(tmp_path / "db"), "MIOPEN_CUSTOM_CACHE_DIR": str(tmp_path / "db")}
    assert check_miopen(good, mounts).status == "ok"
    shared = {**good, "MIOPEN_USER_DB_PATH": str(tmp_path / "shared" / "db")}
    c = check_miopen(shared, mounts)
    assert c.failed and "is on nfs4" in c.detail and "node-local" in c.detail
    c = check_miopen({}, mounts)
    assert c.failed and "MIOPEN_USER_DB_PATH is not set" in c.detail
    blocker = tmp_path / "file"
    blocker.write_text("")
    c = check_miopen({**good, "MIOPEN_CUSTOM_CACHE_DIR": str(blocker / "db")}, mounts)
    assert c.failed and "cannot create" in c.detail


def test_preflight_plugin_needed_only_across_nodes(tmp_path: Path) -> None:
    assert check_plugin(FRONTIER, {}, nodes=1).status == "note"
    c = check_plugin(FRONTIER, {}, nodes=2)
    assert c.failed and "module rccl-net-plugin" in c.detail and "TCP sockets" in c.detail
    c = check_plugin(FRONTIER, {"NCCL_NET_PLUGIN": str(tmp_path / "none.so")}, nodes=2)
    assert c.failed and "does not exist" in c.detail
    if os.path.exists("/lib/x86_64-linux-gnu/libm.so.6"):
        c = check_plugin(FRONTIER, {"NCCL_NET_PLUGIN": "/lib/x86_64-linux-gnu/libm.so.6"}, nodes=2)
        assert c.failed and "exports no ncclNetPlugin_vN" in c.detail
