"""ROCm builds compile hipified sources: torch's own hipify (extension mode) run on a copy of csrc/."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from pathlib import Path

from porter.executor import HOST, Executor
from porter.probe import run_probe
from porter.run import Runner, make_env
from ops_prebuild.catalogue import OpSpec


def hipify_sources(tree: Path, ops: list[OpSpec], dest: Path, *, python: str, runner: Runner,
                   executor: Executor = HOST) -> dict[str, dict[str, str]]:
    """op -> {relative source: hipified host path under ``dest``}. The copy is refreshed on every call.

    A dry run (a recording ``runner``) hipifies into a temp folder (so the mapping is torch's own, not a guess), removes it, and
    returns the paths a real run writes under ``dest``: nothing is written into caches or trees.
    """
    if runner.dry:
        with executor.scratch("porter-hipify-") as tmp:
            found = hipify_sources(tree, ops, tmp / "hip", python=python, runner=runner.real(), executor=executor)
            return {op: {rel: str(dest / os.path.relpath(p, tmp / "hip")) for rel, p in m.items()}
                    for op, m in found.items()}
    # hipified beside ``dest``, then synced into it: a file whose bytes did not change keeps its time, so ninja
    # keeps what it compiled from it (a compile-only rerun, which no compiler cache serves, compiles only what is new)
    staging = dest.with_name(f".{dest.name}.new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for rel in sorted({s.split("/")[0] for o in ops for s in o.sources} | {"csrc"}):
        if (tree / rel).is_dir():  # csrc/, and e.g. deepspeed/ where inference v2 keeps its kernels
            shutil.copytree(tree / rel, staging / rel, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    seen = {s: executor.inside(staging / s) for o in ops for s in o.sources}  # as the build python names them
    groups = [[[executor.inside(staging / p) for p in o.include_paths], [seen[s] for s in o.sources]]
              for o in ops]  # each op with its own include dirs (see porter/probes/hipify_ext.py)
    mapping: dict[str, str] = run_probe("hipify_ext", [executor.inside(staging), json.dumps(groups)],
                                        python=python, runner=runner, executor=executor, env=make_env(),
                                        timeout=900, what="to hipify the ops' sources")
    sync_tree(staging, dest)
    shutil.rmtree(staging)
    inner = executor.inside(staging)
    # each source's in-root path (hipified, or as it was) back to the host's, in dest
    return {o.name: {s: str(dest / os.path.relpath(mapping.get(seen[s], seen[s]), inner)) for s in o.sources}
            for o in ops}


def sync_tree(src: Path, dest: Path) -> None:
    """Make ``dest`` hold exactly what ``src`` holds, moving files out of ``src``; a file whose bytes are the
    same stays as it was (its modification time too)."""
    dest.mkdir(parents=True, exist_ok=True)
    keep: set[Path] = set()
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        keep.add(rel)
        target = dest / rel
        if path.is_dir() and not path.is_symlink():
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            target.mkdir(exist_ok=True)
        elif not (target.is_file() and not target.is_symlink() and not path.is_symlink()
                  and filecmp.cmp(path, target, shallow=False)):
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(path, target)
    for path in sorted(dest.rglob("*"), reverse=True):  # what src no longer has, deepest first
        if path.relative_to(dest) not in keep:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
