"""porter install | verify | report: the compute-node side."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import click

from porter.cli import emit, emit_json
from porter.cli.options import json_option, options, runner_for
from porter.components import all_dists
from porter.errors import CheckFailed, NothingToDo
from porter.install.engine import InstallOptions, install, node_arch_option, parse_only
from porter.install.env import detect_node, inspect_env
from porter.log import Logger
from porter.optspec import dry_run_option, target_python_option
from porter.run import Runner


@dataclass(frozen=True, kw_only=True)
class InstallCommandOptions(InstallOptions):
    """``porter install``'s options: the library's request (each field declares its option) and the command's own
    --dry-run, which picks the runner (a recording one) and is no part of what :func:`install` reads."""

    dry_run: bool = dry_run_option.field(help="Select and check the wheels, print the pip command, install nothing.")


@click.command("install")
@options(InstallCommandOptions)
@json_option
@click.pass_obj
def install_cmd(log: Logger, /, req: InstallCommandOptions, as_json: bool) -> None:
    """Install the wheels from WHEELHOUSE that fit this environment and node, offline.

    \b
    A wheel fits when its tags take this python, it was built against this torch (version and
    cpu/rocm/cuda kind) and ROCm/CUDA version, and it carries code for the node's GPU arch with the
    same wavefront size. Each chosen wheel is copied, its sha256 checked against its manifest
    (<wheel>.porter.json) and its entries checked not to escape the target, then installed with
    'pip install --no-index --find-links WHEELHOUSE' under a lock in the environment, so concurrent
    installs into one environment run one after the other.

    Before anything is installed, each chosen wheel's shared objects are read (ELF) and checked to load
    on the node (--node-root): the libraries they need are there (torch's lib/, the node's library
    folders, LD_LIBRARY_PATH), with the glibc / libstdc++ symbol versions they need, and torch's
    libraries here define the torch symbols they use (same torch, same C++ ABI).
    """
    result = install(replace(req, only=parse_only(req.only)), runner_for(log, req.dry_run, echo=not log.quiet), log)
    emit(as_json, result.to_json(), lambda: [
        *(f"installed {w.component} {w.version_text} ({w.filename})" for w in result.installed),
        *(f"unchanged {w.component} {w.version_text} (already installed from {w.filename})" for w in result.skipped),
        *(f"would install {w.component} {w.version_text} ({w.filename})" for w in result.selection.chosen
          if req.dry_run)])


@click.command("verify")
@target_python_option
@node_arch_option
@click.option("--no-import", "no_import", is_flag=True, help="Skip the import check (static checks only).")
@json_option
@click.pass_obj
def verify_cmd(log: Logger, python: str | None, archs: tuple[str, ...], no_import: bool, as_json: bool) -> None:
    """Prove the installed prebuilt kernels load without compiling and carry the node's GPU code.

    \b
    For DeepSpeed, APEX, FlashAttention and Megatron fused kernels: every prebuilt module imports
    with compilers and ninja trapped and an empty TORCH_EXTENSIONS_DIR; every .so holds code objects
    for the node's arch; wavefront, torch and ROCm/CUDA versions match the build. Exit 0 when all
    hold, 1 otherwise, each problem naming the file, what was expected and what was found.
    """
    from porter.install.verify import verify

    runner = Runner(log, echo=log.verbose)
    env = inspect_env(python or sys.executable, runner, dists=all_dists())
    node = detect_node(runner, archs)
    rep = verify(env, node, runner, imports=not no_import)
    if as_json:
        emit_json(rep.to_json())
    else:
        click.echo(f"python  {env.describe()}")
        click.echo(f"GPU     {node.describe()}")
        for c in rep.components:
            mark = "ok  " if not c.problems else "FAIL"
            click.echo(f"{mark}    {c.component} {c.version or '-'} [{c.label or c.kind or 'no porter record'}] "
                       f"{len(c.modules)} prebuilt module(s)")
            for m in c.modules:
                click.echo(f"          {m['module']}: archs {','.join(m.get('archs') or []) or '-'}, "
                           f"import {m.get('import', 'not tried')}")
        if not rep.components:
            click.echo("nothing porter checks is installed (no DeepSpeed, APEX, FlashAttention, Megatron kernels)")
        for note in rep.notes:
            click.echo(f"note: {note}")
    if rep.problems:
        for p in rep.problems:
            log.error(str(p))
        raise CheckFailed(f"verify found {len(rep.problems)} problem(s) in {env.executable}",
                          hint="install wheels built for this node with 'porter install', or rebuild for its arch")
    if not rep.components:
        raise NothingToDo(f"nothing to verify in {env.executable}",
                          hint="install porter-built wheels first with 'porter install WHEELHOUSE'")


@click.command("report")
@target_python_option
@node_arch_option
@json_option
@click.pass_obj
def report_cmd(log: Logger, python: str | None, archs: tuple[str, ...], as_json: bool) -> None:
    """The whole stack at a glance: python, torch/ROCm, GPU, compilers, each component and its kernels.

    Reads only (no import of the prebuilt modules: 'porter verify' does that). Always exits 0.
    """
    from porter.install.verify import collect, compilers_on_path

    runner = Runner(log, echo=log.verbose)
    env = inspect_env(python or sys.executable, runner, dists=all_dists())
    node = detect_node(runner, archs)
    comps = collect(env, node)
    tools = compilers_on_path()
    if as_json:
        emit_json({"python": {"executable": env.executable, "tag": env.python_tag, "prefix": env.prefix},
                   "torch": env.torch.to_dict() if env.torch else None,
                   "node": {"archs": list(node.archs), "source": node.source},
                   "compilers": tools,
                   "components": [c.to_json() for c in comps]})
        return
    click.echo(f"python       {env.executable} ({env.python_tag})")
    click.echo(f"torch        {env.torch.describe() if env.torch else 'not installed'}")
    click.echo(f"GPU          {node.describe()}")
    click.echo("compilers    " + (", ".join(f"{k}={v}" for k, v in tools.items() if v) or "none on PATH")
               + ("" if any(tools.values()) else " (a compute node: nothing can JIT here)"))
    if not comps:
        click.echo("components   none of DeepSpeed, APEX, FlashAttention, Megatron fused kernels installed")
    for c in comps:
        click.echo(f"{c.component:<12} {c.version or 'not installed'}  {c.mode}"
                   f"{'  [' + c.label + ']' if c.label else ''}{'' if c.record else '  (no porter record)'}")
        for m in c.modules:
            click.echo(f"    {m['module']}  archs: {','.join(m.get('archs') or []) or 'cpu'}")
        if c.installed_ops is not None:
            on = sorted(k for k, v in c.installed_ops.items() if v)
            click.echo(f"    installed_ops: {', '.join(on) or 'none (every op JIT-compiles)'}")
        for p in c.problems:
            click.echo(f"    ! {p}")
