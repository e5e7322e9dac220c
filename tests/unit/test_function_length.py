"""#39's guards: no function in porter/ or ops_prebuild/ over 80 lines (decorators included); every manifest
made in one place. Each with a planted break that it catches."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

LIMIT = 80


def long_functions(root: Path, packages: tuple[str, ...] = ("porter", "ops_prebuild")) -> dict[str, int]:
    """``path:name`` -> lines, for each function (method, nested function) longer than LIMIT."""
    out: dict[str, int] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                    lines = (node.end_lineno or node.lineno) - start + 1
                    if lines > LIMIT:
                        out[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return out


def test_no_function_is_over_80_lines() -> None:
    assert long_functions(ROOT) == {}


def test_the_length_rule_sees_a_long_function_with_its_decorators(tmp_path: Path) -> None:
    pkg = tmp_path / "porter"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))
    method = "".join(f"        y{i} = {i}\n" for i in range(LIMIT))
    (pkg / "m.py").write_text(f"@decorator\ndef long_one():\n{body}\n\ndef eighty():\n{body}\n\n"
                              f"class A:\n    def method(self):\n{method}")
    assert long_functions(tmp_path, ("porter",)) == {"porter/m.py:long_one": LIMIT + 1,
                                                     "porter/m.py:method": LIMIT + 1}


def calls_of(root: Path, name: str, packages: tuple[str, ...] = ("porter", "ops_prebuild")) -> list[str]:
    """``path`` of each call of a function named ``name`` (plain or attribute call)."""
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and name in (getattr(node.func, "id", None),
                                                           getattr(node.func, "attr", None)):
                    out.append(path.relative_to(root).as_posix())
    return out


def test_every_manifest_is_made_in_one_place() -> None:
    """#39: wheels and plugin packages get their manifest from porter.artifacts.manifest.publish alone."""
    assert calls_of(ROOT, "build_manifest") == ["porter/artifacts/manifest.py"]


def test_the_one_place_rule_sees_a_second_caller(tmp_path: Path) -> None:
    (tmp_path / "porter").mkdir()
    (tmp_path / "porter" / "a.py").write_text("from m import build_manifest\nbuild_manifest(x=1)\n")
    (tmp_path / "porter" / "b.py").write_text("import m\nm.build_manifest(x=2)\n")
    assert calls_of(tmp_path, "build_manifest", ("porter",)) == ["porter/a.py", "porter/b.py"]


def dry_run_parameters(root: Path, packages: tuple[str, ...] = ("porter", "ops_prebuild")) -> list[str]:
    """``path:name`` of each function with a ``dry_run`` parameter, but a click command's (``@group.command``),
    which receives --dry-run: a library function learns of a dry run from its runner (``Runner.dry``)."""
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                a = node.args
                if "dry_run" in [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)] and not any(
                        isinstance(d, ast.Call) and getattr(d.func, "attr", None) == "command"
                        for d in node.decorator_list):
                    out.append(f"{path.relative_to(root).as_posix()}:{node.name}")
    return out


def test_no_library_function_takes_dry_run() -> None:
    """#39: a dry run is a recording runner, not a parameter."""
    assert dry_run_parameters(ROOT) == []


def test_the_dry_run_rule_sees_a_parameter_but_not_a_command(tmp_path: Path) -> None:
    (tmp_path / "porter").mkdir()
    (tmp_path / "porter" / "m.py").write_text(
        "def build(x, *, dry_run=False):\n    pass\n\n\n@group.command('apply')\ndef apply_cmd(dry_run):\n    pass\n")
    assert dry_run_parameters(tmp_path, ("porter",)) == ["porter/m.py:build"]
