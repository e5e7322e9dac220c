"""The matrix file: toolchains x components x versions -> cells, each one porter build command.

```toml
name = "site-wheels"                 # job names; default: the file's stem
dir = "/shared/porter/site-wheels"   # the matrix folder on the shared filesystem (--dir wins)
toolchains = ["frontier", "mi300x"]  # preset names or profile files, for every [[component]] below

[[component]]
name = "deepspeed"
versions = ["0.19.7", "0.19.8"]      # -> --source deepspeed==0.19.8
ops = ["cpu_adam", "fused_adam"]

[[component]]
name = "apex"
sources = ["src/apex"]               # trees or sdists, relative to this file
toolchains = ["mi300x"]              # this entry only

[slurm]
partition = "batch"
time = "2:00:00"
cpus_per_task = 16
```

Every problem of the whole matrix (an unknown toolchain or component, a missing source, two cells that
would write the same wheel) is found and reported at once, naming the cells, before anything is
written or submitted.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from porter.artifacts import labels
from porter.cluster.slurm.sbatch import SlurmSettings
from porter.errors import ConfigError, shown
from porter.fs import exists, read_user_text
from porter.toolchain.profile import Toolchain, load_toolchain
from porter.userdata import check_keys, parse_toml

TOP_KEYS = ("name", "dir", "wheelhouse", "toolchains", "python", "jobs", "component", "slurm")
ENTRY_KEYS = ("name", "versions", "sources", "toolchains", "ops", "args", "tag")
# options of the build command that each cell sets itself
OWNED_OPTIONS = ("--source", "-t", "--toolchain", "-o", "--wheelhouse", "--json", "--dry-run", "--python",
                 "-j", "--jobs", "--arch", "--cpu-isa", "-q", "--quiet")
_SDIST = re.compile(r"(\.tar\.gz|\.tgz|\.zip|\.tar\.bz2)$")


@dataclass(frozen=True)
class Recipe:
    """How a matrix cell builds one component: the porter command (the component's own
    ``build_command``), whether a version can be fetched as ``NAME==VERSION``, whether ``--ops`` applies."""

    fetch: bool
    ops: bool


# Components built by `porter ops build` / `porter wheel NAME`. megatron-deepspeed is a port of a training
# tree (porter port), not a wheel of a release, so it is not a matrix component.
RECIPES: Mapping[str, Recipe] = {
    "deepspeed": Recipe(fetch=True, ops=True),
    "apex": Recipe(fetch=False, ops=True),
    "flash-attn": Recipe(fetch=True, ops=False),
}


@dataclass(frozen=True)
class Cell:
    """One build: a component from one source with one toolchain."""

    index: int
    id: str
    component: str
    source: str
    """An absolute path (tree or sdist) or ``NAME==VERSION``."""
    toolchain: str
    """As the cell passes it: a preset name or an absolute profile path."""
    toolchain_name: str
    label: str
    """The toolchain's local version label: the wheel's ``+label``."""
    args: tuple[str, ...]
    """porter's arguments (after ``python -m porter``), except ``-o``, which the cell adds."""

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "id": self.id, "component": self.component, "source": self.source,
                "toolchain": self.toolchain, "toolchain_name": self.toolchain_name, "label": self.label,
                "args": list(self.args)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cell:
        return cls(index=int(d["index"]), id=str(d["id"]), component=str(d["component"]), source=str(d["source"]),
                   toolchain=str(d["toolchain"]), toolchain_name=str(d["toolchain_name"]), label=str(d["label"]),
                   args=tuple(str(a) for a in d["args"]))


@dataclass(frozen=True)
class Matrix:
    name: str
    file: Path
    dir: Path
    wheelhouse: Path
    python: str
    """The interpreter that runs porter in every job: porter's own (it must be on the shared filesystem)."""
    cells: tuple[Cell, ...]
    slurm: SlurmSettings


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "x"




def _strings(value: Any, where: str, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {key!r} must be a list of non-empty strings, not {shown(value)}",
                          hint=f"e.g. {key} = [\"...\", \"...\"]")
    nul = next((v for v in value if "\0" in v), None)
    if nul is not None:
        raise ConfigError(f"{where}: {key!r} holds {nul!r}, with a NUL byte",
                          hint="no path, name, version or argument can contain NUL; remove it")
    return list(value)


def _is_file_ref(ref: str) -> bool:
    return ref.endswith(".toml") or "/" in ref


def _source_stem(source: str) -> str:
    if "==" in source:
        return source.split("==", 1)[1]
    return _SDIST.sub("", Path(source).name)


def load_matrix(path: str | os.PathLike[str], *, directory: str | os.PathLike[str] | None = None,
                wheelhouse: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
                python: str | None = None) -> Matrix:
    """Read and validate a matrix file. ``directory`` and ``wheelhouse`` (the command line) win over the
    file's ``dir`` and ``wheelhouse``; relative paths in the file are relative to the file."""
    where = str(path)
    if "\0" in where:
        raise ConfigError(f"matrix file {where!r}: a path cannot hold a NUL byte", hint="pass the matrix file's path")
    file = Path(path).resolve()
    text = read_user_text(file, f"matrix file {where}", kind="a matrix TOML file",
                          unreadable_hint="pass the path of a readable matrix TOML file")
    data = parse_toml(text, where)
    check_keys(data, TOP_KEYS, where)
    base = file.parent

    def here(p: str) -> Path:
        if "\0" in p:  # expanduser and resolve raise ValueError on it
            raise ConfigError(f"{where}: path {p!r} holds a NUL byte", hint="no path can contain NUL; remove it")
        return (base / os.path.expanduser(p)).resolve()

    name = data.get("name", file.stem)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: 'name' must be a non-empty string")
    if directory is not None:
        folder = Path(directory).resolve()
    elif isinstance(data.get("dir"), str):
        folder = here(data["dir"])
    else:
        raise ConfigError(f"{where}: no matrix folder", hint="pass --dir with a folder on the shared filesystem, "
                                                              "or set dir = \"...\" in the matrix file")
    if wheelhouse is not None:
        house = Path(wheelhouse).resolve()
    elif isinstance(data.get("wheelhouse"), str):
        house = here(data["wheelhouse"])
    else:
        house = folder / "wheelhouse"
    default_tcs = _strings(data.get("toolchains"), where, "toolchains")
    build_python = data.get("python")
    if build_python is not None and (not isinstance(build_python, str) or "\0" in build_python):
        raise ConfigError(f"{where}: 'python' must be a string (the build python, as --python takes it)",
                          hint="e.g. python = \"/opt/venv/bin/python\"")
    jobs = data.get("jobs")
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or not 1 <= jobs < 2 ** 63):
        raise ConfigError(f"{where}: 'jobs' must be a whole number >= 1, not {shown(jobs)}",
                          hint="the parallel compile jobs of each cell (--jobs), e.g. jobs = 16")
    slurm_table = data.get("slurm", {})
    if not isinstance(slurm_table, dict):
        raise ConfigError(f"{where}: [slurm] must be a table")
    slurm = SlurmSettings.from_table(slurm_table, where)
    entries = data.get("component")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ConfigError(f"{where}: no [[component]] entries",
                          hint="add at least one [[component]] table with a name and versions or sources")

    # 1. the cells, named from the file alone, so every later problem can name the cells it concerns
    planned: list[dict[str, Any]] = []
    problems: list[str] = []
    for n, entry in enumerate(entries, start=1):
        ewhere = f"{where}: [[component]] #{n}"
        check_keys(entry, ENTRY_KEYS, ewhere)
        comp = entry.get("name")
        if not isinstance(comp, str) or not comp:
            raise ConfigError(f"{ewhere}: 'name' (the component) is required")
        tag = entry.get("tag")
        if tag is not None and not isinstance(tag, str):
            raise ConfigError(f"{ewhere}: 'tag' must be a string")
        versions = _strings(entry.get("versions"), ewhere, "versions")
        sources = _strings(entry.get("sources"), ewhere, "sources")
        tcs = _strings(entry.get("toolchains"), ewhere, "toolchains") if "toolchains" in entry else default_tcs
        if not versions and not sources:
            raise ConfigError(f"{ewhere} ({comp}): no 'versions' and no 'sources'",
                              hint="list the releases to build (versions) or trees/sdists (sources)")
        if not tcs:
            raise ConfigError(f"{ewhere} ({comp}): no toolchains",
                              hint="set toolchains = [...] at the top of the file or in this entry")
        ops = _strings(entry.get("ops"), ewhere, "ops")
        args = _strings(entry.get("args"), ewhere, "args")
        owned = [a for a in args if a.split("=", 1)[0] in OWNED_OPTIONS]
        if owned:
            raise ConfigError(f"{ewhere} ({comp}): 'args' may not set {', '.join(owned)}",
                              hint="each cell sets its source, toolchain, output and python itself")
        for v in versions:
            try:
                Version(v)
            except ValueError as exc:  # InvalidVersion, or a release number past Python's int-from-string limit
                why = "" if isinstance(exc, InvalidVersion) else " (a number in it is too long)"
                problems.append(f"{ewhere} ({comp}): {v!r} is not a version{why}")
        items: list[tuple[str, str, str | None]] = [(v, f"{comp}=={v}", None) for v in versions]
        for s in sources:
            p = s if "==" in s else str(here(s))
            items.append((_source_stem(p), p, s))
        for stem, source, given in items:
            for ref in tcs:
                tc_ref = str(here(ref)) if _is_file_ref(ref) else ref
                tc_name = Path(ref).stem if _is_file_ref(ref) else ref
                cell_id = _safe("-".join(x for x in (comp, tag, stem, tc_name) if x))
                planned.append({"id": cell_id, "component": comp, "source": source, "given": given,
                                "toolchain": tc_ref, "ref": ref, "toolchain_name": tc_name,
                                "ops": ops, "args": args, "where": ewhere})

    # 2. validate the whole matrix; report every problem at once, naming the cells
    seen: dict[str, str] = {}
    for c in planned:
        if c["id"] in seen:
            problems.append(f"cell {c['id']}: defined twice ({seen[c['id']]} and {c['where']})"
                            " -- merge the entries or give one a 'tag'")
        seen.setdefault(c["id"], c["where"])
    toolchains: dict[str, Toolchain] = {}
    for ref in dict.fromkeys(c["toolchain"] for c in planned):
        users = [c["id"] for c in planned if c["toolchain"] == ref]
        try:
            toolchains[ref] = load_toolchain(ref, environ=environ)
        except ConfigError as exc:
            problems.append(f"cell {', '.join(users)}: toolchain {ref!r}: {exc.message}")
    from porter.components import get as get_component

    for comp in dict.fromkeys(c["component"] for c in planned):
        users = [c["id"] for c in planned if c["component"] == comp]
        try:
            component = get_component(comp)
        except ConfigError as exc:
            problems.append(f"cell {', '.join(users)}: {exc.message}")
            continue
        recipe = RECIPES.get(comp)
        if recipe is None:
            problems.append(f"cell {', '.join(users)}: {comp} is built by '{component.build_command}', "
                            f"which is not a matrix build (matrix components: {', '.join(RECIPES)})")
            continue
        for c in planned:
            if c["component"] != comp:
                continue
            if "==" in c["source"] and not recipe.fetch:
                problems.append(f"cell {c['id']}: {comp} cannot be fetched as {c['source']}: "
                                "give its tree or sdist in 'sources'")
            if c["ops"] and not recipe.ops:
                problems.append(f"cell {c['id']}: {component.build_command} takes no --ops")
            c["command"] = component.build_command.split()[1:]
    for c in planned:
        if c["given"] is not None and not exists(Path(c["source"])):
            problems.append(f"cell {c['id']}: source {c['given']!r} not found ({c['source']})")
    wheels: dict[tuple[str, str, str], str] = {}
    for c in planned:
        tc = toolchains.get(c["toolchain"])
        if tc is None:
            continue
        c["label"] = labels.make(tc)
        key = (c["component"], c["source"], labels.make(tc))
        if key in wheels and wheels[key] != c["id"]:
            problems.append(f"cells {wheels[key]} and {c['id']}: both would write the same wheel "
                            f"({c['component']} from {c['source']} labelled +{labels.make(tc)})")
        wheels.setdefault(key, c["id"])
    if problems:
        raise ConfigError(f"{where}: {len(problems)} problem(s) in the matrix; nothing was submitted:\n  "
                          + "\n  ".join(problems),
                          hint="fix the matrix file; porter toolchain list shows the presets")

    cells: list[Cell] = []
    for index, c in enumerate(planned):
        argv = [*c["command"], "--source", c["source"], "--toolchain", c["toolchain"]]
        if c["ops"]:
            argv += ["--ops", ",".join(c["ops"])]
        if build_python:
            argv += ["--python", build_python]
        if jobs:
            argv += ["--jobs", str(jobs)]
        argv += c["args"]
        cells.append(Cell(index=index, id=c["id"], component=c["component"], source=c["source"],
                          toolchain=c["toolchain"], toolchain_name=c["toolchain_name"], label=c["label"],
                          args=tuple(argv)))
    return Matrix(name=_safe(name), file=file, dir=folder, wheelhouse=house, python=python or sys.executable,
                  cells=tuple(cells), slurm=slurm)
