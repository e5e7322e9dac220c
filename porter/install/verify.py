"""``porter verify`` and ``porter report``: prove an environment will not JIT and carries the node's code.

What is checked, per installed component (DeepSpeed, APEX, FlashAttention, Megatron fused kernels,
found through ``importlib.metadata`` in the target interpreter plus porter's install records):

- the record matches what is installed (same version; every extension file present, same sha256);
- every prebuilt module imports in a subprocess of the target python whose ``PATH`` starts with a
  folder of *trap* compilers (``c++``, ``g++``, ``hipcc``, ``nvcc``, ``ninja``, ...: each one logs its
  call and fails), ``CC``/``CXX`` pointing at traps, and a fresh empty ``TORCH_EXTENSIONS_DIR``; any
  trap call or any file appearing there is a JIT build and a problem. For DeepSpeed, each op marked
  prebuilt in ``installed_ops`` is also loaded through DeepSpeed's own op loader when it is present;
- every ``.so``'s embedded GPU code objects (:mod:`porter.codeobjects`) cover the node's arch, and
  agree with the archs the manifest claims;
- wavefront, torch version and kind, ROCm / CUDA version match what the wheel was built for.

A trapped compiler call is either a JIT build (ninja, an extension's sources, torch's extension defines: a
problem) or a *feature probe* (DeepSpeed's ``has_function`` compiling a lone ``test.c`` to ask whether a library
is there): that one is reported apart, as a note, not as a failure. It builds nothing, but a node without a
compiler answers it differently from the build host. A wheel ``porter ops build`` writes answers it from what it
recorded at build time (its copy of DeepSpeed's op builder carries deepspeed/no-jit), with no setting, so such a
note means an installation porter did not write (or an older porter's). The import check runs in the caller's
environment plus the traps, and sets nothing of porter's own (no ``PORTER_NO_JIT``): it checks what a node does by
default.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from porter.codeobjects import read_code_objects
from porter.errors import ConfigError, ToolError
from porter.probe import run_probe
from porter import components
from porter.install.env import InstalledDist, Node, TargetEnv
from porter.install.records import RecordFile, carried_manifest, read_records
from porter.install.wheelhouse import runtime_mismatches, same_version
from porter.artifacts.manifest import Manifest
from porter.artifacts.wheelfile import module_name
from porter.fs import owned_temp, sha256_file
from porter.run import Runner, make_env

TRAPPED = ("cc", "c++", "gcc", "g++", "clang", "clang++", "amdclang", "amdclang++", "hipcc", "hipcc.pl",
           "nvcc", "ninja", "ld", "x86_64-linux-gnu-g++", "x86_64-linux-gnu-gcc")
_TRAP = """#!/bin/sh
printf '%s\\n' "$(basename "$0") $*" >> "{log}"
echo "porter verify: compiler call refused: $(basename "$0")" >&2
exit 97
"""

# A feature probe compiles or links a lone test program (DeepSpeed's has_function: test.c -> test.o -> a.out);
# a JIT build runs ninja, compiles an extension's C++/CUDA/HIP sources or passes torch's extension defines.
_PROBE_FILE = re.compile(r"(^|/)(test\.c|test\.o|a\.out)$")
_BUILD_MARK = re.compile(r"TORCH_EXTENSION_NAME|torch_extensions|\.(cpp|cc|cxx|cu|hip)$")


def classify_call(line: str) -> str:
    """``probe`` or ``build`` for one trapped call (``PROGRAM ARGS...``, as the trap logs it)."""
    program, _, rest = line.partition(" ")
    args = rest.split()
    if program == "ninja" or any(_BUILD_MARK.search(a) for a in args):
        return "build"
    return "probe" if any(_PROBE_FILE.search(a) for a in args) else "build"


@dataclass(frozen=True)
class Problem:
    component: str
    file: str
    check: str
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.component}: {self.file}: {self.check}: expected {self.expected}, found {self.found}"


@dataclass
class ComponentReport:
    component: str
    project: str
    version: str | None
    record: str | None                  # path of the install record, if any
    kind: str | None = None             # rocm | cuda | cpu (from the manifest)
    label: str | None = None
    modules: list[dict[str, Any]] = field(default_factory=list)
    installed_ops: dict[str, bool] | None = None
    loader: dict[str, str | None] = field(default_factory=dict)   # DeepSpeed op -> None (loaded) or error
    loader_ops: list[str] = field(default_factory=list)           # ops to load through the project's loader
    import_env: dict[str, str] = field(default_factory=dict)      # what the import probe needs (component's)
    problems: list[Problem] = field(default_factory=list)
    feature_probes: list[str] = field(default_factory=list)        # trapped feature-probe calls (not builds)
    wave64_allowed: list[str] = field(default_factory=list)        # unproven findings built by --allow-wave32

    @property
    def notes(self) -> list[str]:
        out = []
        if self.wave64_allowed:
            out.append(f"{self.component}: built for 64-lane wavefronts with {len(self.wave64_allowed)} warp-size-32 "
                       f"finding(s) nothing proves safe (--allow-wave32): {'; '.join(self.wave64_allowed[:3])}"
                       + (" ..." if len(self.wave64_allowed) > 3 else "") + " (porter sbom WHEEL lists each)")
        if self.feature_probes:
            out.append(f"{self.component}: {len(self.feature_probes)} load-time feature probe call(s), not a JIT "
                       f"build: {'; '.join(self.feature_probes[:3])}. Nothing is built, but a node without a compiler "
                       "answers 'feature absent' where the build host may have said present: rebuild the wheel with "
                       "'porter ops build' (its copy of the op builder carries deepspeed/no-jit and answers from the "
                       "answers recorded at build time, by default); unset PORTER_FEATURE_PROBES=compile if it is set")
        return out

    @property
    def mode(self) -> str:
        return "prebuilt" if self.modules else "JIT (no prebuilt modules)"

    def problem(self, file: str, check: str, expected: str, found: str) -> None:
        self.problems.append(Problem(self.component, file, check, expected, found))

    def to_json(self) -> dict[str, Any]:
        """What ``porter report --json`` shows of it (``porter verify --json`` adds the import check's findings)."""
        shown = ("component", "project", "version", "record", "kind", "label", "mode", "installed_ops", "modules")
        return {k: getattr(self, k) for k in shown} | {"problems": [str(p) for p in self.problems]}


@dataclass
class VerifyReport:
    env: TargetEnv
    node: Node
    components: list[ComponentReport]

    @property
    def problems(self) -> list[Problem]:
        return [p for c in self.components for p in c.problems]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def notes(self) -> list[str]:
        return [n for c in self.components for n in c.notes]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "python": self.env.executable, "python_tag": self.env.python_tag,
            "torch": self.env.torch.to_dict() | {"path": self.env.torch.root} if self.env.torch else None,
            "node": {"archs": list(self.node.archs), "source": self.node.source},
            "components": [c.to_json() | {"loader": c.loader, "feature_probes": c.feature_probes,
                                          "problems": [asdict(p) for p in c.problems]} for c in self.components],
            "problems": [asdict(p) for p in self.problems], "notes": self.notes,
        }


def collect(env: TargetEnv, node: Node) -> list[ComponentReport]:
    """Static checks (records, files, sha256, code objects, versions): no subprocess."""
    records = read_records(env)
    projects = sorted(set(records) | {d for d in components.all_dists() if d in env.dists})
    out: list[ComponentReport] = []
    for project in projects:
        rf: RecordFile | None = records.get(project)
        dist = env.dists.get(project)
        manifest: Manifest | None = rf.record["manifest"] if rf and rf.record else None
        if manifest is None and dist is not None and dist.carried_manifest:
            manifest = carried_manifest(dist.carried_manifest)  # a corrupt copy counts as none
        known = components.for_dist(project)
        comp = str(manifest.get("component") or project) if manifest is not None else known.name if known else project
        rep = ComponentReport(comp, project, dist.version if dist else None, str(rf.path) if rf else None)
        out.append(rep)
        if rf is not None and rf.error:
            rep.problem(str(rf.path), "install record", "a readable porter record", rf.error)
        if dist is None:
            want = rf.record["version"] if rf and rf.record else "?"
            rep.problem(str(rf.path) if rf else project, "installed", f"{project} {want} installed (porter record)",
                        "not installed")
            continue
        if manifest is None:
            if dist.shared_objects or known is not None:
                rep.problem(dist.location, "porter manifest", "an install record written by 'porter install'",
                            "none: installed some other way, so its build target cannot be checked")
        else:
            rep.kind = str((manifest.get("target") or {}).get("kind", "cpu"))
            rep.wave64_allowed = [f"{f.get('op')}: {f.get('file')}:{f.get('line')} {f.get('rule')}" for f in
                                  (manifest.get("wave64") or {}).get("findings", []) if f.get("state") == "allowed"]
            rep.label = manifest["version"].partition("+")[2] or None
            if not same_version(manifest["version"], dist.version):
                rep.problem(str(rf.path) if rf else dist.location, "version", manifest["version"], dist.version)
            for why in runtime_mismatches(manifest, env, node):
                check, _, detail = why.partition(": ")
                rep.problem((manifest.get("wheel") or {}).get("filename", project), check, "a match", detail)
        _add_modules_from_dist(rep, dist, node, manifest)
        if known is not None:  # what the component adds (DeepSpeed: installed_ops agrees with what ships)
            extra = known.check_installed(dist, manifest, rep.kind or "cpu")
            for where, check, expected, found in extra.problems:
                rep.problem(where, check, expected, found)
            rep.loader_ops = extra.loader_ops
            rep.import_env = extra.import_env
            ops = extra.facts.get("installed_ops")
            rep.installed_ops = ops if isinstance(ops, dict) else None
    return out


def _add_modules_from_dist(rep: ComponentReport, dist: InstalledDist, node: Node, manifest: Manifest | None) -> None:
    located = dict(dist.shared_objects)
    entries: list[dict[str, Any]] = ([dict(e) for e in manifest.get("extensions") or []] if manifest is not None
                                     else [{"module": module_name(rel), "path": rel} for rel in located])
    gpu = rep.kind in ("rocm", "cuda") or manifest is None
    for e in entries:
        rel = str(e["path"])
        abs_path = located.get(rel) or str(Path(dist.location) / rel)
        mod: dict[str, Any] = {"module": e.get("module") or module_name(rel), "path": abs_path,
                               "op": e.get("op"), "archs": None}
        rep.modules.append(mod)
        if not Path(abs_path).is_file():
            rep.problem(abs_path, "file", "installed (listed in the manifest)", "missing")
            continue
        if "sha256" in e:
            if (found := sha256_file(abs_path)) != e["sha256"]:
                rep.problem(abs_path, "sha256", str(e["sha256"]), found)
        try:
            objs = read_code_objects(abs_path)
        except (ConfigError, OSError, IndexError, ValueError, struct.error) as exc:
            rep.problem(abs_path, "code objects", "a readable ELF .so", str(exc))
            continue
        archs = sorted({o.arch for o in objs if o.kind != "ptx"})
        mod["archs"] = archs
        mod["code_objects"] = sorted({o.target for o in objs})
        # an emulated build's arch names the wavefront it emulates (wave64): its modules carry no GPU code objects
        claimed = [] if rep.kind == "emulated" else sorted({str(a).split(":")[0] for a in e.get("archs") or []})
        if rep.kind == "emulated" and objs:
            rep.problem(abs_path, "emulated module", "no GPU code objects", ",".join(archs))
        if claimed and claimed != archs:
            rep.problem(abs_path, "archs in file vs manifest", ",".join(claimed), ",".join(archs) or "none")
        if e.get("host_only"):
            mod["host_only"] = True
            if objs:
                rep.problem(abs_path, "host-only module", "no GPU code objects", ",".join(archs))
            continue
        if not gpu or (manifest is None and not objs):
            continue
        if not node.archs:
            if rep.kind in ("rocm", "cuda") or objs:
                rep.problem(abs_path, "GPU arch", "a node arch (a visible GPU, or --arch)",
                            f"none; the file has code for {','.join(archs) or 'none'}")
            continue
        if missing := [a for a in node.archs if a not in archs]:
            rep.problem(abs_path, "GPU code objects", f"code for {','.join(node.archs)}",
                        f"code for {','.join(archs) or 'no GPU arch'}")


def trap_compilers(root: Path) -> tuple[Path, Path]:
    """A folder ``root/bin`` of trap compilers (:data:`TRAPPED`: each logs its call and fails) and the log they
    append to, ``root/compiler-calls.log`` (one ``PROGRAM ARGS...`` line per call)."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    log = root / "compiler-calls.log"
    log.touch()
    for name in TRAPPED:
        p = bin_dir / name
        p.write_text(_TRAP.format(log=log))
        p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir, log


def trapped_env(bin_dir: Path, ext_dir: Path) -> dict[str, str | None]:
    """What the import check changes in the caller's environment: the traps first on PATH and as CC/CXX, a fresh
    TORCH_EXTENSIONS_DIR. Nothing of porter's own (no PORTER_NO_JIT): what a node does by default is what counts,
    and a caller's own setting passes through."""
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "TORCH_EXTENSIONS_DIR": str(ext_dir), "CC": str(bin_dir / "cc"), "CXX": str(bin_dir / "c++"),
            "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "MAX_JOBS": "1"}


def import_check(env: TargetEnv, reps: Iterable[ComponentReport], runner: Runner) -> None:
    """Import every prebuilt module with compilers trapped and a fresh TORCH_EXTENSIONS_DIR."""
    for rep in reps:
        modules = [m["module"] for m in rep.modules if Path(m["path"]).is_file()]
        ds_ops = rep.loader_ops  # ops the project's own loader must load (DeepSpeed's OpBuilder)
        if not modules and not ds_ops:
            continue
        with owned_temp(None, "porter-verify-") as work:
            bin_dir, log = trap_compilers(work)
            ext_dir = work / "torch_extensions"
            ext_dir.mkdir()
            update = {**trapped_env(bin_dir, ext_dir), **rep.import_env}
            try:
                data = run_probe("imports", [json.dumps(modules), json.dumps(ds_ops)], python=env.executable,
                                 runner=runner, env=make_env(update), cwd=str(work), timeout=600,
                                 what="to import the prebuilt modules")
            except ToolError as exc:
                rep.problem(env.executable, "import (subprocess)", "a result document",
                            f"{exc.message}: {exc.hint or ''}"[-800:])
            else:
                for mod, err in data["modules"].items():
                    entry = next(m for m in rep.modules if m["module"] == mod)
                    entry["import"] = "ok" if err is None else err
                    if err is not None:
                        rep.problem(entry["path"], f"import {mod}", "imports with no compiler", err)
                for op, err in data["loader"].items():
                    if err is not None and not err.startswith("skipped:"):
                        rep.problem(f"deepspeed op {op}", "DeepSpeed op loader", "the prebuilt module loads", err)
                rep.loader = data["loader"]
            calls = [c for c in log.read_text().splitlines() if c.strip()]
            rep.feature_probes = [c for c in calls if classify_call(c) == "probe"]
            if builds := [c for c in calls if classify_call(c) == "build"]:
                rep.problem(env.executable, "compiler calls", "0", f"{len(builds)}: " + "; ".join(builds[:5]))
            if built := sorted(str(p.relative_to(ext_dir)) for p in ext_dir.rglob("*")):
                rep.problem(str(ext_dir), "TORCH_EXTENSIONS_DIR", "empty (no JIT build)", ", ".join(built[:8]))


def verify(env: TargetEnv, node: Node, runner: Runner, *, imports: bool = True) -> VerifyReport:
    reps = collect(env, node)
    if imports:
        import_check(env, reps, runner)
    return VerifyReport(env, node, reps)


def compilers_on_path() -> dict[str, str | None]:
    path = os.environ.get("PATH", "")
    return {n: shutil.which(n, path=path) for n in ("hipcc", "nvcc", "g++", "c++", "ninja", "rocminfo")}
