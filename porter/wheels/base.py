"""The model shared by the wheel drivers: what a source tree is, what to build, and the plan.

A driver (apex, flash-attn) knows one upstream project's *build interface*: how to recognise its tree,
which version and build regime it has, which environment variables and pip arguments make it build
what the toolchain profile asks for, and what a correct wheel must contain. It never runs anything:
:mod:`porter.wheels.engine` runs the plan, verifies, labels and writes the manifest.
"""

from __future__ import annotations

import filecmp
import os
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import click

from porter.errors import ConfigError
from porter.executor import Executor
from porter.log import Logger
from porter.optspec import jobs_option, ops_option, opt, python_option
from porter.resources import available_memory, cpu_count, default_jobs
from porter.run import Result, Runner, make_env
from porter.toolchain.profile import Toolchain
from porter.wheels.costs import MeasuredCosts

from ops_prebuild.build import EngineRun
from ops_prebuild.catalogue import OpSpec
from ops_prebuild.source import Source

if TYPE_CHECKING:
    from porter.hipify.wave64 import Wave64
    from porter.torch_facts import TorchInfo

GiB = 1 << 30
BACKENDS: tuple[str, ...] = ("ck", "triton")


@dataclass(frozen=True)
class Machine:
    """What the build host offers right now: cores and free memory (bytes). Injected in tests."""

    cores: int
    free_bytes: int

    @classmethod
    def current(cls) -> Machine:
        return cls(cores=cpu_count(), free_bytes=available_memory())


@dataclass(frozen=True)
class SourceInfo(Source):
    """A tree a wheel driver recognised (:class:`ops_prebuild.source.Source`), with what the driver read of it."""

    ops: tuple[OpSpec, ...] = ()
    """Prebuildable ops the tree declares (apex)."""
    allowed_archs: tuple[str, ...] = ()
    """GPU archs the tree's setup.py accepts (flash-attn's GPU_ARCHS check); empty = no such check."""
    backends: tuple[str, ...] = ()
    """Backends the tree can build (flash-attn: ck, triton)."""


SAMPLE_MODES = ("cover", "pairs")
"""``--sample`` by coverage rather than count: ``cover``, the fewest instances in which every family, every
head-dim bucket and every dtype appear at least once; ``pairs``, every family at every head-dim bucket and in
every dtype the build generates for it (:func:`porter.components.flash_attn.ck_cover`)."""


class SampleType(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2; >=8.1 is allowed
    """``--sample``: a count of at least 1, or the name of a covering sample."""

    name = "sample"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        text = str(value).strip()
        if text in SAMPLE_MODES:
            return text
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            self.fail(f"{value!r} is neither a count of 1 or more nor one of {', '.join(SAMPLE_MODES)}", param, ctx)
        return n


@dataclass(frozen=True, kw_only=True)
class WheelChoices:
    """What every ``porter wheel PROJECT`` takes beside its source, toolchain and wheelhouse. Each field declares
    its option, here once: the commands' options classes and :class:`WheelRequest` take these classes."""

    python: str | None = python_option.field()
    jobs: int | None = jobs_option.field()
    patch_set: str | None = opt("--patch-set", default=None, metavar="PROJECT[/NAME]|FILE",
                                help="Patch set to apply to the work copy before building (the source is never "
                                     "changed).")


@dataclass(frozen=True, kw_only=True)
class ApexChoices:
    """What ``porter wheel apex`` takes (:class:`WheelChoices`)."""

    ops: tuple[str, ...] = ops_option.field(
        help="Ops to prebuild: names (amp_C, fused_adam_cuda), groups (cpp, cuda) or all; repeat or comma-separate; "
             "-NAME leaves an op out (all,-fast_multihead_attn). Default: all the profile can build (cpp only for a "
             "cpu profile).")
    regime: str | None = opt("--regime", type=click.Choice(["env", "flags"]), default=None,
                             help="Force the build regime instead of reading it from the tree (APEX_BUILD_* env or "
                                  "--cpp_ext/--cuda_ext flags).")


@dataclass(frozen=True, kw_only=True)
class CkChoices:
    """What ``porter wheel flash-attn`` takes (:class:`WheelChoices`): the backend, and what ``--compile-only``
    compiles of the CK instances."""

    backend: str = opt("--backend", type=click.Choice(BACKENDS), default="ck", show_default=True,
                       help="ck: compile the composable_kernel extension; triton: pure-Python wheel, JIT at run time.")
    units: tuple[str, ...] = opt("--units", multiple=True, metavar="GLOB",
                                 help="--compile-only: compile the CK instances whose generated file names match "
                                      "(fnmatch, e.g. 'fmha_fwd_d128_*'); 'flash_attn_2_cuda' selects the extension's "
                                      "own sources. Repeat or comma-separate. Default: everything.")
    sample: int | str | None = opt("--sample", type=SampleType(), default=None, metavar="N|cover|pairs",
                                   help="--compile-only: a stratified sample, with the extension's own sources. N: the "
                                        "first N CK instances of each family (fwd, fwd_splitkv, appendkv, bwd, ...) x "
                                        "head-dim bucket x dtype (every kind of kernel the build generates, compiled "
                                        "and measured; 70 units for 2.8.3); 'cover': the fewest instances in which "
                                        "every family, head-dim bucket and dtype appear (7); 'pairs': every family at "
                                        "every head-dim bucket and in every dtype (about 30).")
    instances: int | None = opt("--instances", type=click.IntRange(min=0), default=None, metavar="N",
                                help="--compile-only: the first N CK instances (name order) of those --units / "
                                     "--sample select.")
    drop_flags: tuple[str, ...] = opt("--drop-flag", multiple=True, metavar="FLAG",
                                      help="--compile-only: leave one of upstream's compiler flags out (repeat for "
                                           "more), e.g. --drop-flag=-amdgpu-early-inline-all: the -mllvm before it "
                                           "goes too, and FLAG=VALUE matches. With Debian's clang 22 that flag makes "
                                           "each CK backward instance compile for over an hour per arch. The objects "
                                           "are then not what upstream's build makes; the plan says so.")


@dataclass(frozen=True, kw_only=True)
class CatalogueChoices:
    """What ``porter ops build`` takes of a tree whose builders declare their ops (DeepSpeed's catalogue)."""

    all_compatible: bool = opt("--all-compatible", is_flag=True, help="Build every op this toolchain can build.")


@dataclass(frozen=True, kw_only=True)
class WheelRequest(CatalogueChoices, CkChoices, ApexChoices, WheelChoices):
    """What the user asked for. Every field is explicit; nothing is read from the build host's GPU. What the
    command line says of it is declared by the classes it takes (their fields' options say what each is)."""

    source: Path
    """Upstream tree (a directory)."""
    toolchain: Toolchain
    output: Path
    """Wheelhouse: the labelled wheel and its manifest go here."""
    torch_check: bool = True
    """Refuse early when the build needs a ROCm torch and the build python has another kind."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Provenance gathered before planning (sdist sha256, git commit), copied into the manifest."""
    measured: MeasuredCosts | None = None
    """Compile costs ``--compile-only`` runs measured for this project (its version and ROCm line, else the
    nearest: :mod:`porter.wheels.costs`); when set, MAX_JOBS is sized from them instead of the driver's guess."""
    allow_wave32: tuple[str, ...] = ()
    """Ops built for a 64-lane target despite unproven warp-size-32 code (``all``: every op; :mod:`porter.hipify.wave64`)."""
    engine: EngineRun = EngineRun()
    """How porter's engine compiles a driver's ops (compiler cache, precompiled header, debug info, one shard of the
    compiles or the link after them); the flow sets its jobs and whether it links."""


def drop_flags(flags: Sequence[str], drops: Sequence[str], *, what: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``flags`` without each of ``drops`` (kept, dropped). A drop matches a flag that equals it or is it
    followed by ``=VALUE``; the ``-mllvm``/``-Xclang`` before a matched flag goes with it. A drop that matches
    nothing is an error that lists ``what``'s flags: a typo must not pass for a change."""
    keep: list[str] = []
    gone: list[str] = []
    used: set[str] = set()
    for f in flags:
        hit = next((d for d in drops if f == d or f.startswith(d + "=")), None)
        if hit is None:
            keep.append(f)
            continue
        used.add(hit)
        if keep and keep[-1] in ("-mllvm", "-Xclang"):
            gone.append(keep.pop())
        gone.append(f)
    if unused := [d for d in drops if d not in used]:
        raise ConfigError(f"--drop-flag {', '.join(unused)}: not among {what}'s flags ({shlex.join(flags)})",
                          hint="give the flag as upstream spells it, e.g. --drop-flag=-amdgpu-early-inline-all "
                               "(its -mllvm goes with it)")
    return tuple(keep), tuple(gone)


@dataclass(frozen=True)
class Expectation:
    """What a correct wheel holds. The engine refuses a wheel that does not meet it."""

    modules: tuple[str, ...] = ()
    """Extension modules that must be inside (``apex.amp_C``)."""
    optional: tuple[str, ...] = ()
    """Extension modules that may be missing (built by upstream only under further conditions)."""
    prebuilt: bool = False
    """At least one prebuilt extension must be inside (a wheel with zero ``.so`` is refused)."""
    packages: tuple[str, ...] = ()
    """Directories that must be inside (``flash_attn/flash_attn_triton_amd``)."""
    archs: tuple[str, ...] = ()
    """GPU archs whose code objects every ``.so`` must hold (but the host-only ones); empty for cpu builds."""
    host_only: tuple[str, ...] = ()
    """Extension modules with no device code (apex's apex_C): no code objects are expected in them."""
    empty_hint: str = ""
    """What most likely went wrong when nothing was prebuilt (shown with the refusal)."""


@dataclass(frozen=True, kw_only=True)
class BuildPlan:
    """The exact build: one pip command and the environment changes porter makes for it."""

    project: str
    version: str
    regime: str
    backend: str | None
    label: str
    """PEP 440 local label the wheel gets (``rocm6.2.gfx942``)."""
    pip_args: tuple[str, ...]
    """Arguments after ``pip wheel --no-deps --no-build-isolation -w OUT SRC`` (e.g. --config-settings)."""
    env: Mapping[str, str | None]
    """Variables porter sets (str) or removes (None) on top of the toolchain environment."""
    jobs: int
    per_job_bytes: int
    needs_torch: str | None
    """``rocm`` when the build imports a ROCm torch (torch.version.hip); None when any torch will do."""
    expect: Expectation
    ops: tuple[OpSpec, ...] = ()
    notes: tuple[str, ...] = ()
    needs_torch_why: str = ""
    """Why the build needs that torch, when it is not the obvious (linking a ROCm extension)."""
    per_job_source: str = "guess"
    """``guess`` (the driver's table), ``measured`` or ``partly measured`` (:attr:`WheelRequest.measured`)."""
    setup_py: bool = True
    """False: the wheel's Python side is the tree's package as it is, not setup.py's (the emulated target's apex,
    whose setup.py would ask a CPU torch for ROCm)."""

    def to_dict(self) -> dict[str, Any]:
        """Every field but ``setup_py`` (tuples as lists; the ops by name; the expectation but its hint)."""
        return {**{f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "setup_py"},
                "needs_torch_why": self.needs_torch_why or None, "ops": [op.name for op in self.ops],
                "expect": {f.name: _plain(getattr(self.expect, f.name)) for f in fields(Expectation)
                           if f.name != "empty_hint"}}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value


class WheelDriver(Protocol):
    """One upstream project's build interface."""

    name: str
    """Registry key and CLI subcommand: ``apex``, ``flash-attn``."""
    title: str
    """For messages: ``ROCm apex``."""
    sdist_env: Mapping[str, str]
    """Environment that lets ``pip download`` prepare this project's sdist metadata without compiling."""

    def detect(self, root: Path) -> SourceInfo | None:
        """Recognise the tree (None: not this project); raise ConfigError when it is but is unusable."""

    def plan(self, info: SourceInfo, request: WheelRequest, machine: Machine) -> BuildPlan:
        """Args and env from the profile; raise ConfigError for anything the tree cannot build."""

    def kernel_ops(self, info: SourceInfo, request: WheelRequest, ctx: KernelContext) -> KernelSet:
        """``--compile-only``: the translation units of what :meth:`plan` would build, as the ops of
        porter's own planner, with sources relative to ``ctx.tree`` (a work copy the driver may add
        generated files to, through ``ctx``). No setup.py runs."""


LEAVE = "leave {ops} out with --ops (ROCm apex: --ops all,{minus})"
"""The hint of a wave-64 refusal (:meth:`porter.hipify.wave64.Wave64.error`) in a wheel build."""


@runtime_checkable
class DeviceSources(Protocol):
    """A driver that names what its device ops compile, for the wave-64 step of a 64-lane build."""

    def device_sources(self, info: SourceInfo, plan: BuildPlan,
                       request: WheelRequest) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """Each device op of ``plan``: its sources and include paths, relative to the tree (generated sources left
        out: the headers the tree's own sources include stand for them)."""


@runtime_checkable
class Assessed(Protocol):
    """A driver whose device code was assessed for a 64-lane target before the build (Megatron's port, which knows
    the findings porter's patches fixed): the flow's wave-64 step takes that assessment instead of scanning."""

    lanes: Wave64 | None


@dataclass(frozen=True)
class KernelSet:
    """What a driver hands the compile-only flow: porter planner ops and what to do before planning."""

    ops: tuple[OpSpec, ...]
    hipify: tuple[str, ...] = ()
    """Ops whose sources are CUDA and go through torch's hipify first (a copy; the tree is untouched)."""
    total_units: int = 0
    """Units the whole build has (the selection is ``ops``); 0 = the same."""
    notes: tuple[str, ...] = ()
    unplanned: tuple[tuple[str, str], ...] = ()
    """(op, why) of selected ops porter could not plan: reported as failed, the others still compile."""
    declared: tuple[OpSpec, ...] = ()
    """Every op the tree declares, when the driver read more than ``ops`` (the wheel's record marks the others not
    prebuilt; those the tree's builders declare incompatible are listed with their reason)."""
    probes: tuple[tuple[str, bool], ...] = ()
    """The tree's load-time feature probes answered in the build python (:class:`~ops_prebuild.catalogue.Catalogue`)."""
    torch_view: bool | None = None
    """True: the ops are HIP already but include torch's CUDA headers, which a compile-only run without a ROCm torch
    sees through porter's HIP view (None: when an op is hipified in the build)."""


def per_job(guess: int, request: WheelRequest, families: Sequence[str] | None = None,
            family_of: Callable[[str], str] | None = None) -> tuple[int, str, str]:
    """Memory per compile job: measured costs when the request carries them, else ``guess``.
    With ``families`` (the kinds of units the build has) and ``family_of`` (unit name -> family), a
    family nothing was measured of keeps the guess (:meth:`MeasuredCosts.for_families`).
    Returns (bytes, ``guess`` | ``measured`` | ``partly measured``, a plan note)."""
    if (m := request.measured) is None:
        return guess, "guess", ""
    if families is not None and family_of is not None:
        return m.for_families(families, family_of, guess)
    return m.per_job_bytes(), "measured", f"per-job memory from measured compile costs: {m.describe()}"


def choose_jobs(per_job_bytes: int, machine: Machine, requested: int | None = None) -> int:
    """MAX_JOBS: the request if given, else as many as cores and free memory allow (at least one)."""
    if requested is not None:
        return max(1, requested)
    return default_jobs(per_job_bytes, cores=machine.cores, free_bytes=machine.free_bytes)


# -- the work copy a driver's kernel_ops fills (--compile-only) ------------------------------------------------

_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".eggs")


@dataclass
class KernelContext:
    """What a driver's ``kernel_ops`` may use: the tree it reads and the work copy it fills."""

    source: Path
    """The recognised upstream tree (never written)."""
    tree: Path
    """The work copy (host path) the ops' relative sources point into; filled by :meth:`copy` / :meth:`put`."""
    plan_tree: Path
    """Where the plan's commands find the work copy (the same folder, but in a dry run, where a real run
    puts it): for an absolute include path."""
    toolchain: Toolchain
    python: str
    """The build python as ``py_ex`` sees it."""
    py_ex: Executor
    runner: Runner
    """Runs for real, in a dry run too (the tree is then a temp folder)."""
    log: Logger
    scratch: Path | None = None
    """A folder the build python sees, for throw-away output (generated sources before they are synced)."""
    torch: TorchInfo | None = None
    """The build python's torch (its headers decide some of a tree's flags)."""

    @property
    def planning(self) -> bool:
        """A dry run: the work copy is a temp folder, not where a real run puts it."""
        return self.tree != self.plan_tree

    def copy(self, rel: str) -> Path:
        """Copy ``rel`` (a file or folder of the source) into the work copy; files that did not change keep
        their time stamps, so ninja compiles only what changed."""
        src = self.source / rel
        dest = self.tree / rel
        if not src.exists():
            raise ConfigError(f"{src} does not exist", hint="is the source tree complete?")
        if src.is_dir():
            self._copy_dir(src, dest, set())
        else:
            _sync_file(src, dest)
        return dest

    def _copy_dir(self, src: Path, dest: Path, seen: set[Path]) -> None:
        """A folder, file by file. A symlinked folder that points inside the source (ROCm/apex's ``contrib/csrc``
        -> ``../apex/contrib/csrc``) stays a link, and what it points to is copied too, so every header is one file
        reached by the tree's own paths; one pointing outside the source is copied as a folder."""
        if src.resolve() in seen:
            return
        seen.add(src.resolve())
        top = self.source.resolve()
        for dirpath, dirnames, filenames in os.walk(src):
            base = Path(dirpath)
            skip = _IGNORE(dirpath, [*dirnames, *filenames])
            kept = []
            for d in dirnames:
                if d in skip:
                    continue
                if not (base / d).is_symlink():
                    kept.append(d)
                    continue
                target, link = (base / d).resolve(), dest / base.relative_to(src) / d
                if target.is_relative_to(top):
                    self._copy_dir(target, self.tree / target.relative_to(top), seen)
                    if not link.is_symlink():
                        link.parent.mkdir(parents=True, exist_ok=True)
                        shutil.rmtree(link, ignore_errors=True)
                        link.symlink_to(os.readlink(base / d))
                else:
                    self._copy_dir(target, link, seen)
            dirnames[:] = kept
            for name in filenames:
                if name not in skip:
                    _sync_file(base / name, dest / base.relative_to(src) / name)

    def put(self, rel: str, data: bytes) -> Path:
        """Write ``data`` at ``rel`` in the work copy unless the file already holds exactly that."""
        dest = self.tree / rel
        if dest.is_file() and dest.stat().st_size == len(data) and dest.read_bytes() == data:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return dest

    def seen(self, path: Path) -> str:
        """A host path as the build python sees it."""
        return self.py_ex.inside(path) if self.py_ex.kind != "host" else str(path)

    def run_python(self, args: Sequence[str], *, cwd: Path, what: str, timeout: float = 1800) -> Result:
        """Run the build python with ``args`` (paths already as it sees them), for real even in a dry run:
        drivers only run tree-provided generators into :attr:`scratch`."""
        argv = self.py_ex.argv(self.python, *args)
        return self.runner.run(argv, env=make_env(), cwd=cwd if self.py_ex.kind == "host" else None, timeout=timeout,
                               hint=f"{what} failed in the build python; the output above is the tree's own")


def _sync_file(src: Path, dest: Path) -> None:
    if dest.is_file():
        s, d = src.stat(), dest.stat()
        if s.st_size == d.st_size and (int(s.st_mtime) == int(d.st_mtime) or filecmp.cmp(src, dest, shallow=False)):
            return
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dest)
