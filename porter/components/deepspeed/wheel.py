"""DeepSpeed's own wheel with the prebuilt ops in it.

DeepSpeed's own setup.py builds the pure-Python wheel (``DS_BUILD_OPS=0``; cached per source), then
porter's one wheel writer writes it anew with the prebuilt ``.so`` modules, ``installed_ops`` set
for them, the target named in the PEP 440 local label, and a platform tag.

The wheel's own copy of DeepSpeed's op builder also gets porter's deepspeed/no-jit patch set (:data:`WHEEL_SETS`),
edited in memory here and never in the source tree: DeepSpeed answers its load-time feature probes (``has_function``)
by compiling a test program, on import (0.18) or when ``deepspeed.ops.__compatible_ops__`` is first read (0.19);
patched, an installation porter wrote answers them from ``porter_feature_probes`` (the build python's answers,
recorded beside ``installed_ops``), so a prebuilt install starts no compiler by default. The same set's opt-in
``PORTER_NO_JIT=1`` guard comes with it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from porter.artifacts.wheelfile import Payload, read_wheel, rewrite_wheel
from porter.components.deepspeed.audit import VERSION_INFO
from porter.components.op_builder import set_installed_ops
from porter.errors import ToolError
from porter.executor import HOST, Executor
from porter.fs import owned_temp
from porter.locks import hold
from porter.patching import PatchSet, failure_message, load_shipped
from porter.patching import Plan as PatchPlan, plan as plan_patches
from porter.run import Runner, make_env

WHEEL_SETS: tuple[tuple[str, str], ...] = (("deepspeed", "no-jit"),)
"""Patch sets (project, name) applied to the wheel's own copy of the files they edit; a file they do not need to
change (no such probe, already patched in the source tree) is left as DeepSpeed's setup.py wrote it."""


def base_wheel(tree: Path, cache: Path, *, python: str, accelerator: str, runner: Runner,
               executor: Executor = HOST) -> Path:
    """The pure-Python DeepSpeed wheel built by its own setup.py with no ops (a cache entry: one process builds
    it, under a lock, and publishes it by rename; builds at once wait for it and reuse it)."""
    found = sorted(cache.glob("*.whl")) if cache.is_dir() else []
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    with hold(cache, f"building DeepSpeed's own wheel from {tree.name}", say=runner.log.info):
        found = sorted(cache.glob("*.whl"))
        if found:  # another build made it while this one waited
            return found[0]
        # beside the cache entry (same filesystem, visible where the build python runs)
        with owned_temp(cache.parent, ".porter-ds-") as tmp:
            copy = Path(tmp) / "src"
            shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
            out = Path(tmp) / "out"
            runner.run(executor.argv(python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                                     executor.inside(out), executor.inside(copy)),
                       # its setup.py lists extras from sets: a fixed hash seed keeps METADATA's order (and the
                       # wheel's bytes) the same from one build of the entry to the next
                       cwd=copy, env=make_env({"DS_BUILD_OPS": "0", "DS_ACCELERATOR": accelerator,
                                               "PYTHONHASHSEED": "0"}), timeout=1800,
                       hint="DeepSpeed's setup.py failed to build its pure-Python wheel; see its output above")
            wheels = sorted(out.glob("*.whl"))
            if not wheels:
                raise ToolError(f"pip wheel produced no wheel for {tree}")
            os.replace(wheels[0], cache / wheels[0].name)
    return cache / wheels[0].name


def compose(base: Path, dest_dir: Path, *, version: str, tag: str, extensions: Mapping[str, Path],
            installed_ops: Mapping[str, bool], extra_files: Mapping[str, bytes],
            feature_probes: Mapping[str, bool] | None = None) -> Path:
    """Write the final wheel into ``dest_dir`` (atomically); return its path. ``feature_probes`` (the build
    python's answers to the tree's load-time ``has_function`` probes) are recorded beside ``installed_ops`` as
    ``porter_feature_probes``; the wheel's copy of the op builder, patched with :data:`WHEEL_SETS`, answers from
    them instead of compiling a test program."""
    guarded = guard_files(read_wheel(base).files)

    def edit(name: str, data: bytes) -> bytes:
        if name in guarded:
            return guarded[name]
        if name != VERSION_INFO:
            return data
        return _feature_probes(set_installed_ops(data.decode(), installed_ops), feature_probes or {}).encode()

    add: dict[str, Payload] = {**extensions, **extra_files}
    return rewrite_wheel(base, dest_dir, version=version, tag=tag, purelib=False, add=add, edit=edit)


def guard_files(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """The files of a wheel (archive name -> bytes) that :data:`WHEEL_SETS` change, as they change them: the sets are
    planned in memory on a scratch copy of just those files. A needed edit that cannot be made (DeepSpeed moved a
    line the set anchors on) is an error naming the file, the anchor and the closest line: a wheel that would run
    the compiler at import is not written. Each patch decides by its own ``needed_if`` (no version gate)."""
    planned = _guard_plan(files)
    if planned is None:
        return {}
    return {c.path: c.after for c in planned.changes if c.after is not None and c.path in files}


def wheel_patches(base: Path) -> list[dict[str, Any]]:
    """The patches :func:`compose` makes to the wheel's own copy of ``base``'s files, as its manifest lists them
    (:meth:`porter.patching.engine.Plan.records`, each with ``applied_to: wheel``)."""
    planned = _guard_plan(read_wheel(base).files)
    return [{**r, "applied_to": "wheel"} for r in planned.records()] if planned is not None else []


def _guard_plan(files: Mapping[str, bytes]) -> PatchPlan | None:
    sets: list[PatchSet] = [load_shipped(project, name) for project, name in WHEEL_SETS]
    names = {f for s in sets for p in s.patches for f in p.files}
    mine = {n: d for n, d in files.items() if n in names}
    if not mine:
        return None
    with owned_temp(None, "porter-wheel-guard-") as tmp:
        for rel, data in mine.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        planned = plan_patches(tmp, sets)
    if planned.failed:
        refs = ", ".join(s.ref for s in sets)
        raise ToolError(f"cannot add {refs} to the wheel's copy of {', '.join(sorted(mine))}: "
                        + failure_message(planned.failed),
                        hint=f"this DeepSpeed moved a line {refs} anchors on, so its wheel would compile feature "
                             f"probes at import; 'porter patch check TREE --set {refs}' shows which (the source "
                             "tree itself is never changed by 'porter ops build')")
    return planned


def _feature_probes(text: str, probes: Mapping[str, bool]) -> str:
    line = "porter_feature_probes=" + repr(dict(sorted(probes.items())))
    if re.search(r"(?m)^porter_feature_probes\s*=", text):
        return re.sub(r"(?m)^porter_feature_probes\s*=.*$", line.replace("\\", "\\\\"), text, count=1)
    return text.rstrip("\n") + "\n" + line + "\n"


def dist_version(base: Path) -> tuple[str, str]:
    """(distribution name, version) from a wheel's METADATA."""
    w = read_wheel(base)
    return w.name, w.version
