"""porter site list | show | preflight: site profiles (node layout, runtime env, scheduler, plugin)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from porter.cli import emit
from porter.cli.options import json_option
from porter.cluster.site.profiles import load_site, runtime_env, site_names
from porter.optspec import nodes_option, skip_option, target_python_option


@click.group()
def site() -> None:
    """Site profiles: a cluster's node layout, runtime environment, Slurm defaults and RCCL network plugin.

    Built-in: frontier, lumi-g, mi300x (generic); any TOML file with the same keys works too
    (docs/cluster.md).
    """


@site.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """List the built-in site profiles."""
    sites = [load_site(n) for n in site_names()]
    emit(as_json, [s.to_dict() for s in sites],
         lambda: [f"{s.name:<10} {s.node.devices} x {s.node.arch} ({s.node.device_memory_gib:g} GiB) per node, "
                  f"{s.node.cores_per_gcd} cores per device, toolchain {s.toolchain or '-'}, plugin "
                  f"{s.plugin.name if s.plugin else 'none'}" for s in sites])


@site.command("show")
@click.argument("ref", metavar="NAME|FILE")
@json_option
def show_cmd(ref: str, as_json: bool) -> None:
    """Show one site profile, with the environment every rank gets."""
    s = load_site(ref)
    n, sch, p = s.node, s.scheduler, s.plugin
    plugin = "none" if p is None else (f"{p.name} {p.version}".strip() + (f", module {p.module}" if p.module else "")
                                       + (f", {p.library}" if p.library else f", path from ${p.env_var}"))
    emit(as_json, s.to_dict() | {"rank_env": runtime_env(s)}, lambda: [
        f"site        {s.name}: {s.description}",
        f"source      {s.source}",
        f"toolchain   {s.toolchain or '-'}",
        f"node        {n.gpus} GPU(s) x {n.gcds_per_gpu} GCD(s) = {n.devices} devices of "
        f"{n.device_memory_gib:g} GiB, {n.arch}; {n.cores} cores, {n.cores_per_gcd} per device",
        *([f"numa        device i -> NUMA {','.join(map(str, n.numa_of_gcd))}"] if n.numa_of_gcd else []),
        *([f"nics        {','.join(n.nics)}" + (f" ({n.gcds_per_nic} devices per NIC)" if n.gcds_per_nic else "")]
          if n.nics else []),
        f"binding     --cpu-bind={n.cpu_bind or '(none)'} --gpu-bind={n.gpu_bind or '(none)'}",
        f"node-local  {n.local_dir}" + (f", NVMe {n.nvme} ({' '.join(n.nvme_sbatch)})" if n.nvme else ""),
        f"modules     {' '.join(s.runtime.modules) or '-'}",
        f"slurm       partition {sch.partition or '(default)'}, time {sch.time}"
        + (f", {' '.join(sch.sbatch_args)}" if sch.sbatch_args else ""),
        f"plugin      {plugin}",
        "env", *(f"  {k}={v}" for k, v in runtime_env(s).items())])


@site.command("preflight")
@click.argument("ref", metavar="NAME|FILE")
@target_python_option
@nodes_option.but(help="Nodes of the job (default: $SLURM_JOB_NUM_NODES, else 1); a one-node job needs no network "
                       "plugin.").option("nodes")
@skip_option.but(metavar="CHECK", help="Skip a check: env, miopen, plugin, ops, archs.").option("skip")
@json_option
@click.pass_obj
def preflight_cmd(log: Any, ref: str, python: str | None, nodes: int | None, skip: tuple[str, ...],
                  as_json: bool) -> None:
    """Check this node before a training job's ranks start: the site's env is set, MIOpen's DB folder is
    node-local and writable, the network plugin loads, the prebuilt ops load with no JIT, the GPUs are the
    site's arch. Exit 0 when all hold, 1 otherwise (each failure says what to change)."""
    from porter.cluster.site.preflight import describe, preflight
    from porter.errors import CheckFailed
    from porter.run import Runner

    s = load_site(ref)
    n = nodes or int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    rep = preflight(s, python=python or sys.executable, nodes=n, skip=set(skip), environ=dict(os.environ),
                    runner=Runner(log, echo=log.verbose))
    emit(as_json, rep.to_dict(), lambda: describe(rep))
    if not rep.ok:
        failed = [c.name for c in rep.checks if c.failed]
        raise CheckFailed(f"preflight failed on {rep.host}: {', '.join(failed)}",
                          hint="fix the environment the job script exports (porter launch write), or --skip a check "
                               "that does not apply")
