"""porter port megatron-deepspeed: copy, hipify, patch and prebuild in one command."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from porter.cli import emit_json
from porter.cli.options import (ToolchainChoice, allowed, compile_failures, json_option, options, runner_for,
                                show_compiled, show_plan)
from porter.errors import refusal_line
from porter.log import Logger
from porter.optspec import (allow_wave32_option, arg, compile_only_option, dry_run_option, in_place_option, jobs_option,
                            opt, python_option, set_option, skip_option, target_version_option, wheelhouse_option)

if TYPE_CHECKING:
    from porter.port import PatchSummary, PortResult


def summary_lines(patches: list[PatchSummary]) -> list[str]:
    """Per patch: its state, its id, and its files (each file's own state where they differ)."""
    from porter.port import STATE_WORDS as _WORDS

    width = max((len(p.patch) for p in patches), default=0)
    out = []
    for i, p in enumerate(patches):
        if i == 0 or p.set != patches[i - 1].set:
            out.append(f"patches ({p.set}):")
        files = [f for f in p.files if f[0]]
        if p.state == "skipped":
            detail = "(--skip)"
        elif files and all(st == files[0][1] for _, st, _ in files):
            detail = ", ".join(f for f, _, _ in files) if len(files) <= 3 else f"{len(files)} files"
            if p.state == "not-needed" and files[0][2]:
                detail += f" ({files[0][2]})"
        else:
            detail = ", ".join(f"{f}: {_WORDS.get(st, st)}" for f, st, _ in files)
        out.append(f"  {_WORDS.get(p.state, p.state):<12} {p.patch:<{width}}  {detail}".rstrip())
    return out


@click.group()
def port() -> None:
    """Port a project tree to a toolchain in one command (copy, hipify, patch, prebuild)."""


@dataclass(frozen=True, kw_only=True)
class PortOptions:
    """What every ``porter port PROJECT`` takes: each field declares its option (``--help`` says what each is)."""

    tree: Path = arg(type=click.Path(file_okay=False, path_type=Path))
    dest: Path | None = opt("--dest", type=click.Path(file_okay=False, path_type=Path), default=None,
                            help="Where the ported copy goes (default: next to TREE, named after it). It appears only "
                                 "when the whole port worked.")
    in_place: bool = in_place_option.field(help="Change TREE itself instead of a copy.")
    target_version: str | None = target_version_option.field()
    sets: tuple[str, ...] = set_option.field(short="", metavar="SET",
                                             help="Patch set(s) to apply instead of every set of the project: a "
                                                  "shipped set (megatron-deepspeed/rocm), a project, or a set file of "
                                                  "your own. Repeatable.")
    skip: tuple[str, ...] = skip_option.field(metavar="PATCH", help="Leave this patch (by id, see 'porter patch "
                                                                    "list') out of the port. Repeatable.")
    dry_run: bool = dry_run_option.field()


@dataclass(frozen=True, kw_only=True)
class PortMegatronOptions(ToolchainChoice, PortOptions):
    """``porter port megatron-deepspeed``'s options: each field declares its own."""

    wheelhouse: Path = wheelhouse_option.field()
    no_kernels: bool = opt("--no-kernels", is_flag=True,
                           help="Port the tree only (hipify, patch); do not build the fused kernels (no torch needed).")
    compile_only: bool = compile_only_option.field(
                             help="Port the tree and compile the kernels for every arch of the profile, reporting per "
                                  "kernel and arch; nothing is linked or packaged (a HIP view of torch's headers "
                                  "stands in for a ROCm torch).")
    python: str | None = python_option.field()
    jobs: int | None = jobs_option.field()
    allow_wave32: str | None = allow_wave32_option.field()


@port.command("megatron-deepspeed")
@options(PortMegatronOptions)
@json_option
@click.pass_obj
def megatron_deepspeed(log: Logger, /, req: PortMegatronOptions, as_json: bool) -> None:
    """Port a Megatron-DeepSpeed TREE: hipify its fused kernels, apply megatron-deepspeed/rocm, and build
    the kernels ahead of time into a wheel in the wheelhouse. A build python whose torch is not of the
    profile's kind (ROCm profiles need a ROCm torch) is refused before any work; --dry-run prints the
    plan and the refusal, --no-kernels ports the tree without building the kernels."""
    from porter.components.megatron.port import port_megatron

    tc = req.toolchain()
    res = port_megatron(req.tree, tc, out=req.dest, in_place=req.in_place, wheelhouse=req.wheelhouse,
                        python=req.python, jobs=req.jobs,
                        runner=runner_for(log, req.dry_run), kernels=not req.no_kernels, compile_only=req.compile_only,
                        target_version=req.target_version, sets=req.sets, skip=req.skip, log=log,
                        allow_wave32=allowed(req.allow_wave32))
    if as_json:
        emit_json(res.to_dict())
    else:
        _echo_tree(res, f"megatron version: {res.version or 'unknown'}   toolchain: {res.toolchain}", req.dry_run)
    if res.compiled:
        if not as_json:
            show_compiled(f"{len(res.compiled)} fused kernel(s) of {res.source} for {', '.join(tc.arch_names)} with "
                          f"{res.toolchain}", res.compiled, list(tc.arch_names))
        compile_failures(res.compiled, f"the tree {res.source}", tc, what="fused kernel")
    elif as_json:
        return
    elif res.wheel:
        for op in res.built:
            click.echo(f"built {op['name']} ({op['status']}, {op['seconds']:.1f}s)")
        click.echo(f"wheel: {res.wheel}")
        click.echo(f"manifest: {res.manifest}")
    elif res.plan is not None:
        show_plan(f"{len(res.plan.objects)} fused kernel(s), toolchain {res.toolchain}", res.plan, res.refusal)
    elif res.refusal is not None:
        click.echo(refusal_line(res.refusal.message))


@port.command("deepspeed")
@options(PortOptions)
@json_option
@click.pass_obj
def deepspeed_cmd(log: Logger, /, req: PortOptions, as_json: bool) -> None:
    """Port a DeepSpeed TREE: apply the deepspeed patch sets (layered on op_builder/builder.py), each patch where
    its problem is present. Then build its ops ahead of time with 'porter ops build --source OUT'."""
    from porter.components.deepspeed.port import port_deepspeed

    res = port_deepspeed(req.tree, out=req.dest, in_place=req.in_place, sets=req.sets, skip=req.skip,
                         target_version=req.target_version,
                         runner=runner_for(log, req.dry_run), log=log)
    if as_json:
        emit_json(res.to_dict())
        return
    _echo_tree(res, f"deepspeed version: {res.version or 'unknown'}", req.dry_run)
    click.echo(f"next: porter ops build --source {res.out} --toolchain <profile> --ops <ops> -o <wheelhouse>")


def _echo_tree(res: PortResult, what: str, planned: bool) -> None:
    """What a port did to the tree (``planned``: would do, a dry run), the same for every project."""
    click.echo(f"ported tree: {res.out}{' (dry run: not written)' if planned else ''}")
    click.echo(what)
    for path in res.hipified:
        click.echo(f"hipified {path}")
    for path in res.patched:
        click.echo(f"{'would patch' if planned else 'patched'} {path}")
    for line in summary_lines(res.patches):
        click.echo(line)
    for note in res.notes:
        click.echo(f"note: {note}")
