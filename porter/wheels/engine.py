"""Turn an upstream tree into a verified, labelled wheel: the one build flow behind every driver.

    resolve source -> detect -> plan -> check torch -> porter's patched copy -> wave-64 step
      -> (an engine driver) its ops compiled and linked by the engine -> setup.py: the Python side only
      -> (else) setup.py builds everything
      -> verify -> label -> manifest

The user's tree is never touched: porter patches a copy of its own, and setup.py runs on a work copy of that (pip
builds in place and setup.py scripts write into their own tree). ``--dry-run`` reports the plan, with the exact
commands and environment, through a recording runner.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from packaging.tags import parse_tag
from packaging.utils import parse_wheel_filename

from porter.artifacts.manifest import ExtensionEntry, OpEntry
from porter.artifacts.wheelfile import Payload, WheelSpec, read_wheel, write_wheel
from porter.errors import CheckFailed, PorterError, stop_note
from porter.executor import build_python
from porter.fs import cache_dir, ensure_writable_dir, owned_temp, sha256_file
from porter.locks import hold
from porter.log import Logger, quiet_logger
from porter.patching import resolve_sets
from porter.run import Runner, env_changes, plan_lines
from porter.toolchain.check import ready
from porter.toolchain.profile import toolchain_env
from porter.torch_facts import TorchInfo, build_torch
from porter.wheels import costs
from porter.wheels.base import BuildPlan, Machine, SourceInfo, WheelDriver, WheelRequest
from porter.wheels.compile import CompileOnlyResult, compile_only as engine_step, wave64_step
from porter.wheels.source import detect, resolve_source
from porter.wheels.verify import relabel, verify_wheel
from ops_prebuild.build import OpResult, failures, key
from ops_prebuild.catalogue import Catalogue, OpSpec
from ops_prebuild.source import Patched, Source, build_copy, fingerprint


_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".eggs")

@dataclass(frozen=True)
class WheelResult:
    plan: BuildPlan
    argv: list[str]
    env: dict[str, str | None]
    """What the build command's environment changes relative to the caller's."""
    torch: TorchInfo | None
    wheel: Path | None = None
    manifest: Path | None = None
    dry_run: bool = False
    refusal: PorterError | None = None
    """Dry run only: why a real build here would be refused before any work (the torch check, ...)."""
    wave64: dict[str, Any] | None = None
    """A 64-lane build: each warp-size-32 finding in its device ops, with its state (:mod:`porter.hipify.wave64`)."""
    engine: CompileOnlyResult | None = None
    """The engine's part, when it built the ops (:class:`EngineDriver`)."""

    @property
    def failed(self) -> list[OpResult]:
        return self.engine.failed if self.engine else []

    def to_dict(self) -> dict[str, Any]:
        built = self.engine.engine if self.engine else None
        return {"dry_run": self.dry_run, "plan": self.plan.to_dict(), "command": self.argv, "env": self.env,
                **({"ops": [o.__dict__ for o in built.ops], "excluded": built.excluded, "engine": built.to_dict()}
                   if built else {}),
                "wave64": self.wave64,
                "torch": self.torch.to_dict() if self.torch else None,
                "wheel": str(self.wheel) if self.wheel else None,
                "manifest": str(self.manifest) if self.manifest else None,
                "refusal": self.refusal.message if self.refusal else None}

    def describe(self) -> str:
        """The plan as a user can read and replay it (``--dry-run`` prints this, as every build prints its plan)."""
        p, e = self.plan, self.plan.expect
        checks = [*(["at least one prebuilt .so"] if e.prebuilt else []),
                  *(["modules " + ", ".join(e.modules)] if e.modules else []),
                  *(["packages " + ", ".join(e.packages)] if e.packages else []),
                  *(["code objects for " + ", ".join(e.archs) + " in every .so"] if e.archs else [])]
        notes = [*p.notes, *([f"build torch: {self.torch.version} ({self.torch.kind})"] if self.torch else []),
                 f"MAX_JOBS={p.jobs}: {p.per_job_bytes / (1 << 30):.2g} GiB per job ({p.per_job_source})",
                 "verify: " + ("; ".join(checks) or "metadata only"), *([f"wheel: {self.wheel}"] if self.wheel else [])]
        head = f"{p.project} {p.version} (regime {p.regime}" + (f", backend {p.backend}" if p.backend else "") + \
            f") -> label +{p.label}"
        return "\n".join(plan_lines(head, notes, self.env, [self.argv], self.refusal.message if self.refusal else None))


# -- the build -----------------------------------------------------------------------------------

def build_wheel(driver: WheelDriver, source: str, request: WheelRequest, *, runner: Runner,
                log: Logger | None = None, machine: Machine | None = None,
                others: Mapping[str, WheelDriver] | None = None) -> WheelResult:
    """The whole flow. ``runner`` runs (or, for probes, asks); a recording runner is a dry run: the build is only
    recorded, nothing is written. A driver whose ops porter's engine builds (:class:`EngineDriver`) has them
    compiled and linked first (:func:`~porter.wheels.compile.compile_only`: one shard of them, with
    ``request.engine.shard``), and its setup.py writes only the Python side."""
    log = log or quiet_logger()
    tc = request.toolchain
    ex = tc.executor
    py_ex, python = build_python(ex, tc.python, request.python)
    if not runner.dry and request.engine.shard is None:
        ensure_writable_dir(request.output, what="wheelhouse")
    _, not_ready = ready(tc, runner, log, compiler=False)  # (the engine's link checks it)
    cache = ex.work_dir(cache_dir(), make=not runner.dry)
    with owned_temp(_scratch(ex, runner), "porter-wheel-") as work:
        with log.step(f"reading {driver.title} source {source}"):
            # the shared cache (an sdist unpacked once, under a lock); a dry run writes only into its temp folder
            root, provenance = resolve_source(source, driver, cache, runner, work if runner.dry else None)
            info = detect(driver, root, others or {})
        request = replace(request, source=root, sources={**provenance, **request.sources})
        if request.measured is None:  # what a --compile-only run measured sizes MAX_JOBS (porter.wheels.costs)
            request = replace(request, measured=costs.load(driver.name, info.version, tc))
        engine, plan = _on_engine(driver, info, driver.plan(info, request, machine or Machine.current()))
        torch, refused = _torch_step(plan, request, python, py_ex, runner, log)
        tree, out = work / "tree", work / "out"
        # setup.py runs where the build python runs: the toolchain's root when --python names one there, else the
        # host (a backend that compiles nothing, FlashAttention's Triton one, needs no more; one that compiles is
        # refused above unless the build python has the profile's torch, which lives where its compiler does)
        argv = py_ex.argv(python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-"
                          "check", "-w", py_ex.visible(out, stage=False), py_ex.visible(tree, stage=False), *plan.pip_args)
        env = toolchain_env(tc, plan.env)
        if engine is not None:
            return _engine_wheel(driver, engine, source, request, info, plan, (argv, env), work, runner=runner, log=log,
                                 machine=machine, others=others, torch=torch, refused=refused or not_ready)
        # the patch set asked for, then the kind's (ck-rocm7, ...), on porter's copy of the source of its own
        asked = resolve_sets(request.patch_set) if request.patch_set else []
        patched = build_copy(Source(info.project, info.version, root, source), tc.kind, cache, runner, log, asked=asked)
        lanes, stop = wave64_step(driver, info, plan, request, patched, log)
        if lanes is not None:
            plan = replace(plan, notes=(*plan.notes, *([stop_note(stop.message)] if stop else []),
                                        *lanes.allowed_notes()))
        if runner.dry:
            runner.run(argv, env=env, cwd=tree)
            return WheelResult(plan, argv, env_changes(env), torch, dry_run=True, refusal=refused or not_ready or stop,
                               wave64=lanes.to_dict() if lanes else None)
        if stop is not None:
            raise stop
        built = _setup_py(plan, (argv, env), patched.source.tree, work, runner, log)
        return _finish(built, plan, request, info, torch, list(patched.records), argv, env, log,
                       wave64=lanes.to_dict() if lanes else None)


def _setup_py(plan: BuildPlan, command: tuple[list[str], dict[str, str]], tree: Path, work: Path, runner: Runner,
              log: Logger, *, what: str = "") -> Path:
    """Upstream's setup.py run by ``pip wheel`` (``command``) on a work copy of ``tree`` in ``work`` (pip builds in
    place): its one wheel."""
    argv, env = command
    with log.step(f"copying {tree} to a work tree"):
        shutil.copytree(tree, work / "tree", ignore=_IGNORE, symlinks=True)
        (work / "out").mkdir()
    with log.step(f"building {plan.project} {plan.version} for +{plan.label} " + (what or f"(MAX_JOBS={plan.jobs})")):
        runner.run(argv, env=env, cwd=work / "tree", hint=f"the {plan.project} build failed; the output above is "
                                                          "upstream's. Run with --dry-run to see the exact command and "
                                                          "environment")
    if len(built := sorted((work / "out").glob("*.whl"))) != 1:
        raise CheckFailed(f"pip wheel produced {len(built)} wheels in {work / 'out'}, expected one")
    return built[0]


def _finish(built: Path, plan: BuildPlan, request: WheelRequest, info: SourceInfo, torch: TorchInfo | None,
            patches: list[dict[str, Any]], argv: list[str], env: dict[str, str], log: Logger, *,
            wave64: dict[str, Any] | None, linked: CompileOnlyResult | None = None,
            add: Mapping[str, Payload] | None = None) -> WheelResult:
    """The wheel (with the engine's files ``add``ed) verified, labelled and published with its manifest."""
    tag = torch.wheel_tag if add and torch else None  # (the engine's modules are ABI-bound to the build torch)
    with log.step(f"verifying {built.name}" + (f" with the {len(linked.ops) - len(linked.failed)} module(s) the "
                                               "engine built" if linked else "")):
        entries = verify_wheel(built, plan.expect, add)
    with log.step(f"labelling +{plan.label}"):
        final, mpath = relabel(built, plan.label, request.output,
                               _manifest(plan, request, built, tag, entries, torch, info, patches, linked),
                               extra={**({"wave64": wave64} if wave64 else {}),
                                      **({"build": _build_facts(linked, request)} if linked else {})}, add=add, tag=tag)
    log.info(f"wrote {final} ({len(entries)} extension module(s)) and {mpath.name}")
    return WheelResult(plan, argv, env_changes(env), torch, wheel=final, manifest=mpath, wave64=wave64, engine=linked)


def _engine_wheel(driver: WheelDriver, engine: EngineDriver, source: str, request: WheelRequest, info: SourceInfo,
                  plan: BuildPlan, command: tuple[list[str], dict[str, str]], work: Path, *, runner: Runner,
                  log: Logger, machine: Machine | None, others: Mapping[str, WheelDriver] | None,
                  torch: TorchInfo | None, refused: PorterError | None) -> WheelResult:
    """A driver whose ops porter's engine builds: the ops compiled and linked from porter's patched copy of the
    source (one shard of them, or the link after every shard) while setup.py writes the Python side of a copy of
    it on a thread, and the modules go in, marked prebuilt. An op that fails is left out and named (the caller's
    exit 3); none built stops the build (after the thread's pip has finished: nothing is left running)."""
    argv, env = command
    cache = request.toolchain.executor.work_dir(cache_dir()) / "python-side"
    with ThreadPoolExecutor(1, thread_name_prefix="python-side") as pool:
        side: list[Future[Path]] = []

        def beside(patched: Patched, torch: TorchInfo) -> None:
            """Upstream's setup.py builds the Python side while the engine compiles (its last round leaves cores
            idle). Its command is shown, its steps are not (a terminal shows one live status at a time)."""
            log.info(f"building {plan.project} {plan.version}'s Python side beside the engine")
            side.append(pool.submit(_python_side, plan, command, patched.source.tree, work, driver.name, runner,
                                    quiet_logger(), cache=cache, torch=torch.version))

        linked = engine_step(driver, source, request, runner=runner, log=log, machine=machine, others=others,
                             torch_info=torch, link=True,
                             on_ready=beside if request.engine.shard is None else None, found=(request.source, info))
        plan = _engine_plan(plan, linked)
        if runner.dry or request.engine.shard is not None:
            if runner.dry:
                runner.run(argv, env=env, cwd=work / "tree")
            return WheelResult(plan, argv, env_changes(env), torch or (linked.engine.catalogue.torch if linked.engine
                                                                       else None), dry_run=runner.dry,
                               refusal=refused or linked.refusal, wave64=linked.wave64, engine=linked)
        if linked.ops and len(linked.failed) == len(linked.ops):
            raise CheckFailed(f"no op of {plan.project} {plan.version} built, so no wheel was written, "
                              + failures(linked.failed, source, request.toolchain),
                              hint=f"read the logs, e.g. {linked.failed[0].log or 'above'}; or leave the op out "
                                   "with --ops")
        assert linked.patched is not None and linked.engine is not None
        assert side, "a real build that reached the engine has started its Python side (on_ready)"
        base = side[0].result()
    add, edits = prebuilt_files(base, linked.engine.catalogue, linked.ops, engine, info.ops)
    return _finish(base, plan, request, info, linked.engine.catalogue.torch, [*linked.patched.records, *edits], argv,
                   env, log, wave64=linked.wave64, linked=linked, add=add)


def _python_side(plan: BuildPlan, command: tuple[list[str], dict[str, str]], tree: Path, work: Path, package: str,
                 runner: Runner, log: Logger, *, cache: Path, torch: str) -> Path:
    """An engine-built wheel's Python side: upstream's setup.py with no op on a work copy of porter's patched copy
    ``tree`` (the emulated target: the tree's ``package`` as it is), once per tree, command and build ``torch``
    (setup.py may record it), published into the cache by rename under a lock (builds at once wait for it and
    reuse it)."""
    argv, env = command
    python = argv[:argv.index("-m")]  # (the rest names this run's work folders)
    entry = cache / f"{plan.project}-{plan.version}-" \
        f"{key(fingerprint(tree).hex(), python, torch, plan.pip_args, env_changes(env), plan.setup_py)}"
    if found := sorted(entry.glob("*.whl")) if entry.is_dir() else []:
        return found[0]
    entry.mkdir(parents=True, exist_ok=True)
    with hold(entry, f"building {plan.project} {plan.version}'s Python side", say=log.info):
        if found := sorted(entry.glob("*.whl")):  # another build made it while this one waited
            return found[0]
        if plan.setup_py:
            built = _setup_py(plan, command, tree, work, runner, log, what="(the Python side)")
        else:  # the emulated target: setup.py would ask the CPU torch for ROCm
            with log.step(f"packaging {plan.project} {plan.version}'s Python side as the tree has it"):
                built = python_side(tree, package, plan.version, work)
        shutil.copy2(built, entry / f".{built.name}.part")
        os.replace(entry / f".{built.name}.part", entry / built.name)
    return entry / built.name


def _engine_plan(plan: BuildPlan, linked: CompileOnlyResult) -> BuildPlan:
    """The plan as the engine built it: its ops, its notes (the wave-64 step's, the patched copy's), and the modules
    the wheel must hold (those that did not fail)."""
    if linked.engine is None:
        return plan
    cat = linked.engine.catalogue
    ops = tuple(o for o in cat.ops if o.name in linked.engine.plan.objects)
    failed = {o.name for o in linked.failed}
    return replace(plan, ops=ops, notes=(*plan.notes, *(n for n in linked.notes if n not in plan.notes)),
                   expect=replace(plan.expect, modules=tuple(o.module for o in ops if o.name not in failed),
                                  host_only=tuple(o.module for o in ops if not o.device)))


def _build_facts(linked: CompileOnlyResult, request: WheelRequest) -> dict[str, Any]:
    """The manifest's ``build`` section of an engine build: the compiler cache's numbers, debug info, precompiled
    headers."""
    built = linked.engine
    ccache = built.ccache if built else None
    return {"cache": {**ccache.to_dict(), **built.cache_stats} if ccache and built else None,
            "debug_info": request.engine.debug, "pch": request.engine.pch}


def _scratch(ex: Any, runner: Runner) -> Path | None:
    """Where the work folder goes: under the toolchain's root when it has one (its python sees it), else the host's
    temp folder (None); a dry run makes no folder in the root."""
    if ex.kind == "host":
        return None
    scratch: Path = ex.work_dir(Path(tempfile.gettempdir()), make=not runner.dry)
    if not runner.dry:
        scratch.mkdir(parents=True, exist_ok=True)
    return scratch if scratch.is_dir() else None


def _on_engine(driver: WheelDriver, info: SourceInfo, plan: BuildPlan) -> tuple[EngineDriver | None, BuildPlan]:
    """The driver when porter's engine compiles and links the plan's ops (upstream's setup.py then writes only the
    Python side), with the plan saying so."""
    if not (isinstance(driver, EngineDriver) and driver.on_engine(info, plan)):
        return None, plan
    return driver, replace(plan, env={**plan.env, **driver.python_only_env(info)},
                           notes=(*plan.notes, f"{len(plan.ops)} op(s) compiled and linked by porter's AOT engine "
                                  "(compiler cache, per-op errors); setup.py below builds only the Python side"))


def _torch_step(plan: BuildPlan, request: WheelRequest, python: str, py_ex: Any, runner: Runner,
                log: Logger) -> tuple[TorchInfo | None, PorterError | None]:
    """The build python's torch and, when it is not what the plan needs, the refusal (raised in a real run)."""
    if not request.torch_check:
        if plan.needs_torch:
            log.warn(f"torch check skipped: this build needs a {plan.needs_torch} torch; "
                     "upstream's setup.py fails late if the build python has another")
        return None, None
    return build_torch(python, py_ex, runner, need=plan.needs_torch,
                       what=f"{plan.project} {plan.version} ({plan.backend or plan.regime} build for +{plan.label}"
                            + (f"; {plan.needs_torch_why}" if plan.needs_torch_why else "") + ")")


@runtime_checkable
class EngineDriver(Protocol):
    """A driver whose ops (some regime of its project) compile and link on porter's AOT engine."""

    version_info: str
    """The wheel's file that records which ops are prebuilt (its loader imports those, JIT-builds the rest)."""

    def on_engine(self, info: SourceInfo, plan: BuildPlan) -> bool: ...

    def mark_prebuilt(self, text: str, installed: Mapping[str, bool]) -> str:
        """:attr:`version_info`'s text ('' when the wheel has none) recording ``installed`` (op -> prebuilt)."""

    def python_only_env(self, info: SourceInfo) -> dict[str, str | None]:
        """setup.py's environment for a wheel with no compiled op (the Python side only)."""


@runtime_checkable
class WheelEdits(Protocol):
    """An :class:`EngineDriver` that changes more of its Python-only wheel than the record of its prebuilt ops."""

    def wheel_edits(self, files: Mapping[str, bytes],
                    probes: Mapping[str, bool]) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
        """The files of the wheel (archive name -> bytes, the record already marked) to write anew, and the patches
        that made them as the manifest lists them; ``probes``: the tree's feature probes answered at build time."""


def prebuilt_files(base: Path, cat: Catalogue, results: Sequence[OpResult], engine: EngineDriver,
                   declared: Sequence[OpSpec] = ()) -> tuple[dict[str, Payload], list[dict[str, Any]]]:
    """What goes into upstream's Python-only wheel ``base``: the engine's modules of ``cat`` at their import paths
    (named for the build torch, whose wheel tag the wheel then takes: they are ABI-bound to it), the driver's record
    marking them prebuilt (the other ops of ``cat`` and ``declared`` not), and the driver's own edits
    (:class:`WheelEdits`); and the patches those edits made, as the manifest lists them."""
    modules = {o.name: o.module for o in cat.ops if o.module}
    ok = [r for r in results if r.status != "failed" and r.name in modules]
    add: dict[str, Payload] = {modules[r.name].replace(".", "/") + cat.torch.ext_suffix: Path(r.so) for r in ok}
    installed = {**{o.name: False for o in declared}, **{o: False for o in modules}, **{r.name: True for r in ok}}
    w = read_wheel(base)
    # a tree whose setup.py writes no such file has a loader that finds the modules by import alone: it gets one
    record = engine.version_info
    files = {**w.files, record: engine.mark_prebuilt(w.files[record].decode() if record in w.files else "",
                                                     installed).encode()}
    edits, patches = engine.wheel_edits(files, dict(cat.feature_probes)) if isinstance(engine, WheelEdits) else ({}, [])
    return {**add, record: files[record], **edits}, patches


def python_side(tree: Path, package: str, version: str, out: Path) -> Path:
    """A pure-Python wheel of the tree's package ``package`` (its .py files as they are), for the emulated target,
    whose CPU torch upstream's setup.py may not accept."""
    files: dict[str, Payload] = {p.relative_to(tree).as_posix(): p for p in sorted((tree / package).rglob("*.py"))}
    if not files:
        raise CheckFailed(f"{tree} has no Python package {package}/", hint="is the source tree complete?")
    return write_wheel(out, WheelSpec(package, version, "py3-none-any", purelib=True), files)


def _manifest(plan: BuildPlan, request: WheelRequest, wheel: Path, tag: str | None, entries: list[ExtensionEntry],
              torch: TorchInfo | None, info: SourceInfo, patches: list[dict[str, Any]],
              linked: CompileOnlyResult | None) -> dict[str, Any]:
    """The manifest's fields for the labelled wheel (its version and wheel section are set by :func:`relabel`;
    ``tag``: the one it gets instead of ``wheel``'s);
    ``patches``: those applied to the work copy; ``linked``: the engine's part (each op's result)."""
    tags = parse_tag(tag) if tag else parse_wheel_filename(wheel.name)[3]
    python_tag = ".".join(sorted({t.interpreter for t in tags}))
    sources: dict[str, Any] = {"upstream_version": info.version, "setup.py_sha256": sha256_file(info.tree / "setup.py"),
                               **request.sources, "patches": patches}
    for entry in entries:
        if op := next((o.name for o in plan.ops if o.module == entry["module"]), None):
            entry["op"] = op
        if entry["module"] in plan.expect.host_only:
            entry["host_only"] = True
    ops: list[OpEntry] | None = None
    if linked is not None:
        ops = [{"name": r.name, "status": r.status, "seconds": round(r.seconds, 2), "log": r.log} for r in linked.ops]
    elif plan.ops:
        have = {e["module"] for e in entries}
        why = "optional: upstream built it only under further conditions"
        ops = [{"name": o.name, "status": "built"} if o.module in have else
               {"name": o.name, "status": "skipped", "reason": why} for o in plan.ops]
    return {"component": plan.project, "version": "", "tc": request.toolchain, "torch": torch,
            "python_tag": python_tag, "sources": sources, "extensions": entries, "ops": ops,
            "target": {"regime": plan.regime, "backend": plan.backend}}
