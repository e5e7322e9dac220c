"""Turn an upstream tree into a verified, labelled wheel: the one algorithm behind every driver.

    resolve source -> detect -> plan -> check torch -> copy -> patch -> pip wheel -> verify -> label -> manifest

The user's tree is never touched: the build runs on a copy (pip builds in place and setup.py scripts
write into their own tree). ``--dry-run`` stops after the torch check and reports the plan, with the
exact command and environment, through a recording runner.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from packaging.utils import parse_wheel_filename

from porter.artifacts.manifest import ExtensionEntry, OpEntry
from porter.artifacts.wheelfile import Payload, read_wheel, rewrite_wheel
from porter.errors import CheckFailed, PorterError, stop_note
from porter.executor import build_python
from porter.fs import cache_dir, ensure_writable_dir, owned_temp, sha256_file
from porter.log import Logger, quiet_logger
from porter.run import Runner, env_changes, plan_lines
from porter.toolchain.check import ready
from porter.toolchain.profile import toolchain_env
from porter.torch_facts import TorchInfo, build_torch, probe_torch
from porter.wheels import costs
from porter.hipify import wave64
from porter.wheels.base import LEAVE, BuildPlan, Machine, SourceInfo, WheelDriver, WheelRequest
from porter.wheels.compile import wave64_step
from porter.wheels.source import detect, resolve_source
from porter.wheels.verify import relabel, verify_wheel
from ops_prebuild.build import OpResult
from ops_prebuild.source import build_sets


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

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "plan": self.plan.to_dict(), "command": self.argv, "env": self.env,
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


# -- patch sets ----------------------------------------------------------------------------------

def apply_patch_set(tree: Path, ref: str, version: str, log: Logger) -> list[dict[str, Any]]:
    """Apply a patch set (``PROJECT/NAME``, ``PROJECT`` or a file) with porter's patch engine; return the patches
    applied, as the wheel's manifest lists them."""
    from porter.patching import apply, resolve_sets

    applied = apply(tree, resolve_sets(ref), target_version=version)
    log.info(f"patch set {ref}: {len(applied.changed)} file(s) changed")
    return applied.plan.records()


def check_patch_set(tree: Path, ref: str, version: str, log: Logger) -> None:
    """A dry run's :func:`apply_patch_set`: the set checked against ``tree``, nothing written (a set that does not
    apply to this version stops the build before any compiling)."""
    from porter.patching import checked, resolve_sets

    planned = checked(tree, resolve_sets(ref), target_version=version)
    log.info(f"patch set {ref}: applies to {version} ({len(planned.changes)} file(s) would change)")


# -- the build -----------------------------------------------------------------------------------

def build_wheel(driver: WheelDriver, source: str, request: WheelRequest, *, runner: Runner,
                log: Logger | None = None, machine: Machine | None = None,
                others: Mapping[str, WheelDriver] | None = None, torch_info: TorchInfo | None = None) -> WheelResult:
    """The whole flow. ``runner`` runs (or, for probes, asks); a recording runner is a dry run: the build is only
    recorded, nothing is written.

    ``torch_info`` skips probing the build python (callers that already know it).
    """
    log = log or quiet_logger()
    tc = request.toolchain
    ex = tc.executor
    py_ex, python = build_python(ex, tc.python, request.python)
    if not runner.dry:
        ensure_writable_dir(request.output, what="wheelhouse")
    _, not_ready = ready(tc, runner, log, compiler=False)  # (the engine's link checks it)
    with owned_temp(_scratch(ex, runner), "porter-wheel-") as work:
        with log.step(f"reading {driver.title} source {source}"):
            # the shared cache (an sdist unpacked once, under a lock); a dry run writes only into its temp folder
            root, provenance = resolve_source(source, driver, work if runner.dry else ex.work_dir(cache_dir()),
                                              runner.real())
            info = detect(driver, root, others or {})
        request = replace(request, source=root, sources={**provenance, **request.sources})
        if request.measured is None:  # what a --compile-only run measured sizes MAX_JOBS (porter.wheels.costs)
            request = replace(request, measured=costs.load(driver.name, info.version, tc))
        engine, plan = _on_engine(driver, info, driver.plan(info, request, machine or Machine.current()))
        torch, refused = _torch_step(plan, request, torch_info, python, py_ex, runner, log)
        tree, out = work / "tree", work / "out"
        # setup.py runs where the build python runs: the toolchain's root when --python names one there, else the
        # host (a backend that compiles nothing, FlashAttention's Triton one, needs no more; one that compiles is
        # refused above unless the build python has the profile's torch, which lives where its compiler does)
        argv = py_ex.argv(python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-"
                          "check", "-w", py_ex.visible(out, stage=False), py_ex.visible(tree, stage=False), *plan.pip_args)
        env = toolchain_env(tc, plan.env)
        refs = ([request.patch_set] if request.patch_set is not None else []) + [
            s.ref for s in build_sets(driver.name, tc.kind, root) if s.ref != request.patch_set]  # ck-rocm7, ...
        if runner.dry:
            for ref in refs:
                check_patch_set(root, ref, info.version, log)
            lanes = wave64_step(driver, info, plan, request, _planned(root, refs), "; ".join(refs), log)
            plan, stop = _gated(plan, lanes, tc.name)
            refused = refused or not_ready
            runner.run(argv, env=env, cwd=tree)
            return WheelResult(plan, argv, env_changes(env), torch, dry_run=True, refusal=refused or stop,
                               wave64=lanes.to_dict() if lanes else None)
        with log.step(f"copying {root} to a work tree"):
            shutil.copytree(root, tree, ignore=_IGNORE, symlinks=True)
            out.mkdir()
        patches = _patch(tree, refs, request.patch_set, info.version, log, what=f"every {tc.kind} build "
                         f"of {driver.title}")
        lanes = wave64_step(driver, info, plan, request, lambda rel: _text(tree / rel), "; ".join(refs), log)
        plan, stop = _gated(plan, lanes, tc.name)
        if stop is not None:
            raise stop
        if engine is not None:
            torch = torch or probe_torch(python, replace(runner, echo=False), executor=py_ex)  # the modules' ABI
            linked = _engine_ops(driver, tree, request, plan, root, runner=runner, log=log, machine=machine,
                                 others=others, torch=torch)
        if engine is not None and tc.kind == "emulated":  # no setup.py: it would ask the CPU torch for ROCm
            with log.step(f"packaging {plan.project} {plan.version}'s Python side as the tree has it"):
                python_side(tree, driver.name, info.version, out)
        else:
            with log.step(f"building {plan.project} {plan.version} for +{plan.label} "
                          + ("(the Python side)" if engine is not None else f"(MAX_JOBS={plan.jobs})")):
                runner.run(argv, env=env, cwd=tree,
                           hint=f"the {plan.project} build failed; the output above is upstream's. "
                                "Run with --dry-run to see the exact command and environment")
        if len(built := sorted(out.glob("*.whl"))) != 1:
            raise CheckFailed(f"pip wheel produced {len(built)} wheels in {out}, expected one")
        if engine is not None and torch is not None:  # (set above)
            with log.step(f"adding the {len(linked)} module(s) the engine built"):
                built = [with_prebuilt(built[0], work / "composed", linked, plan, info, torch, engine)]
        with log.step(f"verifying {built[0].name}"):
            entries = verify_wheel(built[0], plan.expect)
        with log.step(f"labelling +{plan.label}"):
            final, mpath = relabel(built[0], plan.label, request.output,
                                   _manifest(plan, request, built[0], entries, torch, info, patches),
                                   extra={"wave64": lanes.to_dict()} if lanes else None)
        log.info(f"wrote {final} ({len(entries)} extension module(s)) and {mpath.name}")
        return WheelResult(plan, argv, env_changes(env), torch, wheel=final, manifest=mpath,
                           wave64=lanes.to_dict() if lanes else None)


def _scratch(ex: Any, runner: Runner) -> Path | None:
    """Where the work folder goes: under the toolchain's root when it has one (its python sees it), else the host's
    temp folder (None); a dry run makes no folder in the root."""
    if ex.kind == "host":
        return None
    scratch: Path = ex.work_dir(Path(tempfile.gettempdir()), make=not runner.dry)
    if not runner.dry:
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch
    return scratch if scratch.is_dir() else None


def _on_engine(driver: WheelDriver, info: SourceInfo, plan: BuildPlan) -> tuple[EngineDriver | None, BuildPlan]:
    """The driver when porter's engine compiles and links the plan's ops (upstream's setup.py then writes only the
    Python side), with the plan saying so."""
    if not (isinstance(driver, EngineDriver) and driver.on_engine(info, plan)):
        return None, plan
    return driver, replace(plan, env={**plan.env, **driver.python_only_env(info)},
                           notes=(*plan.notes, f"{len(plan.ops)} op(s) compiled and linked by porter's AOT engine "
                                  "(compiler cache, per-op errors); setup.py below builds only the Python side"))


def _torch_step(plan: BuildPlan, request: WheelRequest, known: TorchInfo | None, python: str, py_ex: Any,
                runner: Runner, log: Logger) -> tuple[TorchInfo | None, PorterError | None]:
    """The build python's torch and, when it is not what the plan needs, the refusal (raised in a real run)."""
    if not request.torch_check:
        if plan.needs_torch:
            log.warn(f"torch check skipped: this build needs a {plan.needs_torch} torch; "
                     "upstream's setup.py fails late if the build python has another")
        return known, None
    return build_torch(python, py_ex, runner, need=plan.needs_torch, known=known,
                       what=f"{plan.project} {plan.version} ({plan.backend or plan.regime} build for +{plan.label}"
                            + (f"; {plan.needs_torch_why}" if plan.needs_torch_why else "") + ")")


def _patch(tree: Path, refs: Sequence[str], asked: str | None, version: str, log: Logger, *,
           what: str) -> list[dict[str, Any]] | None:
    """Apply the patch sets to the work copy: the one asked for, then the kind's; the patches, as the manifest lists
    them (None: not known)."""
    patches: list[dict[str, Any]] | None = []
    for ref in refs:
        with log.step(f"applying patch set {ref}" + ("" if ref == asked else f" ({what})")):
            got = apply_patch_set(tree, ref, version, log)
        patches = None if patches is None or got is None else [*patches, *got]
    return patches


def _gated(plan: BuildPlan, lanes: wave64.Wave64 | None, target: str) -> tuple[BuildPlan, CheckFailed | None]:
    """The plan with the wave-64 step's notes, and the stop a refused finding makes."""
    if lanes is None:
        return plan, None
    stop = lanes.error(f"{plan.project} {plan.version} for {target}", LEAVE)
    return replace(plan, notes=(*plan.notes, *([stop_note(stop.message)] if stop else []),
                                *lanes.allowed_notes())), stop


def _engine_ops(driver: WheelDriver, tree: Path, request: WheelRequest, plan: BuildPlan, root: Path, *,
                runner: Runner, log: Logger, machine: Machine | None, others: Mapping[str, WheelDriver] | None,
                torch: TorchInfo) -> list[OpResult]:
    """The plan's ops compiled and linked by porter's engine from the patched work copy; any failure stops the build
    (no wheel with a hole in it)."""
    from porter.wheels.compile import compile_only as engine_build

    linked = engine_build(driver, str(tree), request, runner=runner, log=log, machine=machine, others=others,
                          torch_info=torch, link=True,
                          origin=f"{request.sources.get('sdist_sha256') or root} {request.patch_set or ''}")
    if linked.failed:
        from ops_prebuild.build import failures

        raise CheckFailed(f"{len(linked.failed)} of {len(linked.ops)} op(s) of {plan.project} {plan.version} "
                          "failed to build, so no wheel was written, " + failures(linked.failed, str(root),
                                                                                 request.toolchain),
                          hint=f"read the logs, e.g. {linked.failed[0].log or 'above'}; or leave the op out with --ops")
    return linked.ops




def _text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def _planned(root: Path, refs: Sequence[str]) -> Callable[[str], str | None]:
    """The files the patch sets ``refs`` would change, as they would be (a dry run writes none)."""
    from porter.patching import plan as plan_patches, resolve_sets

    sets = [s for ref in refs for s in resolve_sets(ref)]
    changed = {c.path: c.after for c in plan_patches(root, sets).changes if c.after is not None} if sets else {}
    return lambda rel: changed[rel].decode("utf-8", errors="replace") if rel in changed else None


@runtime_checkable
class EngineDriver(Protocol):
    """A driver whose ops (some regime of its project) compile and link on porter's AOT engine."""

    version_info: str
    """The wheel's file that records which ops are prebuilt (its loader imports those, JIT-builds the rest)."""

    def on_engine(self, info: SourceInfo, plan: BuildPlan) -> bool: ...

    def mark_prebuilt(self, text: str, installed: Mapping[str, bool]) -> str:
        """:attr:`version_info`'s text ('' when the wheel has none) recording ``installed`` (op -> prebuilt)."""
        ...

    def python_only_env(self, info: SourceInfo) -> dict[str, str | None]:
        """setup.py's environment for a wheel with no compiled op (the Python side only)."""
        ...


def with_prebuilt(base: Path, dest: Path, results: list[OpResult], plan: BuildPlan, info: SourceInfo,
                  torch: TorchInfo, engine: EngineDriver) -> Path:
    """Upstream's Python-only wheel with the engine's modules added at their import paths and marked prebuilt in
    the driver's record of them, under the build torch's wheel tag (the modules are ABI-bound to it)."""
    modules = {o.name: o.module for o in plan.ops}
    add: dict[str, Payload] = {modules[r.name].replace(".", "/") + torch.ext_suffix: Path(r.so)
                               for r in results if r.status != "failed" and r.name in modules}
    installed = {o.name: False for o in info.ops}
    installed.update({r.name: True for r in results if r.status != "failed"})
    w = read_wheel(base)
    # a tree whose setup.py writes no such file has a loader that finds the modules by import alone: it gets one
    record = engine.version_info
    add[record] = engine.mark_prebuilt(w.files[record].decode() if record in w.files else "", installed).encode()
    dest.mkdir(parents=True, exist_ok=True)
    return rewrite_wheel(base, dest, version=w.version, tag=torch.wheel_tag, purelib=False, add=add)


def python_side(tree: Path, package: str, version: str, out: Path) -> Path:
    """A pure-Python wheel of the tree's package ``package`` (its .py files as they are), for the emulated target,
    whose CPU torch upstream's setup.py may not accept."""
    from porter.artifacts.wheelfile import WheelSpec, write_wheel

    files: dict[str, Payload] = {p.relative_to(tree).as_posix(): p for p in sorted((tree / package).rglob("*.py"))}
    if not files:
        raise CheckFailed(f"{tree} has no Python package {package}/", hint="is the source tree complete?")
    return write_wheel(out, WheelSpec(package, version, "py3-none-any", purelib=True), files)


def _manifest(plan: BuildPlan, request: WheelRequest, wheel: Path, entries: list[ExtensionEntry],
              torch: TorchInfo | None, info: SourceInfo, patches: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The manifest's fields for the labelled wheel (its version and wheel section are set by :func:`relabel`);
    ``patches``: those applied to the work copy (None: not known)."""
    tc = request.toolchain
    tags = parse_wheel_filename(wheel.name)[3]
    python_tag = ".".join(sorted({t.interpreter for t in tags}))
    setup_py = info.tree / "setup.py"
    sources: dict[str, Any] = {"upstream_version": info.version, "setup.py_sha256": sha256_file(setup_py),
                               **request.sources}
    if patches is not None:
        sources["patches"] = patches
    for entry in entries:
        op = next((o.name for o in plan.ops if o.module == entry["module"]), None)
        if op:
            entry["op"] = op
        if entry["module"] in plan.expect.host_only:
            entry["host_only"] = True
    ops: list[OpEntry] | None = None
    if plan.ops:
        have = {e["module"] for e in entries}
        ops = []
        for o in plan.ops:
            op_entry: OpEntry = {"name": o.name, "status": "built" if o.module in have else "skipped"}
            if o.module not in have:
                op_entry["reason"] = "optional: upstream built it only under further conditions"
            ops.append(op_entry)
    return {"component": plan.project, "version": "", "tc": tc, "torch": torch, "python_tag": python_tag,
            "sources": sources, "extensions": entries, "ops": ops,
            "target": {"regime": plan.regime, "backend": plan.backend}}
