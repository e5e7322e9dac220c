"""porter audit TREE: every start-up compile site of a training tree and its target python."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from porter.cli import emit
from porter.cli.options import json_option
from porter.errors import CheckFailed, ConfigError, NothingToDo
from porter.log import Logger
from porter.optspec import target_python_option
from porter.run import Runner


@click.command("audit")
@click.argument("tree", type=click.Path(file_okay=False, path_type=Path))
@target_python_option
@click.option("--no-python", is_flag=True,
              help="Read the tree only: say which sites porter's patches guard, without looking for prebuilt "
                   "modules in a target environment.")
@json_option
@click.pass_obj
def audit_cmd(log: Logger, tree: Path, python: str | None, no_python: bool, as_json: bool) -> None:
    """Find every place the training in TREE would compile at start-up, and whether a prebuilt module covers it.

    \b
    Sites: torch.utils.cpp_extension.load/load_inline, make (Megatron's compile_helper), DeepSpeed op loads
    (XBuilder().load(), create_op_builder, DeepSpeedCPUAdam & co) of ops the target's DeepSpeed does not mark
    prebuilt, APEX's op builders, Triton kernels, and DeepSpeed's has_function feature probes; in the target's
    installed packages, what runs at import. Each says what it costs and what happens on a node without a
    compiler. Exit 1 when anything would compile on a compute node, 4 when TREE holds no Python file, 0 otherwise.
    """
    from porter.install.audit import audit, render, target_of
    from porter.components import all_dists
    from porter.install.env import inspect_env

    if not tree.is_dir():
        raise ConfigError(f"tree not found: {tree}", hint="pass the top folder of the training code")
    target = None if no_python else target_of(inspect_env(python or sys.executable, Runner(log, echo=log.verbose),
                                                          dists=(*all_dists(), "triton")))
    with log.step(f"reading {tree}"):
        report = audit(tree, target)
    if not report.files:
        raise NothingToDo(f"{tree} holds no Python file: no training code to audit",
                          hint="pass the top folder of the training code (where pretrain_gpt.py or your train script "
                               "is)")
    emit(as_json, report.to_dict(), lambda: render(report))
    if not report.ok:
        raise CheckFailed(f"{len(report.compiles)} site(s) would compile on a compute node",
                          hint="prebuild what they build (porter port megatron-deepspeed, porter ops build, porter "
                               "wheel apex) and install it into the target python, then audit again")
