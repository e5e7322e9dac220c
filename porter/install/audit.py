"""``porter audit``: every place a training stack would compile at start-up, and what covers it.

A training tree (Megatron-DeepSpeed, a fork, a DeepSpeed tree) and the target python it runs with are read,
never run: the tree's Python files are parsed (``ast``), and the target's installed DeepSpeed, APEX and
FlashAttention are found through its own interpreter (one probe, :func:`porter.install.env.inspect_env`) and
then read from disk. A *site* is one place that compiles when it runs:

========== =============================================================================================
torch-jit  ``torch.utils.cpp_extension.load`` / ``load_inline`` (Megatron's fused kernels)
make       a ``make`` subprocess (Megatron's ``compile_helper()`` building ``megatron/data/helpers.cpp``)
deepspeed  ``XBuilder().load()``, ``create_op_builder("X")``, or a DeepSpeed optimizer class that loads its
           op (``DeepSpeedCPUAdam`` -> ``cpu_adam``), for an op the target's DeepSpeed does not mark prebuilt
apex       an APEX op builder's ``load()`` at import (ROCm apex is JIT by default) without its module shipped
triton     a ``@triton.jit`` / ``@triton.autotune`` kernel (compiled at its first call), or a FlashAttention
           install with no compiled extension (its Triton backend)
probe      DeepSpeed's ``has_function`` feature probe (compiles a test program to ask for a library)
========== =============================================================================================

Each site gets a status: ``covered`` (a prebuilt module is installed and nothing compiles), ``guarded``
(porter's patch makes it import a prebuilt module, which is not installed in this python: start-up stops with
an error naming the porter command, nothing compiles), ``compiles`` (it would compile on a compute node), or
``probe`` (a feature probe: it builds nothing, but answers "absent" on a node without a compiler). What a
site costs where a compiler exists, and what happens where none does, is said per kind. The audit fails
(exit 1) when any site compiles.

In the target's installed DeepSpeed and APEX, a site is module-level code of a module the tree imports (and the
packages on its way; what those import in turn is not followed), besides DeepSpeed's feature probes: which of
DeepSpeed's ops a training loads is read from the training tree itself.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from porter.components.deepspeed import OPTIMIZER_OPS, VERSION_INFO, read_installed_ops
from porter.components.megatron import JIT_GUARDS
from porter.artifacts.wheelfile import module_name
from porter.install.env import InstalledDist, TargetEnv

Status = Literal["covered", "guarded", "compiles", "probe"]
SKIP_DIRS = frozenset({".git", ".porter", "__pycache__", "build", "dist", "node_modules", "tests", "test",
                       ".venv", "venv"})


@dataclass(frozen=True)
class Kind:
    cost: str
    """What the site costs when it runs where a compiler exists."""
    no_compiler: str
    """What happens when it runs on a node with no compiler."""
    fails: bool
    """Whether that is a failure (else only a cost or another answer)."""


KINDS: Mapping[str, Kind] = {
    "torch-jit": Kind("ninja and the host/device compilers build the extension on the first rank of each fresh "
                      "node (minutes for CUDA/HIP kernels) while the other ranks wait",
                      "fails: no ninja, no compiler", True),
    "make": Kind("make, g++ and pybind11 build the module at every start (about 20 s)",
                 "fails: no make, no g++, no pybind11", True),
    "deepspeed": Kind("DeepSpeed JIT-builds the op with ninja into TORCH_EXTENSIONS_DIR on first use (cpu_adam: "
                      "about a minute), on every node",
                      "fails: no ninja, no compiler (with porter's deepspeed/no-jit and PORTER_NO_JIT=1: a clear "
                      "error naming 'porter ops build')", True),
    "apex": Kind("APEX's op builder JIT-builds the op when apex is imported (minutes for CUDA/HIP kernels)",
                 "fails: no compiler", True),
    "triton": Kind("Triton compiles the kernel at its first call, again for each new shape or dtype (seconds each, "
                   "per rank; cached in TRITON_CACHE_DIR)",
                   "fails while the cache is empty: Triton builds its launcher with the system C compiler", True),
    "probe": Kind("a test program compiled and linked with cc (under a second)",
                  "does not fail: answers 'absent', which may differ from what the build host found", False),
}


@dataclass(frozen=True)
class Site:
    kind: str
    file: str
    line: int
    what: str
    origin: str
    """``tree``, or the installed distribution (``deepspeed 0.19.8``)."""
    when: str
    """``import`` (module-level code) or ``call`` (when that code runs)."""
    status: Status
    detail: str
    module: str = ""
    """The prebuilt module that covers (or would cover) it."""

    def to_dict(self) -> dict[str, Any]:
        k = KINDS[self.kind]
        return {"kind": self.kind, "file": self.file, "line": self.line, "what": self.what, "origin": self.origin,
                "when": self.when, "status": self.status, "detail": self.detail, "module": self.module or None,
                "cost": k.cost, "without_compiler": k.no_compiler, "fails_without_compiler": k.fails}


@dataclass
class AuditReport:
    tree: Path
    python: str
    sites: list[Site] = field(default_factory=list)
    installed: dict[str, str] = field(default_factory=dict)
    """Distributions of the target that the audit read (name -> version)."""

    @property
    def compiles(self) -> list[Site]:
        return [s for s in self.sites if s.status == "compiles"]

    @property
    def ok(self) -> bool:
        return not self.compiles

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in ("compiles", "guarded", "probe", "covered")}
        for site in self.sites:
            out[site.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "porter.audit/1", "tree": str(self.tree), "python": self.python, "ok": self.ok,
                "installed": self.installed, "counts": self.counts(),
                "fail_without_compiler": sum(1 for s in self.compiles if KINDS[s.kind].fails),
                "sites": [s.to_dict() for s in self.sites]}


# --------------------------------------------------------------------------------------------
# finding sites in Python source

@dataclass(frozen=True)
class Raw:
    kind: str
    line: int
    what: str
    when: str
    key: str = ""
    """torch-jit: the extension name; deepspeed/apex: the builder class; probe: 'function:libs'."""


_SUBPROCESS = {"run", "call", "check_call", "check_output", "Popen", "system"}
_LOADS = {"load", "jit_load"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    if isinstance(node, ast.Call):
        return _dotted(node.func) + "()"
    return ""


def _literal(node: ast.AST | None) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.sites: list[Raw] = []
        self.depth = 0
        self.cpp_modules: set[str] = set()      # names bound to torch.utils.cpp_extension
        self.cpp_funcs: set[str] = set()        # load / load_inline imported by name
        self.triton_names: set[str] = set()     # triton module aliases
        self.triton_decorators: set[str] = set()  # jit / autotune imported from triton
        self.imports: set[str] = set()          # absolute modules this file imports (and from-imported names)

    @property
    def when(self) -> str:
        return "import" if self.depth == 0 else "call"

    def _add(self, kind: str, node: ast.AST, what: str, key: str = "") -> None:
        self.sites.append(Raw(kind, getattr(node, "lineno", 0), what, self.when, key))

    # imports ---------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.imports.add(a.name)
            if a.name == "torch.utils.cpp_extension":
                self.cpp_modules.add(a.asname or a.name)
            if a.name == "triton" or a.name.startswith("triton."):
                self.triton_names.add(a.asname or a.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level == 0 and mod:
            self.imports.add(mod)
            self.imports.update(f"{mod}.{a.name}" for a in node.names if a.name != "*")
        for a in node.names:
            bound = a.asname or a.name
            if mod == "torch.utils" and a.name == "cpp_extension":
                self.cpp_modules.add(bound)
            elif mod == "torch.utils.cpp_extension" and a.name in ("load", "load_inline"):
                self.cpp_funcs.add(bound)
            elif mod.split(".")[0] == "triton" and a.name in ("jit", "autotune"):
                self.triton_decorators.add(bound)
            elif mod.startswith("deepspeed") and a.name in OPTIMIZER_OPS:
                self._add("deepspeed", node, f"{a.name} (from {mod}) loads op {OPTIMIZER_OPS[a.name]} when built",
                          key=f"op:{OPTIMIZER_OPS[a.name]}")

    # scopes ----------------------------------------------------------------------------------
    def _scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._triton(node)
        self._scope(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._triton(node)
        self._scope(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._scope(node)

    def _triton(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for dec in node.decorator_list:
            name = _dotted(dec.func if isinstance(dec, ast.Call) else dec)
            head, _, tail = name.partition(".")
            if (head in self.triton_names and tail in ("jit", "autotune", "heuristics")) or \
                    name in self.triton_decorators:
                self.sites.append(Raw("triton", node.lineno, f"@{name} {node.name}", "call", node.name))
                return

    # calls -----------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = _dotted(func)
        if isinstance(func, ast.Attribute) and func.attr in ("load", "load_inline") and \
                (_dotted(func.value) in self.cpp_modules or _dotted(func.value).endswith("cpp_extension")):
            self._torch_jit(node, name)
        elif isinstance(func, ast.Name) and func.id in self.cpp_funcs:
            self._torch_jit(node, name)
        elif isinstance(func, ast.Attribute) and func.attr in _LOADS and isinstance(func.value, ast.Call) \
                and _dotted(func.value.func).split(".")[-1].endswith("Builder"):
            cls = _dotted(func.value.func).split(".")[-1]
            self._add("deepspeed", node, f"{cls}().{func.attr}()", key=f"builder:{cls}")
        elif name.split(".")[-1] in ("create_op_builder", "get_op_builder") and node.args and _literal(node.args[0]):
            cls = _literal(node.args[0])
            self._add("deepspeed", node, f"{name.split('.')[-1]}({cls!r})", key=f"builder:{cls}")
        elif name.split(".")[-1] == "has_function" and node.args:
            libs = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords
                                                                  if k.arg == "libraries"), None)
            names = [_literal(e) for e in libs.elts] if isinstance(libs, (ast.Tuple, ast.List)) else []
            fn = _literal(node.args[0]) or _literal(next((k.value for k in node.keywords if k.arg == "funcname"),
                                                         None))
            self._add("probe", node, f"has_function({fn!r}, {tuple(names)!r})", key=f"{fn}:{','.join(names)}")
        elif name.split(".")[-1] in _SUBPROCESS and node.args and self._is_make(node.args[0]):
            self._add("make", node, f"{name}(make ...)")
        self.generic_visit(node)

    def _torch_jit(self, node: ast.Call, name: str) -> None:
        ext = _literal(next((k.value for k in node.keywords if k.arg == "name"), node.args[0] if node.args else None))
        self._add("torch-jit", node, f"{name}({'name=' + repr(ext) if ext else '...'})", key=ext)

    @staticmethod
    def _is_make(arg: ast.AST) -> bool:
        if isinstance(arg, (ast.List, ast.Tuple)) and arg.elts:
            return _literal(arg.elts[0]) in ("make", "gmake")
        text = _literal(arg)
        return text == "make" or text.startswith("make ")


def _finder(source: str) -> _Finder:
    finder = _Finder()
    try:
        finder.visit(ast.parse(source))
    except (SyntaxError, ValueError):
        pass
    return finder


def find_sites(source: str) -> list[Raw]:
    """The compile sites in one Python file's text (a file that does not parse has none)."""
    return _finder(source).sites


def imported_files(package_root: Path, modules: Iterable[str]) -> set[Path]:
    """The files of an installed package that importing ``modules`` runs: each module's file and the
    ``__init__.py`` of every package on its way (one level: what those files import in turn is not followed)."""
    out: set[Path] = set()
    top = package_root.name
    for mod in modules:
        parts = mod.split(".")
        if parts[0] != top:
            continue
        for i in range(1, len(parts) + 1):
            base = package_root.parent.joinpath(*parts[:i])
            for cand in (base / "__init__.py", base.with_suffix(".py")):
                if cand.is_file():
                    out.add(cand)
    return out


def python_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for f in sorted(filenames):
            if f.endswith(".py"):
                yield Path(dirpath) / f


def builder_names(roots: Iterable[Path]) -> dict[str, str]:
    """Op builder class -> its op NAME, read from every ``op_builder`` folder under ``roots``."""
    out: dict[str, str] = {}
    for root in roots:
        if not root.is_dir():
            continue
        for path in python_files(root):
            if "op_builder" not in path.parts:
                continue
            try:
                tree = ast.parse(path.read_text(errors="replace"))
            except (SyntaxError, ValueError):
                continue
            for node in tree.body:
                if not isinstance(node, ast.ClassDef):
                    continue
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NAME"
                                                            for t in stmt.targets) and _literal(stmt.value):
                        out.setdefault(node.name, _literal(stmt.value))
    return out


# --------------------------------------------------------------------------------------------
# what the target python has

@dataclass
class Target:
    """What the audit needs from the target python, read from its files."""

    python: str
    modules: dict[str, str] = field(default_factory=dict)
    """Prebuilt extension module -> the distribution (name version) that ships it."""
    dists: dict[str, InstalledDist] = field(default_factory=dict)
    ds_ops: dict[str, bool] | None = None
    ds_accelerator: str = ""
    ds_probes_recorded: bool = False
    ds_no_jit: bool = False
    """The installed builder carries porter's deepspeed/no-jit guard (refuses JIT under PORTER_NO_JIT=1)."""
    ds_probe_patch: bool = False
    """The installed builder answers feature probes from porter's recorded answers (every wheel porter ops build
    writes: its copy of the builder carries deepspeed/no-jit)."""

    @classmethod
    def from_env(cls, env: TargetEnv) -> Target:
        t = cls(env.executable, dists=dict(env.dists))
        for d in env.dists.values():
            for rel, _ in d.shared_objects:
                t.modules[module_name(rel)] = f"{d.name} {d.version}"
        ds = env.dists.get("deepspeed")
        if ds is not None:
            info = Path(ds.location) / VERSION_INFO
            text = info.read_text(errors="replace") if info.is_file() else ""
            t.ds_ops = read_installed_ops(text) if text else None
            m = re.search(r"(?m)^accelerator_name\s*=\s*['\"]([^'\"]*)['\"]", text)
            t.ds_accelerator = m.group(1) if m else ""
            t.ds_probes_recorded = bool(re.search(r"(?m)^porter_feature_probes\s*=", text))
            builder = Path(ds.location) / "deepspeed" / "ops" / "op_builder" / "builder.py"
            t.ds_no_jit = builder.is_file() and "_porter_refuse_jit" in builder.read_text(errors="replace")
            t.ds_probe_patch = builder.is_file() and "_porter_recorded_probe" in builder.read_text(errors="replace")
        return t

    def package_root(self, dist: str, package: str) -> Path | None:
        d = self.dists.get(dist)
        if d is None:
            return None
        root = Path(d.location) / package
        return root if root.is_dir() else None


# --------------------------------------------------------------------------------------------
# the audit

def _guard(rel: str, kind: str, path: Path | None = None) -> tuple[str, str, tuple[str, ...]] | None:
    """(marker, patch id, modules) when porter's patches know this site; ``path``: the site's file on disk
    (the modules are then those of that tree's generation)."""
    for g in JIT_GUARDS:
        if g.kind == kind and rel.endswith(g.file):
            return g.marker, g.patch, g.modules_at(path)
    return None


def _resolve(raw: Raw, rel: str, text: str, origin: str, target: Target | None, ops: Mapping[str, str],
             apex_builders: Mapping[str, str], path: Path | None = None) -> Site:
    py = target.python if target else "the target python"

    def site(status: Status, detail: str, module: str = "", what: str = raw.what, kind: str = raw.kind) -> Site:
        return Site(kind, rel, raw.line, what, origin, raw.when, status, detail, module)

    if raw.kind in ("torch-jit", "make"):
        guard = _guard(rel, raw.kind, path)
        if guard is None:
            return site("compiles", "porter knows no prebuilt module for this site; prebuild it ahead of time or "
                                    "keep it off the start-up path")
        marker, patch, modules = guard
        if marker not in text:
            return site("compiles", f"not patched: 'porter port megatron-deepspeed' applies {patch}, which imports "
                                    f"the prebuilt {', '.join(modules)} instead")
        missing = [m for m in modules if target is None or m not in target.modules]
        if not missing:
            found = sorted({target.modules[m] for m in modules}) if target else []
            return site("covered", f"porter's {patch} imports the prebuilt module(s), installed from "
                                   f"{', '.join(found)}", ", ".join(modules))
        return site("guarded", f"porter's {patch} imports {', '.join(missing)} instead of compiling, but {py} has "
                               "no such module: start-up stops with an error naming 'porter port "
                               "megatron-deepspeed'; install the wheel it builds", ", ".join(modules))
    if raw.kind == "deepspeed":
        kind, cls = raw.key.split(":", 1)
        if kind == "builder" and cls in apex_builders and cls not in ops:
            return _apex(raw, rel, origin, target, apex_builders[cls])
        op = cls if kind == "op" else ops.get(cls, "")
        what = raw.what if kind == "op" or not op else f"{raw.what} -> op {op}"
        if target is None or target.ds_ops is None:
            why = "no DeepSpeed installed in the target python" if target is None or "deepspeed" not in \
                target.dists else "the target's DeepSpeed records no installed_ops"
            return site("compiles", f"{why}: nothing is prebuilt", what=what)
        if not op:
            return site("compiles", f"op builder {cls} is not in the op catalogue porter read", what=what)
        if target.ds_ops.get(op):
            return site("covered", f"prebuilt in {target.modules.get(op, '') or 'the installed DeepSpeed'} "
                                   f"(installed_ops[{op!r}] is True)", op, what=what)
        refuse = " (its no-jit patch raises a clear error under PORTER_NO_JIT=1)" if target.ds_no_jit else ""
        return site("compiles", f"DeepSpeed in {py} does not mark {op} prebuilt{refuse}: build it with 'porter ops "
                                f"build --source <deepspeed> --toolchain <profile> --ops {op}' and install the wheel",
                    what=what)
    if raw.kind == "probe":
        recorded = target is not None and target.ds_probes_recorded and (target.ds_probe_patch or
                                                                         "_porter_recorded_probe" in text)
        if recorded:
            return site("covered", "answered from the answers porter recorded at build time "
                                   "(porter_feature_probes), with no compiler")
        return site("probe", "install the DeepSpeed wheel 'porter ops build' writes: it records the build host's "
                             "answer and its copy of the op builder (patched with deepspeed/no-jit) answers from it, "
                             "so the node compiles no test program")
    return site("compiles", "porter prebuilds no Triton kernels: warm TRITON_CACHE_DIR on node-local disk once per "
                            "node type, or use a compiled backend")


def _apex(raw: Raw, rel: str, origin: str, target: Target | None, name: str) -> Site:
    what = f"{raw.what} -> module {name}"
    shipped = [m for m in (target.modules if target else {}) if m.split(".")[-1] == name]
    if shipped and target is not None:
        return Site("apex", rel, raw.line, what, origin, raw.when, "covered",
                    f"prebuilt in {target.modules[shipped[0]]}", shipped[0])
    return Site("apex", rel, raw.line, what, origin, raw.when, "compiles",
                f"apex ships no prebuilt {name}: build it with 'porter wheel apex --source <apex tree> "
                "--toolchain <profile>' and install that wheel")


def audit(tree: str | os.PathLike[str], target: Target | None) -> AuditReport:
    """Every compile site of ``tree`` and of what ``target`` (None: no python given) has installed."""
    root = Path(tree).resolve()
    report = AuditReport(root, target.python if target else "")
    if target is not None:
        report.installed = {d.name: d.version for k, d in sorted(target.dists.items())
                            if k in ("deepspeed", "apex", "flash-attn", "megatron-fused-kernels", "triton")}
    ds_root = target.package_root("deepspeed", "deepspeed") if target else None
    apex_root = target.package_root("apex", "apex") if target else None
    ops = builder_names([root, *([ds_root] if ds_root else [])])
    apex_builders = builder_names([apex_root]) if apex_root else {}
    imports: set[str] = set()
    for path in python_files(root):
        text = path.read_text(errors="replace")
        rel = path.relative_to(root).as_posix()
        found = _finder(text)
        imports |= found.imports
        for raw in found.sites:
            if not _relevant(raw, path):
                continue
            report.sites.append(_resolve(raw, rel, text, "tree", target, ops, apex_builders, path))
    if target is not None:
        report.sites += _installed_sites(target, ops, apex_builders, imports)
    return report


def _relevant(raw: Raw, path: Path) -> bool:
    """Leave out what is machinery, not a site: the op builders' own ``cpp_extension.load`` (each op load is the
    site), and DeepSpeed importing its own optimizer classes (its op loads are the sites)."""
    if raw.kind == "torch-jit" and "op_builder" in path.parts:
        return False
    if raw.kind == "deepspeed" and raw.key.startswith("op:") and "deepspeed" in path.parts and \
            "ops" in path.parts:
        return False
    return True


def _installed_sites(target: Target, ops: Mapping[str, str], apex_builders: Mapping[str, str],
                     imports: set[str]) -> list[Site]:
    """Sites in the target's installed DeepSpeed and APEX: module-level code of the modules the tree imports, and
    DeepSpeed's feature probes (of the accelerator it was built for); a FlashAttention without compiled code."""
    out: list[Site] = []
    ds = target.dists.get("deepspeed")
    ds_root = target.package_root("deepspeed", "deepspeed")
    if ds is not None and ds_root is not None:
        origin = f"deepspeed {ds.version}"
        info = ds_root / "git_version_info.py"
        at_import = info.is_file() and re.search(r"(?m)^\s*\w+\s*=\s*builder\.is_compatible\(\)",
                                                 info.read_text(errors="replace")) is not None
        accel = target.ds_accelerator or "cuda"
        run_at_import = imported_files(ds_root, imports | {"deepspeed"})
        for path in python_files(ds_root):
            rel = path.relative_to(ds_root.parent).as_posix()
            text = path.read_text(errors="replace")
            in_builders = "op_builder" in path.parts
            for raw in find_sites(text):
                if not _relevant(raw, path):
                    continue
                if raw.kind == "probe":
                    # only the builders of the accelerator the installation was built for
                    sub = path.parent.name if path.parent.name != "op_builder" else "cuda"
                    if not in_builders or sub != (accel if accel != "rocm" else "cuda"):
                        continue
                    raw = Raw(raw.kind, raw.line, raw.what, "import" if at_import else "call", raw.key)
                elif raw.when != "import" or path not in run_at_import:
                    continue
                out.append(_resolve(raw, rel, text, origin, target, ops, apex_builders))
    apex = target.dists.get("apex")
    apex_root = target.package_root("apex", "apex")
    if apex is not None and apex_root is not None:
        run_at_import = imported_files(apex_root, imports)
        for path in sorted(run_at_import):
            text = path.read_text(errors="replace")
            rel = path.relative_to(apex_root.parent).as_posix()
            for raw in find_sites(text):
                if raw.when != "import" or raw.kind not in ("deepspeed", "torch-jit") or not _relevant(raw, path):
                    continue
                cls = raw.key.split(":", 1)[-1]
                if raw.kind == "deepspeed" and cls in apex_builders:
                    out.append(_apex(raw, rel, f"apex {apex.version}", target, apex_builders[cls]))
                else:
                    out.append(_resolve(raw, rel, text, f"apex {apex.version}", target, ops, apex_builders))
    fa = target.dists.get("flash-attn")
    if fa is not None and not fa.shared_objects:
        out.append(Site("triton", "flash_attn", 0, "FlashAttention with no compiled extension (its Triton backend)",
                        f"flash-attn {fa.version}", "call", "compiles",
                        "every attention kernel is compiled by Triton at first use; build the CK backend with "
                        "'porter wheel flash-attn' or warm TRITON_CACHE_DIR on node-local disk"))
    return out


def render(report: AuditReport) -> list[str]:
    """The text report: one line per site, most urgent first, then what it costs and what to do."""
    order = {"compiles": 0, "guarded": 1, "probe": 2, "covered": 3}
    lines = [f"audit of {report.tree}" + (f" with {report.python}" if report.python else " (no target python)")]
    if report.installed:
        lines.append("installed: " + ", ".join(f"{k} {v}" for k, v in report.installed.items()))
    for s in sorted(report.sites, key=lambda s: (order[s.status], s.origin != "tree", s.file, s.line)):
        where = f"{s.file}:{s.line}" if s.line else s.file
        origin = "" if s.origin == "tree" else f" [{s.origin}]"
        lines.append(f"{s.status.upper():<9} {s.kind:<10} {where}{origin}  {s.what} (at {s.when})")
        if s.status != "covered":
            k = KINDS[s.kind]
            lines.append(f"          cost: {k.cost}; without a compiler: {k.no_compiler}")
        lines.append(f"          {s.detail}")
    c = report.counts()
    fails = sum(1 for s in report.compiles if KINDS[s.kind].fails)
    lines.append(f"{len(report.sites)} site(s): {c['compiles']} would compile on a compute node ({fails} of them "
                 f"fail there without a compiler), {c['guarded']} guarded by porter's patches but without their "
                 f"prebuilt module, {c['probe']} feature probe(s), {c['covered']} covered by prebuilt modules")
    return lines


__all__ = ["KINDS", "AuditReport", "Raw", "Site", "Target", "audit", "builder_names", "find_sites",
           "render"]
