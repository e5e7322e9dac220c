"""porter matrix run | status | cell | finish: many builds from one file, here or as a Slurm job array."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from porter.cli import emit
from porter.cli.options import json_option, options, raise_failure, runner_for, show_submitted, slurm_options
from porter.log import Logger
from porter.optspec import (Spec, arg, dir_option, dry_run_option, flags, force_option, slurm_option, wait_option,
                            wheelhouse_option)
from porter.run import Runner, make_env


@click.group()
def matrix() -> None:
    """Build a matrix of wheels (toolchains x components x versions) here or as one Slurm job array.

    \b
    The matrix file (TOML) lists toolchains and [[component]] entries with versions or sources; each
    combination is a cell built by porter's own command (ops build, wheel apex, wheel flash-attn).
    Results live in the matrix folder on the shared filesystem: one result file per cell, the wheels
    in the wheelhouse, then an index and report.json. Format and policies: docs/cluster.md.
    """


@dataclass(frozen=True, kw_only=True)
class MatrixRunOptions:
    """``porter matrix run``'s options: each field declares its own (``--help`` says what each is)."""

    file: Path = arg(type=click.Path(dir_okay=False, path_type=Path))
    mode: str | None = flags(
        Spec(("--local",), dict(flag_value="local", help="Run the cells here, one after another, then index.")),
        slurm_option.but(flag_value="slurm", help="Submit one job array (one task per cell) and an index job that "
                                                  "waits on it (afterok)."))
    directory: Path | None = dir_option.field(help="The matrix folder, on a filesystem every node sees (default: the "
                                                   "file's 'dir').")
    wheelhouse: Path | None = wheelhouse_option.field(default=None, show_default=False,
                                                      help="Where the wheels and the index go (default: the file's "
                                                           "'wheelhouse', else DIR/wheelhouse).")
    force: bool = force_option.field(help="Reuse a matrix folder: its plan, results and report are replaced (wheels "
                                          "are kept).")
    wait: bool = wait_option.field(help="With --slurm: wait for the last job (the index job's report), then exit as "
                                        "--local does.")
    dry_run: bool = dry_run_option.field()
    time_limit: str | None = None
    slurm: dict[str, Any] = field(default_factory=dict)


@matrix.command("run")
@options(MatrixRunOptions, rest="slurm")
@slurm_options()
@json_option
@click.pass_obj
def run_cmd(log: Logger, /, req: MatrixRunOptions, as_json: bool) -> None:
    """Build every cell of the matrix FILE.

    \b
    Exit codes: 0 all cells built and indexed (or, --slurm without --wait, submitted); 3 some cells
    failed, the other wheels shipped; 1 nothing built; 2 a bad matrix (nothing is written or submitted).
    """
    from porter.cluster.slurm.matrix_run import describe, outcome, run_matrix
    from porter.cluster.slurm.matrix import load_matrix

    if req.mode is None:
        raise click.UsageError("pass --local (the cells here, one after another) or --slurm (a Slurm job array)")
    if req.wait and req.mode != "slurm":
        raise click.UsageError("--wait goes with --slurm (--local always waits)")
    env = make_env()
    m = load_matrix(req.file, directory=req.directory, wheelhouse=req.wheelhouse, environ=env)
    settings = m.slurm.merged({**req.slurm, "time": req.time_limit})
    result = run_matrix(m, mode=req.mode, force=req.force, runner=runner_for(log, req.dry_run, not req.dry_run),
                        env=env, settings=settings, wait=req.wait, log=log)
    sub = result.submission or {}
    show_submitted(log, result, result.report, as_json=as_json, describe=describe, outcome=outcome,
                   jobs=f"array job {sub.get('array_job')} ({len(m.cells)} cells), index job {sub.get('index_job')}",
                   tip=f"porter matrix status {m.dir}")


@matrix.command("status")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@json_option
def status_cmd(directory: Path, as_json: bool) -> None:
    """Every cell of the matrix in DIRECTORY: its status, wheel or log, read from the result files.

    Once the index step ran, exits as 'run' does (0, 3 or 1); before that, 0.
    """
    from porter.cluster.slurm.matrix_run import describe, outcome, status

    doc = status(directory)
    sub = doc["submission"]
    jobs = f" array job {sub['array_job']}, index job {sub['index_job']}" if sub else ""
    emit(as_json, doc, lambda: [f"[{doc['state']}]{jobs}", *describe(doc)])
    if doc["state"] == "finished":
        raise_failure(outcome(doc))


@matrix.command("cell")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.argument("index", type=click.IntRange(min=0))
@json_option
@click.pass_obj
def cell_cmd(log: Logger, directory: Path, index: int, as_json: bool) -> None:
    """Build cell INDEX of the matrix in DIRECTORY (what each array task runs).

    A failed build is recorded in the cell's result.json and still exits 0; a non-zero exit means the
    outcome could not be recorded.
    """
    from porter.cluster.slurm.matrix_run import run_cell

    doc = run_cell(directory, index, runner=Runner(log), env=make_env(), log=log)
    emit(as_json, doc, lambda: [f"{doc['id']}: {doc['status']}" + (f" {doc['wheel_path']}" if doc.get("wheel_path")
                                                                   else f" (log {doc['log']})")])


@matrix.command("finish")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@json_option
def finish_cmd(directory: Path, as_json: bool) -> None:
    """Index the wheelhouse and write report.json from the cells' results (what the index job runs;
    by hand, it indexes what was built after a cell was lost)."""
    from porter.cluster.slurm.matrix_run import describe, finish, outcome

    doc = finish(directory)
    emit(as_json, doc, lambda: describe(doc))
    raise_failure(outcome(doc))
