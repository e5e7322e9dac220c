"""Reading an upstream build script without running it: a tiny evaluator of its list and string values.

setup.py scripts and op builders declare what they compile as Python: list literals, ``+`` of lists,
``os.path.join(this_dir, "csrc")``, ``Path(this_dir) / "csrc"``, f-strings with an ``os.environ.get``
default, and ``if`` statements on the platform. Running them needs the project's torch (and, for ROCm
trees, a ROCm torch, which exists nowhere here), so porter reads them: :func:`run` executes the
assignments, ``+=``, ``if`` and ``return`` of a block with a :class:`Scope`, whose ``truth`` hook decides
the conditions porter knows (the ROCm branch is taken, the CUDA branch is not, a flag asked for is
present) and whose ``call`` hook answers the calls it knows. Anything else is *unknown*: dropped from the
list it was in and recorded in :attr:`Scope.skipped`, so a plan can say what it did not read.
"""

from __future__ import annotations

import ast
import operator
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

ROOT = "\0root"
"""The value of the tree's own folder (``this_dir``): ``os.path.join(ROOT, "csrc")`` is ``csrc``."""


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()

@dataclass
class Scope:
    names: dict[str, Any] = field(default_factory=dict)
    truth: Callable[[ast.expr, Scope], bool | None] = lambda node, scope: None
    call: Callable[[ast.Call, Scope], Any] = lambda node, scope: UNKNOWN
    skipped: list[str] = field(default_factory=list)
    """Source snippets porter could not evaluate (for the plan's notes)."""
    source: str = ""
    fixed: frozenset[str] = frozenset()
    """Names whose seeded value porter decides (``IS_ROCM``, ``this_dir``): the script's own assignments
    to them are ignored."""

    def skip(self, node: ast.AST) -> Any:
        text = ast.get_source_segment(self.source, node) if self.source else None
        self.skipped.append((text or ast.dump(node))[:120])
        return UNKNOWN


def dotted(node: ast.AST) -> str:
    """``os.path.join`` for an attribute chain of names; '' otherwise."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _join(parts: Sequence[Any]) -> Any:
    if any(not isinstance(p, str) for p in parts):
        return UNKNOWN
    kept = [p for p in parts if p != ROOT]
    if not kept:
        return ROOT
    return os.path.join(*kept) if parts[0] == ROOT else (
        os.path.join(*parts) if ROOT not in parts else UNKNOWN)


def value(node: ast.expr | None, scope: Scope) -> Any:
    """The value of an expression, or UNKNOWN. Lists keep their known items (the others are skipped)."""
    if node is None:
        return UNKNOWN
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        out: list[Any] = []
        for elt in node.elts:
            starred = isinstance(elt, ast.Starred)
            v = value(elt.value if isinstance(elt, ast.Starred) else elt, scope)
            if starred and isinstance(v, list):
                out += v
            elif starred or v is UNKNOWN:
                scope.skip(elt)
            else:
                out.append(v)
        return out
    if isinstance(node, ast.Dict):
        return {value(k, scope): value(v, scope) for k, v in zip(node.keys, node.values) if k is not None}
    if isinstance(node, ast.Name):
        return scope.names.get(node.id, UNKNOWN)
    if isinstance(node, ast.JoinedStr):
        text = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                text += str(part.value)
            elif isinstance(part, ast.FormattedValue):
                v = value(part.value, scope)
                if v is UNKNOWN or v == ROOT:
                    return UNKNOWN
                text += str(v)
        return text
    if isinstance(node, ast.BinOp):
        left, right = value(node.left, scope), value(node.right, scope)
        if isinstance(node.op, ast.Add):
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(left, list) and right is UNKNOWN:
                scope.skip(node.right)
                return left
            if left is UNKNOWN and isinstance(right, list):
                scope.skip(node.left)
                return right
            return (left + right if isinstance(left, str) and isinstance(right, str) and ROOT not in (left, right)
                    else UNKNOWN)
        return _join([left, right]) if isinstance(node.op, ast.Div) else UNKNOWN  # pathlib: Path(this_dir) / "csrc"
    if isinstance(node, ast.IfExp):
        t = truth_of(node.test, scope)
        return UNKNOWN if t is None else value(node.body if t else node.orelse, scope)
    if isinstance(node, ast.Call):
        name = dotted(node.func)
        if name in ("os.path.join", "path.join"):
            return _join([value(a, scope) for a in node.args])
        if name in ("Path", "pathlib.Path") and len(node.args) == 1:
            return value(node.args[0], scope)
        if name in ("os.environ.get", "os.getenv", "environ.get") and len(node.args) == 2:
            # porter never takes a build knob from its own environment: the script's default applies
            return value(node.args[1], scope)
        if name in ("str",) and len(node.args) == 1:
            v = value(node.args[0], scope)
            return str(v) if v is not UNKNOWN and v != ROOT else UNKNOWN
        return scope.call(node, scope)
    return UNKNOWN


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge}


def compare(node: ast.Compare, scope: Scope) -> bool | None:
    """A comparison of values porter knows (numbers, strings, lists, versions); None otherwise."""
    left = value(node.left, scope)
    for op, right_node in zip(node.ops, node.comparators):
        right = value(right_node, scope)
        fn = _COMPARE.get(type(op))
        if fn is None or left is UNKNOWN or right is UNKNOWN or ROOT in (left, right):
            return None
        try:
            if not fn(left, right):
                return False
        except TypeError:
            return None
        left = right
    return True


def truth_of(node: ast.expr, scope: Scope) -> bool | None:
    """``and`` / ``or`` / ``not`` around the scope's own truth hook, then comparisons of known values."""
    if isinstance(node, ast.BoolOp):
        parts = [truth_of(v, scope) for v in node.values]
        if isinstance(node.op, ast.And):
            return False if False in parts else (None if None in parts else True)
        return True if True in parts else (None if None in parts else False)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        t = truth_of(node.operand, scope)
        return None if t is None else not t
    t = scope.truth(node, scope)
    if t is None and isinstance(node, ast.Compare):
        return compare(node, scope)
    if t is None and isinstance(node, ast.Name) and isinstance(scope.names.get(node.id), bool):
        return bool(scope.names[node.id])
    return t


def terminates(block: Sequence[ast.stmt]) -> bool:
    """A block that always ends the script or function: ``raise``, ``sys.exit(...)``, ``exit(...)``."""
    last = block[-1] if block else None
    return isinstance(last, ast.Raise) or (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
                                           and dotted(last.value.func) in ("sys.exit", "exit", "quit"))


def branch(st: ast.If, scope: Scope) -> bool | None:
    """Whether an ``if`` takes its body (False: its ``else``; None: not known). A guard (one branch always ends the
    script) leaves the other branch unconditional."""
    t = truth_of(st.test, scope)
    return terminates(st.orelse) if t is None and terminates(st.body) != terminates(st.orelse) else t


def run(body: Sequence[ast.stmt], scope: Scope) -> Any:
    """Execute assignments, ``+=``, ``if`` and ``return`` (value, or None when the block does not return)."""
    for st in body:
        if isinstance(st, (ast.Assign, ast.AnnAssign)) and st.value is not None:
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id not in scope.fixed:
                scope.names[targets[0].id] = value(st.value, scope)
        elif (isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name) and isinstance(st.op, ast.Add)
              and st.target.id not in scope.fixed):
            old = scope.names.get(st.target.id, UNKNOWN)
            new = value(st.value, scope)
            if isinstance(old, list) and isinstance(new, list):
                scope.names[st.target.id] = old + new
            elif isinstance(new, list) and old is UNKNOWN:
                scope.names[st.target.id] = new  # what came before is not known: keep what is
            elif isinstance(old, list):
                scope.skip(st)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            scope.call(st.value, scope)  # a call the hook knows (a generator run, ...); others do nothing
        elif isinstance(st, ast.If):
            t = branch(st, scope)
            if t is None:
                scope.skip(st.test)
                continue
            r = run(st.body if t else st.orelse, scope)
            if r is not None:
                return r
        elif isinstance(st, ast.Return):
            return value(st.value, scope)
    return None


def strings(v: Any) -> list[str]:
    """The strings of a value (a list of them, or one), ROOT-relative paths kept as is."""
    items = [v] if isinstance(v, str) else v if isinstance(v, list) else []
    return [x if x != ROOT else "." for x in items if isinstance(x, str)]


def assigns(body: Sequence[ast.stmt]) -> dict[str, ast.expr]:
    """The ``NAME = value`` statements of a block (a class's attributes), name -> value expression."""
    return {st.targets[0].id: st.value for st in body
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)}


def parse(text: str, where: str) -> ast.Module:
    from porter.errors import ConfigError

    try:
        return ast.parse(text, where)
    except SyntaxError as exc:
        raise ConfigError(f"{where}: cannot parse ({exc.msg}, line {exc.lineno})") from None
