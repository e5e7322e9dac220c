"""What the audit (``porter audit``, :mod:`porter.install.audit`) and the components share: a compile site as found
in Python source, the finder, and what a component answers about its own sites (:class:`JitSites`).

The finder knows no project: it sees ``torch.utils.cpp_extension.load``/``load_inline``, ``make`` subprocesses,
``@triton.jit`` kernels, ``has_function`` feature probes, op builder loads (``XBuilder().load()``,
``create_op_builder("X")``) and the classes a component says load an op when imported (its ``loads_on_import``).
Which component a site belongs to, and whether a prebuilt module covers it, the components answer.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from porter.artifacts.wheelfile import module_name
from porter.components import static

if TYPE_CHECKING:
    from porter.install.env import InstalledDist, TargetEnv

Status = Literal["covered", "guarded", "compiles", "probe"]
Loads = Mapping[str, Mapping[str, str]]
"""Package -> class importable from it -> the op importing it loads."""
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
    "op": Kind("an op builder JIT-builds the op on first use", "fails: no compiler", True),
    "triton": Kind("Triton compiles the kernel at its first call, again for each new shape or dtype (seconds each, "
                   "per rank; cached in TRITON_CACHE_DIR)",
                   "fails while the cache is empty: Triton builds its launcher with the system C compiler", True),
    "probe": Kind("a test program compiled and linked with cc (under a second)",
                  "does not fail: answers 'absent', which may differ from what the build host found", False),
}
"""The kinds the finder knows; a component adds its own (:attr:`JitSites.jit_kinds`)."""


@dataclass(frozen=True)
class Site:
    kind: str
    file: str
    line: int
    what: str
    origin: str
    """``tree``, or the installed distribution (``NAME VERSION``)."""
    when: str
    """``import`` (module-level code) or ``call`` (when that code runs)."""
    status: Status
    detail: str
    module: str = ""
    """The prebuilt module that covers (or would cover) it."""

    def to_dict(self, kinds: Mapping[str, Kind]) -> dict[str, Any]:
        k = kinds[self.kind]
        return {**asdict(self), "module": self.module or None, "cost": k.cost, "without_compiler": k.no_compiler,
                "fails_without_compiler": k.fails}


@dataclass(frozen=True)
class Raw:
    kind: str
    line: int
    what: str
    when: str
    key: str = ""
    """torch-jit: the extension name; op: ``builder:CLASS`` or ``op:NAME``; probe: 'function:libs'."""


@dataclass(frozen=True)
class At:
    """Where a site was found: its file (relative, as reported), text, origin and path on disk (None: not known)."""

    rel: str
    text: str
    origin: str
    path: Path | None = None

    def site(self, raw: Raw, status: Status, detail: str, module: str = "", *, kind: str = "",
             what: str = "") -> Site:
        return Site(kind or raw.kind, self.rel, raw.line, what or raw.what, self.origin, raw.when, status, detail,
                    module)


@dataclass
class Target:
    """What the audit needs from the target python, read from its files."""

    python: str
    modules: dict[str, str] = field(default_factory=dict)
    """Prebuilt extension module -> the distribution (name version) that ships it."""
    dists: dict[str, InstalledDist] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    """Component -> what it read of its own installation (:meth:`JitSites.read_target`)."""

    @classmethod
    def of(cls, env: TargetEnv) -> Target:
        modules = {module_name(rel): f"{d.name} {d.version}" for d in env.dists.values() for rel, _ in d.shared_objects}
        return cls(env.executable, modules, dict(env.dists))

    def package_root(self, dist: str, package: str) -> Path | None:
        d = self.dists.get(dist)
        root = Path(d.location) / package if d is not None else None
        return root if root is not None and root.is_dir() else None


@dataclass(frozen=True)
class Audit:
    """What a component's answers may read: the target (None: no python given), every component's op builders
    (class -> op name, in the registry's order) and the import loads."""

    target: Target | None
    builders: Mapping[str, Mapping[str, str]]
    loads: Loads
    resolve: Callable[[Raw, At], Site]
    """The audit's own answer for a site: the first component's that claims it, else porter's."""

    @property
    def python(self) -> str:
        return self.target.python if self.target else "the target python"

    def owner(self, cls: str) -> str | None:
        """The component whose op builder ``cls`` is (the first that has it)."""
        return next((c for c, names in self.builders.items() if cls in names), None)


@runtime_checkable
class JitSites(Protocol):
    """A component whose code, or its users', compiles at run time: ``porter audit`` asks it about its sites. A
    component that inherits it answers by default no kind, no import load, no site, and overrides what it knows."""

    name: str
    jit_kinds: Mapping[str, Kind] = {}
    """Its own kinds of site (the report names them)."""
    loads_on_import: Loads = {}

    def read_target(self, target: Target) -> None:
        """Read what it needs of its installation in ``target`` into ``target.facts`` (nothing when absent)."""
        return None

    def builder_roots(self, tree: Path, target: Target | None) -> list[Path]:
        """Folders whose ``op_builder`` classes are its op builders."""
        return []

    def resolve(self, raw: Raw, at: At, audit: Audit) -> Site | None:
        """The site's status when the site is this component's (None: not its)."""
        return None

    def installed_sites(self, audit: Audit, imports: set[str]) -> list[Site]:
        """Sites in its installed copy that a training importing ``imports`` runs."""
        return []


NoSites = JitSites
"""The name a component inherits the audit's default answers by."""


_SUBPROCESS = {"run", "call", "check_call", "check_output", "Popen", "system"}
_LOADS = {"load", "jit_load"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    return _dotted(node.func) + "()" if isinstance(node, ast.Call) else ""


def _literal(node: ast.AST | None) -> str:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


class _Finder(ast.NodeVisitor):
    def __init__(self, loads: Loads) -> None:
        self.loads = loads
        self.sites: list[Raw] = []
        self.depth = 0
        self.cpp_modules: set[str] = set()      # names bound to torch.utils.cpp_extension
        self.cpp_funcs: set[str] = set()        # load / load_inline imported by name
        self.triton_names: set[str] = set()     # triton module aliases
        self.triton_decorators: set[str] = set()  # jit / autotune imported from triton
        self.imports: set[str] = set()          # absolute modules this file imports (and from-imported names)

    def _add(self, kind: str, node: ast.AST, what: str, key: str = "") -> None:
        self.sites.append(Raw(kind, getattr(node, "lineno", 0), what, "import" if self.depth == 0 else "call", key))

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
            elif (op := self.loads.get(mod.split(".")[0], {}).get(a.name)) is not None:
                # importing a package's op-loading class (an optimizer) loads its op
                self._add("op", node, f"{a.name} (from {mod}) loads op {op} when built", key=f"op:{op}")

    # scopes ----------------------------------------------------------------------------------
    def _scope(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_Lambda = _scope

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """A scope; a Triton kernel when a triton decorator is on it."""
        for dec in node.decorator_list:
            name = _dotted(dec.func if isinstance(dec, ast.Call) else dec)
            head, _, tail = name.partition(".")
            if (head in self.triton_names and tail in ("jit", "autotune", "heuristics")) or \
                    name in self.triton_decorators:
                self.sites.append(Raw("triton", node.lineno, f"@{name} {node.name}", "call", node.name))
                break
        self._scope(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    # calls -----------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = _dotted(func)
        leaf = name.split(".")[-1]
        if (isinstance(func, ast.Attribute) and func.attr in ("load", "load_inline") and
                (_dotted(func.value) in self.cpp_modules or _dotted(func.value).endswith("cpp_extension"))) or \
                (isinstance(func, ast.Name) and func.id in self.cpp_funcs):
            ext = _literal(next((k.value for k in node.keywords if k.arg == "name"),
                                node.args[0] if node.args else None))
            self._add("torch-jit", node, f"{name}({'name=' + repr(ext) if ext else '...'})", key=ext)
        elif isinstance(func, ast.Attribute) and func.attr in _LOADS and isinstance(func.value, ast.Call) \
                and (cls := _dotted(func.value.func).split(".")[-1]).endswith("Builder"):
            self._add("op", node, f"{cls}().{func.attr}()", key=f"builder:{cls}")
        elif leaf in ("create_op_builder", "get_op_builder") and node.args and (cls := _literal(node.args[0])):
            self._add("op", node, f"{leaf}({cls!r})", key=f"builder:{cls}")
        elif leaf == "has_function" and node.args:
            libs = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords
                                                                  if k.arg == "libraries"), None)
            names = [_literal(e) for e in libs.elts] if isinstance(libs, (ast.Tuple, ast.List)) else []
            fn = _literal(node.args[0]) or _literal(next((k.value for k in node.keywords if k.arg == "funcname"),
                                                         None))
            self._add("probe", node, f"has_function({fn!r}, {tuple(names)!r})", key=f"{fn}:{','.join(names)}")
        elif leaf in _SUBPROCESS and node.args and self._is_make(node.args[0]):
            self._add("make", node, f"{name}(make ...)")
        self.generic_visit(node)

    @staticmethod
    def _is_make(arg: ast.AST) -> bool:
        if isinstance(arg, (ast.List, ast.Tuple)) and arg.elts:
            return _literal(arg.elts[0]) in ("make", "gmake")
        text = _literal(arg)
        return text == "make" or text.startswith("make ")


def scan(source: str, loads: Loads = {}) -> _Finder:
    """The compile sites of one Python file's text, and what it imports (a file that does not parse has none)."""
    finder = _Finder(loads)
    try:
        finder.visit(ast.parse(source))
    except (SyntaxError, ValueError):
        pass
    return finder


def find_sites(source: str, loads: Loads = {}) -> list[Raw]:
    """The compile sites in one Python file's text (a file that does not parse has none)."""
    return scan(source, loads).sites


def imported_files(package_root: Path, modules: Iterable[str]) -> set[Path]:
    """The files of an installed package that importing ``modules`` runs: each module's file and the
    ``__init__.py`` of every package on its way (one level: what those files import in turn is not followed)."""
    out: set[Path] = set()
    for mod in modules:
        parts = mod.split(".")
        if parts[0] == package_root.name:
            bases = [package_root.parent.joinpath(*parts[:i]) for i in range(1, len(parts) + 1)]
            out |= {c for b in bases for c in (b / "__init__.py", b.with_suffix(".py")) if c.is_file()}
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
        for path in (p for p in python_files(root) if "op_builder" in p.parts):  # none under a root that is no folder
            try:
                tree = ast.parse(path.read_text(errors="replace"))
            except (SyntaxError, ValueError):
                continue
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and (name := _literal(static.assigns(node.body).get("NAME"))):
                    out.setdefault(node.name, name)
    return out


def relevant(raw: Raw, path: Path, loads: Loads) -> bool:
    """Leave out what is machinery, not a site: an op builder's own ``cpp_extension.load`` (each op load is the
    site), and a package importing its own op-loading classes (its op loads are the sites)."""
    return not ((raw.kind == "torch-jit" and "op_builder" in path.parts) or (
        raw.kind == "op" and raw.key.startswith("op:") and "ops" in path.parts and any(p in path.parts for p in loads)))
