"""porter build --request FILE: run a build written down as data (a sharded build's jobs, a matrix cell, CI)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click
from click.core import ParameterSource

from porter.cli.options import BUILDERS, json_option, options
from porter.errors import ConfigError
from porter.optspec import dry_run_option, opt, shard_option, wheelhouse_option


def builder(ctx: click.Context, component: str) -> tuple[click.Command, str]:
    """The command that builds ``component`` (``@builds`` marks it), and its name as typed (``ops build``)."""
    root = ctx.find_root().command
    assert isinstance(root, click.Group)
    for name in root.list_commands(ctx):  # importing each command module registers its builders
        sub = root.get_command(ctx, name)
        if component not in BUILDERS and isinstance(sub, click.Group) and component in sub.list_commands(ctx):
            sub.get_command(ctx, component)  # a group that makes a command per component (porter wheel NAME)
    if component not in BUILDERS:
        raise ConfigError(f"porter builds no component {component!r} from a request",
                          hint=f"components a request can build: {', '.join(sorted(BUILDERS))}")
    cmd, group = BUILDERS[component]
    return cmd, f"{group} {cmd.name}"


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """``porter build``'s options: each field declares its own (``--help`` says what each is)."""

    request_file: Path = opt("--request", required=True, type=click.Path(dir_okay=False, path_type=Path),
                             help="The build request (JSON): a sharded build's request.json, a matrix cell's, or one "
                                  "of yours (docs/ops.md shows its form).")
    shard: str | None = shard_option.field(help="Compile only shard I of N of the build's compile steps (as the "
                                                "build command's --shard).")
    last: bool = opt("--last", is_flag=True,
                     help="The run after every shard: add the request's 'last' options (link and package the wheel, "
                          "or report every unit of a compile-only build).")
    wheelhouse: Path | None = wheelhouse_option.field(default=None, show_default=False,
                                                      help="Where the wheel and its manifest go (default: the "
                                                           "request's, else ./wheelhouse).")
    dry_run: bool = dry_run_option.field()


@click.command("build")
@options(RunOptions)
@json_option
@click.pass_context
def build_cmd(ctx: click.Context, /, req: RunOptions, as_json: bool) -> None:
    """Run the build a request file holds, with the command that builds its component."""
    from porter.cluster.request import read_request

    build = read_request(req.request_file)
    cmd, name = builder(ctx, build.component)
    params = {p.name: p for p in cmd.params}
    if req.shard is not None and "shard" not in params:
        raise click.UsageError(f"--shard: 'porter {name}' builds in one run (it has no shards)")
    own = {"shard": req.shard, "wheelhouse": req.wheelhouse, "dry_run": req.dry_run or None, "as_json": as_json or None}
    options = {**build.options, **(build.last if req.last else {}),
               **{k: v for k, v in own.items() if v is not None and k in params}}
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ConfigError(f"the request sets {', '.join(unknown)}, which 'porter {name}' does not take",
                          hint=f"porter {name} --help lists its options (a request names them as the help's "
                               "words with - as _)")
    # the command with the options (each converted and checked by its click option as typed ones are) and the
    # user's own args; the request wins over the job's environment
    sub = cmd.make_context(f"porter {name}", list(build.args), parent=ctx, default_map=options)
    for key, value in options.items():
        if sub.get_parameter_source(key) is ParameterSource.ENVIRONMENT:
            sub.params[key] = params[key].process_value(sub, value)
    with sub:
        cmd.invoke(sub)
