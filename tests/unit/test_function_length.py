"""#39's guard on function size: no function in porter/ or ops_prebuild/ over 80 lines (decorators included).

The functions still longer than that are listed with their length at the time: a ratchet. One of them may shrink but
not grow; once it is 80 lines or fewer it must leave the list (the test says so), and no other may join it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

LIMIT = 80
STILL_LONG = {  # to be split by the one-build-flow restructure (#39)
    "porter/cluster/slurm/matrix.py:load_matrix": 171,
}


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


def ratchet(found: dict[str, int], allowed: dict[str, int]) -> list[str]:
    """What breaks the rule: a new long function, a listed one grown, a listed one no longer long."""
    bad = [f"{k}: {n} lines (limit {LIMIT})" for k, n in found.items() if k not in allowed]
    bad += [f"{k}: grew from {allowed[k]} to {n} lines" for k, n in found.items() if k in allowed and n > allowed[k]]
    bad += [f"{k}: now {LIMIT} lines or fewer: take it off STILL_LONG" for k in allowed if k not in found]
    return bad


def test_no_function_grows_past_80_lines() -> None:
    assert ratchet(long_functions(ROOT), STILL_LONG) == []


def test_the_length_rule_sees_a_new_long_function_and_a_grown_one(tmp_path: Path) -> None:
    pkg = tmp_path / "porter"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT))
    (pkg / "m.py").write_text(f"@decorator\ndef long_one():\n{body}\n\ndef short():\n    return 1\n")
    found = long_functions(tmp_path, ("porter",))
    assert found == {"porter/m.py:long_one": LIMIT + 2}
    assert ratchet(found, {}) == [f"porter/m.py:long_one: {LIMIT + 2} lines (limit {LIMIT})"]
    assert ratchet(found, {"porter/m.py:long_one": LIMIT + 1}) == [
        f"porter/m.py:long_one: grew from {LIMIT + 1} to {LIMIT + 2} lines"]
    assert ratchet({}, {"porter/m.py:long_one": 90}) == [
        f"porter/m.py:long_one: now {LIMIT} lines or fewer: take it off STILL_LONG"]


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
