"""A one-node Slurm cluster on this machine, for the matrix tests and benchmarks/matrix.py.

Debian's slurm-wlm + munge (installed with apt-get when sbatch is missing and we are root). Everything
lives in one folder: a munge key and socket, slurm.conf naming this host (CPUs from the machine,
cons_tres, linuxproc, task/none, no accounting), state/spool/log dirs. munged, slurmctld and slurmd
are started by hand (no systemd) with SLURM_CONF in their env only, and stopped by their own pids.
Clients find the cluster through :attr:`SlurmCluster.env` (SLURM_CONF); os.environ is never changed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROGRAMS = ("sbatch", "scontrol", "squeue", "sinfo", "slurmctld", "slurmd", "munged")


class ClusterUnavailable(RuntimeError):
    """Slurm could not be installed or started here (the message says why)."""


@dataclass(frozen=True)
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    cpus: int

    @property
    def env(self) -> dict[str, str]:
        """What a client of this cluster needs on top of the environment."""
        return {"SLURM_CONF": str(self.conf)}


def _missing() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def ensure_installed() -> None:
    """apt-get install slurm-wlm munge when a program is missing (root only)."""
    if not _missing():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ClusterUnavailable(f"missing {', '.join(_missing())}; install slurm-wlm and munge (needs root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(argv)} failed: {proc.stderr[-800:]}")
    if _missing():
        raise ClusterUnavailable(f"still missing after apt-get: {', '.join(_missing())}")


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _mem_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(int(line.split()[1]) / 1024 * 0.8)
    return 1024


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop(pid_file: Path, name: str) -> None:
    """SIGTERM the daemon named in pid_file (only if that pid still runs `name`), then wait for it."""
    pid = _pid(pid_file)
    if pid is None:
        return
    try:
        if name not in Path(f"/proc/{pid}/comm").read_text():
            return
        os.kill(pid, signal.SIGTERM)
    except (OSError, ProcessLookupError):
        return
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _write_conf(root: Path, node: str, cpus: int) -> Path:
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=porter-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
AuthInfo=socket={root / 'munge-run' / 'munge.sock'}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'log' / 'slurmctld.log'}
SlurmdLogFile={root / 'log' / 'slurmd.log'}
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={_mem_mib()} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


@contextmanager
def one_node_slurm(root: Path, *, ready_timeout: float = 60.0) -> Iterator[SlurmCluster]:
    """Start munged, slurmctld and slurmd under ``root``; yield the cluster once its node is idle; stop
    all three (by their pids) on the way out."""
    ensure_installed()
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("munge-key", "munge-run", "state", "spool", "log"):
        (root / sub).mkdir(exist_ok=True)
    (root / "munge-key").chmod(0o700)
    (root / "munge-run").chmod(0o755)
    key = root / "munge-key" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    node = socket.gethostname().split(".")[0]
    cpus = len(os.sched_getaffinity(0))
    conf = _write_conf(root, node, cpus)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munge_pid = root / "munge-run" / "munged.pid"
    try:
        for argv in ([_program("munged"), "--force", f"--key-file={key}", f"--socket={root / 'munge-run' / 'munge.sock'}",
                      f"--pid-file={munge_pid}", f"--log-file={root / 'log' / 'munged.log'}",
                      f"--seed-file={root / 'munge-key' / 'munged.seed'}"],
                     [_program("slurmctld"), "-i"], [_program("slurmd"), "-N", node]):
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise ClusterUnavailable(f"{Path(argv[0]).name} did not start: {(proc.stdout + proc.stderr)[-800:]}")
        deadline = time.monotonic() + ready_timeout
        state = ""
        while time.monotonic() < deadline:
            proc = subprocess.run([_program("sinfo"), "-h", "-N", "-o", "%t"], env=env, capture_output=True, text=True)
            state = proc.stdout.strip()
            if proc.returncode == 0 and state.startswith("idle"):
                break
            time.sleep(0.5)
        else:
            logs = "".join((root / "log" / f).read_text()[-600:] for f in ("slurmctld.log", "slurmd.log")
                           if (root / "log" / f).exists())
            raise ClusterUnavailable(f"the node is not idle after {ready_timeout:.0f}s (state {state!r}): {logs}")
        yield SlurmCluster(root=root, conf=conf, node=node, cpus=cpus)
    finally:
        _stop(root / "slurmd.pid", "slurmd")
        _stop(root / "slurmctld.pid", "slurmctld")
        _stop(munge_pid, "munged")
