"""The layering rules, read from the code: top-level imports only (what runs at import time)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    mods = {_module(p): p for pkg in ("porter", "ops_prebuild") for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: imports inside functions are deliberate late binding
            if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            graph[mod] |= {n for n in names if n in mods and n != mod}
    return graph


def test_no_import_cycle_between_porter_and_ops_prebuild() -> None:
    graph = _graph()
    down = {m for m in graph if m.startswith("ops_prebuild")}
    # ops_prebuild may use porter's core, never porter's flows or CLI that call it
    for mod in down:
        for dep in graph[mod]:
            assert not dep.startswith(("porter.cli", "porter.port", "porter.wheels", "porter.install")), (mod, dep)
    # nothing in ops_prebuild reaches back (transitively) to a porter module that imports ops_prebuild
    callers = {m for m, deps in graph.items() if m.startswith("porter") and any(d in down for d in deps)}
    assert callers <= {m for m in graph if m.startswith(("porter.port", "porter.cli", "porter.components",
                                                         "porter.wheels"))}, callers

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for d in graph[todo.pop()]:
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return seen

    for mod in down:
        assert not (reach(mod) & callers), (mod, reach(mod) & callers)


def test_patching_is_text_edits_only() -> None:
    graph = _graph()
    for mod, deps in graph.items():
        if mod.startswith("porter.patching"):
            assert all(not d.startswith(("ops_prebuild", "porter.hipify", "porter.wheels", "porter.install",
                                         "porter.port", "porter.toolchain")) for d in deps), (mod, deps)


def test_probes_are_standalone() -> None:
    for path in (ROOT / "porter" / "probes").glob("*.py"):
        for line in path.read_text().splitlines():
            if line.startswith(("import porter", "from porter")):
                assert line.endswith("# porter: concatenated"), (path.name, line)
