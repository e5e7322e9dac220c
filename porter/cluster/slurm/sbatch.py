"""Slurm through its own commands, and the job folder a run lives in (the matrix's and the sharded build's):
one job array (one task per cell of a matrix, or per shard of a build), submitted held, a final job (the matrix's
index, the build's link) that waits on it with ``afterok``, then one ``scontrol release``.

```
DIR/jobs/TASK.sh          one array task (``bash TASK.sh INDEX`` by hand): a matrix cell, a build shard
DIR/jobs/FINAL.sh         the job after every task (afterok): the matrix's index, the build's link
DIR/logs/TASK-I.log       each task's own output (Slurm's --output); logs/FINAL.log the final job's
DIR/submission.json       the Slurm job ids, the sbatch commands, the settings, when
DIR/...                   what the run itself keeps (the frozen request, results, the report)
```

Every file is written whole (a temporary sibling renamed into place); the jobs read only what the folder
holds, so a folder on a filesystem every node sees is all they need. Everything goes through
:class:`porter.run.Runner` (argv lists, an explicit env). Nothing here reads Slurm's accounting: results are files
the jobs write on the shared filesystem; ``squeue`` is asked only whether the final job is still alive while
``--wait`` waits for the report.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porter import __version__
from porter.errors import CommandFailed, ConfigError, PorterError, ToolError, refusal_line, shown
from porter.fs import atomic_write_json, atomic_write_text
from porter.log import Logger, quiet_logger
from porter.run import Runner, which
from porter.userdata import check_keys, whole_number

SUBMISSION = "submission.json"
_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$")     # minutes, m:s, h:m:s, d-h, d-h:m, d-h:m:s
_MEM = re.compile(r"^\d+[KMGT]?$")
_NAME = re.compile(r"^[A-Za-z0-9_.,+-]+$")
# sbatch options porter sets itself: the array, the dependency, the hold, where logs go
OWNED_SBATCH = ("--array", "--dependency", "--hold", "--output", "--error", "--parsable", "--chdir",
                "--job-name", "--kill-on-invalid-dep", "-a", "-d", "-H", "-o", "-e", "-D", "-J")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
_NAMES = (_NAME, "a Slurm name", "letters, digits, '_', '.', '-' (several partitions: comma-separated)")
_TIMES = (_TIME, "a Slurm time", "minutes (90), hours:minutes:seconds (2:00:00) or days-hours (1-12)")
_FORMATS = {"partition": _NAMES, "account": _NAMES, "qos": _NAMES, "time": _TIMES, "index_time": _TIMES,
            "mem": (_MEM, "a Slurm memory size", "e.g. 16G or 4000M")}
"""The text settings: the pattern each must match, what it is, the hint when it does not."""


@dataclass(frozen=True, kw_only=True)
class SlurmSettings:
    """What each job asks Slurm for. Precedence: command line > ``PORTER_SLURM_*`` > the matrix file's
    ``[slurm]`` table > these defaults."""

    partition: str | None = None
    """``--partition`` of every job (default: the cluster's default partition)."""
    account: str | None = None
    """``--account`` to charge."""
    qos: str | None = None
    """``--qos``."""
    time: str | None = None
    """``--time`` of each cell task (Slurm's formats: ``90``, ``2:00:00``, ``1-12``)."""
    cpus_per_task: int | None = None
    """``--cpus-per-task`` of each cell task."""
    mem: str | None = None
    """``--mem`` of each cell task (``16G``)."""
    max_parallel: int = 8
    """At most this many cells run at once (the array's ``%N``)."""
    index_time: str | None = None
    """``--time`` of the index job (default: the partition's default)."""
    sbatch_args: tuple[str, ...] = ()
    """More sbatch options for every job (``--constraint=nvme``, ``--gres=gpu:1``)."""

    def __post_init__(self) -> None:
        for key, (pattern, what, hint) in _FORMATS.items():
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"slurm {key} must be a string, not {shown(value)}")
            if value is not None and not pattern.match(value):
                raise ConfigError(f"slurm {key} {value!r} is not {what}", hint=hint)
        for key in ("cpus_per_task", "max_parallel"):  # below 2**63 so that a message never shows a huge value
            value = getattr(self, key)
            if value is not None and not whole_number(value, 1):
                raise ConfigError(f"slurm {key} must be a whole number >= 1, not {shown(value)}")
        for arg in self.sbatch_args:
            if not isinstance(arg, str) or not arg.startswith("-"):
                raise ConfigError(f"slurm sbatch_args: {arg!r} is not an sbatch option",
                                  hint="give options as '--name=value' strings")
            if arg.split("=", 1)[0] in OWNED_SBATCH:
                raise ConfigError(f"slurm sbatch_args: porter sets {arg.split('=', 1)[0]} itself",
                                  hint="leave it out; porter writes the array, the dependency and the log paths")

    @classmethod
    def from_table(cls, data: Mapping[str, Any], where: str) -> SlurmSettings:
        check_keys(data, {f.name for f in dataclasses.fields(cls)}, where, table="slurm")
        values = dict(data)
        if "sbatch_args" in values:
            args = values["sbatch_args"]
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise ConfigError(f"{where}: [slurm] sbatch_args must be a list of strings",
                                  hint="give options as '--name=value' strings")
            values["sbatch_args"] = tuple(args)
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc.message}", hint=exc.hint) from None

    def merged(self, overrides: Mapping[str, Any]) -> SlurmSettings:
        """These settings with every override that is not None (or empty) applied."""
        changes: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None and v != ()}
        if "sbatch_args" in changes:
            changes["sbatch_args"] = self.sbatch_args + tuple(changes["sbatch_args"])
        return dataclasses.replace(self, **changes)

    def common_args(self) -> list[str]:
        """Options every job gets: where it runs and who pays."""
        out = [f"--{k}={v}" for k, v in (("partition", self.partition), ("account", self.account),
                                          ("qos", self.qos)) if v]
        return out + list(self.sbatch_args)


@dataclass(frozen=True)
class Programs:
    sbatch: Path
    scontrol: Path
    squeue: Path | None
    scancel: Path | None


def programs_or_refusal(env: Mapping[str, str], runner: Runner, *, what: str = "the matrix",
                        local: str = "run the cells on this machine one after another with --local",
                        ) -> tuple[Programs | None, str | None]:
    """Slurm's commands on the env's PATH; sbatch or scontrol missing is an error that names the local
    alternative (``local``: what to do instead on this machine), and in a dry run (a recording ``runner``) the
    refusal to end with instead."""
    found = {name: which(name, path=env.get("PATH")) for name in ("sbatch", "scontrol", "squeue", "scancel")}
    if missing := [n for n in ("sbatch", "scontrol") if found[n] is None]:
        message = f"{' and '.join(missing)} not found on PATH: --slurm submits {what} with Slurm's own commands"
        if not runner.dry:
            raise ToolError(message, hint=f"{local}, or run porter on a Slurm login node (module load slurm)")
        return None, message
    sbatch, scontrol = found["sbatch"], found["scontrol"]
    assert sbatch is not None and scontrol is not None
    return Programs(sbatch, scontrol, found["squeue"], found["scancel"]), None


def local_disk_warnings(paths: Mapping[str, str | Path]) -> list[str]:
    """One warning per path (``what -> path``) on this machine's own disk, which other nodes cannot see."""
    return [f"the {what} {path} is on this machine's local disk: only jobs on this node can see it"
            for what, path in paths.items() if str(path).startswith(("/tmp/", "/dev/shm/", "/var/tmp/"))]


# ---------------------------------------------------------------------------------------------- the job folder

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

    def array_argv(self, sbatch: str | Path, *, name: str, tasks: int, settings: SlurmSettings) -> list[str]:
        """The tasks (matrix cells, build shards): one array task each, at most ``max_parallel`` at once, submitted
        held; each task's output in its own log."""
        argv = [str(sbatch), "--parsable", "--hold", f"--job-name={name}",
                f"--array=0-{tasks - 1}%{min(settings.max_parallel, tasks)}", f"--chdir={self.dir}",
                f"--output={self.task_log('%a')}", *settings.common_args()]
        argv += [f"--{k.replace('_', '-')}={v}" for k, v in (("time", settings.time),
                                                             ("cpus_per_task", settings.cpus_per_task),
                                                             ("mem", settings.mem)) if v]
        return argv + [str(self.task_script)]

    def final_argv(self, sbatch: str | Path, *, name: str, array_job: str, settings: SlurmSettings) -> list[str]:
        """The final job: starts once every array task ended with exit 0 (a matrix cell records a failed build in
        its result file and still exits 0); cancelled by Slurm when a task failed or was lost (killed, timed out)."""
        argv = [str(sbatch), "--parsable", f"--job-name={name}-{self.final}", f"--dependency=afterok:{array_job}",
                "--kill-on-invalid-dep=yes", f"--chdir={self.dir}", f"--output={self.final_log}",
                "--cpus-per-task=1", *settings.common_args()]
        if settings.index_time:
            argv.append(f"--time={settings.index_time}")
        return argv + [str(self.final_script)]

    def dry_run_tail(self, *, name: str, tasks: int, settings: SlurmSettings, programs: Programs | None,
                     refusal: str | None) -> list[str]:
        """A dry run's last lines: the three commands a submission runs (the held array, the final job, the
        release), then what a real run here would refuse."""
        sbatch = programs.sbatch if programs else "sbatch"
        argvs = [self.array_argv(sbatch, name=name, tasks=tasks, settings=settings),
                 self.final_argv(sbatch, name=name, array_job="<array-job>", settings=settings),
                 [str(programs.scontrol if programs else "scontrol"), "release", "<array-job>"]]
        return ["# submitted as:", *map(shlex.join, argvs), *([refusal_line(refusal)] if refusal else [])]

    def submit(self, *, name: str, tasks: int, settings: SlurmSettings, programs: Programs, runner: Runner,
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

    def wait(self, report: Path, submission: Mapping[str, Any], *, programs: Programs, runner: Runner,
             env: Mapping[str, str], log: Logger | None = None, poll: float = 0.5, lost_hint: str | None = None,
             sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        """Wait until the final job of ``submission`` wrote ``report``. Slurm is asked (squeue) only every 10
        seconds, and only whether that job is still queued or running: when it ended, or Slurm forgot it, without
        a report, waiting stops with an error (``lost_hint``: what to do then)."""
        log = log or quiet_logger()
        job = submission[f"{self.final}_job"]
        last_check = clock()
        while not report.exists():
            sleep(poll)
            if clock() - last_check < 10.0:
                continue
            last_check = clock()
            # its state while slurmctld still knows it (PENDING, COMPLETED...); None once forgotten, or with no squeue
            res = runner.run([str(programs.squeue), "-h", "-t", "all", "-j", job, "-o", "%T"], env=env,
                             check=False) if programs.squeue else None
            states = res.output.split() if res is not None and res.ok else []
            state = states[0] if states else None
            if state is not None and state not in ENDED:
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
