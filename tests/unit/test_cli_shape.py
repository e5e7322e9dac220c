"""The commands are thin: each click function takes its request object and a handful of parameters more."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

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
    return list(inspect.signature(f).parameters)


def catch_all(cmd: click.Command) -> list[str]:
    """The ``**kw`` of the function behind the command: options passed on unparsed, never counted."""
    f = inspect.unwrap(cmd.callback)  # type: ignore[arg-type]
    return [p.name for p in inspect.signature(f).parameters.values() if p.kind is p.VAR_KEYWORD]


def test_no_command_takes_more_than_a_handful_of_parameters() -> None:
    fat = {name: len(own_parameters(cmd)) for name, cmd in commands().items()}
    assert {n: c for n, c in fat.items() if c > MAX_PARAMS} == {}
    assert len(fat) > 20  # every command was found, lazily loaded ones included


def test_no_command_passes_its_options_on_unparsed() -> None:
    """A ``**kw`` would hide any number of options from the count above: every command parses into a request."""
    assert {name: catch_all(cmd) for name, cmd in commands().items() if catch_all(cmd)} == {}


def test_a_command_with_a_catch_all_is_caught() -> None:
    @click.command()
    @click.option("--a")
    @click.option("--b")
    def fat(**kw: object) -> None: ...

    assert catch_all(fat) == ["kw"]


def test_wheel_commands_parse_into_one_request() -> None:
    from porter.cli.wheel import ApexOptions, FlashAttnOptions

    for name, request in (("wheel apex", ApexOptions), ("wheel flash-attn", FlashAttnOptions)):
        f = inspect.unwrap(commands()[name].callback)  # type: ignore[arg-type]
        assert list(inspect.signature(f).parameters) == ["log", "req", "as_json"], name
        assert inspect.signature(f).parameters["req"].annotation in (request, request.__name__)


def test_ops_build_parses_into_one_request() -> None:
    from porter.cli.ops import BuildOptions

    params = own_parameters(commands()["ops build"])
    assert params == ["log", "req", "as_json"]
    assert inspect.signature(inspect.unwrap(commands()["ops build"].callback)).parameters["req"].annotation in (
        BuildOptions, "BuildOptions")


def test_slurm_settings_without_shards_are_refused_by_name() -> None:
    """What --shards N --slurm needs is refused by name without them, the same way for ops build and FlashAttention
    (one check in options.sharded); before, FlashAttention silently dropped --partition, --time and the others."""
    from click.testing import CliRunner

    for argv in (["wheel", "flash-attn", "--source", "x", "--partition", "p"],
                 ["wheel", "flash-attn", "--source", "x", "--time", "1:00:00"],
                 ["ops", "build", "--source", "x", "--partition", "p"]):
        res = CliRunner().invoke(cli, argv)
        assert res.exit_code == 2 and f"{argv[-2]}: only with --shards N --slurm" in res.output, (argv, res.output)


def test_a_relative_python_path_is_made_absolute_and_a_bare_name_is_left_to_path(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Seen building for CUDA with '--python .venv-cuda/bin/python': pip's wheel step ran in a temp folder and
    failed with 'program not found'. Every command's --python that takes a path resolves it where it is given."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PORTER_PYTHON", raising=False)
    cmds = commands()
    given = {"ops build": ["--source", "deepspeed==0.19.8"], "install": ["wh"], "verify": [],
             "port megatron-deepspeed": ["tree"], "wheel apex": ["--source", "apex"]}
    for name, argv in given.items():
        for python, want in ((".venv/bin/python", str(tmp_path / ".venv/bin/python")), ("python3", "python3"),
                             ("/opt/venv/bin/python", "/opt/venv/bin/python")):
            ctx = cmds[name].make_context(name, [*argv, "--python", python])
            assert ctx.params["python"] == want, (name, python, ctx.params["python"])


# The most click options one command declares today ('ops build'); a new option on the fattest command, or any
# command growing past it, fails here. Declaring each option once (and one build request) is to lower it.
MAX_OPTIONS = 34


def options(cmd: click.Command) -> list[str]:
    """The command's own click options, however its function receives them (a request object counts each)."""
    return [p.name or "" for p in cmd.params if isinstance(p, click.Option)]


def fat_commands(cmds: dict[str, click.Command], limit: int = MAX_OPTIONS) -> dict[str, int]:
    return {name: len(options(cmd)) for name, cmd in cmds.items() if len(options(cmd)) > limit}


def test_no_command_declares_more_click_options_than_the_ceiling() -> None:
    assert fat_commands(commands()) == {}
    assert max(len(options(c)) for c in commands().values()) == MAX_OPTIONS  # lower the ceiling as commands shrink


def test_a_command_with_options_behind_one_request_is_still_counted() -> None:
    from dataclasses import dataclass

    from porter.cli.options import into

    @dataclass(frozen=True)
    class Many:
        a: str | None
        b: str | None
        c: str | None

    @click.command()
    @click.option("--a")
    @click.option("--b")
    @click.option("--c")
    @click.pass_obj
    @into(Many)
    def thin(log: object, /, req: Many) -> None: ...

    assert own_parameters(thin) == ["log", "req"] and fat_commands({"thin": thin}, limit=2) == {"thin": 3}


# Fields of an options class that no option of their own declares: what another declaration hands them (the Slurm
# settings of slurm_options, a base class's placeholder a subclass declares).
RECEIVERS = {"slurm", "time_limit"}


def undeclared(cls: type) -> list[str]:
    """Fields of an options class that declare no option: each would be a second declaration of an option made
    elsewhere (a click decorator on the command), which is what 'each option declared once' rules out."""
    import dataclasses

    from porter.cli.options import OPTION

    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get(OPTION) and f.name not in RECEIVERS]


def declaring_modules() -> dict[str, Path]:
    """Every module that declares options: the commands (porter/cli/), porter/optspec.py, and each module of the
    library whose request dataclasses declare their own (it imports porter.optspec)."""
    root = Path(__file__).resolve().parents[2]
    found = {"porter.cli" if p.stem == "__init__" else f"porter.cli.{p.stem}": p
             for p in sorted(root.joinpath("porter", "cli").glob("*.py"))}
    for path in sorted(root.joinpath("porter").rglob("*.py")):
        if "porter.optspec" in path.read_text() and "cli" not in path.relative_to(root).parts:
            found[".".join(path.relative_to(root).with_suffix("").parts)] = path
    return found | {"porter.optspec": root / "porter" / "optspec.py"}


def option_classes() -> list[type]:
    import dataclasses
    import importlib
    import inspect as insp

    from porter.optspec import OPTION

    found = []
    for name in declaring_modules():
        mod = importlib.import_module(name)
        found += [c for _, c in insp.getmembers(mod, insp.isclass) if dataclasses.is_dataclass(c)
                  and c.__module__ == mod.__name__ and (c.__name__.endswith(("Options", "Choice")) if
                  name.startswith("porter.cli") else any(f.metadata.get(OPTION) for f in dataclasses.fields(c)
                                                         if f.name in vars(c).get("__annotations__", {})))]
    # a library class whose own fields declare one option declares them all (a request that takes such classes, as
    # WheelRequest takes WheelChoices, declares none of its own)
    return found


def test_each_option_is_declared_once_by_its_field() -> None:
    classes = option_classes()
    assert len(classes) >= 15
    problems = {c.__name__: undeclared(c) for c in classes}
    assert {k: v for k, v in problems.items() if v} == {}
    for path in sorted(Path(__file__).resolve().parents[2].joinpath("porter", "cli").glob("*.py")):
        assert "@into(" not in path.read_text(), path.name  # an option class's command takes it with @options


def test_a_field_fed_by_a_separate_click_option_is_caught() -> None:
    from dataclasses import dataclass

    from porter.cli.options import opt

    @dataclass(frozen=True)
    class TwiceOptions:
        a: str | None = opt("--a")
        b: str | None = None  # declared again by a @click.option("--b") on the command

    assert undeclared(TwiceOptions) == ["b"]


def required_with_default(cls: type) -> list[str]:
    """Fields whose option (or argument) click requires but which a direct caller of the class may leave out."""
    import dataclasses

    from porter.optspec import OPTION

    def required(spec: Any, name: str) -> bool:
        decorated = spec.option(name)(lambda: None)
        return bool(decorated.__click_params__[-1].required)

    return [f.name for f in dataclasses.fields(cls) if any(required(s, f.name) for s in f.metadata.get(OPTION, ()))
            and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)]


def test_what_the_command_line_requires_a_direct_caller_must_give() -> None:
    import dataclasses

    from porter.image.build import ImageRequest

    found = {c.__name__: required_with_default(c) for c in option_classes()}
    assert {k: v for k, v in found.items() if v} == {}
    assert {"base", "output", "toolchain"} <= {f.name for f in dataclasses.fields(ImageRequest)
                                               if f.default is dataclasses.MISSING}


def test_a_required_option_with_a_default_is_caught() -> None:
    from dataclasses import dataclass, field

    from porter.optspec import opt, source_option

    @dataclass(frozen=True, kw_only=True)
    class Loose:
        source: str = source_option.field()
        out: str = field(default="", metadata=opt("--out", required=True).metadata)
        name: str | None = opt("--name")

    assert required_with_default(Loose) == ["out"]


def declarations(text: str) -> list[str]:
    """The long option names a module's source declares: in ``Spec((...))``, ``opt(...)`` and ``click.option(...)``
    (a command that takes a shared option through ``Spec.but`` / ``Spec.field`` declares nothing)."""
    import ast

    names = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("Spec", "opt", "click.option"):
            decls = node.args[0].elts if ast.unparse(node.func) == "Spec" and isinstance(node.args[0], ast.Tuple) \
                else node.args
            names += [d.value for d in decls if isinstance(d, ast.Constant) and isinstance(d.value, str)
                      and d.value.startswith("--")]
    return names


def declared_twice(texts: dict[str, str]) -> dict[str, list[str]]:
    where: dict[str, list[str]] = {}
    for name, text in texts.items():
        for option in declarations(text):
            where.setdefault(option, []).append(name)
    return {o: w for o, w in where.items() if len(w) > 1}


def test_each_option_name_is_declared_in_one_place() -> None:
    """One declaration per option name across every command (porter/cli/options.py holds the shared ones); a
    command narrows the help with Spec.but or Spec.field, it does not declare the option again."""
    texts = {name: p.read_text() for name, p in declaring_modules().items()}
    assert sum(len(declarations(t)) for t in texts.values()) > 80
    assert declared_twice(texts) == {}


def test_an_option_declared_again_is_caught() -> None:
    texts = {"a.py": 'x = Spec(("-o", "--out"), dict())\n@click.option("--dry-run", is_flag=True)\ndef f(): ...\n',
             "b.py": 'class B:\n    out: str = opt("-o", "--out", default="")\n    y: str = shared.but(help="")\n'}
    assert declared_twice(texts) == {"--out": ["a.py", "b.py"]}


def kinds_by_name(cmds: dict[str, click.Command]) -> dict[str, set[tuple[bool, bool]]]:
    """Each option name: what it is across commands (a flag or not, taken once or many times)."""
    kinds: dict[str, set[tuple[bool, bool]]] = {}
    for cmd in cmds.values():
        for p in cmd.params:
            if isinstance(p, click.Option):
                for name in p.opts:
                    kinds.setdefault(name, set()).add((p.is_flag, p.multiple))
    return kinds


def test_an_option_name_is_the_same_kind_of_option_in_every_command() -> None:
    """One meaning per name: --arch is repeatable everywhere, --dry-run a flag everywhere..."""
    kinds = kinds_by_name(commands())
    assert len(kinds) > 100
    assert {n: k for n, k in kinds.items() if len(k) > 1} == {}


def test_an_option_that_changes_kind_in_one_command_is_caught() -> None:
    @click.command()
    @click.option("--arch", multiple=True)
    def one(arch: tuple[str, ...]) -> None: ...

    @click.command()
    @click.option("--arch")
    def two(arch: str) -> None: ...

    assert kinds_by_name({"one": one, "two": two}) == {"--arch": {(False, True), (False, False)}}
