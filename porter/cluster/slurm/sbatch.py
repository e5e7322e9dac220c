"""Slurm through its own commands: the settings every job asks for and the programs that submit them (a job
folder's held array, its final job after it with ``afterok``, one ``scontrol release``:
:class:`porter.cluster.slurm.folder.JobFolder`).

Everything goes through :class:`porter.run.Runner` (argv lists, an explicit env). Nothing here reads
Slurm's accounting: results are files the jobs write on the shared filesystem (:mod:`porter.cluster.slurm.matrix_run`);
``squeue`` is asked only whether the final job is still alive while ``--wait`` waits for the report.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porter.errors import ConfigError, ToolError, shown
from porter.run import Runner, which
from porter.userdata import check_keys, whole_number

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


def find_programs(env: Mapping[str, str], *, what: str = "the matrix",
                  local: str = "run the cells on this machine one after another with --local") -> Programs:
    """Slurm's commands on the env's PATH; sbatch or scontrol missing is an error that names the local
    alternative (``local``: what to do instead on this machine)."""
    path = env.get("PATH")
    found = {name: which(name, path=path) for name in ("sbatch", "scontrol", "squeue", "scancel")}
    missing = [n for n in ("sbatch", "scontrol") if found[n] is None]
    if missing:
        raise ToolError(f"{' and '.join(missing)} not found on PATH: --slurm submits {what} with Slurm's "
                        "own commands",
                        hint=f"{local}, or run porter on a Slurm login node (module load slurm)")
    sbatch, scontrol = found["sbatch"], found["scontrol"]
    assert sbatch is not None and scontrol is not None
    return Programs(sbatch, scontrol, found["squeue"], found["scancel"])


def programs_or_refusal(env: Mapping[str, str], runner: Runner, **where: str) -> tuple[Programs | None, str | None]:
    """:func:`find_programs` (``where``: its ``what`` and ``local``); where they are missing, a dry run (a recording
    ``runner``) gets the refusal to end with instead of the error."""
    try:
        return find_programs(env, **where), None
    except ToolError as exc:
        if not runner.dry:
            raise
        return None, exc.message


def local_disk_warnings(paths: Mapping[str, str | Path]) -> list[str]:
    """One warning per path (``what -> path``) on this machine's own disk, which other nodes cannot see."""
    return [f"the {what} {path} is on this machine's local disk: only jobs on this node can see it"
            for what, path in paths.items() if str(path).startswith(("/tmp/", "/dev/shm/", "/var/tmp/"))]
