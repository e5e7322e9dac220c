"""A text file as lines with their own endings, so CRLF files and files with no trailing newline
keep their form, and the anchored edits that work on it."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from porter.patching.model import Edit


@dataclass(eq=False)
class EditFailed(Exception):
    """An edit cannot be applied; the engine adds the patch id and file."""

    reason: str
    anchor: str = ""
    closest: str = ""
    closest_line: int = 0


@dataclass
class Lines:
    """Line contents plus each line's ending (``\\n``, ``\\r\\n`` or ``""`` for a last line without one)."""

    text: list[str]
    ends: list[str]
    newline: str

    @classmethod
    def parse(cls, data: str) -> Lines:
        text: list[str] = []
        ends: list[str] = []
        for raw in data.splitlines(keepends=True):
            end = "\r\n" if raw.endswith("\r\n") else "\n" if raw.endswith("\n") else ""
            text.append(raw[:len(raw) - len(end)])
            ends.append(end)
        crlf = ends.count("\r\n")
        newline = "\r\n" if crlf and crlf >= ends.count("\n") else "\n"
        return cls(text, ends, newline)

    def render(self) -> str:
        return "".join(t + e for t, e in zip(self.text, self.ends))

    def insert(self, index: int, new: list[str]) -> None:
        """Insert ``new`` lines before line ``index`` (``len`` appends), with the file's newline."""
        if not new:
            return
        ends = [self.newline] * len(new)
        if index == len(self.text) and self.ends and self.ends[-1] == "":
            # appending after a last line that has no newline: it gets one, the new last line has none
            self.ends[-1] = self.newline
            ends[-1] = ""
        self.text[index:index] = new
        self.ends[index:index] = ends

    def delete(self, index: int) -> None:
        last_without_newline = index == len(self.text) - 1 and self.ends[index] == ""
        del self.text[index]
        del self.ends[index]
        if last_without_newline and self.ends:
            self.ends[-1] = ""


def closest(lines: list[str], needle: str) -> tuple[str, int]:
    """The line most like ``needle`` (difflib ratio), and its 1-based number; ("", 0) if none."""
    best, best_i, best_r = "", 0, 0.0
    matcher = difflib.SequenceMatcher(b=needle.strip(), autojunk=False)
    for i, line in enumerate(lines):
        s = line.strip()
        if not s:
            continue
        matcher.set_seq1(s)
        if matcher.real_quick_ratio() <= best_r or matcher.quick_ratio() <= best_r:
            continue
        r = matcher.ratio()
        if r > best_r:
            best, best_i, best_r = line, i + 1, r
    return best, best_i


def _already(edit: Edit, lines: Lines, hits: list[int]) -> bool | None:
    """True when the edit's result is already in place, False when it is not, None when unclear."""
    if edit.applied_if:
        return re.search(edit.applied_if, lines.render(), re.MULTILINE) is not None
    new = edit.text.splitlines()  # a trailing newline in the TOML text ends the last line
    if edit.action in ("insert_before", "insert_after") and hits:  # the new lines just before or after each hit
        at = 1 if edit.action == "insert_after" else -len(new)
        return all(i + at >= 0 and lines.text[i + at:i + at + len(new)] == new for i in hits)
    if edit.action == "replace" and not hits and edit.text and not edit.regex and "\n" not in edit.text:
        # the anchor is gone and exactly ``count`` lines carry the replacement (else use applied_if)
        return sum(edit.text in line for line in lines.text) == edit.count
    return None


def apply_edit(edit: Edit, lines: Lines) -> bool:
    """Apply one edit in place. Returns False when it was already applied (nothing changed)."""
    pattern = re.compile(edit.anchor if edit.regex else re.escape(edit.anchor))
    hits = [i for i, line in enumerate(lines.text) if pattern.search(line)]
    if _already(edit, lines, hits):
        return False
    if len(hits) != edit.count:
        if not hits:
            best, at = closest(lines.text, edit.anchor)
            raise EditFailed("anchor not found", anchor=edit.anchor, closest=best, closest_line=at)
        where = ", ".join(str(i + 1) for i in hits[:8])
        raise EditFailed(f"anchor matched {len(hits)} lines (expected {edit.count}) at line(s) {where}",
                         anchor=edit.anchor)
    new = edit.text.splitlines()
    for i in reversed(hits):
        if edit.action in ("insert_before", "insert_after"):
            lines.insert(i + 1 if edit.action == "insert_after" else i, new)
        elif edit.action == "delete":
            lines.delete(i)
        else:  # a regex's replacement may use its groups; a literal anchor's text is taken as it is
            line = lines.text[i]
            value = pattern.sub(edit.text, line) if edit.regex else line.replace(edit.anchor, edit.text)
            pieces = value.split("\n")
            lines.text[i:i + 1] = pieces
            # a multi-line replacement: the extra lines take the file's newline, the last keeps the line's own
            lines.ends[i:i + 1] = [lines.newline] * (len(pieces) - 1) + [lines.ends[i]]
    return True
