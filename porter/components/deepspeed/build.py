"""``porter ops build``: DeepSpeed's source -> porter's patched copy -> its op catalogue -> the AOT engine ->
DeepSpeed's own wheel with the prebuilt modules and a manifest (+ its dependencies, for offline nodes)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from porter.artifacts import labels
from porter.artifacts.labels import with_label
from porter.artifacts.manifest import ExtensionEntry, publish
from porter.components.deepspeed import DEEPSPEED
from porter.components.deepspeed.catalogue import read_catalogue
from porter.components.deepspeed.wheel import base_wheel, compose, dist_version, wheel_patches
from porter.errors import CheckFailed, ConfigError, PorterError, stop_note
from porter.executor import Executor, build_python
from porter.fs import cache_dir, ensure_writable_dir, owned_temp
from porter.hipify import wave64
from porter.log import Logger, quiet_logger
from porter.run import Runner, make_env
from porter.toolchain.check import ready
from porter.toolchain.profile import Toolchain
from porter.torch_facts import build_torch, need_for, refusal
from ops_prebuild.build import BuildResult, EngineRun, OpResult, compile_catalogue, key
from ops_prebuild.catalogue import Catalogue, OpSpec
from ops_prebuild.source import Patched, Source, build_copy, cached_source, git_commit, resolve_source


def build_ops(source_spec: str, tc: Toolchain, *, ops: list[str] | None = None, all_compatible: bool = False,
              wheelhouse: Path, how: EngineRun = EngineRun(), python: str | None = None,
              with_deps: bool = False, log: Logger | None = None, runner: Runner | None = None,
              cache: Path | None = None, allow_wave32: Sequence[str] = ()) -> BuildResult:
    """source -> catalogue -> plan -> one ninja run -> one wheel + manifest. Everything is checked before any work
    (output folder writable, toolchain root ready, torch of the right kind); a dry run (a recording ``runner``)
    returns the complete plan with ``refusal`` set instead of raising, and writes nothing into caches or trees.

    ``how`` is the engine's part (:class:`ops_prebuild.build.EngineRun`): with ``shard=(i, n)`` a run compiles
    only shard i of n of the compile steps into the (shared) build folder and stops: n such runs (a Slurm job
    array) and then one ``link_only`` run (which compiles nothing, refuses when an object is missing, links and
    packages) give what one local run gives. On a 64-lane target every warp-size-32 finding in the selected ops
    gets a state (:mod:`porter.hipify.wave64`); a refused one stops the build (exit 1) unless ``allow_wave32``
    names its op (or ``all``)."""
    compile_only, shard = how.compile_only, how.shard
    log = log or quiet_logger()
    runner = runner or Runner(log)
    if compile_only and tc.kind == "cpu":
        raise ConfigError(f"--compile-only compiles GPU code for every arch of a rocm or cuda profile; toolchain "
                          f"{tc.name} is a cpu profile", hint="pick a GPU profile (-t debian-rocm7, -t cuda-h100, "
                          "...), or drop --compile-only to build the CPU ops into a wheel")
    ex = tc.executor
    py_ex, python = build_python(ex, tc.python, python)
    cache = cache or ex.work_dir(cache_dir(), make=not runner.dry)
    start = time.monotonic()
    packs = not compile_only and shard is None  # this run writes the wheel
    compiler_version, not_ready = _preflight(tc, python, py_ex, wheelhouse if packs else None,
                                             link=not compile_only, runner=runner, log=log)
    with ExitStack() as stack:
        with log.step("reading the source and its op catalogue"):
            source = _source(source_spec, cache, py_ex, runner, stack)
            patched = build_copy(source, tc.kind, cache, runner, log, only_present=False)
            unpatched = source
            source = patched.source if not runner.dry else source
            cat = read_catalogue(source, tc, python=python, runner=Runner(log, echo=log.verbose), executor=py_ex)
        selected = _selected(cat, ops, all_compatible, log)
        refused = (None if compile_only else refusal(need_for(tc.kind), cat.torch, python,
                                                     what=f"building DeepSpeed ops for {tc.name}")) or not_ready
        lanes = _wave64(unpatched, patched, selected, allow_wave32, log) if tc.wavefront == 64 else None
        stop = lanes.error(f"DeepSpeed {source.version} for {tc.name}") if lanes is not None else None
        if stop is not None and not runner.dry:
            raise stop
        build_dir = cache / "ops" / f"{source.project}-{source.version}-{tc.name}-" \
            f"{key(str(source.tree), tc.to_dict(), cat.torch.version, cat.torch.python_tag, compile_only)}"
        # DeepSpeed's own pure-Python wheel (one pip process) is built while ninja compiles: the compile's last
        # round leaves cores idle, and the wheel is ready when packaging needs it
        base: Future[Path] | None = None if runner.dry or not packs or refused is not None else stack.enter_context(
            ThreadPoolExecutor(1, thread_name_prefix="base-wheel")).submit(
            base_wheel_of, cat, cache, python=python, runner=runner, executor=py_ex, tc=tc)
        result = compile_catalogue(cat, tc, selected, build_dir, python=python, py_ex=py_ex, runner=runner, log=log,
                                   cache=cache, how=how, compiler_version=compiler_version,
                                   refused=refused, source_patches=patched.applied)
        if lanes is not None:
            _record_wave64(result, lanes, stop)
        if runner.dry or shard is not None or compile_only:
            result.seconds = time.monotonic() - start
            return result
        for o in result.failed:
            log.error(f"op {o.name} failed to build; log: {o.log}")
        if len(result.failed) == len(result.ops):
            raise CheckFailed(f"no op built ({', '.join(o.name for o in result.failed)} failed)",
                              hint=f"read the logs under {build_dir}")
        patches = list(patched.records)  # as the manifest lists them
        with log.step("packaging the wheel"):
            result.wheel, result.manifest = package(cat, tc, selected, result.ops, wheelhouse, python=python,
                                                    runner=runner, cache=cache, executor=py_ex,
                                                    base=base.result() if base is not None else None,
                                                    patches=patches, wave64=result.wave64, build=_build_facts(result, how))
    if with_deps:
        with log.step("downloading the wheel's dependencies (all but torch) into the wheelhouse"):
            download_dependencies(result.wheel, wheelhouse, python=sys.executable, runner=runner)
    result.seconds = time.monotonic() - start
    return result


def _build_facts(result: BuildResult, how: EngineRun) -> dict[str, Any]:
    """The manifest's ``build`` section: the compiler cache's numbers, debug info, precompiled headers."""
    ccache = result.ccache
    return {"cache": {**ccache.to_dict(), **result.cache_stats} if ccache else None, "debug_info": how.debug,
            "pch": how.pch}


def _selected(cat: Catalogue, ops: list[str] | None, all_compatible: bool, log: Logger) -> list[OpSpec]:
    """The ops asked for, with the ops they load at run time (said: a node would compile those otherwise)."""
    selected = cat.select(ops, all_compatible)
    for dep in (o for o in selected if not all_compatible and o.name not in (ops or ())):
        users = [o.name for o in selected if dep.name in o.loads]
        log.info(f"also building {dep.name}: {', '.join(users)} load{'s' if len(users) == 1 else ''} it at run "
                 "time (a node would compile it otherwise)")
    return selected


def _source(spec: str, cache: Path, py_ex: Executor, runner: Runner, stack: ExitStack) -> Source:
    """The source, unpacked once into the shared cache; a dry run uses what the cache has or unpacks into a temp
    folder (where the build python sees it), never into the cache."""
    if not runner.dry:
        return resolve_source(DEEPSPEED, spec, runner=runner, cache=cache)
    source = cached_source(DEEPSPEED, spec, cache)
    if source is not None:
        return source
    parent = cache if py_ex.kind != "host" and cache.is_dir() else None
    scratch = stack.enter_context(owned_temp(parent, "porter-dry-"))
    return resolve_source(DEEPSPEED, spec, runner=runner.real(), cache=scratch)


def _preflight(tc: Toolchain, python: str, py_ex: Executor, wheelhouse: Path | None, *, link: bool, runner: Runner,
               log: Logger) -> tuple[str, PorterError | None]:
    """Everything a real build checks before any work: the wheelhouse writable, a torch of the profile's kind in the
    build python (linking needs it; compiling does not), then the toolchain's readiness (:func:`ready`)."""
    if not runner.dry and wheelhouse is not None:
        ensure_writable_dir(wheelhouse, what="wheelhouse")
    if not runner.dry and link:
        build_torch(python, py_ex, Runner(log), need=need_for(tc.kind), what=f"building DeepSpeed ops for {tc.name}")
    return ready(tc, runner, log)


def _record_wave64(result: BuildResult, lanes: wave64.Wave64, stop: CheckFailed | None) -> None:
    """The states into the build's document, and into its plan: the stop a real run would make (a dry run), the
    findings built by the override."""
    result.wave64 = lanes.to_dict()
    if stop is not None:
        result.refusal = result.refusal or stop
        result.plan.notes.append(stop_note(stop.message))
    result.plan.notes.extend(lanes.allowed_notes())


def _wave64(unpatched: Source, patched: Patched, selected: Sequence[OpSpec], allow: Sequence[str],
            log: Logger) -> wave64.Wave64:
    """The state of each warp-size-32 finding in the selected device ops (those the patch sets remove are fixed)."""
    return wave64.gate(unpatched.project, unpatched.tree, patched.after, "; ".join(a.split(":")[0] for a in patched.applied),
                       {o.name: (o.sources, o.include_paths) for o in selected if o.device}, allow, log)


def download_dependencies(wheel: Path, wheelhouse: Path, *, python: str, runner: Runner) -> list[str]:
    """Binary wheels of the wheel's runtime requirements, so compute nodes can install offline.

    torch is left out on purpose: the node's torch comes from the site (module, container, venv).
    """
    import email.parser
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.BytesParser().parsebytes(z.read(meta))
    reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
    wanted = [str(r) for r in reqs if r.name.lower() != "torch" and "extra" not in str(r.marker or "")]
    if wanted:
        runner.run([python, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(wheelhouse), *wanted],
                   env=make_env(), timeout=1800,
                   hint="the package index must be reachable from the build host; or fill the wheelhouse yourself")
    return wanted


def base_wheel_of(cat: Catalogue, cache: Path, *, python: str, runner: Runner, executor: Executor,
                  tc: Toolchain) -> Path:
    """DeepSpeed's own pure-Python wheel of the catalogue's source (a cache entry). For porter's emulated target
    its setup.py runs for the CPU accelerator: the modules run on a CPU torch, with which setup.py for "cuda" looks
    for a CUDA toolkit (DeepSpeed 0.18.9: 'CUDA_HOME does not exist'); its ops are answered as for ROCm."""
    src = cat.source
    accelerator = "cpu" if tc.kind == "emulated" else cat.accelerator
    return base_wheel(src.tree, cache / "base" / f"{src.project}-{src.version}-"
                      f"{key(str(src.tree), accelerator, cat.torch.version)}",
                      python=python, accelerator=accelerator, runner=Runner(runner.log, echo=runner.echo),
                      executor=executor)


def package(cat: Catalogue, tc: Toolchain, selected: list[OpSpec], results: list[OpResult], wheelhouse: Path,
            *, python: str, runner: Runner, cache: Path, executor: Executor, base: Path | None = None,
            build: dict[str, Any] | None = None, patches: Sequence[dict[str, Any]] = (),
            wave64: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """The wheel (DeepSpeed's own, with the ops) and its manifest; ``patches``: those applied to the source
    (:meth:`porter.patching.engine.Plan.records`). The manifest also lists the patches made to the wheel's own
    copy of DeepSpeed's files (:func:`~porter.components.deepspeed.wheel.wheel_patches`)."""
    src = cat.source
    base = base or base_wheel_of(cat, cache, python=python, runner=runner, executor=executor, tc=tc)
    _dist, base_version = dist_version(base)
    version = with_label(base_version, labels.make(tc))
    tag = cat.torch.wheel_tag
    specs = {o.name: o for o in selected}
    ok = [r for r in results if r.status != "failed"]
    extensions = {specs[r.name].module.replace(".", "/") + cat.torch.ext_suffix: Path(r.so) for r in ok}
    installed = {o.name: False for o in cat.ops if o.module}
    installed.update({r.name: True for r in ok})
    entries: list[ExtensionEntry] = []
    for arc, r in zip(extensions, ok):
        entry: ExtensionEntry = {"module": specs[r.name].module, "path": arc, "sha256": r.sha256, "op": r.name,
                                 "archs": list(tc.arch_names) if specs[r.name].device else []}
        if not specs[r.name].device:
            entry["host_only"] = True
        entries.append(entry)
    sources: dict[str, Any] = {"sdist_sha256": src.sha256, "origin": src.origin, "version": src.version}
    commit = git_commit(Path(src.origin))  # a checkout given as the source (an sdist has its sha256)
    if commit:
        sources["git_commit"] = commit
    sources["patches"] = [*patches, *wheel_patches(base)]
    dest, mpath, _ = publish(
        wheelhouse, lambda tmp, data: compose(base, tmp, version=version, tag=tag, extensions=extensions,
                                              installed_ops=installed, extra_files={"{dist_info}/porter.json": data},
                                              feature_probes=dict(cat.feature_probes)),
        extra={**({"build": build} if build else {}), **({"wave64": wave64} if wave64 else {})},
        component=src.project, version=version, tc=tc, torch=cat.torch, python_tag=cat.torch.python_tag,
        sources=sources, extensions=entries, target={"accelerator": cat.accelerator},
        ops=[{"name": r.name, "status": r.status, "seconds": round(r.seconds, 2), "log": r.log} for r in results])
    return dest, mpath
