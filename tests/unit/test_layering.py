"""The layering rules, read from the code: every import counts, at module level, inside functions and under
``TYPE_CHECKING`` (a late import is still a dependency, and a cycle through one is still a cycle)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("porter", "ops_prebuild")


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in (root / pkg).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports, anywhere in its text (``from X import Y`` is X.Y when
    that is a module, else X; a relative import is resolved against the module's package)."""
    mods = modules(root, packages)
    out: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for name in names:
                while name and name not in mods:  # a name inside a module: the module
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    out[mod].add(name)
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(g):
        if start in index:
            continue
        work = [(start, iter(sorted(g[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(g[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


@functools.cache
def project() -> dict[str, set[str]]:
    return graph()


def test_no_import_cycle_among_porter_and_ops_prebuild() -> None:
    assert cycles(project()) == []


def test_the_cycle_check_sees_late_and_type_checking_imports(tmp_path: Path) -> None:
    """A planted cycle: one side imports inside a function, the other under TYPE_CHECKING."""
    pkg = tmp_path / "planted"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from planted import b\n    return b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n")
    (pkg / "c.py").write_text("import planted.a\n")
    g = graph(tmp_path, ("planted",))
    assert g["planted.a"] == {"planted.b"} and g["planted.b"] == {"planted.a"}
    assert cycles(g) == [["planted.a", "planted.b"]]


# What the AOT engine never imports: a command, a flow, or a component (it knows no project).
ENGINE_NEVER = ("porter.cli", "porter.port", "porter.wheels", "porter.install", "porter.cluster", "porter.image",
                "porter.components", "porter.emulate.run")


def engine_breaks(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in g.items() if m.startswith("ops_prebuild")
                  for d in deps if d.startswith(ENGINE_NEVER))


def test_ops_prebuild_imports_no_flow_command_or_component() -> None:
    assert engine_breaks(project()) == []


def test_the_engine_rule_sees_a_component_import(tmp_path: Path) -> None:
    """A planted engine module importing a component's package (not a module of it) is caught."""
    for pkg in ("ops_prebuild", "porter", "porter/components", "porter/components/thing"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "ops_prebuild" / "plan.py").write_text("import porter.components.thing\n")
    assert engine_breaks(graph(tmp_path, PACKAGES)) == ["ops_prebuild.plan -> porter.components.thing"]


def test_components_never_import_their_registry() -> None:
    """Each component imports porter.components.base, never the package that lists them all."""
    for mod, deps in project().items():
        if mod.startswith("porter.components."):
            assert "porter.components" not in deps, mod


def test_patching_is_text_edits_only() -> None:
    for mod, deps in project().items():
        if mod.startswith("porter.patching"):
            assert all(not d.startswith(("ops_prebuild", "porter.hipify", "porter.wheels", "porter.install",
                                         "porter.port", "porter.toolchain")) for d in deps), (mod, deps)


def test_probes_are_standalone() -> None:
    for path in (ROOT / "porter" / "probes").glob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith(("import porter", "from porter")):
                assert line.endswith("# porter: concatenated"), (path.name, line)


# The layers, top to bottom (DESIGN.md "Layout"): an import may point down or within its layer, never up.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cli", ("porter.cli", "porter.__main__")),
    ("components and flows", ("porter.components", "porter.port", "porter.install", "porter.cluster", "porter.image",
                              "porter.emulate.run")),
    ("engines", ("ops_prebuild", "porter.wheels", "porter.hipify", "porter.patching", "porter.ccache")),
    ("artifacts and toolchain", ("porter.artifacts", "porter.toolchain", "porter.emulate")),
    ("core", ("porter.errors", "porter.log", "porter.run", "porter.executor", "porter.fs", "porter.archive", "porter.locks", "porter.faults",
              "porter.probe", "porter.probes", "porter.torch_facts", "porter.torch_hip_view", "porter.codeobjects",
              "porter.resources", "porter.userdata", "porter.optspec", "porter")),
)
ROOTS = ("porter",)
"""Package roots listed for their own ``__init__`` alone: a root is never a catch-all for its modules."""


def layer_of(mod: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int:
    """The index of the module's layer (the longest matching prefix decides; -1: none). A root package matches
    only itself, so a new module of ``porter`` has no layer until the table names it."""
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            if (mod == p or (p not in ROOTS and mod.startswith(p + "."))) and len(p) > best:
                best, rank = len(p), i
    return rank


def upward(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})"
                  for m, deps in g.items() for d in deps if layer_of(d) < layer_of(m))


def test_every_module_has_a_layer() -> None:
    assert [m for m in project() if layer_of(m) < 0] == []


def test_a_new_module_has_no_layer_until_the_table_names_it(tmp_path: Path) -> None:
    (tmp_path / "porter").mkdir()
    (tmp_path / "porter" / "__init__.py").write_text("")
    (tmp_path / "porter" / "newthing.py").write_text("")
    g = graph(tmp_path, ("porter",))
    assert [m for m in g if layer_of(m) < 0] == ["porter.newthing"]


def doc_layers(text: str) -> set[tuple[str, str]]:
    """(module prefix, layer) from docs/architecture.md's layer table: each backticked path of a row
    (``porter/cli/`` -> porter.cli, ``porter/port.py`` -> porter.port)."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    out: set[tuple[str, str]] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or cells[0] in ("layer", "") or set(cells[0]) <= {"-"}:
            continue
        for path in re.findall(r"`([^`]+)`", cells[1]):
            mod = path.rstrip("/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            out.add((mod, cells[0].lower()))
    return out


def code_layers() -> set[tuple[str, str]]:
    return {(p, name.lower()) for name, prefixes in LAYERS for p in prefixes
            if not p.startswith("porter.__main__") and p not in ROOTS}


def test_the_documented_layer_table_is_the_one_the_code_holds() -> None:
    doc = doc_layers((ROOT / "docs" / "architecture.md").read_text())
    assert doc == code_layers()


def test_a_module_missing_from_the_documented_table_is_caught() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text().replace("`porter/image/`, ", "")
    assert code_layers() - doc_layers(text) == {("porter.image", "components and flows")}


def test_no_import_points_up_the_layers() -> None:
    assert upward(project()) == []


def test_the_layer_check_sees_an_upward_late_import(tmp_path: Path) -> None:
    """A planted engine module that imports a component inside a function: reported, with both layers."""
    for pkg in ("ops_prebuild", "porter", "porter/components"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "porter" / "components" / "thing.py").write_text("X = 1\n")
    (tmp_path / "ops_prebuild" / "engine.py").write_text("def f():\n    from porter.components.thing import X\n"
                                                         "    return X\n")
    g = graph(tmp_path, PACKAGES)
    assert upward(g) == ["ops_prebuild.engine (engines) -> porter.components.thing (components and flows)"]


def test_the_packages_name_entry_points_that_exist() -> None:
    """The entry points a package's docstring names are where it says (they moved once, and the text did not)."""
    import importlib

    for pkg in PACKAGES:
        doc = importlib.import_module(pkg).__doc__ or ""
        for ref in re.findall(r":(?:func|class):`([\w.]+)`", doc):
            mod, _, name = ref.rpartition(".")
            assert hasattr(importlib.import_module(mod), name), ref
