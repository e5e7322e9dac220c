"""The target: the Python environment wheels go into, and the GPU of the node they will run on.

The environment is inspected by running *its* interpreter (through the runner) with a small script
that prints JSON: interpreter and tags, install paths, torch (read from ``torch/version.py`` without
importing torch), and the distributions porter cares about with their shared objects. The node's GPU
comes from ``--arch`` or, failing that, from ``rocminfo`` / ``nvidia-smi``; a build never uses this,
only install and verify do.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from porter.errors import ConfigError, ToolError
from porter.probe import run_probe
from porter.run import Runner, make_env, which
from porter.toolchain.archs import ARCHS, parse_target
from porter.torch_facts import TorchInfo

@dataclass(frozen=True)
class InstalledDist:
    name: str
    version: str
    location: str
    shared_objects: tuple[tuple[str, str], ...]   # (path in RECORD, absolute path)
    carried_manifest: str | None = None


@dataclass(frozen=True)
class TargetEnv:
    """What the target interpreter reported about itself."""

    executable: str
    version: tuple[int, int, int]
    implementation: str
    prefix: str
    paths: Mapping[str, str]
    tags: tuple[str, ...]
    pip: str | None
    torch: TorchInfo | None
    dists: Mapping[str, InstalledDist] = field(default_factory=dict)

    @property
    def python_tag(self) -> str:
        short = {"cpython": "cp", "pypy": "pp"}.get(self.implementation, self.implementation)
        return f"{short}{self.version[0]}{self.version[1]}"

    @property
    def porter_dir(self) -> Path:
        """Where porter keeps its install records and lock for this environment."""
        return Path(self.paths["data"]) / "share" / "porter"

    def describe(self) -> str:
        torch = self.torch.describe() if self.torch else "not installed"
        return f"{self.executable} ({self.python_tag}, torch {torch})"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TargetEnv:
        t = data.get("torch")
        torch = TorchInfo(str(t["version"]), t.get("hip"), t.get("cuda"), root=str(t.get("path", ""))) \
            if t and t.get("version") else None
        dists = {k: InstalledDist(v["name"], v["version"], v["location"],
                                  tuple((a, b) for a, b in v["shared_objects"]), v.get("carried_manifest"))
                 for k, v in (data.get("dists") or {}).items()}
        v = data["version"]
        return cls(executable=data["executable"], version=(int(v[0]), int(v[1]), int(v[2])),
                   implementation=data["implementation"], prefix=data["prefix"], paths=dict(data["paths"]),
                   tags=tuple(data.get("tags") or ()), pip=data.get("pip"), torch=torch, dists=dists)


def inspect_env(python: str | os.PathLike[str], runner: Runner, *, dists: Iterable[str]) -> TargetEnv:
    """Run the target interpreter and read back what it reports (tags, paths, torch, ``dists``: the distributions
    the caller cares about, usually every component's: :func:`porter.components.all_dists`)."""
    want = sorted({canonicalize_name(n) for n in dists})
    try:
        doc = run_probe("env", [json.dumps(want)], python=os.fspath(python), runner=runner,
                        env=make_env({"PYTHONNOUSERSITE": None}), timeout=120, what="about itself")
    except ToolError as exc:
        if exc.message.startswith("python not found"):
            raise ConfigError(f"target python not found: {python}",
                              hint="pass --python with the interpreter of the environment to install into") from None
        raise ToolError(f"{python} could not be inspected; is it a working Python 3 interpreter?",
                        hint=exc.hint) from None
    return TargetEnv.from_json(doc)


# -- the node's GPU ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """The GPU archs install and verify check against, and where they came from."""

    archs: tuple[str, ...]
    source: str          # --arch | rocminfo | nvidia-smi | none

    def describe(self) -> str:
        return f"{','.join(self.archs)} (from {self.source})" if self.archs else "no GPU (none visible, no --arch)"


def parse_rocminfo(output: str) -> list[str]:
    """Distinct gfx agent names in ``rocminfo`` output, in order of appearance."""
    return list(dict.fromkeys(re.findall(r"^\s*Name:\s*(gfx[0-9a-f]+)\b", output, re.M)))


def parse_nvidia_smi(output: str) -> list[str]:
    """Distinct ``sm_XY`` archs of the compute capabilities ``nvidia-smi --query-gpu=name,compute_cap`` lists."""
    caps = [line.rpartition(",")[2].strip() for line in output.strip().splitlines()]
    return list(dict.fromkeys("sm_" + c.replace(".", "") for c in caps if re.fullmatch(r"\d+\.\d+", c)))


def node_from_option(archs: Iterable[str]) -> Node | None:
    names = [a for spec in archs for a in spec.split(",") if a.strip()]
    return Node(tuple(dict.fromkeys(parse_target(a).name for a in names)), "--arch") if names else None


def detect_node(runner: Runner, archs: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> Node:
    """``--arch`` when given, else the GPUs ``rocminfo`` (then ``nvidia-smi``) can see, else none."""
    if (given := node_from_option(archs)) is not None:
        return given
    environ = dict(os.environ if environ is None else environ)
    path = environ.get("PATH", "")
    for var in ("ROCM_PATH", "HIP_PATH"):
        if environ.get(var):
            path = f"{environ[var]}/bin{os.pathsep}{path}"
    for tool, args, parse in (("rocminfo", [], parse_rocminfo),
                              ("nvidia-smi", ["--query-gpu=name,compute_cap", "--format=csv,noheader"],
                               parse_nvidia_smi)):
        if (exe := which(tool, path)) is not None:
            res = runner.run([exe, *args], env=environ, timeout=60, check=False)
            found = [a for a in parse(res.output) if a in ARCHS] if res.ok else []
            if found:
                return Node(tuple(found), tool)
    return Node((), "none")
