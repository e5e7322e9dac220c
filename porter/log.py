"""The step logger. Everything human goes to stderr; stdout is kept for results (text or ``--json``).

On a terminal it uses rich (colour, a spinner for long steps); elsewhere plain lines, with log
folding when running under GitHub Actions (``::group::``).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import IO, Any

from rich.console import Console
from rich.markup import escape


class Logger:
    def __init__(self, *, quiet: bool = False, verbose: bool = False, stream: IO[str] | None = None,
                 color: bool | None = None) -> None:
        self.quiet = quiet
        self.verbose = verbose
        stream = stream if stream is not None else sys.stderr
        self._tty = stream.isatty() if color is None else color
        self._folding = os.environ.get("GITHUB_ACTIONS") == "true" and not self._tty
        self._console = Console(file=stream, force_terminal=self._tty, no_color=not self._tty,
                                highlight=False, soft_wrap=True)

    def _out(self, text: str, style: str | None = None) -> None:
        if self._tty and style:
            self._console.print(f"[{style}]{escape(text)}[/]")
        else:
            self._console.print(escape(text))

    def info(self, msg: str) -> None:
        if not self.quiet:
            self._out(msg)

    def detail(self, msg: str) -> None:
        if self.verbose and not self.quiet:
            self._out(msg, "dim")

    def warn(self, msg: str) -> None:
        self._out(f"WARNING: {msg}", "yellow")

    def error(self, msg: str) -> None:
        self._out(f"ERROR: {msg}", "bold red")

    def tip(self, msg: str) -> None:
        self._out(f"TIP: {msg}", "cyan")

    def command(self, argv: list[str], env_changes: Mapping[str, str | None] | None = None,
                cwd: str | None = None) -> None:
        """Echo a command the way a user could paste it, with only the env vars that changed."""
        if self.quiet:
            return
        prefix = " ".join(f"{k}={shlex.quote(v)}" if v is not None else f"-u {k}"
                          for k, v in sorted((env_changes or {}).items()))
        where = f"(cd {shlex.quote(cwd)}) " if cwd and self.verbose else ""
        self._out(f"$ {where}{prefix + ' ' if prefix else ''}{shlex.join(argv)}", "dim")

    def replay(self, output: str) -> None:
        """Show a failed command's output (always, even with --quiet)."""
        for line in output.rstrip().splitlines()[-200:]:
            self._console.print(escape(line), style="red" if self._tty else None)

    @contextmanager
    def step(self, title: str) -> Iterator[Status]:
        """A titled step; the handle it yields shows progress within it (:meth:`Status.progress`)."""
        start = time.monotonic()
        if self._folding:
            print(f"::group::{title}", file=self._console.file, flush=True)
        elif not self.quiet:
            self._out(f"==> {title}", "bold")
        try:
            spinner = self._console.status(title, spinner="dots") if self._tty and not self.quiet else nullcontext()
            with spinner as live:
                yield Status(self, title, start, live)
        finally:
            if self._folding:
                print("::endgroup::", file=self._console.file, flush=True)
            self.detail(f"    ({title}: {time.monotonic() - start:.1f}s)")


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Status:
    """Progress within a step: units done of a total, the current unit, elapsed time and an ETA. On a terminal the
    step's spinner line shows it; elsewhere (a file, a pipe, a CI log, a Slurm job's output) a plain line
    ``[n/N] unit (elapsed, ETA ...)`` at most every ``every`` seconds, and the last one; nothing with -q."""

    every = 15.0

    def __init__(self, log: Logger, title: str, start: float, live: Any) -> None:
        self._log, self._title, self._start, self._live = log, title, start, live
        self._last = start
        self._lock = threading.Lock()
        self._expected: dict[str, float] = {}
        self._guessed: set[str] = set()
        self._finished: set[str] = set()
        self._jobs = 1

    def expect(self, seconds: Mapping[str, float], jobs: int, guessed: Iterable[str] = (),
               paced: Iterable[str] | None = None) -> None:
        """What each unit (ninja's description of it) is expected to take: measured on an earlier build, or
        ``guessed`` (from its size). The ETA is then the expected time of the units not done yet, over ``jobs``.
        Once a ``paced`` unit (default: every guessed one; a link has no size to guess from, so not it) has
        finished, the paced units left are expected to take what they took in this run (:meth:`_pace`)."""
        self._expected, self._jobs, self._guessed = dict(seconds), max(1, jobs), set(guessed)
        self._paced = self._guessed if paced is None else set(paced) & self._guessed

    def _eta(self, done: int, total: int, unit: str, elapsed: float) -> str:
        if done == 0 and self._expected:  # before any unit finished: every unit's expected time
            return self._left(list(self._expected), "", None)
        if not 0 < done < total:
            return ""
        if self._expected and unit in self._expected:
            self._finished.add(unit)
            return self._left([u for u in self._expected if u not in self._finished], " left", self._pace(elapsed))
        return f", ETA {_clock(elapsed / done * (total - done))} at this run's pace"

    def _left(self, left: list[str], word: str, pace: float | None) -> str:
        """The ETA of the units ``left``: their expected times (``pace`` for each paced one) over the jobs."""
        paced = [u for u in left if u in self._paced] if pace is not None else []
        seconds = sum(pace if u in paced and pace is not None else self._expected[u] for u in left) / \
            max(1, min(self._jobs, len(left)))
        if not (guessed := [u for u in left if u in self._guessed]):
            return f", ETA {_clock(seconds)} from measured unit times"
        if pace is None or not paced:
            return (f", ETA ~{_clock(seconds)}: {len(guessed)} of {len(left)} unit(s){word} estimated from source "
                    f"size (no measured time yet)")
        return (f", ETA ~{_clock(seconds)}: {len(paced)} of {len(left)} unit(s) left at this run's "
                f"{_clock(pace)} a unit (not measured before)")

    def _pace(self, elapsed: float) -> float | None:
        """What a paced unit has taken in this run: the job slots' time so far, less the other units' expected
        share, over the paced units finished. A size guess knows nothing of headers (a generated CK unit is a
        few KiB that compiles for ten minutes; a small host file of DeepSpeed's takes as long as a large one), so
        once one estimated unit has finished, the rest are each expected to take as long. None before that."""
        if not (finished := [u for u in self._finished if u in self._paced]):
            return None
        others = sum(self._expected[u] for u in self._finished if u not in self._paced)
        return max(elapsed * self._jobs - others, 0.0) / len(finished)

    def progress(self, done: int, total: int, unit: str = "") -> None:
        """Units ``done`` of ``total`` (the last one finished: ``unit``). On a terminal one line that fits its width:
        ``[n/N] elapsed, ETA ~t  unit``, cut from the right; elsewhere ``[n/N] unit (elapsed, ETA ... why)``."""
        now = time.monotonic()
        elapsed = now - self._start
        eta = self._eta(done, total, unit, elapsed)
        with self._lock:
            if self._live is not None:
                short = _SHORT_ETA.match(eta)
                line = f"[{done}/{total}] {_clock(elapsed)}{short.group(0) if short else ''}  {unit}".rstrip()
                room = max(20, self._log._console.width - 3)  # the spinner and a space before it, the last column
                self._live.update(escape(line if len(line) <= room else line[:room - 1] + "…"))
            elif not self._log.quiet and (done >= total or now - self._last >= self.every):
                self._last = now
                self._log.info(f"[{done}/{total}] {unit}".rstrip() + f" ({_clock(elapsed)}{eta})")

    def ninja_line(self, line: str) -> None:
        """Read one line of ninja's output (with ``NINJA_STATUS`` set to ``[%f/%t] ``) into :meth:`progress`."""
        if m := _NINJA_STATUS.match(line):
            self.progress(int(m.group(1)), int(m.group(2)), m.group(3))


_NINJA_STATUS = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
_SHORT_ETA = re.compile(r", ETA ~?[0-9hms]+")
NINJA_STATUS = "[%f/%t] "
"""What porter sets ``NINJA_STATUS`` to, so that :meth:`Status.ninja_line` can read ninja's progress."""


def quiet_logger() -> Logger:
    """A logger that prints only errors; the default for library calls made without one."""
    return Logger(quiet=True)
