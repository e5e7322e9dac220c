"""Package prebuilt ops into the project's own wheel.

DeepSpeed's own setup.py builds the pure-Python wheel (``DS_BUILD_OPS=0``; cached per source), then
porter's one wheel writer writes it anew with the prebuilt ``.so`` modules, ``installed_ops`` set
for them, the target named in the PEP 440 local label, and a platform tag.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from porter.artifacts.wheelfile import Payload, read_wheel, rewrite_wheel
from porter.components.deepspeed import VERSION_INFO
from porter.errors import ToolError
from porter.executor import HOST, Executor
from porter.run import Runner, make_env


def base_wheel(tree: Path, cache: Path, *, python: str, accelerator: str, runner: Runner,
               executor: Executor = HOST) -> Path:
    """The pure-Python DeepSpeed wheel built by its own setup.py with no ops (cached)."""
    found = sorted(cache.glob("*.whl")) if cache.is_dir() else []
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    # beside the cache entry (same filesystem, visible where the build python runs)
    with tempfile.TemporaryDirectory(prefix=".porter-ds-", dir=cache.parent) as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        out = Path(tmp) / "out"
        runner.run(executor.argv(python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                                 executor.inside(out), executor.inside(copy)),
                   cwd=copy, env=make_env({"DS_BUILD_OPS": "0", "DS_ACCELERATOR": accelerator}), timeout=1800,
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
    ``porter_feature_probes``, where porter's deepspeed/no-jit patch reads them when PORTER_NO_JIT is set."""
    def edit(name: str, data: bytes) -> bytes:
        if name != VERSION_INFO:
            return data
        return _feature_probes(_installed_ops(data.decode(), installed_ops), feature_probes or {}).encode()

    add: dict[str, Payload] = {**extensions, **extra_files}
    return rewrite_wheel(base, dest_dir, version=version, tag=tag, purelib=False, add=add, edit=edit)


def _installed_ops(text: str, installed: Mapping[str, bool]) -> str:
    line = "installed_ops=" + repr(dict(sorted(installed.items())))
    if re.search(r"(?m)^installed_ops\s*=", text):
        return re.sub(r"(?m)^installed_ops\s*=.*$", line.replace("\\", "\\\\"), text, count=1)
    return text.rstrip("\n") + "\n" + line + "\n"


def _feature_probes(text: str, probes: Mapping[str, bool]) -> str:
    line = "porter_feature_probes=" + repr(dict(sorted(probes.items())))
    if re.search(r"(?m)^porter_feature_probes\s*=", text):
        return re.sub(r"(?m)^porter_feature_probes\s*=.*$", line.replace("\\", "\\\\"), text, count=1)
    return text.rstrip("\n") + "\n" + line + "\n"


def dist_version(base: Path) -> tuple[str, str]:
    """(distribution name, version) from a wheel's METADATA."""
    w = read_wheel(base)
    return w.name, w.version
