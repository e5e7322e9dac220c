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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porter import __version__
from porter.cluster.slurm import sbatch as sl
from porter.errors import CommandFailed, PorterError, ToolError, refusal_line
from porter.fs import atomic_write_json, atomic_write_text
from porter.log import Logger, quiet_logger
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


def _job_id(output: str, argv: list[str]) -> str:
    """sbatch --parsable prints ``JOBID`` or ``JOBID;CLUSTER`` (after any warnings)."""
    for line in reversed(output.strip().splitlines()):
        first = line.strip().split(";", 1)[0]
        if first.isdigit():
            return first
    raise CommandFailed(argv, 0, output, hint="sbatch --parsable printed no job id")


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

    def task_log(self, index: int | str) -> Path:
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

    def array_argv(self, sbatch: str | Path, *, name: str, tasks: int, settings: sl.SlurmSettings) -> list[str]:
        """The tasks (matrix cells, build shards): one array task each, at most ``max_parallel`` at once, submitted
        held; each task's output in its own log."""
        argv = [str(sbatch), "--parsable", "--hold", f"--job-name={name}",
                f"--array=0-{tasks - 1}%{min(settings.max_parallel, tasks)}", f"--chdir={self.dir}",
                f"--output={self.task_log('%a')}", *settings.common_args()]
        argv += [f"--{k.replace('_', '-')}={v}" for k, v in (("time", settings.time),
                                                             ("cpus_per_task", settings.cpus_per_task),
                                                             ("mem", settings.mem)) if v]
        return argv + [str(self.task_script)]

    def final_argv(self, sbatch: str | Path, *, name: str, array_job: str, settings: sl.SlurmSettings) -> list[str]:
        """The final job: starts once every array task ended with exit 0 (a matrix cell records a failed build in
        its result file and still exits 0); cancelled by Slurm when a task failed or was lost (killed, timed out)."""
        argv = [str(sbatch), "--parsable", f"--job-name={name}-{self.final}", f"--dependency=afterok:{array_job}",
                "--kill-on-invalid-dep=yes", f"--chdir={self.dir}", f"--output={self.final_log}",
                "--cpus-per-task=1", *settings.common_args()]
        if settings.index_time:
            argv.append(f"--time={settings.index_time}")
        return argv + [str(self.final_script)]

    def dry_run_tail(self, *, name: str, tasks: int, settings: sl.SlurmSettings, programs: sl.Programs | None,
                     refusal: str | None) -> list[str]:
        """A dry run's last lines: the three commands a submission runs (the held array, the final job, the
        release), then what a real run here would refuse."""
        sbatch = programs.sbatch if programs else "sbatch"
        argvs = [self.array_argv(sbatch, name=name, tasks=tasks, settings=settings),
                 self.final_argv(sbatch, name=name, array_job="<array-job>", settings=settings),
                 [str(programs.scontrol if programs else "scontrol"), "release", "<array-job>"]]
        return ["# submitted as:", *map(shlex.join, argvs), *([refusal_line(refusal)] if refusal else [])]

    def submit(self, *, name: str, tasks: int, settings: sl.SlurmSettings, programs: sl.Programs, runner: Runner,
               env: Mapping[str, str],
               hint: str = "check the partition, account and limits in the [slurm] table") -> dict[str, Any]:
        """Submit the array held, the final job after it, then release the array, and record it all in
        ``submission.json`` (``array_job``, ``<final>_job``, their argv, the settings, when). A step that fails
        cancels what was already submitted, so nothing is left queued by half."""
        first = self.array_argv(programs.sbatch, name=name, tasks=tasks, settings=settings)
        submitted = [_job_id(runner.run(first, env=env, hint=hint).output, first)]
        try:
            second = self.final_argv(programs.sbatch, name=name, array_job=submitted[0], settings=settings)
            submitted.append(_job_id(runner.run(second, env=env).output, second))
            runner.run([str(programs.scontrol), "release", submitted[0]], env=env)
        except PorterError:
            if programs.scancel is not None:
                runner.run([str(programs.scancel), *submitted], env=env, check=False)
            raise
        record = {"array_job": submitted[0], f"{self.final}_job": submitted[1], "array_argv": first,
                  f"{self.final}_argv": second, "settings": dataclasses.asdict(settings), "submitted": now()}
        atomic_write_json(self.dir / SUBMISSION, record)
        return record

    def wait(self, report: Path, submission: Mapping[str, Any], *, programs: sl.Programs, runner: Runner,
             env: Mapping[str, str], log: Logger | None = None, poll: float = 0.5, check_every: float = 10.0,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
             lost_hint: str | None = None) -> None:
        """Wait until the final job of ``submission`` wrote ``report``. Slurm is asked (squeue) only every
        ``check_every`` seconds, and only whether that job is still queued or running: when it ended, or Slurm
        forgot it, without a report, waiting stops with an error (``lost_hint``: what to do then)."""
        log = log or quiet_logger()
        job = submission[f"{self.final}_job"]
        last_check = clock()
        while not report.exists():
            sleep(poll)
            if clock() - last_check < check_every:
                continue
            last_check = clock()
            # its state while slurmctld still knows it (PENDING, COMPLETED...); None once forgotten, or with no squeue
            res = runner.run([str(programs.squeue), "-h", "-t", "all", "-j", job, "-o", "%T"], env=env,
                             check=False) if programs.squeue else None
            states = res.output.split() if res is not None and res.ok else []
            state = states[0] if states else None
            if state is not None and state not in sl.ENDED:
                log.detail(f"{self.final} job {job}: {state}")
                continue
            sleep(poll)  # the report may land just after the job ends
            if report.exists():
                return
            raise ToolError(f"the {self.final} job {job} ended ({state or 'no longer known to Slurm'}) "
                            f"without writing {report}",
                            hint=lost_hint or f"a cell task was lost (killed, timed out, out of memory) so afterok:"
                                 f"{submission['array_job']} never held; read 'porter matrix status {self.dir}' "
                                 f"and the logs in {self.dir / 'logs'}, then 'porter matrix finish {self.dir}' "
                                 "indexes what was built")

    def still_running_warning(self, finished: bool) -> list[str]:
        """A warning when the folder holds a submission whose final job left nothing yet: its jobs may
        still run and would write into the new run's files."""
        sub = self.submission()
        if sub is None or finished:
            return []
        return [f"{self.dir} holds an earlier submission without a result from its {self.final} job: its jobs "
                f"{sub.get('array_job')} and {sub.get(f'{self.final}_job')} may still run (scancel them)"]
