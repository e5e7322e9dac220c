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

import dataclasses
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from porter import __version__
from porter.artifacts import labels
from porter.cluster.request import BuildRequest, jsonable
from porter.cluster.slurm.sbatch import JobFolder, SlurmSettings
from porter.errors import ConfigError, shown
from porter.fs import exists, read_user_text
from porter.toolchain.profile import Toolchain, load_toolchain
from porter.userdata import check_keys, parse_toml, whole_number

TOP_KEYS = ("name", "dir", "wheelhouse", "toolchains", "python", "jobs", "component", "slurm")
ENTRY_KEYS = ("name", "versions", "sources", "toolchains", "ops", "args", "tag")
# options of the build command that each cell sets itself
OWNED_OPTIONS = ("--source", "-t", "--toolchain", "-o", "--wheelhouse", "--json", "--dry-run", "--python",
                 "-j", "--jobs", "--arch", "--cpu-isa", "-q", "--quiet")
_SDIST = re.compile(r"(\.tar\.gz|\.tgz|\.zip|\.tar\.bz2)$")
PLAN_SCHEMA = "porter.matrix/2"
REQUEST = "request.json"


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
    ops: tuple[str, ...] = ()
    python: str | None = None
    jobs: int | None = None
    args: tuple[str, ...] = ()
    """More options of the build, as the matrix file gives them."""

    def request(self) -> BuildRequest:
        """The build this cell runs (``porter build --request``), its output left to the run."""
        options: dict[str, Any] = {"source": self.source, "toolchain_ref": self.toolchain}
        options.update({k: v for k, v in (("ops", list(self.ops)), ("python", self.python), ("jobs", self.jobs)) if v})
        return BuildRequest(self.component, options, self.args)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cell:
        return cls(**{**d, "ops": tuple(d.get("ops", ())), "args": tuple(d["args"])})


@dataclass(frozen=True)
class Matrix:
    """A matrix and its folder: all a job needs, written into ``matrix.json`` and read back from it."""

    name: str
    dir: Path
    wheelhouse: Path
    python: str
    """The interpreter that runs porter in every job: porter's own (it must be on the shared filesystem)."""
    cells: tuple[Cell, ...]
    file: str = ""
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    """The file's [slurm] table (the submission's business: ``matrix.json`` leaves it out)."""

    @property
    def folder(self) -> JobFolder:
        return JobFolder(self.dir, "cell", "index")

    def cell_dir(self, cell: Cell) -> Path:
        return self.dir / "cells" / cell.id

    def argv(self, cell: Cell) -> list[str]:
        """What the cell's job runs: its request, the wheel into the cell's own out/ (shipped from there)."""
        return [self.python, "-m", "porter", "build", "--request", str(self.cell_dir(cell) / REQUEST),
                "-o", str(self.cell_dir(cell) / "out")]

    def job_log(self, cell: Cell) -> Path:
        """Where the cell's job writes its own output (``--output=logs/cell-%a.log``)."""
        return self.folder.task_log(cell.index)

    def to_dict(self) -> dict[str, Any]:
        doc = jsonable(dataclasses.asdict(self))
        del doc["slurm"]
        return {"schema": PLAN_SCHEMA, "porter_version": __version__, **doc}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text).strip("-") or "x"


def _strings(value: Any, where: str, key: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: {key!r} must be a list of non-empty strings, not {shown(value)}",
                          hint=f"e.g. {key} = [\"...\", \"...\"]")
    if (nul := next((v for v in value if "\0" in v), None)) is not None:
        raise ConfigError(f"{where}: {key!r} holds {nul!r}, with a NUL byte",
                          hint="no path, name, version or argument can contain NUL; remove it")
    return list(value)


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

    def here(p: str) -> Path:
        if "\0" in p:  # expanduser and resolve raise ValueError on it
            raise ConfigError(f"{where}: path {p!r} holds a NUL byte", hint="no path can contain NUL; remove it")
        return (file.parent / os.path.expanduser(p)).resolve()

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
    house = Path(wheelhouse).resolve() if wheelhouse is not None else \
        here(data["wheelhouse"]) if isinstance(data.get("wheelhouse"), str) else folder / "wheelhouse"
    default_tcs = _strings(data.get("toolchains"), where, "toolchains")
    build_python = data.get("python")
    if build_python is not None and (not isinstance(build_python, str) or "\0" in build_python):
        raise ConfigError(f"{where}: 'python' must be a string (the build python, as --python takes it)",
                          hint="e.g. python = \"/opt/venv/bin/python\"")
    jobs = data.get("jobs")
    if jobs is not None and not whole_number(jobs, 1):
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
    problems: list[str] = []
    # 1. the cells, named from the file alone, so every later problem can name the cells it concerns
    planned = [c for n, entry in enumerate(entries, start=1)
               for c in _entry_cells(entry, f"{where}: [[component]] #{n}", default_tcs, here, problems)]
    # 2. validate the whole matrix; report every problem at once, naming the cells
    _check_cells(planned, environ, problems)
    if problems:
        raise ConfigError(f"{where}: {len(problems)} problem(s) in the matrix; nothing was submitted:\n  "
                          + "\n  ".join(problems),
                          hint="fix the matrix file; porter toolchain list shows the presets")
    cells = tuple(Cell(index=index, ops=tuple(c["ops"]), python=build_python, jobs=jobs, args=tuple(c["args"]),
                       **{k: c[k] for k in ("id", "component", "source", "toolchain", "toolchain_name", "label")})
                  for index, c in enumerate(planned))
    return Matrix(name=_safe(name), dir=folder, wheelhouse=house, python=python or sys.executable, cells=cells,
                  file=str(file), slurm=slurm)


def _entry_cells(entry: dict[str, Any], ewhere: str, default_tcs: list[str], here: Callable[[str], Path],
                 problems: list[str]) -> list[dict[str, Any]]:
    """One [[component]] entry's cells: each version or source with each toolchain. A malformed entry is a
    ConfigError; a version that is not one is a problem (reported with the others)."""
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
    if owned := [a for a in args if a.split("=", 1)[0] in OWNED_OPTIONS]:
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
        items.append((p.split("==", 1)[1] if "==" in p else _SDIST.sub("", Path(p).name), p, s))
    cells = []
    for stem, source, given in items:
        for ref in tcs:
            is_file = ref.endswith(".toml") or "/" in ref  # a profile file; else a preset's name
            tc_name = Path(ref).stem if is_file else ref
            cells.append({"id": _safe("-".join(x for x in (comp, tag, stem, tc_name) if x)), "component": comp,
                          "source": source, "given": given, "toolchain": str(here(ref)) if is_file else ref,
                          "toolchain_name": tc_name, "ops": ops, "args": args, "where": ewhere})
    return cells


def _check_cells(planned: list[dict[str, Any]], environ: Mapping[str, str] | None, problems: list[str]) -> None:
    """Every problem of the matrix as a whole, naming its cells: a cell twice, a toolchain or component that does
    not load or cannot be built so, a source that is not there, two cells writing one wheel. Each cell gets its
    command and label."""
    seen: dict[str, str] = {}
    for c in planned:
        if c["id"] in seen:
            problems.append(f"cell {c['id']}: defined twice ({seen[c['id']]} and {c['where']})"
                            " -- merge the entries or give one a 'tag'")
        seen.setdefault(c["id"], c["where"])
    toolchains: dict[str, Toolchain] = {}
    for ref in dict.fromkeys(c["toolchain"] for c in planned):
        try:
            toolchains[ref] = load_toolchain(ref, environ=environ)
        except ConfigError as exc:
            users = [c["id"] for c in planned if c["toolchain"] == ref]
            problems.append(f"cell {', '.join(users)}: toolchain {ref!r}: {exc.message}")
    _check_components(planned, problems)
    for c in planned:
        if c["given"] is not None and not exists(Path(c["source"])):
            problems.append(f"cell {c['id']}: source {c['given']!r} not found ({c['source']})")
    wheels: dict[tuple[str, str, str], str] = {}
    for c in planned:
        if (tc := toolchains.get(c["toolchain"])) is None:
            continue
        c["label"] = labels.make(tc)
        first = wheels.setdefault((c["component"], c["source"], c["label"]), c["id"])
        if first != c["id"]:
            problems.append(f"cells {first} and {c['id']}: both would write the same wheel "
                            f"({c['component']} from {c['source']} labelled +{c['label']})")


def _check_components(planned: list[dict[str, Any]], problems: list[str]) -> None:
    """Each cell's component: one porter knows, that a matrix can build (``MatrixBuild``: its build command makes
    a wheel of a release), from what it can fetch, with --ops only where its command takes them."""
    from porter.components import get as get_component, registry
    from porter.components.base import MatrixBuild

    buildable = [n for n, c in registry().items() if isinstance(c, MatrixBuild)]
    for comp in dict.fromkeys(c["component"] for c in planned):
        users = [c["id"] for c in planned if c["component"] == comp]
        try:
            component = get_component(comp)
        except ConfigError as exc:
            problems.append(f"cell {', '.join(users)}: {exc.message}")
            continue
        if not isinstance(component, MatrixBuild):
            problems.append(f"cell {', '.join(users)}: {comp} is not built into a wheel by a matrix "
                            f"(matrix components: {', '.join(buildable)})")
            continue
        for c in (c for c in planned if c["component"] == comp):
            if "==" in c["source"] and not component.fetches:
                problems.append(f"cell {c['id']}: {comp} cannot be fetched as {c['source']}: "
                                "give its tree or sdist in 'sources'")
            if c["ops"] and not component.takes_ops:
                problems.append(f"cell {c['id']}: {comp} takes no ops")
