"""The matrix folder on the shared filesystem, and what each job runs.

```
DIR/matrix.json              the validated cells, frozen at submission (the jobs read only this)
DIR/jobs/cell.sh             one cell: `porter matrix cell DIR INDEX` (INDEX = the array task id)
DIR/jobs/index.sh            the final step: `porter matrix finish DIR`
DIR/cells/<id>/request.json  the cell's build (porter.cluster.request), which `porter build --request` runs
DIR/cells/<id>/result.json   one per cell: status, exit code, seconds, wheel, log paths
DIR/cells/<id>/build.log     the build command's whole output
DIR/logs/cell-<index>.log    the job's own output (Slurm's --output; --local writes the same file)
DIR/logs/index.log           the index job's output
DIR/report.json              every cell with its wheel and status, and the wheelhouse index
DIR/submission.json          the Slurm job ids (--slurm only)
WHEELHOUSE/                  every cell's wheel + manifest, then simple/ and porter-wheelhouse.json
```

Failed cells: a build that fails is a *result*. The cell records it (status, exit code, log) and its
job still exits 0, so the index job's ``afterok`` holds and the good wheels are indexed and shipped;
the report lists the failed cells with their logs. A job that exits non-zero is one porter could not
record (killed by a time or memory limit, a node failure): then ``afterok`` never holds, Slurm cancels
the index job, and ``porter matrix status`` shows that cell as incomplete. ``--local`` follows the same
rule, so a local run rehearses the cluster run exactly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import socket
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porter import __version__
from porter.artifacts.manifest import SUFFIX, manifest_path, read_manifest
from porter.cluster.request import jsonable
from porter.cluster.slurm import sbatch as sl
from porter.cluster.slurm.sbatch import now, read_json
from porter.cluster.slurm.matrix import PLAN_SCHEMA, REQUEST, Cell, Matrix
from porter.errors import CheckFailed, ConfigError, PartialSuccess, PorterError, ToolError, first_error
from porter.fs import atomic_path, atomic_write_json, atomic_write_text, ensure_writable_dir, read_folder_document
from porter.log import Logger, quiet_logger
from porter.run import Runner

PLAN = "matrix.json"
REPORT = "report.json"
RESULT = "result.json"
RESULT_SCHEMA = "porter.matrix-cell/1"
REPORT_SCHEMA = "porter.matrix-report/1"
SHIPPED = ("built", "partial")


def read_plan(directory: str | os.PathLike[str]) -> Matrix:
    folder = Path(directory).resolve()
    data = read_folder_document(folder, PLAN, PLAN_SCHEMA, missing="matrix",
                                missing_hint="pass the folder given to 'porter matrix run --dir'",
                                unreadable_hint="run 'porter matrix run --force' again",
                                other_hint="run the matrix with this porter version")
    return Matrix(name=str(data["name"]), dir=folder, wheelhouse=Path(data["wheelhouse"]),
                  python=str(data["python"]), cells=tuple(Cell.from_dict(c) for c in data["cells"]),
                  file=str(data.get("file", "")))


def preflight(plan: Matrix, *, force: bool) -> list[str]:
    """Refuse bad folders before anything is written: the matrix folder and the wheelhouse must be
    writable, and a folder that already holds a matrix is only reused with ``--force``. Returns warnings."""
    ensure_writable_dir(plan.dir, what="matrix folder", option="--dir")
    ensure_writable_dir(plan.wheelhouse, what="wheelhouse", option="-o")
    if not (plan.dir / PLAN).exists():
        return []
    if not force:
        raise ConfigError(f"{plan.dir} already holds a matrix ({PLAN})",
                          hint="pass --force to replace its plan and results (wheels are kept), or another --dir")
    return plan.folder.still_running_warning((plan.dir / REPORT).exists())


def write_plan(plan: Matrix, *, force: bool) -> None:
    """Create the matrix folder: ``matrix.json``, the two job scripts, one folder per cell. With
    ``force``, an earlier plan's results, logs and report are removed first (wheels are kept)."""
    preflight(plan, force=force)
    ensure_writable_dir(plan.dir, what="matrix folder", option="--dir", create=True)
    ensure_writable_dir(plan.wheelhouse, what="wheelhouse", option="-o", create=True)
    plan.folder.reset("cells", files=(REPORT, PLAN))
    for cell in plan.cells:
        plan.cell_dir(cell).mkdir(parents=True, exist_ok=True)
    porter, title = [plan.python, "-m", "porter"], f"matrix {plan.name!r}"
    index = '"${1:-${SLURM_ARRAY_TASK_ID:?pass the cell index, or run as an array task}}"'
    plan.folder.write_scripts(
        plan.folder.script(title, "one cell per array task (or: bash cell.sh INDEX)",
                           body=f"exec {shlex.join([*porter, 'matrix', 'cell', str(plan.dir)])} {index}\n"),
        plan.folder.script(title, "index the wheelhouse and write the report",
                           body=f"exec {shlex.join([*porter, 'matrix', 'finish', str(plan.dir)])}\n"))
    atomic_write_json(plan.dir / PLAN, plan.to_dict())


# ---------------------------------------------------------------------------------------------- one cell

def _move(src: Path, dest: Path) -> None:
    """Rename ``src`` onto ``dest``; across filesystems, copy beside ``dest`` and rename."""
    try:
        os.replace(src, dest)
    except OSError:
        with atomic_path(dest) as tmp:
            shutil.copyfile(src, tmp)
        src.unlink()


def _ship(out: Path, wheelhouse: Path) -> Path:
    """Move what a build left in ``out`` into the wheelhouse (each manifest before its wheel, so a
    reader never sees a porter wheel without one); returns the porter wheel's new path."""
    manifests = sorted(out.glob(f"*.whl{SUFFIX}"))
    if len(manifests) != 1:
        raise ConfigError(f"the build left {len(manifests)} porter wheel(s) with a manifest in {out}, not one")
    wheel = out / manifests[0].name[: -len(SUFFIX)]
    if not wheel.is_file():
        raise ConfigError(f"{manifests[0]} has no wheel beside it")
    wheelhouse.mkdir(parents=True, exist_ok=True)
    for extra in sorted(out.glob("*.whl")):
        if extra != wheel:
            _move(extra, wheelhouse / extra.name)  # dependencies a build fetched (args: --with-deps)
    _move(manifests[0], wheelhouse / manifests[0].name)
    _move(wheel, wheelhouse / wheel.name)
    return wheelhouse / wheel.name


def run_cell(directory: str | os.PathLike[str], index: int, *, runner: Runner, env: Mapping[str, str],
             log: Logger | None = None) -> dict[str, Any]:
    """Build one cell and record the outcome in ``cells/<id>/result.json``. A failed build is recorded
    (status ``failed``, exit code, log) and returned, not raised: the job must end 0 so the index job's
    ``afterok`` holds."""
    log = log or quiet_logger()
    plan = read_plan(directory)
    if not 0 <= index < len(plan.cells):
        raise ConfigError(f"no cell {index} in {plan.dir} (cells 0-{len(plan.cells) - 1})")
    cell = plan.cells[index]
    out, build_log = plan.cell_dir(cell) / "out", plan.cell_dir(cell) / "build.log"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    atomic_write_json(plan.cell_dir(cell) / REQUEST, cell.request().to_dict())
    argv = plan.argv(cell)
    ids = {"job_id": "SLURM_JOB_ID", "array_job_id": "SLURM_ARRAY_JOB_ID", "array_task_id": "SLURM_ARRAY_TASK_ID"}
    doc: dict[str, Any] = {"schema": RESULT_SCHEMA, **jsonable(dataclasses.asdict(cell)), "status": "running",
                           "host": socket.gethostname(), "slurm": {k: env[v] for k, v in ids.items() if env.get(v)},
                           "started": now(), "command": argv, "log": str(build_log), "job_log": str(plan.job_log(cell))}
    atomic_write_json(plan.cell_dir(cell) / RESULT, doc)
    log.info(f"cell {cell.index} {cell.id}: {cell.component} from {cell.source} with {cell.toolchain_name}")
    start = time.monotonic()
    try:
        res = runner.run(argv, env=env, check=False)
        code, output = res.returncode, res.output
    except ToolError as exc:  # the python itself is gone
        code, output = 127, f"ERROR: {exc.message}\n"
    seconds = round(time.monotonic() - start, 2)
    atomic_write_text(build_log, f"$ {shlex.join(argv)}\n{output}\n"
                                            f"[porter matrix] exit code {code} after {seconds:.1f} s\n")
    doc.update(returncode=code, seconds=seconds, finished=now())
    if code in (0, PartialSuccess.exit_code):
        try:
            wheel = _ship(out, plan.wheelhouse)
        except ConfigError as exc:
            doc.update(status="failed", error=f"exit code {code} but {exc.message}")
        else:
            doc.update(status="built" if code == 0 else "partial", wheel=wheel.name, wheel_path=str(wheel))
            if code:
                doc["error"] = first_error(output)
    else:
        doc.update(status="failed", error=first_error(output))
    with contextlib.suppress(OSError):
        out.rmdir()  # empty once shipped; what a failed build left stays for a look
    atomic_write_json(plan.cell_dir(cell) / RESULT, doc)
    log.info(f"cell {cell.index} {cell.id}: {doc['status']} in {seconds:.1f} s"
             + (f": {doc['wheel']}" if doc.get("wheel") else f"; log {build_log}"))
    return doc


# --------------------------------------------------------------------------------- results and the report

def _cell_entry(plan: Matrix, cell: Cell) -> dict[str, Any]:
    """One cell as the report shows it, read from its result file and its wheel's manifest."""
    entry: dict[str, Any] = {"index": cell.index, "id": cell.id, "component": cell.component, "source": cell.source,
                             "toolchain": cell.toolchain_name, "label": cell.label, "status": "not run",
                             "wheel": None, "log": None, "job_log": str(plan.job_log(cell))}
    try:
        result = json.loads((plan.cell_dir(cell) / RESULT).read_text())
    except FileNotFoundError:
        return entry
    except (OSError, json.JSONDecodeError) as exc:
        entry.update(status="failed", error=f"result file unreadable: {exc}")
        return entry
    entry.update((k, result[k]) for k in ("status", "returncode", "seconds", "host", "started", "finished", "error",
                                          "log", "slurm", "wheel", "wheel_path") if k in result)
    if entry["status"] == "running":
        entry.update(status="incomplete", error=f"started on {result.get('host')} at {result.get('started')} "
                                                "and left no result: still running, or killed (see job_log)")
    elif entry["status"] in SHIPPED:
        try:
            manifest = read_manifest(manifest_path(entry["wheel_path"]))
        except ConfigError as exc:
            entry.update(status="failed", error=exc.message)
        else:
            entry.update(version=manifest["version"], sha256=manifest["wheel"].get("sha256"),
                         manifest=str(manifest_path(entry["wheel_path"])))
            failed_ops = [o["name"] for o in manifest.get("ops", []) if o.get("status") == "failed"]
            if failed_ops:
                entry["failed_ops"] = failed_ops
    return entry


def collect(plan: Matrix) -> dict[str, Any]:
    cells = [_cell_entry(plan, c) for c in plan.cells]
    return {"name": plan.name, "dir": str(plan.dir), "wheelhouse": str(plan.wheelhouse),
            "counts": dict(Counter(c["status"] for c in cells)), "cells": cells}


def finish(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The final job: read every cell's result, index the wheelhouse when anything shipped
    (``porter wheelhouse index``), write ``report.json`` and return it."""
    from porter.install.wheelhouse import INDEX_NAME, write_index

    plan = read_plan(directory)
    started = now()
    doc = collect(plan)
    index: dict[str, Any] | None = None
    index_error: str | None = "no cell built a wheel; nothing to index"
    if any(c["status"] in SHIPPED for c in doc["cells"]):
        try:
            written = write_index(plan.wheelhouse)
        except PorterError as exc:
            index_error = exc.message
        else:
            index_error = None
            index = {"simple": str(plan.wheelhouse / "simple"), "manifest": str(plan.wheelhouse / INDEX_NAME),
                     "wheels": len(written["wheels"])}
    report = {"schema": REPORT_SCHEMA, "porter_version": __version__, **doc, "index": index,
              "index_error": index_error, "index_started": started, "finished": now()}
    atomic_write_json(plan.dir / REPORT, report)
    return report


def status(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The matrix now: each cell from its result file; the index from the report once it is written."""
    plan = read_plan(directory)
    doc = collect(plan)
    report = read_json(plan.dir / REPORT)
    submission = plan.folder.submission()
    if report is not None:
        doc.update(state="finished", index=report.get("index"), index_error=report.get("index_error"),
                   finished=report.get("finished"))
    else:
        doc["state"] = "submitted" if submission else "planned"
    doc["submission"] = submission
    return doc


def outcome(doc: Mapping[str, Any]) -> PorterError | None:
    """The exit a finished matrix deserves: None (all built and indexed), PartialSuccess (3: some cells
    failed, the others shipped), CheckFailed (1: nothing shipped, or the index failed)."""
    cells = doc["cells"]
    bad = [c for c in cells if c["status"] != "built"]
    where = doc["dir"]
    if doc.get("index_error") or not any(c["status"] in SHIPPED for c in cells):
        return CheckFailed(f"matrix {doc['name']}: {doc.get('index_error') or 'no cell built a wheel'}",
                           hint=f"read the cells' logs (porter matrix status {where})")
    if bad:
        return PartialSuccess(f"matrix {doc['name']}: {len(bad)} of {len(cells)} cell(s) did not build cleanly: "
                              + ", ".join(f"{c['id']} ({c['status']})" for c in bad),
                              hint=f"the other wheels shipped and are indexed; logs: porter matrix status {where}")
    return None


def describe(doc: Mapping[str, Any]) -> list[str]:
    """The report (or a status) as text, one line per cell."""
    counts = ", ".join(f"{n} {s}" for s, n in sorted(doc["counts"].items()))
    lines = [f"matrix {doc['name']}: {len(doc['cells'])} cell(s): {counts}"]
    width = max((len(c["id"]) for c in doc["cells"]), default=4)
    for c in doc["cells"]:
        secs = f"{c['seconds']:7.1f}s" if isinstance(c.get("seconds"), (int, float)) else " " * 8
        if c["status"] in SHIPPED:
            what = str(c.get("wheel"))
            if c.get("failed_ops"):
                what += f"  (without {', '.join(c['failed_ops'])})"
        elif c["status"] == "not run":
            what = f"no result yet; job log {c['job_log']}"
        else:
            what = f"log {c.get('log') or c['job_log']}" + (f"  {c['error']}" if c.get("error") else "")
        lines.append(f"  {c['id']:<{width}}  {c['status']:<10} {secs}  {what}")
    if doc.get("index"):
        lines.append(f"wheelhouse {doc['wheelhouse']}: {doc['index']['wheels']} wheel(s) indexed in "
                     f"{doc['index']['simple']}/")
    elif doc.get("index_error"):
        lines.append(f"wheelhouse {doc['wheelhouse']}: not indexed: {doc['index_error']}")
    return lines


# ------------------------------------------------------------------------------------------------ --local

def run_local(plan: Matrix, *, runner: Runner, env: Mapping[str, str], log: Logger | None = None) -> dict[str, Any]:
    """Run the same two job scripts here: every cell one after another, then the index step. As on
    Slurm (afterok), the index step runs only when every cell's job exited 0."""
    log = log or quiet_logger()
    lost: list[str] = []
    for cell in plan.cells:
        log.info(f"==> cell {cell.index + 1}/{len(plan.cells)}: {cell.id}")
        res = runner.run(["bash", str(plan.folder.task_script), str(cell.index)], env=env, check=False)
        atomic_write_text(plan.job_log(cell), res.output)
        entry = _cell_entry(plan, cell)
        if not res.ok:
            lost.append(cell.id)
            log.warn(f"cell {cell.id}: its job exited {res.returncode} without a result; see {plan.job_log(cell)}")
        else:
            log.info(f"    {entry['status']}" + (f": {entry['wheel']}" if entry.get("wheel") else
                                                  f"; log {entry.get('log')}"))
    if lost:
        raise ToolError(f"{len(lost)} cell job(s) ended without a result: {', '.join(lost)}; the wheelhouse "
                        "was not indexed (as afterok would on Slurm)",
                        hint=f"read their logs in {plan.dir / 'logs'}; 'porter matrix finish {plan.dir}' "
                             "indexes what was built")
    res = runner.run(["bash", str(plan.folder.final_script)], env=env, check=False)
    atomic_write_text(plan.folder.final_log, res.output)
    if (report := read_json(plan.dir / REPORT)) is None:
        raise ToolError(f"the index step wrote no report (exit code {res.returncode})",
                        hint=f"read {plan.folder.final_log}")
    return report


# ------------------------------------------------------------------------------------- the whole run

@dataclass
class RunResult:
    plan: Matrix
    mode: str
    report: dict[str, Any] | None = None
    """The report, once the index step ran (--local, --slurm --wait)."""
    submission: dict[str, Any] | None = None
    dry_run: list[str] | None = None
    """The plan as text (--dry-run), ending with what a real run here would refuse."""

    def to_dict(self) -> dict[str, Any]:
        if self.dry_run is not None:
            return {"dry_run": True, "mode": self.mode, "plan": self.plan.to_dict(), "lines": self.dry_run}
        return {"mode": self.mode, "dir": str(self.plan.dir), "submission": self.submission, "report": self.report}


def _dry_run_lines(plan: Matrix, tail: list[str]) -> list[str]:
    """The plan as text, then the Slurm submission's commands (``tail``, none to run the cells here)."""
    lines = [f"# matrix {plan.name}: {len(plan.cells)} cell(s) in {plan.dir}, wheels into {plan.wheelhouse}"]
    for cell in plan.cells:
        lines.append(f"# cell {cell.index} {cell.id}: {cell.component} from {cell.source} with "
                     f"{cell.toolchain_name} (+{cell.label})")
        lines.append(f"# {REQUEST}: {json.dumps(cell.request().to_dict(), sort_keys=True)}")
        lines.append(shlex.join(plan.argv(cell)))
    lines.append(f"# then: index {plan.wheelhouse} and write {plan.dir / REPORT}")
    lines.append(shlex.join([plan.python, "-m", "porter", "matrix", "finish", str(plan.dir)]))
    return lines + tail


def run_matrix(plan: Matrix, *, mode: str, force: bool, runner: Runner, env: Mapping[str, str],
               settings: sl.SlurmSettings | None = None, wait: bool = False, log: Logger | None = None) -> RunResult:
    """``porter matrix run``: check everything, write the matrix folder, then run the cells here one after
    another (``local``) or submit them (``slurm``: held array, afterok index job, release; with ``wait``,
    until the report is written). A dry run (a recording ``runner``) only describes it."""
    log = log or quiet_logger()
    settings = settings if settings is not None else plan.slurm
    programs, refusal = sl.programs_or_refusal(env, runner) if mode == "slurm" else (None, None)
    warnings = preflight(plan, force=force)
    name, tasks = f"porter-matrix-{plan.name}", len(plan.cells)
    if runner.dry:
        tail = plan.folder.dry_run_tail(name=name, tasks=tasks, settings=settings, programs=programs, refusal=refusal)
        return RunResult(plan, mode, dry_run=_dry_run_lines(plan, tail if mode == "slurm" else []))
    if mode == "slurm":
        warnings += sl.local_disk_warnings({"matrix folder": plan.dir, "python": plan.python})
    for w in warnings:
        log.warn(w)
    write_plan(plan, force=force)
    if mode == "local":
        return RunResult(plan, mode, report=run_local(plan, runner=runner, env=env, log=log))
    assert programs is not None
    submission = plan.folder.submit(name=name, tasks=tasks, settings=settings, programs=programs, runner=runner,
                                    env=env)
    log.info(f"submitted {len(plan.cells)} cell(s) as array job {submission['array_job']} (at most "
             f"{min(settings.max_parallel, len(plan.cells))} at once) and index job {submission['index_job']} "
             f"(afterok:{submission['array_job']})")
    if not wait:
        return RunResult(plan, mode, submission=submission)
    plan.folder.wait(plan.dir / REPORT, submission, programs=programs, runner=runner, env=env, log=log)
    return RunResult(plan, mode, report=read_json(plan.dir / REPORT), submission=submission)
