"""The cluster layer and the audit ask components (capabilities: MatrixBuild, JitSites, ...); they spell no project's
name in their code (docstrings may tell the story)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = re.compile(r"deepspeed|megatron|apex|flash[-_ ]?attn|flashattention|aws-ofi|ds_config", re.I)
KEPT_CLEAN = ("porter/cluster", "porter/install/audit.py")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of every docstring constant: a module's, a class's, a function's, and an attribute's."""
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
        for prev, cur in zip(body, body[1:]):
            if isinstance(prev, (ast.Assign, ast.AnnAssign)) and isinstance(cur, ast.Expr) \
                    and isinstance(cur.value, ast.Constant):
                out.add(id(cur.value))
    return out


def project_names(text: str) -> list[tuple[int, str]]:
    """(line, string) of each string in the code that names a project."""
    tree = ast.parse(text)
    docs = _docstrings(tree)
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs and NAMES.search(n.value)]


def test_the_cluster_layer_and_the_audit_name_no_project() -> None:
    files = [p for part in KEPT_CLEAN for p in ([ROOT / part] if part.endswith(".py")
                                                 else sorted((ROOT / part).rglob("*.py")))]
    assert len(files) > 10
    found = {f"{p.relative_to(ROOT)}:{line}": s for p in files for line, s in project_names(p.read_text())}
    assert found == {}


def test_a_planted_name_is_caught_and_a_docstring_is_not() -> None:
    text = ('"""Builds DeepSpeed."""\n'
            'X = 1\n"""apex: the attribute\'s docstring."""\n'
            'def f():\n    """Megatron."""\n    return ["--deepspeed_config", f"{X} flash-attn"]\n')
    assert [s for _, s in project_names(text)] == ["--deepspeed_config", " flash-attn"]
