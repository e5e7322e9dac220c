"""porter launch plan | write: a Megatron-DeepSpeed layout for a site, and the sbatch job that runs it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from porter.cli import emit
from porter.cli.options import json_option, options
from porter.cluster.site.launch import JobOptions, model_of, plan, write_job
from porter.cluster.site.profiles import load_site
from porter.optspec import nodes_option, opt, out_option, site_option


@click.group()
def launch() -> None:
    """Plan a Megatron-DeepSpeed run on a site (TP inside a node, PP, DP, ZeRO-1, memory per device) and write
    its sbatch job and DeepSpeed config. Formula and rules: docs/cluster.md."""


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """``porter launch plan``'s options (the site, the model's shape, the layout asked for): each field declares its
    own."""

    site_ref: str = site_option.field(required=True)
    preset: str | None = opt("--model", default=None, metavar="PRESET",
                             help="gpt-1.3b, gpt-22b, gpt-175b, gpt-1t (the shape options below override its fields).")
    layers: int | None = opt("--layers", type=int, default=None)
    hidden: int | None = opt("--hidden", type=int, default=None)
    heads: int | None = opt("--heads", type=int, default=None)
    seq: int | None = opt("--seq", type=int, default=None)
    vocab: int | None = opt("--vocab", type=int, default=None)
    nodes: int = nodes_option.field(required=True)
    tp: int | None = opt("--tp", type=int, default=None, help="Tensor parallel size (default: the smallest that fits).")
    pp: int | None = opt("--pp", type=int, default=None,
                         help="Pipeline parallel size (default: the smallest that fits).")
    micro_batch: int = opt("--micro-batch", type=click.IntRange(min=1), default=1, show_default=True)
    global_batch: int | None = opt("--global-batch", type=click.IntRange(min=1), default=None,
                                   help="Default: micro x DP x (4 x PP microbatches, 1 without a pipeline).")
    zero_stage: int = opt("--zero-stage", type=click.IntRange(0, 3), default=1, show_default=True)
    no_recompute: bool = opt("--no-recompute", is_flag=True, help="Plan without activation recompute.")
    force_cross_node_tp: bool = opt("--force-cross-node-tp", is_flag=True, help="Accept a TP larger than a node.")

    def make_plan(self) -> Any:
        """The site and the planned layout (:func:`porter.cluster.site.launch.plan`)."""
        site = load_site(self.site_ref)
        model = model_of(self.preset, layers=self.layers, hidden=self.hidden, heads=self.heads, seq=self.seq,
                         vocab=self.vocab)
        return site, plan(site, model, nodes=self.nodes, tp=self.tp, pp=self.pp, micro_batch=self.micro_batch,
                          global_batch=self.global_batch, zero_stage=self.zero_stage, recompute=not self.no_recompute,
                          force_cross_node_tp=self.force_cross_node_tp)


@launch.command("plan")
@options(PlanOptions)
@json_option
def plan_cmd(req: PlanOptions, as_json: bool) -> None:
    """Plan the layout; exit 2 when it cannot run (TP larger than a node, nodes not divisible by PP) or does
    not fit in the devices' memory (the numbers are in the message)."""
    _, p = req.make_plan()
    emit(as_json, p.to_dict(), p.describe)


@dataclass(frozen=True, kw_only=True)
class LaunchWriteOptions(JobOptions, PlanOptions):
    """``porter launch write``'s options, the job's (:class:`JobOptions`, each field declaring its own) after the
    plan's."""

    out_dir: Path = out_option.field(required=True, help="Folder for job.sbatch, the DeepSpeed config and plan.json.")


@launch.command("write")
@options(LaunchWriteOptions)
@json_option
def write_cmd(req: LaunchWriteOptions, as_json: bool) -> None:
    """Plan, then write the sbatch job (site env, MIOpen DB on node-local storage, a preflight on every node,
    one rank per device bound to its cores) and the DeepSpeed config. ENTRY_ARGS (after --) go to the
    training script after the layout's own Megatron arguments."""
    from porter.cluster.site.preflight import CHECKS
    from porter.errors import ConfigError

    for s in req.preflight_skip:
        if s not in CHECKS:
            raise ConfigError(f"unknown preflight check {s!r}", hint=f"checks: {', '.join(CHECKS)}")
    site, p = req.make_plan()
    written = write_job(p, site, req)
    emit(as_json, {"plan": p.to_dict(), "written": asdict(written)},  # its paths as text
         lambda: [*p.describe(), f"wrote {written.script}, {written.config}, {written.plan}"])
