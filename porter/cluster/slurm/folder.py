"""The job folder a Slurm run lives in, shared by the matrix and the sharded build.

```
DIR/jobs/TASK.sh          one array task (``bash TASK.sh INDEX`` by hand): a matrix cell, a build shard
DIR/jobs/FINAL.sh         the job after every task (afterok): the matrix's index, the build's link
DIR/logs/TASK-I.log       each task's own output (Slurm's --output); logs/FINAL.log the final job's
DIR/submission.json       the Slurm job ids, the sbatch commands, the settings, when
DIR/...                   what the run itself keeps (the frozen request, results, the report)
```

Every file is written whole (a temporary sibling renamed into place); the jobs read only what the folder
holds, so a folder on a filesystem every node sees is all they need.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porter import __version__
from porter.cluster.slurm import sbatch as sl
from porter.errors import refusal_line
from porter.fs import atomic_write_json, atomic_write_text
from porter.run import Runner

SUBMISSION = "submission.json"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object a job wrote, or None when it is absent, half-read or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_exit_code(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class JobFolder:
    """One run's folder: ``task`` names the array's jobs (``cell``, ``shard``), ``final`` the job after them
    (``index``, ``link``)."""

    dir: Path
    task: str
    final: str

    @property
    def task_script(self) -> Path:
        return self.dir / "jobs" / f"{self.task}.sh"

    @property
    def final_script(self) -> Path:
        return self.dir / "jobs" / f"{self.final}.sh"

    def task_log(self, index: int) -> Path:
        return self.dir / "logs" / f"{self.task}-{index}.log"

    @property
    def final_log(self) -> Path:
        return self.dir / "logs" / f"{self.final}.log"

    def submission(self) -> dict[str, Any] | None:
        return read_json(self.dir / SUBMISSION)

    def reset(self, *folders: str, files: tuple[str, ...] = ()) -> None:
        """Empty ``jobs/``, ``logs/`` and the run's own ``folders`` (made anew), and remove the submission
        and the run's own ``files``: what an earlier run left is never read as this run's."""
        for sub in ("jobs", "logs", *folders):
            shutil.rmtree(self.dir / sub, ignore_errors=True)
            (self.dir / sub).mkdir(parents=True)
        for name in (SUBMISSION, *files):
            (self.dir / name).unlink(missing_ok=True)

    def script(self, title: str, what: str, body: str, *, exports: Mapping[str, str] | None = None) -> str:
        """A job script: what it is, who wrote it, the variables it exports, then ``body``."""
        return ("#!/bin/bash\n"
                f"# porter {title}: {what}\n"
                f"# written by porter {__version__}; the run is described in {self.dir}\n"
                + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in (exports or {}).items())
                + body)

    def write_scripts(self, task: str, final: str) -> None:
        for path, text in ((self.task_script, task), (self.final_script, final)):
            atomic_write_text(path, text)
            path.chmod(0o755)

    def dry_run_tail(self, *, name: str, tasks: int, settings: sl.SlurmSettings, programs: sl.Programs | None,
                     refusal: str | None) -> list[str]:
        """A dry run's last lines: the three commands a submission runs (the held array, the final job, the
        release), then what a real run here would refuse."""
        sbatch = programs.sbatch if programs else "sbatch"
        argvs = [sl.array_argv(sbatch, name=name, cells=tasks, directory=self.dir, script=self.task_script,
                               settings=settings, task_log=f"{self.task}-%a.log"),
                 sl.index_argv(sbatch, name=name, array_job="<array-job>", directory=self.dir,
                               script=self.final_script, settings=settings, final=self.final),
                 [str(programs.scontrol if programs else "scontrol"), "release", "<array-job>"]]
        return ["# submitted as:", *map(shlex.join, argvs), *([refusal_line(refusal)] if refusal else [])]

    def submit(self, *, name: str, tasks: int, settings: sl.SlurmSettings, programs: sl.Programs, runner: Runner,
               env: Mapping[str, str], hint: str | None = None) -> tuple[sl.Submission, dict[str, Any]]:
        """Submit the held array and the final job, release, and record it all in ``submission.json``
        (``array_job``, ``<final>_job``, their argv, the settings, when)."""
        extra = {"hint": hint} if hint else {}
        sub = sl.submit(name=name, cells=tasks, directory=self.dir, cell_script=self.task_script,
                        index_script=self.final_script, settings=settings, programs=programs, runner=runner,
                        env=env, task_log=f"{self.task}-%a.log", final=self.final, **extra)
        record = {"array_job": sub.array_job, f"{self.final}_job": sub.index_job, "array_argv": sub.array_argv,
                  f"{self.final}_argv": sub.index_argv, "settings": dataclasses.asdict(settings), "submitted": now()}
        atomic_write_json(self.dir / SUBMISSION, record)
        return sub, record

    def still_running_warning(self, finished: bool) -> list[str]:
        """A warning when the folder holds a submission whose final job left nothing yet: its jobs may
        still run and would write into the new run's files."""
        sub = self.submission()
        if sub is None or finished:
            return []
        return [f"{self.dir} holds an earlier submission without a result from its {self.final} job: its jobs "
                f"{sub.get('array_job')} and {sub.get(f'{self.final}_job')} may still run (scancel them)"]
