"""Scanners over hipified text: CUDA APIs left without a HIP equivalent, and warp-size-32 assumptions.

Both run on the text with comments and string literals blanked (same length, newlines kept), so
positions are the output file's line and column (1-based), and a CUDA name in a comment is not a
finding. ``#include`` lines are kept as written.

Only names from CUDA's own headers are CUDA API (the map's ``[unsupported]`` patterns and names
say which): a name the tree defines itself -- a macro, a type, a function with a body, a variable
-- never is, in the file that defines it or in any other (the caller drops it everywhere).

A warp-size-32 assumption in a branch that is not compiled for ROCm (``#ifdef __HIP_PLATFORM_AMD__`` ...
``#else`` here ``#endif``, ``#if !defined(USE_ROCM)``, a conjunction with such a term) is not a finding: no
64-lane code is made from it. Other conditions count as compiled.

A 32-bit full mask bound to a name (``unsigned mask = 0xffffffff`` as a parameter default or a
variable, ``#define FULL_MASK 0xffffffff``) is flagged only while the name is still used after the
translation: once porter's map has dropped the mask argument of every ``__shfl_*_sync`` call that
took it, the binding is dead code and not a finding.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from porter.hipify.maps import CompiledMap, Rule, left_boundary_ok

# Part of the incremental cache key: bump when the scanners' results change for the same text.
SCAN_VERSION = 3

FULL_MASK_RULE = "full-mask"

_MASK_RE = re.compile(r"""(\#[ \t]*include[^\n]*)|//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""",
                      re.DOTALL)
_NOT_NEWLINE = re.compile(r"[^\n]")
# What precedes a name on its line when the line defines it (a macro, type or alias of the tree's
# own): such a name is never reported as an unsupported CUDA API, here or in any other file.
_DEFINES_BEFORE = re.compile(r"(?:#[ \t]*define|\bstruct|\bclass|\bunion|\benum|\busing|\btypedef\b.*)[ \t]+$")
# Words after a function's parameter list and before its body.
_QUALIFIER = re.compile(r"(?:const|volatile|noexcept|override|final|mutable|throw|__attribute__|__restrict__|"
                        r"__restrict|__host__|__device__)\b|&&|&")
# A word that can precede a name in an expression, not a type: `return cudaFoo;` uses cudaFoo.
_NOT_A_TYPE = frozenset({"return", "case", "goto", "else", "do", "new", "delete", "throw", "sizeof", "alignof",
                         "typeid", "co_return", "co_yield", "co_await", "not", "and", "or", "xor", "bitand",
                         "bitor", "compl", "operator", "typename", "template", "if", "while", "for", "switch"})
_WORD_BEFORE = re.compile(r"([A-Za-z_]\w*)[ \t]+$")
_PREPROCESSOR_LINE = re.compile(r"^[ \t]*#[ \t]*(\w*)[^\n]*", re.MULTILINE)
_DEFINE_HEAD = re.compile(r"#[ \t]*define[ \t]+\w+")
_MACRO_BINDING = re.compile(r"[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t(]*$")
_VAR_BINDING = re.compile(r"([A-Za-z_]\w*)\s*(?:\[[^\]\n]*\]\s*)?(?:=|\{)\s*\(?\s*$")
# What precedes a `{` that opens no function body: names declared inside are seen by other code.
_BLOCK_NOT_LOCAL = re.compile(r"(?:\bnamespace(?:\s+[\w:]+)?|\b(?:struct|class|union|enum)\b[^;{}()]*|\bextern\s*|=)"
                              r"\s*$")
_SCAN_LIMIT = 20000  # characters looked at for a parameter list, a body or a block


@dataclass(frozen=True)
class Finding:
    """One report line: ``path:line:column: identifier: message``."""

    kind: str        # "unsupported" | "warp32"
    path: str        # POSIX path relative to the tree root
    line: int
    column: int
    identifier: str  # the CUDA name (unsupported) or the rule id (warp32)
    message: str     # the hint (unsupported) or what is assumed (warp32)
    text: str        # the source line, stripped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.identifier}: {self.message}"


@dataclass
class ScanResult:
    """What one file contributes to the report; the last two fields are settled tree-wide."""

    unsupported: list[Finding] = field(default_factory=list)
    warp32: list[Finding] = field(default_factory=list)
    # Candidate CUDA-looking names this file defines itself: never CUDA API, in any file.
    defines: set[str] = field(default_factory=set)
    # Full-mask findings on a name this file binds but no longer uses (``#define FULL_MASK ...``):
    # kept only if another file of the tree uses the name (see :func:`uses_name`).
    pending_masks: list[tuple[str, Finding]] = field(default_factory=list)


def mask(text: str) -> str:
    """Blank comments and string/char literals (keeping length and newlines); keep #include lines."""
    def repl(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return m.group(0)
        s = m.group(0)
        return " " * len(s) if "\n" not in s else _NOT_NEWLINE.sub(" ", s)

    return _MASK_RE.sub(repl, text)


def uses_view(masked: str) -> str:
    """``masked`` where only uses of names are left: preprocessor lines other than ``#define`` are
    blanked (``#ifndef FULL_MASK`` is no use of FULL_MASK), and so is each ``#define NAME`` head
    (the macro's body stays: a macro that uses a name is a use)."""
    def repl(m: re.Match[str]) -> str:
        line = m.group(0)
        if m.group(1) == "define":
            head = _DEFINE_HEAD.search(line)
            if head is not None:
                return line[:head.start()] + " " * (head.end() - head.start()) + line[head.end():]
        return " " * len(line)

    return _PREPROCESSOR_LINE.sub(repl, masked)


# Macros every ROCm build of a torch extension defines (torch's cpp_extension, hipcc): a branch decided by one of
# them alone is known to be compiled, or not, for ROCm.
_HIP_MACROS = frozenset({"__HIP_PLATFORM_AMD__", "__HIP_PLATFORM_HCC__", "USE_ROCM"})
_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b([^\n]*)", re.MULTILINE)
_TERM = re.compile(r"^(!?)\s*(?:defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)|(\w+))$")


def _on_hip(directive: str, cond: str) -> bool | None:
    """Whether a conditional's condition holds in a ROCm build: True, False, or None (not known here)."""
    cond = cond.strip()
    if directive in ("ifdef", "ifndef"):
        name = cond.split()[0] if cond.split() else ""
        return None if name not in _HIP_MACROS else directive == "ifdef"
    for op, short in (("&&", False), ("||", True)):
        if op in cond and ("&&" in cond) != ("||" in cond):
            values = [_on_hip("if", term) for term in cond.split(op)]
            return short if short in values else (not short if all(v is not None for v in values) else None)
    while cond.startswith("(") and _close(cond, 0, "(", ")") == len(cond) - 1:  # one pair around it all
        cond = cond[1:-1].strip()
    m = _TERM.match(cond)
    if m is None or (m.group(2) or m.group(3) or m.group(4)) not in _HIP_MACROS:
        return None
    return not m.group(1)


def not_on_hip(masked: str) -> list[tuple[int, int]]:
    """The spans of ``masked`` in a branch no ROCm build compiles (see the module docstring)."""
    spans: list[tuple[int, int]] = []
    frames: list[list[bool | None]] = []  # per open conditional: the value of each branch so far
    dead_from: int | None = None

    def dead() -> bool:
        return any(f[-1] is False for f in frames)

    for m in _CONDITIONAL.finditer(masked):
        directive, cond = m.group(1), m.group(2)
        was = dead()
        if directive in ("if", "ifdef", "ifndef"):
            frames.append([_on_hip(directive, cond)])
        elif not frames:
            continue
        elif directive == "endif":
            frames.pop()
        else:
            branches = frames[-1]
            if True in branches:
                branches.append(False)
            elif directive == "else":
                branches.append(True if all(b is False for b in branches) else None)
            else:
                branches.append(_on_hip("if", cond) if all(b is False for b in branches) else None)
        now = dead()
        if now and not was:
            dead_from = m.end()
        elif was and not now and dead_from is not None:
            spans.append((dead_from, m.start()))
    if dead() and dead_from is not None:
        spans.append((dead_from, len(masked)))
    return spans


def _locate(text: str, starts: list[int], pos: int) -> tuple[int, int, str]:
    """Line and column (1-based) of ``pos`` and its line, stripped; ``starts``: where each line of ``text`` starts."""
    i = bisect.bisect_right(starts, pos) - 1
    end = text.find("\n", starts[i])
    return i + 1, pos - starts[i] + 1, text[starts[i]:end if end >= 0 else len(text)].strip()


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _close(masked: str, open_pos: int, opener: str, closer: str) -> int:
    """Index of the bracket closing the one at ``open_pos`` (comments and strings are blanked), or -1."""
    depth = 0
    for i in range(open_pos, min(len(masked), open_pos + _SCAN_LIMIT)):
        c = masked[i]
        if c == opener:
            depth += 1
        elif c == closer:
            depth -= 1
            if depth == 0:
                return i
        elif c in ";{}" and opener == "<":
            return -1
    return -1


def _after_declarator(masked: str, close: int) -> int:
    """Index of the first character after a parameter list's ``)`` and the qualifiers that may
    follow it (const, noexcept(...), __attribute__((...)), a trailing return type)."""
    i = close + 1
    n = len(masked)
    while i < n:
        i = _skip_ws(masked, i)
        q = _QUALIFIER.match(masked, i)
        if q is not None:
            i = q.end()
            j = _skip_ws(masked, i)
            if j < n and masked[j] == "(" and q.group(0) in ("noexcept", "throw", "__attribute__"):
                k = _close(masked, j, "(", ")")
                if k < 0:
                    return n
                i = k + 1
            continue
        if masked.startswith("->", i):  # trailing return type: up to the body or the end of the declaration
            depth = 0
            i += 2
            while i < n:
                c = masked[i]
                if c in "(<":
                    depth += 1
                elif c in ")>":
                    depth -= 1
                elif depth <= 0 and c in "{;":
                    return i
                i += 1
            return n
        return i
    return n


def _defined_here(masked: str, start: int, end: int) -> bool:
    """Whether the name at ``masked[start:end]`` is defined here: a macro, type or alias (by what
    precedes it on its line), a function with a body, or a variable."""
    line_start = masked.rfind("\n", 0, start) + 1
    if _DEFINES_BEFORE.search(masked, line_start, start):
        return True
    i = _skip_ws(masked, end)
    if i < len(masked) and masked[i] == "<":  # explicit template arguments: cuFoo<float>(...) { ... }
        k = _close(masked, i, "<", ">")
        if k > 0:
            i = _skip_ws(masked, k + 1)
    if i < len(masked) and masked[i] == "(":
        k = _close(masked, i, "(", ")")
        if k < 0:
            return False
        j = _after_declarator(masked, k)
        return j < len(masked) and masked[j] == "{"
    # A variable: `int cuCount = 0;`, `__shared__ float cuBuf[32];` -- a type name before it.
    if i < len(masked) and masked[i] in "=;[" and not masked.startswith("==", i):
        before = _WORD_BEFORE.search(masked, line_start, start)
        return before is not None and before.group(1) not in _NOT_A_TYPE
    return False


def _innermost_opener(masked: str, pos: int) -> int:
    """Index of the innermost ``(`` or ``{`` still open at ``pos``, or -1 at file scope."""
    depth = {"(": 0, "{": 0}  # closed before pos, per kind
    lo = max(0, pos - 4 * _SCAN_LIMIT)
    for i in range(pos - 1, lo - 1, -1):
        c = masked[i]
        if c in ")}":
            depth["(" if c == ")" else "{"] += 1
        elif c in "({":
            if depth[c] == 0:
                return i
            depth[c] -= 1
    return -1


def uses_name(text: str, name: str) -> bool:
    """Whether hipified ``text`` uses ``name`` (outside comments, strings, #define heads and
    #if/#ifdef/#undef lines)."""
    return name in text and _used(uses_view(mask(text)), name, 0, len(text), -1)


def _used(code: str, name: str, start: int, end: int, skip: int) -> bool:
    return any(start + m.start() != skip for m in re.finditer(rf"\b{re.escape(name)}\b", code[start:end]))


def _mask_binding(masked: str, code: str, pos: int) -> tuple[str, str] | None:
    """How the full mask at ``pos`` is bound and whether the binding is still used.

    Returns None when the literal must be flagged (used as such, or bound to a name still in use),
    ``("dead", name)`` when its binding is no longer used anywhere it could be, and
    ``("tree", name)`` when only other files could use it (a macro, or an upper-case name at file
    scope); lower-case names at file scope are flagged, as other files' uses are not looked for.
    """
    macro = _MACRO_BINDING.match(masked, masked.rfind("\n", 0, pos) + 1, pos)
    var = macro or _VAR_BINDING.search(masked, max(0, pos - 200), pos)
    if var is None:
        return None
    name, npos = var.group(1), var.start(1)
    opener = -1 if macro else _innermost_opener(masked, npos)
    if opener >= 0 and masked[opener] == "(":
        # A parameter's default (or a for/if initialiser): the parentheses and the body after them.
        close = _close(masked, opener, "(", ")")
        if close < 0:
            return None
        body = _after_declarator(masked, close)
        if body >= len(masked) or masked[body] != "{":
            return None  # a declaration: the definition may use it
        start, end = opener, _close(masked, body, "{", "}")
    elif opener >= 0 and not _BLOCK_NOT_LOCAL.search(masked, max(0, opener - 200), opener):
        # A variable in a function body (or a block inside one): the rest of the block.
        start, end = pos, _close(masked, opener, "{", "}")
    else:
        # A macro, or file, namespace or class scope: any use in this file; other files only know upper-case names.
        return None if _used(code, name, 0, len(code), npos) or not name.isupper() else ("tree", name)
    if end < 0:
        return None
    return None if _used(code, name, start, end, npos) else ("dead", name)


def scan(text: str, path: str, cmap: CompiledMap) -> ScanResult:
    """Unsupported-API and warp32 findings of one hipified file (see the module docstring)."""
    masked = mask(text)
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    result = ScanResult()
    hits: dict[int, tuple[str, str]] = {}
    if cmap.names_re is not None:
        for m in cmap.names_re.finditer(masked):
            hint = cmap.unsupported_names.get(m.group(0))
            if hint is not None and left_boundary_ok(masked, m.start()):
                hits[m.start()] = (m.group(0), hint)
    for rx, boundary, hint in cmap.unsupported_res:
        for m in rx.finditer(masked):
            if m.start() not in hits and (not boundary or left_boundary_ok(masked, m.start())):
                hits[m.start()] = (m.group(0), hint)
    for pos in sorted(hits):
        ident, hint = hits[pos]
        if _defined_here(masked, pos, pos + len(ident)):
            result.defines.add(ident)
            continue
        line, col, src = _locate(text, starts, pos)
        result.unsupported.append(Finding("unsupported", path, line, col, ident, hint, src))

    if not cmap.warp_rules or not cmap.is_warp_code(masked):
        return result
    candidates: list[tuple[int, Rule]] = []
    for r in cmap.warp_rules:
        for m in r.rx.finditer(masked):
            pos = m.start()
            if r.boundary and not left_boundary_ok(masked, pos):
                continue
            if r.context is not None:
                start = masked.rfind("\n", 0, pos) + 1
                end = masked.find("\n", pos)
                if not r.context.search(masked, start, end if end >= 0 else len(masked)):
                    continue
            while pos > 0 and (masked[pos].isalnum() or masked[pos] == "_") and not left_boundary_ok(masked, pos):
                pos -= 1  # a match inside a name (kWarpSize, WARP_SHFL) is reported at the name
            candidates.append((pos, r))
    code = uses_view(masked) if candidates else masked
    skipped = not_on_hip(masked) if candidates else []
    for pos, r in sorted(candidates, key=lambda c: c[0]):
        if any(a <= pos < b for a, b in skipped):
            continue
        line, col, src = _locate(text, starts, pos)
        finding = Finding("warp32", path, line, col, r.rule.id, r.rule.message, src)
        if r.rule.id == FULL_MASK_RULE:
            binding = _mask_binding(masked, code, pos)
            if binding is not None:
                if binding[0] == "tree":
                    result.pending_masks.append((binding[1], finding))
                continue
        result.warp32.append(finding)
    return result
