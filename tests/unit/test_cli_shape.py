"""The commands are thin: each click function takes its request object and a handful of parameters more."""

from __future__ import annotations

import inspect

import click

from porter.cli import cli

MAX_PARAMS = 6


def commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    out: dict[str, click.Command] = {}

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None, name
                walk(sub, (*path, name))
        else:
            out[" ".join(path)] = cmd

    walk(cli, ())
    return out


def own_parameters(cmd: click.Command) -> list[str]:
    """What the function behind the command takes (through porter's own ``into`` wrapper, not click's)."""
    f = inspect.unwrap(cmd.callback)  # type: ignore[arg-type]
    return [p for p in inspect.signature(f).parameters if p not in ("kw", "kwargs")]


def test_no_command_takes_more_than_a_handful_of_parameters() -> None:
    fat = {name: len(own_parameters(cmd)) for name, cmd in commands().items()}
    assert {n: c for n, c in fat.items() if c > MAX_PARAMS} == {}
    assert len(fat) > 20  # every command was found, lazily loaded ones included


def test_ops_build_parses_into_one_request() -> None:
    from porter.cli.ops import BuildOptions

    params = own_parameters(commands()["ops build"])
    assert params == ["log", "req", "as_json"]
    assert inspect.signature(inspect.unwrap(commands()["ops build"].callback)).parameters["req"].annotation in (
        BuildOptions, "BuildOptions")
