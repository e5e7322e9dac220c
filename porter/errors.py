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

    exit_code = 1


class CommandFailed(ToolError):
    """A subprocess exited non-zero; carries its output so it can be replayed."""

    def __init__(self, argv: list[str], returncode: int, output: str, *, hint: str | None = None) -> None:
        super().__init__(f"command failed with exit code {returncode}: {argv[0]}", hint=hint)
        self.argv = argv
        self.returncode = returncode
        self.output = output


class CheckFailed(PorterError):
    """A check ran and found problems (toolchain check, verify, --check)."""

    exit_code = 1


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
