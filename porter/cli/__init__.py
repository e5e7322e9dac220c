"""The porter CLI. Each command lives in its own module and is loaded lazily from ``COMMANDS``.

This module is the only place where a :class:`porter.errors.PorterError` becomes an exit code.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any, cast

import click

from porter import __version__
from porter.errors import CommandFailed, PorterError, from_os_error
from porter.log import Logger

# name -> "module:attribute"; a new command is one line here plus its module.
COMMANDS: dict[str, str] = {
    "toolchain": "porter.cli.toolchain:toolchain",
    "hipify": "porter.cli.hipify:hipify",
    "ops": "porter.cli.ops:ops",
    "build": "porter.cli.build:build_cmd",
    "install": "porter.cli.install:install_cmd",
    "verify": "porter.cli.install:verify_cmd",
    "report": "porter.cli.install:report_cmd",
    "wheelhouse": "porter.cli.wheelhouse:wheelhouse",
    "wheel": "porter.cli.wheel:wheel",
    "patch": "porter.cli.patch:patch",
    "port": "porter.cli.port:port",
    "audit": "porter.cli.audit:audit_cmd",
    "matrix": "porter.cli.matrix:matrix",
    "site": "porter.cli.site:site",
    "launch": "porter.cli.launch:launch",
    "net-plugin": "porter.cli.netplugin:net_plugin",
    "image": "porter.cli.image:image",
    "sbom": "porter.cli.sbom:sbom_cmd",
    "emulate": "porter.cli.emulate:emulate",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name].split(":")
        return cast(click.Command, getattr(importlib.import_module(module), attr))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="porter")
@click.option("-q", "--quiet", is_flag=True, help="Print only errors and results.")
@click.option("-v", "--verbose", is_flag=True, help="Print more detail (timings, working dirs).")
@click.pass_context
def cli(ctx: click.Context, quiet: bool, verbose: bool) -> None:
    """porter: take a Megatron-DeepSpeed training stack to AMD ROCm GPUs.

    \b
    The flow: toolchain profile + source -> hipify -> patch -> plan -> compile -> wheel + manifest,
    then on compute nodes: install -> verify.
    Results (and --json documents) go to stdout; progress and errors go to stderr.
    \b
    Exit codes: 0 ok, 1 failed (a check or a build), 2 bad input, 3 partial (some items failed,
    the rest were kept), 4 nothing to do, 130 interrupted.
    """
    ctx.obj = Logger(quiet=quiet, verbose=verbose)


def terminated(signum: int, frame: object) -> None:
    """SIGTERM (``timeout``, a Slurm time limit, ``scancel``) stops porter the way Ctrl-C does: the
    running command's process group (ninja and its compilers, started in a session of their own) is
    stopped too, and nothing half-written is kept."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    import signal

    log = Logger()
    signal.signal(signal.SIGTERM, terminated)
    try:
        cli.main(args=argv, prog_name="porter", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:
        if isinstance(exc.__cause__, EOFError):  # (click's for an end of file): a damaged file, not an interrupt
            log.error(f"a file ended early: {exc.__cause__ or 'end of file'}")
            log.tip("a file porter read is truncated or damaged (an interrupted download, a copy cut short): "
                    "get it again; --verbose names each step")
            sys.exit(2)
        log.error("aborted")
        sys.exit(130)
    except (PorterError, OSError) as caught:
        # an OSError (a full disk, a read-only or foreign folder) as its cause and path, with no traceback
        err = from_os_error(caught) if isinstance(caught, OSError) else caught
        hint = err.hint
        if isinstance(err, CommandFailed):
            full = "No space left on device" in err.output or "Disk quota exceeded" in err.output
            log.error(f"{err.message}" + (" (the command ran out of disk space: 'No space left on device' in its "
                                          "output above)" if full else "") + f"\n  command: {' '.join(err.argv)}")
            if full:
                hint = ("free space where the command writes (df -h), or point porter elsewhere: PORTER_CACHE_DIR "
                        "for the cache, -o for a wheelhouse")
        else:
            log.error(err.message)
        if hint:
            log.tip(hint)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        log.error("interrupted")
        sys.exit(130)
    sys.exit(0)


def emit_json(obj: Any) -> None:
    """Write one JSON document to stdout (and nothing else goes there)."""
    import json

    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def emit(as_json: bool, doc: Any, lines: Callable[[], Iterable[str]]) -> None:
    """A result as one JSON document (``doc``, with --json) or as the ``lines()`` of text it reads as."""
    if as_json:
        emit_json(doc)
    else:
        click.echo("\n".join(lines()))
