"""ROCm builds compile hipified sources: torch's own hipify (extension mode) run on a copy of csrc/."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from porter.executor import HOST, Executor
from porter.probe import run_probe
from porter.run import Runner, make_env
from ops_prebuild.catalogue import OpSpec


def hipify_sources(tree: Path, ops: list[OpSpec], dest: Path, *, python: str, runner: Runner,
                   executor: Executor = HOST, dry_run: bool = False) -> dict[str, dict[str, str]]:
    """op -> {relative source: hipified host path under ``dest``}. The copy is refreshed on every call.

    A dry run hipifies into a temp folder (so the mapping is torch's own, not a guess), removes it, and
    returns the paths a real run writes under ``dest``: nothing is written into caches or trees.
    """
    if not ops:
        return {}
    if dry_run:
        parent = executor.work_dir(Path(tempfile.gettempdir())) if executor.kind != "host" else None
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="porter-hipify-", dir=parent) as tmp:
            found = hipify_sources(tree, ops, Path(tmp) / "hip", python=python, runner=runner, executor=executor)
            return {op: {rel: str(dest / os.path.relpath(p, Path(tmp) / "hip")) for rel, p in m.items()}
                    for op, m in found.items()}
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for rel in sorted({s.split("/")[0] for o in ops for s in o.sources} | {"csrc"}):
        if (tree / rel).is_dir():  # csrc/, and e.g. deepspeed/ where inference v2 keeps its kernels
            shutil.copytree(tree / rel, dest / rel, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    groups = [[[executor.inside(dest / p) for p in o.include_paths], [executor.inside(dest / s) for s in o.sources]]
              for o in ops]  # each op with its own include dirs (see porter/probes/hipify_ext.py)
    mapping: dict[str, str] = run_probe("hipify_ext", [executor.inside(dest), json.dumps(groups)],
                                        python=python, runner=runner, executor=executor, env=make_env(),
                                        timeout=900, what="to hipify the ops' sources")
    inner = executor.inside(dest)

    def host(path: str) -> str:
        return str(dest / os.path.relpath(path, inner))  # an in-root path back to the host's

    return {o.name: {s: host(mapping.get(executor.inside(dest / s), executor.inside(dest / s))) for s in o.sources}
            for o in ops}
