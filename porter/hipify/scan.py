"""Scanners over hipified text: CUDA APIs left without a HIP equivalent, and warp-size-32 assumptions.

Both run on the text with comments and string literals blanked (same length, newlines kept), so
positions are the output file's line and column (1-based), and a CUDA name in a comment is not a
finding. ``#include`` lines are kept as written.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from porter.hipify.maps import CompiledMap, left_boundary_ok

_MASK_RE = re.compile(r"""(\#[ \t]*include[^\n]*)|//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'""",
                      re.DOTALL)
_NOT_NEWLINE = re.compile(r"[^\n]")
# What precedes a name on its line when the line defines it (a macro, type or alias of the tree's
# own): such a name is never reported as an unsupported CUDA API, here or in any other file.
_DEFINES_BEFORE = re.compile(r"(?:#[ \t]*define|\bstruct|\bclass|\bunion|\benum|\busing|\btypedef\b.*)[ \t]+$")


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

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "path": self.path, "line": self.line, "column": self.column,
                "identifier": self.identifier, "message": self.message, "text": self.text}

    @staticmethod
    def from_dict(d: dict[str, object]) -> Finding:
        return Finding(kind=str(d["kind"]), path=str(d["path"]), line=int(d["line"]),  # type: ignore[call-overload]
                       column=int(d["column"]), identifier=str(d["identifier"]),  # type: ignore[call-overload]
                       message=str(d["message"]), text=str(d["text"]))

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: {self.identifier}: {self.message}"


def mask(text: str) -> str:
    """Blank comments and string/char literals (keeping length and newlines); keep #include lines."""
    def repl(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return m.group(0)
        s = m.group(0)
        return " " * len(s) if "\n" not in s else _NOT_NEWLINE.sub(" ", s)

    return _MASK_RE.sub(repl, text)


class _Lines:
    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def locate(self, pos: int) -> tuple[int, int, str]:
        i = bisect.bisect_right(self.starts, pos) - 1
        start = self.starts[i]
        end = self.text.find("\n", start)
        return i + 1, pos - start + 1, self.text[start:end if end >= 0 else len(self.text)].strip()


def scan(text: str, path: str, cmap: CompiledMap, masked: str | None = None,
         defines: set[str] | None = None) -> tuple[list[Finding], list[Finding]]:
    """(unsupported, warp32) findings of one hipified file.

    Candidate names this file defines itself (``#define cudaCheck``, ``struct cudaThing``) are added
    to ``defines`` instead of being reported; the caller drops them from every file's findings.
    """
    masked = mask(text) if masked is None else masked
    lines = _Lines(text)
    unsupported: list[Finding] = []
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
        line_start = masked.rfind("\n", 0, pos) + 1
        if _DEFINES_BEFORE.search(masked, line_start, pos):
            if defines is not None:
                defines.add(ident)
            continue
        line, col, src = lines.locate(pos)
        unsupported.append(Finding("unsupported", path, line, col, ident, hint, src))
    warp: list[Finding] = []
    if cmap.warp_rules and (cmap.warp_file_re is None or cmap.warp_file_re.search(masked)):
        for r in cmap.warp_rules:
            for m in r.rx.finditer(masked):
                if r.boundary and not left_boundary_ok(masked, m.start()):
                    continue
                line, col, src = lines.locate(m.start())
                if r.context is not None:
                    start = masked.rfind("\n", 0, m.start()) + 1
                    end = masked.find("\n", m.start())
                    if not r.context.search(masked, start, end if end >= 0 else len(masked)):
                        continue
                warp.append(Finding("warp32", path, line, col, r.rule.id, r.rule.message, src))
        warp.sort(key=lambda f: (f.line, f.column))
    return unsupported, warp
