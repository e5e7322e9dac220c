"""The one subprocess runner.

argv lists only (never a shell), an explicit env dict per call (``os.environ`` is read once, copied,
never changed), a timeout, the command echoed before it runs, and its output replayed when it fails.
A dry run is just another runner: :class:`RecordingRunner` records what would run.

Nothing a command starts outlives porter. Each command runs in a session of its own under a small guardian
(:data:`GUARD`, a second python with no site imports) that asks Linux for a signal when its parent dies
(``PR_SET_PDEATHSIG``): when porter ends in any way, a ``kill -9`` included, the guardian stops the whole process
group (ninja and every compiler it started). Ctrl-C, SIGTERM and timeouts stop the group from porter itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path

from porter.errors import CommandFailed, Interrupted, ToolError, refusal_line, stop_note
from porter.log import Logger, quiet_logger

EnvUpdate = Mapping[str, str | None]


def make_env(update: EnvUpdate | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default: the current environment) with ``update`` applied; None unsets."""
    changes = update or {}
    env = {**(os.environ if base is None else base), **{k: v for k, v in changes.items() if v is not None}}
    return {k: v for k, v in env.items() if changes.get(k, "") is not None}


def env_changes(env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """What ``env`` changes relative to ``base``: the variables worth echoing."""
    base = os.environ if base is None else base
    changes: dict[str, str | None] = {k: v for k, v in env.items() if base.get(k) != v}
    changes.update({k: None for k in base if k not in env})
    return changes


def plan_lines(header: str, notes: Sequence[str], env: Mapping[str, str | None], argvs: Sequence[Sequence[str]],
               refusal: str | None = None) -> list[str]:
    """A dry run's plan as every build shows it: the header, its notes, the environment its commands get (``-u K``:
    unset), each command as it would run, then what a real run here would refuse."""
    import shlex

    said = stop_note(refusal) if refusal else None  # the last line says it
    lines = [f"# plan: {header}", *(f"# note: {n}" for n in notes if n != said)]
    if env:
        lines.append("# env: " + " ".join(f"-u {k}" if v is None else f"{k}={shlex.quote(v)}"
                                          for k, v in sorted(env.items())))
    lines += [shlex.join(argv) for argv in argvs]
    return lines + ([refusal_line(refusal)] if refusal else [])


@dataclass(frozen=True)
class Result:
    argv: list[str]
    returncode: int
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass
class Runner:
    """Runs commands for real, as given: where they run (host, chroot, container) is the argv an
    :class:`porter.executor.Executor` made."""

    log: Logger = field(default_factory=quiet_logger)
    echo: bool = True

    dry: bool = False
    """A dry run (:class:`RecordingRunner`): commands that change something are recorded, not run, and the library
    writes nothing into caches, trees or outputs; what it only reads, or plans in a temp folder, runs through
    :meth:`real`."""
    recorded: list[tuple[list[str], dict[str, str | None], str | None]] = field(default_factory=list)
    """A dry run's commands, each with its env changes and folder, instead of running them."""

    def real(self, echo: bool | None = None) -> Runner:
        """This runner running for real, even in a dry run: for probes and for work into a temp folder."""
        if not self.dry and echo in (None, self.echo):
            return self
        return replace(self, dry=False, echo=self.echo if echo is None else echo)

    def run(self, argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None, timeout: float | None = None,
            check: bool = True, hint: str | None = None, input: str | None = None,
            on_line: Callable[[str], None] | None = None) -> Result:
        """``on_line``: called with each line of output as it comes (from a reader thread), for progress."""
        args = [os.fspath(a) for a in argv]
        full_env = dict(env) if env is not None else make_env()
        changes, where = env_changes(full_env), os.fspath(cwd) if cwd else None
        if self.echo:
            self.log.command(args, changes, None if self.dry else where)
        if self.dry:
            self.recorded.append((args, changes, where))
            return Result(args, 0, "", 0.0)
        start = time.monotonic()
        try:
            proc = subprocess.Popen([*guard_prefix(), *args], env=full_env, cwd=cwd, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL if input is None else subprocess.PIPE, text=True,
                                    errors="replace", start_new_session=True)
        except FileNotFoundError as exc:
            raise ToolError(f"program not found: {args[0]}",
                            hint=hint or "install it or put it on PATH, or name it in the toolchain profile") from exc

        reader = _LineReader(proc, on_line) if on_line is not None and input is None else None
        try:
            if reader is not None:
                proc.wait(timeout=timeout)
                out = reader.join()
            else:
                out, _ = proc.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired:
            out = _stop_group(proc, reader)
            raise CommandFailed(args, -1, (out or "") + f"\n[porter] timed out after {timeout:.0f}s",
                                hint=hint or "raise the timeout or look at why the command hangs")
        except KeyboardInterrupt:
            _stop_group(proc, reader)
            raise Interrupted(f"interrupted while running {args[0]}; the process group was stopped")
        if proc.returncode == 127 and (out or "").startswith(GUARD_NOT_FOUND):
            raise ToolError(f"program not found: {args[0]}",
                            hint=hint or "install it or put it on PATH, or name it in the toolchain profile")
        result = Result(args, proc.returncode, out or "", time.monotonic() - start)
        if check and not result.ok:
            self.log.replay(result.output)
            raise CommandFailed(args, result.returncode, result.output, hint=hint)
        return result


class _LineReader:
    """Reads a command's output line by line in a thread, handing each line to ``on_line`` as it comes (a
    callback that raises is not asked again) and keeping the whole output."""

    def __init__(self, proc: subprocess.Popen[str], on_line: Callable[[str], None]) -> None:
        self._lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc, on_line), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str], on_line: Callable[[str], None] | None) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._lines.append(line)
            if on_line is not None:
                try:
                    on_line(line.rstrip("\n"))
                except Exception:
                    on_line = None
        proc.stdout.close()

    def join(self) -> str:
        self._thread.join()
        return "".join(self._lines)


GUARD_NOT_FOUND = "porter-guard: not found: "
GUARD = r"""
import os, signal, sys
parent = int(sys.argv[1])
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
except Exception:
    pass
def stop(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        os.killpg(0, signal.SIGTERM)
    except OSError:
        pass
    signal.alarm(10)
def last(signum, frame):
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGALRM, last)
if os.getppid() != parent:
    stop(0, None)
    sys.exit(143)
try:
    pid = os.fork()
except OSError as exc:
    sys.stdout.write("porter-guard: fork: %s\n" % exc)
    sys.exit(126)
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as exc:
        missing = isinstance(exc, FileNotFoundError)
        sys.stdout.write("porter-guard: not found: %s\n" % sys.argv[2] if missing else
                         "porter-guard: %s: %s\n" % (sys.argv[2], exc))
        sys.stdout.flush()
        os._exit(127 if missing else 126)
try:
    _, status = os.waitpid(pid, 0)  # (a signal that interrupts it is handled, then the wait goes on: PEP 475)
except ChildProcessError:
    status = 0
if os.WIFSIGNALED(status):
    try:
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    except (OSError, ValueError):
        pass  # SIGKILL, SIGSTOP: their disposition is the default already
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.WEXITSTATUS(status))
"""
"""The guardian between porter and each command: it forks the command (same session, same process group, the
same stdin and stdout), passes its exit status on (a signal as the same signal; a program not found as 127 and
:data:`GUARD_NOT_FOUND`), and stops the group when porter dies (the thread that started it: a thread that starts a
command waits for it before it ends) or asks it to."""


def guard_prefix() -> list[str]:
    """The argv that runs a command under :data:`GUARD` (Linux; elsewhere none: the command runs as it is)."""
    return [sys.executable, "-I", "-S", "-c", GUARD, str(os.getpid())] if sys.platform.startswith("linux") else []


def _stop_group(proc: subprocess.Popen[str], reader: _LineReader | None) -> str:
    """Stop the command's process group (SIGTERM, then SIGKILL after 10 s) and return the output it left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return reader.join() if reader is not None else proc.communicate()[0]


@dataclass
class RecordingRunner(Runner):
    """A dry run: records each command (and its env changes) in ``recorded`` instead of running it."""

    dry: bool = True


def which(name: str, path: str | None = None) -> Path | None:
    found = shutil.which(name, path=path)
    return Path(found) if found else None
