"""One error tree. Library code raises these; only ``porter.cli.main`` turns them into exit codes."""

from __future__ import annotations


class PorterError(Exception):
    """Base error: a message that names the thing, and a hint that says what to do next."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class ConfigError(PorterError):
    """Bad input: a profile, an option, a path, a version. Nothing was built."""

    exit_code = 2


class ToolError(PorterError):
    """A program porter needs is missing or failed (compiler, pip, ninja)."""


class CommandFailed(ToolError):
    """A subprocess exited non-zero; carries its output so it can be replayed."""

    def __init__(self, argv: list[str], returncode: int, output: str, *, hint: str | None = None) -> None:
        super().__init__(f"command failed with exit code {returncode}: {argv[0]}", hint=hint)
        self.argv = argv
        self.returncode = returncode
        self.output = output


class CheckFailed(PorterError):
    """A check ran and found problems (toolchain check, verify, --check)."""


class PartialSuccess(PorterError):
    """Some items were built or applied, others failed; the successful ones were kept."""

    exit_code = 3


class NothingToDo(PorterError):
    """The request selected nothing (no ops, no matching wheels)."""

    exit_code = 4


class Interrupted(PorterError):
    """Ctrl-C: work was stopped and nothing partial was left behind."""

    exit_code = 130


def refusal_line(message: str) -> str:
    """How a dry run reports what a real run would refuse: one line, printed with the plan."""
    return "# a real run here would be refused: " + " ".join(message.split())


def stop_note(message: str) -> str:
    """A dry run's plan note for a stop a real run would make after planning (a wave-64 finding): kept in the plan's
    notes, so it is said even when another refusal comes first (the printed plan says it once)."""
    return "a real run here would stop: " + message


class FileSystemError(PorterError):
    """The file system refused a write or a read: no space, read-only, no permission, over quota."""


def from_os_error(exc: OSError) -> FileSystemError:
    """An ``OSError`` that escaped, as an ERROR naming the cause and the path, with a TIP for that cause (never a
    traceback, never a hint that blames another program)."""
    import errno
    import os
    import shutil
    from contextlib import suppress
    from pathlib import Path

    path = exc.filename if exc.filename is not None else ""
    where = f" ({path})" if path else ""
    nearest = Path(os.path.abspath(os.fspath(path))) if path else None  # its nearest folder (os.path: never raises)
    folder = next((str(d) for d in (nearest, *nearest.parents) if os.path.isdir(d)), "") if nearest else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = ""
        with suppress(OSError):
            free = f"; {shutil.disk_usage(folder).free / 2**20:.0f} MiB free there now" if folder else ""
        what = "no space left on device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        return FileSystemError(f"{what} while writing{where or ' a file'}{free}",
                               hint=f"free space on the file system that holds {folder or 'it'} (df -h), or point "
                                    "porter elsewhere: PORTER_CACHE_DIR for the cache, -o for a wheelhouse; nothing "
                                    "half-written was kept")
    if exc.errno == errno.EROFS:
        return FileSystemError(f"read-only file system{where}",
                               hint="give porter a writable place: PORTER_CACHE_DIR for the cache, -o for outputs")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return FileSystemError(f"permission denied{where}",
                               hint=f"check who owns {folder or 'it'} and its mode (ls -ld), or point porter at a "
                                    "folder of yours (PORTER_CACHE_DIR, -o)")
    return FileSystemError(f"{exc.strerror or exc}{where}", hint="see the path above; nothing half-written was kept")


def first_error(text: str) -> str:
    """The line of a command's output worth reading first (porter's one reader of compiler and tool output):

    1. the compiler's first diagnostic (``file:line[:col]: [fatal ]error: ...``); when it is inside an included
       header, with the unit that included it (the last line of the compiler's include chain), so it names the
       tree's own file;
    2. else porter's or pip's last ``ERROR`` line;
    3. else the first other ``error:`` line (``clang: error: ...``), else the first line that mentions an error,
       else the last line (``failed with no output`` for none).
    """
    import re

    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("FAILED:")]
    at = next((i for i, ln in enumerate(lines) if re.match(r"\S+?:\d+(?::\d+)?: (?:fatal )?error: ", ln)), None)
    if at is None:
        errors = [ln for ln in lines if ln.startswith("ERROR")]
        if errors:
            return errors[-1].removeprefix("ERROR: ")[:400]
        return next((ln for ln in lines if re.search(r"\berror\b:", ln)),
                    next((ln for ln in lines if "error" in ln.lower()),
                         lines[-1] if lines else "failed with no output"))[:400]
    include = lines[at - 1] if at and lines[at - 1].startswith(("In file included from ", "from ")) else ""
    unit = include.removeprefix("In file included from ").removeprefix("from ").rstrip(":,")
    return (lines[at] + (f" (included from {unit})" if unit else ""))[:600]


def shown(value: object) -> str:
    """A value read from a user's file, for a message: short however big or deep (its plain repr may be huge, run
    out of recursion on a table thousands deep, or raise on an integer of thousands of digits)."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, 80, 80
    try:
        return short.repr(value)
    except ValueError:  # an int past Python's int-to-string limit (a TOML 0x... of thousands of digits)
        return f"a {value.bit_length()}-bit number" if isinstance(value, int) else "a value too large to show"
