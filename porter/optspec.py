"""Command-line options, declared once: the :class:`Spec` helper and the options several commands take, same name,
same meaning everywhere. Below the library, so a request dataclass of the library declares its own options with it
(its fields are what the command takes); ``porter.cli.options`` turns such a class into a command's options."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

OPTION = "porter.option"


@dataclasses.dataclass(frozen=True)
class Spec:
    """One command-line option, declared once: ``decls`` and ``attrs`` as :func:`click.option` takes them (no
    parameter name: the field's, or ``name``). A field of an options class declares its option with
    :meth:`field` (or :func:`opt`); a command with no options class puts the spec itself on as a decorator."""

    decls: tuple[str, ...]
    attrs: Mapping[str, Any]
    name: str = ""
    argument: bool = False
    """A positional argument (``click.argument``), not an option."""

    def field(self, *, short: str | None = None, **more: Any) -> Any:
        """An options-class field that declares this option (``short``, ``more``: as :meth:`but`)."""
        spec = self.but(short=short, **more)
        many = spec.attrs.get("multiple") or spec.attrs.get("nargs") == -1
        if spec.attrs.get("required", spec.argument and not many and "default" not in spec.attrs):
            return dataclasses.field(metadata={OPTION: (spec,)})  # no default: a direct caller must give it too
        default = spec.attrs.get("default", False if spec.attrs.get("is_flag") else () if many else None)
        return dataclasses.field(default=default, metadata={OPTION: (spec,)})

    def but(self, *, short: str | None = None, **more: Any) -> Spec:
        """The same option as one command takes it: its help narrowed to what it is there, its default...;
        ``short``: its one-letter form there ('' for none, where the command gives the letter to another)."""
        decls = self.decls if short is None else (*([short] if short else []),
                                                  *(d for d in self.decls if d.startswith("--")))
        return dataclasses.replace(self, decls=decls, attrs={**self.attrs, **more})

    def option(self, name: str) -> Callable[[F], F]:
        if self.argument:
            return click.argument(name, **self.attrs)
        return click.option(*self.decls, name, **self.attrs)

    def __call__(self, f: F) -> F:
        return self.option(self.name)(f)


def opt(*decls: str, **attrs: Any) -> Any:
    """An options-class field that declares its option (:class:`Spec`): ``x: int | None = opt("--x", ...)``."""
    return Spec(decls, attrs).field()


def arg(**attrs: Any) -> Any:
    """An options-class field that is the command's positional argument (``click.argument``)."""
    return Spec((), attrs, argument=True).field()


def flags(*specs: Spec, default: Any = None) -> Any:
    """A field set by several flags (``--local`` / ``--slurm``, each with its ``flag_value``)."""
    return dataclasses.field(default=default, metadata={OPTION: specs})


dry_run_option = Spec(("--dry-run",), dict(
    is_flag=True, help="Print the complete plan (every command, its environment) and what a real run here would "
                       "refuse, then exit 0. Writes nothing: no cache, no tree, no output."), "dry_run")


allow_wave32_option = Spec(("--allow-wave32",), dict(
    default=None, metavar="A,B|all",
    help="For a 64-lane target (gfx9 archs, emulate-wave64): build these ops or kernels although a warp-size-32 "
         "assumption in their sources is neither fixed by a shipped patch nor proven safe by an emulated wave-64 "
         "check (without it such code stops the build, exit 1). The plan, the manifest and the SBOM record each "
         "such finding as allowed."), "allow_wave32")


def _python_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A relative path to a python (``.venv/bin/python``) is made absolute here: porter runs it from other
    folders (pip in a temp folder, a probe in the build folder). A bare name (``python3``) stays a PATH lookup."""
    return os.path.abspath(value) if value and "/" in value and not os.path.isabs(value) else value


python_option = Spec(("--python",), dict(
    default=None, metavar="PATH", envvar="PORTER_PYTHON", show_envvar=True, callback=_python_path,
    help="The build python (its torch is what is built against), as the toolchain's launcher sees it (inside its "
         "chroot or container). Default: the profile's 'python', else porter's own python on the host. (For node "
         "commands, --python is the training environment's python.)"), "python")

target_python_option = python_option.but(envvar=None, show_envvar=False, help=(
    "The training environment's python (what is installed into, verified or launched), as the compute nodes see it. "
    "Default: the python running porter. (For builds, --python is the build python.)"))

wheelhouse_option = Spec(
    ("-o", "--wheelhouse"), dict(type=click.Path(file_okay=False, path_type=Path), default=Path("wheelhouse"),
                                 show_default=True, help="Wheelhouse folder for the wheel and its manifest."),
    "wheelhouse")

jobs_option = Spec(("-j", "--jobs"), dict(type=click.IntRange(min=1), default=None,
                                          help="Parallel compile jobs (default: from cores and free memory)."), "jobs")

# Options more than one command takes, each declared here once with its one meaning; a command narrows the help to
# what the option is there (Spec.but, Spec.field).
source_option = Spec(("--source",), dict(required=True, metavar="SRC",
                                         help="The project's source: its tree, an sdist (.tar.gz), or NAME==VERSION "
                                              "to download."))
compile_only_option = Spec(("--compile-only",), dict(
    is_flag=True, help="Compile every translation unit for every arch of the profile and report per op and arch: "
                       "compiled or the first error. Nothing is linked or packaged."))
ops_option = Spec(("--ops",), dict(multiple=True, metavar="OPS", help="Ops to build: repeat or comma-separate."))
in_place_option = Spec(("--in-place",), dict(is_flag=True, help="Change the tree itself instead of a copy."))
arch_option = Spec(("--arch",), dict(multiple=True, metavar="GFX",
                                     help="GPU archs, overriding the profile's (repeat or comma-separate): gfx90a, "
                                          "gfx942, sm_90."), "archs")
toolchain_option = Spec(("-t", "--toolchain"), dict(
    default=None, metavar="NAME|FILE", help="Toolchain preset name or TOML file (default: $PORTER_TOOLCHAIN, else "
                                            "'cpu')."))
site_option = Spec(("--site",), dict(default=None, metavar="NAME|FILE",
                                     help="Site profile: a preset ('porter site list') or a TOML file."))
set_option = Spec(("-s", "--set"), dict(multiple=True, metavar="PROJECT[/NAME]|FILE",
                                        help="Patch set(s): a shipped set (deepspeed/no-jit), every set of a project "
                                             "(deepspeed), or a set file of your own. Repeat for several."))
skip_option = Spec(("--skip",), dict(multiple=True, metavar="NAME", help="Leave this one out (repeatable)."))
only_option = Spec(("--only",), dict(multiple=True, metavar="NAMES", help="Only these (repeat or comma-separate)."))
force_option = Spec(("--force",), dict(is_flag=True, help="Go on over what porter would otherwise refuse to replace."))
target_version_option = Spec(("--target-version",), dict(
    default=None, metavar="VERSION", help="Treat the tree as this version of its project for the patch sets "
                                          "(instead of reading it from the tree)."))
nodes_option = Spec(("--nodes",), dict(type=click.IntRange(min=1), default=None, help="Number of nodes."))
output_option = Spec(("-o", "--output"), dict(type=click.Path(path_type=Path), default=None,
                                             help="Where the result is written."))
out_option = Spec(("-o", "--out"), dict(type=click.Path(file_okay=False, path_type=Path), default=None,
                                       help="The folder the result is written to."))
no_cache_option = Spec(("--no-cache",), dict(is_flag=True, help="Do not use porter's cache for this step."))
dir_option = Spec(("-d", "--dir"), dict(type=click.Path(file_okay=False, path_type=Path), default=None,
                                       help="The folder of a Slurm run's scripts, results and logs, on a filesystem "
                                            "every node sees."))
wait_option = Spec(("--wait",), dict(is_flag=True, help="With --slurm: wait for the last job, then report."))
slurm_option = Spec(("--slurm",), dict(is_flag=True, help="Submit the work as Slurm jobs instead of running it here."))
shard_option = Spec(("--shard",), dict(default=None, metavar="I/N",
                                       help="Compile only shard I of N of the build's compile steps."))
partition_option = Spec(("--partition",), dict(default=None, help="Slurm partition."))
account_option = Spec(("--account",), dict(default=None, help="Slurm account to charge."))
time_option = Spec(("--time",), dict(default=None, help="Slurm time limit."), "time_limit")

