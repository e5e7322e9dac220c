"""The launch planner: a Megatron-DeepSpeed layout for a site, a model and a node count, and the job that runs it.

Layout rules (what ORNL's Frontier runs taught, arXiv 2312.12705):

- tensor parallelism (TP) stays inside a node: its all-reduce runs in every layer, and across nodes it is
  latency-bound on the network. TP larger than a node is refused unless forced;
- pipeline parallelism (PP) spans nodes; the layers must split evenly over the stages;
- data parallelism (DP) is what is left: devices / (TP x PP);
- ZeRO stage 1 (the optimizer states sharded over DP) by default.

Memory per device (bytes), for the worst pipeline stage (the first: it holds the embeddings and the most
microbatches in flight)::

    P       = (layers/PP * (12 h^2 + 13 h) + V h + s h) / TP        parameters on the device
    states  = (2 + 2) P + (4 + 4 + 4) P / DP                         bf16 weights and grads; fp32 master
                                                                     weights, Adam m and v sharded by ZeRO-1
    layer   = s b h (10 + 24/TP + 5 a s / (h TP))                    one layer's activations, no recompute
                                                                     (Korthikanti et al. 2022, TP without
                                                                     sequence parallelism)
    acts    = min(PP, m) * layers/PP * 2 s b h + layer               with activation recompute (the default):
                                                                     each layer keeps its bf16 input per
                                                                     microbatch in flight, one layer is live
            = min(PP, m) * layers/PP * layer                         without recompute
    total   = states + acts; it fits when total <= 90 % of the device's memory (the rest: RCCL buffers, the
              HIP runtime, the allocator's fragmentation)

with h hidden, a heads, s sequence, V vocabulary, b micro batch, m microbatches per step.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from porter.cluster.site.profiles import Site, runtime_env, site_names
from porter.components.megatron.launch import CONFIG, training_args, training_config
from porter.errors import ConfigError
from porter.fs import atomic_write_json, atomic_write_text, ensure_writable_dir
from porter.optspec import (account_option, arg, opt, out_option, partition_option, target_python_option,
                            time_option)

GIB = 1 << 30
USABLE = 0.9
PLAN_SCHEMA = "porter.launch-plan/1"
SHAPE = ("layers", "hidden", "heads", "seq", "vocab")
"""A model's shape: what a preset fixes and the command line may override."""


@dataclass(frozen=True, kw_only=True)
class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200

    def __post_init__(self) -> None:
        for key in SHAPE:
            if getattr(self, key) < 1:
                raise ConfigError(f"model {self.name}: {key} must be >= 1, not {getattr(self, key)}")
        if self.hidden % self.heads:
            raise ConfigError(f"model {self.name}: hidden {self.hidden} is not divisible by heads {self.heads}")

    @property
    def parameters(self) -> int:
        return self.layers * (12 * self.hidden ** 2 + 13 * self.hidden) + (self.vocab + self.seq) * self.hidden


# GPT shapes: 22B and 1T as ORNL ran them on Frontier (arXiv 2312.12705), 175B = GPT-3
MODELS: dict[str, Model] = {m.name: m for m in (
    Model(name="gpt-1.3b", layers=24, hidden=2048, heads=16),
    Model(name="gpt-22b", layers=48, hidden=6144, heads=48),
    Model(name="gpt-175b", layers=96, hidden=12288, heads=96),
    Model(name="gpt-1t", layers=128, hidden=25600, heads=160),
)}


def model_of(preset: str | None, *, layers: int | None = None, hidden: int | None = None, heads: int | None = None,
             seq: int | None = None, vocab: int | None = None) -> Model:
    """A named preset (its fields overridable) or a shape given whole."""
    given = {k: v for k, v in zip(SHAPE, (layers, hidden, heads, seq, vocab)) if v is not None}
    if preset is not None:
        if preset not in MODELS:
            close = difflib.get_close_matches(preset, MODELS, n=2)
            raise ConfigError(f"unknown model preset {preset!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                              hint=f"presets: {', '.join(MODELS)}; or give --layers --hidden --heads")
        base = MODELS[preset]
        return dataclasses.replace(base, name=base.name if not given else f"{base.name}-custom", **given)
    if missing := [k for k in ("layers", "hidden", "heads") if k not in given]:
        raise ConfigError(f"no model: give --model PRESET or --{' --'.join(missing)}",
                          hint=f"presets: {', '.join(MODELS)}")
    return Model(name=f"gpt-l{given['layers']}-h{given['hidden']}", **given)


@dataclass(frozen=True)
class Memory:
    """Bytes per device on the worst pipeline stage (the formula is in this module's docstring)."""

    params: int
    weights: int
    grads: int
    optimizer: int
    activations: int
    capacity: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.optimizer + self.activations

    @property
    def usable(self) -> int:
        return int(self.capacity * USABLE)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def describe(self) -> str:
        def g(n: int) -> str:
            return f"{n / GIB:.1f}"

        return (f"{g(self.total)} GiB of {g(self.usable)} usable ({g(self.capacity)} GiB x {USABLE:.0%}): weights "
                f"{g(self.weights)} + grads {g(self.grads)} + optimizer {g(self.optimizer)} (ZeRO-1) + activations "
                f"{g(self.activations)}; {self.params / 1e9:.2f}B parameters on the device")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"total": self.total, "usable": self.usable, "fits": self.fits}


def estimate(model: Model, *, tp: int, pp: int, dp: int, micro: int, microbatches: int, capacity: int,
             recompute: bool = True, zero_stage: int = 1) -> Memory:
    h, s, a, b = model.hidden, model.seq, model.heads, micro
    per_stage_layers = model.layers // pp
    params = (per_stage_layers * (12 * h * h + 13 * h) + (model.vocab + s) * h) // tp
    shard = dp if zero_stage >= 1 else 1
    layer = int(s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)))
    in_flight = min(pp, microbatches)
    acts = in_flight * per_stage_layers * 2 * s * b * h + layer if recompute else in_flight * per_stage_layers * layer
    return Memory(params=params, weights=2 * params, grads=2 * params, optimizer=12 * params // shard,
                  activations=acts, capacity=capacity)


@dataclass(frozen=True)
class Plan:
    site: str
    model: Model
    nodes: int
    devices_per_node: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    microbatches: int
    zero_stage: int
    recompute: bool
    memory: Memory
    notes: tuple[str, ...] = ()

    @property
    def world(self) -> int:
        return self.nodes * self.devices_per_node

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PLAN_SCHEMA, **dataclasses.asdict(self), "world": self.world,
                "model": dataclasses.asdict(self.model) | {"parameters": self.model.parameters},
                "pipeline_bubble": round((self.pp - 1) / (self.microbatches + self.pp - 1), 4),
                "memory": self.memory.to_dict(), "notes": list(self.notes)}

    def describe(self) -> list[str]:
        m = self.model
        return [f"model   {m.name}: {m.parameters / 1e9:.1f}B parameters ({m.layers} layers, hidden {m.hidden}, "
                f"{m.heads} heads, seq {m.seq}, vocab {m.vocab})",
                f"site    {self.site}: {self.nodes} node(s) x {self.devices_per_node} devices = {self.world}",
                f"layout  TP {self.tp} (inside a node) x PP {self.pp} x DP {self.dp}, ZeRO-{self.zero_stage}"
                + (", activation recompute" if self.recompute else ""),
                f"batch   micro {self.micro_batch}, global {self.global_batch} ({self.microbatches} microbatches "
                f"per step per pipeline)",
                f"memory  {self.memory.describe()}: {'fits' if self.memory.fits else 'DOES NOT FIT'}",
                *(f"note    {n}" for n in self.notes)]


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in order, found in sqrt(n) steps (a --layers of 10**9 is answered at once)."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def plan(site: Site, model: Model, *, nodes: int, tp: int | None = None, pp: int | None = None,
         micro_batch: int = 1, global_batch: int | None = None, zero_stage: int = 1, recompute: bool = True,
         force_cross_node_tp: bool = False) -> Plan:
    """The layout for ``model`` on ``nodes`` nodes of ``site``; refuses what cannot run or cannot fit."""
    per_node = site.node.devices
    if nodes < 1:
        raise ConfigError(f"--nodes must be >= 1, not {nodes}")
    if site.scheduler.max_nodes and nodes > site.scheduler.max_nodes:
        raise ConfigError(f"{nodes} nodes is more than site {site.name}'s largest job ({site.scheduler.max_nodes})")
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"ZeRO stage must be 0..3, not {zero_stage}")
    world = nodes * per_node
    notes: list[str] = []
    if tp is not None:
        if tp < 1:
            raise ConfigError(f"--tp must be >= 1, not {tp}")
        if tp > per_node:
            if not force_cross_node_tp:
                raise ConfigError(
                    f"TP {tp} is larger than a node of {site.name} ({per_node} devices): tensor parallelism "
                    "all-reduces inside every layer, and across nodes that all-reduce goes over the network and "
                    "is latency-bound (ORNL kept TP within a node on Frontier)",
                    hint=f"use --tp {per_node} or less and more --pp, or --force-cross-node-tp to accept it")
            if tp % per_node:
                raise ConfigError(f"a cross-node TP {tp} must be a multiple of the {per_node} devices of a node")
            notes.append(f"TP {tp} spans {tp // per_node} nodes (forced): every layer all-reduces over the network")
        elif per_node % tp:
            raise ConfigError(f"TP {tp} does not divide a node's {per_node} devices",
                              hint=f"use one of {', '.join(map(str, _divisors(per_node)))}")
        if model.heads % tp:
            raise ConfigError(f"TP {tp} does not divide the model's {model.heads} attention heads")
    if pp is not None:
        if pp < 1:
            raise ConfigError(f"--pp must be >= 1, not {pp}")
        if model.layers % pp:
            raise ConfigError(f"PP {pp} does not divide the model's {model.layers} layers",
                              hint=f"use one of {', '.join(map(str, _divisors(model.layers)))}")
    if tp is not None and pp is not None and world % (tp * pp):
        if tp == per_node:
            raise ConfigError(f"{nodes} node(s) is not divisible by PP {pp}: with TP {tp} filling a node, each "
                              "pipeline stage is a whole node",
                              hint=f"use a node count that is a multiple of {pp}, or another --pp")
        raise ConfigError(f"{nodes} node(s) x {per_node} = {world} devices is not divisible by TP {tp} x PP {pp}",
                          hint="change --nodes, --tp or --pp")
    tps = [tp] if tp is not None else [t for t in _divisors(per_node) if model.heads % t == 0]
    pps = [pp] if pp is not None else _divisors(model.layers)
    candidates = sorted(((t, p) for t in tps for p in pps if world % (t * p) == 0), key=lambda c: (c[0] * c[1], -c[0]))
    if not candidates:
        raise ConfigError(f"no TP x PP divides {world} devices with {model.layers} layers and {model.heads} heads",
                          hint="change --nodes or give --tp and --pp")
    capacity = int(site.node.device_memory_gib * GIB)
    tried: list[Plan] = []
    for t, p in candidates:
        dp = world // (t * p)
        if global_batch is not None:
            if global_batch % (micro_batch * dp):
                raise ConfigError(f"global batch {global_batch} is not divisible by micro batch {micro_batch} x DP {dp}",
                                  hint=f"use a multiple of {micro_batch * dp}")
            m = global_batch // (micro_batch * dp)
        else:
            m = 4 * p if p > 1 else 1
        mem = estimate(model, tp=t, pp=p, dp=dp, micro=micro_batch, microbatches=m, capacity=capacity,
                       recompute=recompute, zero_stage=zero_stage)
        cand = Plan(site=site.name, model=model, nodes=nodes, devices_per_node=per_node, tp=t, pp=p, dp=dp,
                    micro_batch=micro_batch, global_batch=micro_batch * dp * m, microbatches=m,
                    zero_stage=zero_stage, recompute=recompute, memory=mem, notes=tuple(notes))
        if mem.fits:
            return cand
        tried.append(cand)
    best = min(tried, key=lambda c: c.memory.total)  # the layout that came closest is the one the refusal names
    what = f"TP {best.tp} x PP {best.pp} x DP {best.dp}"
    raise ConfigError(f"{model.name} ({model.parameters / 1e9:.1f}B parameters) does not fit on {nodes} node(s) of "
                      f"{site.name}: with {what}, the closest layout, a device needs {best.memory.describe()}",
                      hint="add nodes, raise --pp, or keep activation recompute on")


# -- the job --------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """The job's settings, each field declaring its ``porter launch write`` option (``--help`` says what each is)."""

    out_dir: Path = out_option.field(required=True)
    """The command narrows its help (which names the training's config: no project is named in this layer)."""
    python: str | None = target_python_option.field()
    entry: str = opt("--entry", default="pretrain_gpt.py", show_default=True, help="The training script.")
    """Megatron-DeepSpeed's pretrain_gpt.py, or a stand-in."""
    entry_args: tuple[str, ...] = arg(nargs=-1, type=click.UNPROCESSED)
    account: str = account_option.field(default="")
    partition: str = partition_option.field(default="", help="Slurm partition (default: the site's).")
    time: str = time_option.field(default="", help="Slurm time limit (default: the site's).")
    broadcast_env: str = opt("--broadcast-env", default="", metavar="TARBALL",
                             help="A packed Python environment (conda-pack) to sbcast to node-local storage and run "
                                  "from.")
    preflight_skip: tuple[str, ...] = opt("--preflight-skip", multiple=True, metavar="CHECK",
                                          help="A preflight check to skip (env, miopen, plugin, ops, archs); repeat.")
    job_name: str = opt("--job-name", default="", help="Slurm job name (default: porter-<model>).")


def _q(value: str) -> str:
    """Double-quoted for bash, ``$VAR`` still expanded."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'


def sbatch_script(p: Plan, site: Site, opts: JobOptions, *, config: Path, site_ref: str, porter_python: str) -> str:
    n = site.node
    sch = site.scheduler
    options = {"job-name": opts.job_name or f"porter-{p.model.name}", "nodes": p.nodes, "ntasks-per-node": n.devices,
               "cpus-per-task": n.cores_per_gcd, "gpus-per-node": n.devices if sch.request_gpus else None,
               "partition": opts.partition or sch.partition, "qos": sch.qos, "account": opts.account,
               "time": opts.time or sch.time}
    lines = ["#!/bin/bash", *(f"#SBATCH --{key}={value}" for key, value in options.items() if value)]
    lines += [f"#SBATCH {arg}" for arg in sch.sbatch_args + (n.nvme_sbatch if opts.broadcast_env and n.nvme else ())]
    lines += ["", f"# written by porter launch write: {p.model.name} on {p.nodes} node(s) of {site.name}, "
              f"TP {p.tp} x PP {p.pp} x DP {p.dp}, ZeRO-{p.zero_stage}",
              f"# memory per device: {p.memory.describe()}", "set -euo pipefail", ""]
    if site.runtime.modules:
        lines += ["if command -v module >/dev/null 2>&1; then",
                  *(f"    module load {shlex.quote(m)}" for m in site.runtime.modules), "fi"]
    lines += [f"export {k}={_q(v)}" for k, v in runtime_env(site).items()]
    lines += [': "${MASTER_ADDR:=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}"',
              f"export MASTER_ADDR MASTER_PORT={site.runtime.master_port}", ""]
    per_node = f"srun --nodes={p.nodes} --ntasks={p.nodes} --ntasks-per-node=1"
    python = opts.python or sys.executable
    if opts.broadcast_env:
        lines += ["# the Python environment on node-local storage: one read of the shared filesystem per node",
                  f"export PORTER_ENV_DIR={_q((n.nvme or n.local_dir) + '/porter-env-${SLURM_JOB_ID}')}",
                  f'{per_node} mkdir -p "$PORTER_ENV_DIR"',
                  f'sbcast --force {shlex.quote(opts.broadcast_env)} "$PORTER_ENV_DIR/env.tar.gz"',
                  f'{per_node} tar -xzf "$PORTER_ENV_DIR/env.tar.gz" -C "$PORTER_ENV_DIR"', ""]
        python = "$PORTER_ENV_DIR/bin/python"
    skip = "".join(f" --skip {shlex.quote(s)}" for s in opts.preflight_skip)
    lines += ["# MIOpen's user DB on node-local storage, made on every node", f'{per_node} mkdir -p "$MIOPEN_USER_DB_PATH"',
              "# preflight on every node: the env, MIOpen's DB dir, the network plugin, prebuilt ops, archs",
              f"{per_node} {shlex.quote(porter_python)} -m porter site preflight {shlex.quote(site_ref)} "
              f"--python {_q(python)} --nodes {p.nodes}{skip}", ""]
    bind = (f" --cpu-bind={n.cpu_bind}" if n.cpu_bind else "") + (f" --gpu-bind={n.gpu_bind}" if n.gpu_bind else "")
    train = [opts.entry, *training_args(p, config), *opts.entry_args]
    lines += ["# one rank per device; torch.distributed reads its rank from Slurm's",
              f"srun --ntasks-per-node={n.devices} --cpus-per-task={n.cores_per_gcd}{bind} \\",
              "    bash -c 'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS; exec \"$@\"' "
              "porter-rank \\",
              f"    {_q(python)} " + " ".join(shlex.quote(a) for a in train), ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class Written:
    script: Path
    config: Path
    plan: Path


def write_job(p: Plan, site: Site, opts: JobOptions, *, porter_python: str = sys.executable) -> Written:
    """``job.sbatch``, the training's config (:data:`CONFIG`) and ``plan.json`` in ``opts.out_dir`` (each written
    atomically); ``porter_python`` runs porter's preflight on every node."""
    out_dir = ensure_writable_dir(opts.out_dir.resolve(), what="job folder", option="-o", create=True)
    config = out_dir / CONFIG
    builtin = site.name in site_names() and Path(site.file).parent.parts[-2:] == ("site", "builtin")
    site_ref = site.file if site.file and Path(site.file).is_file() and not builtin else site.name
    atomic_write_json(config, training_config(p))
    atomic_write_json(out_dir / "plan.json", p.to_dict())
    script = out_dir / "job.sbatch"
    atomic_write_text(script, sbatch_script(p, site, opts, config=config, site_ref=site_ref,
                                            porter_python=porter_python))
    script.chmod(0o755)
    return Written(script, config, out_dir / "plan.json")
