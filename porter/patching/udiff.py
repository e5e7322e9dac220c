"""Plain unified diffs (the ``.patch`` files users bring), parsed and applied by context, not by line
number alone: each hunk is placed where its old lines match, nearest to the stated line first."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from porter.errors import ConfigError
from porter.patching.text import EditFailed, Lines, closest

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Hunk:
    old_start: int
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    old_no_newline: bool = False
    new_no_newline: bool = False


@dataclass
class FileDiff:
    old_path: str | None  # None: /dev/null (a new file)
    new_path: str | None  # None: /dev/null (a deleted file)
    hunks: list[Hunk] = field(default_factory=list)


class DiffError(ConfigError):
    """Text that is not a unified diff: porter's own refusal (a ConfigError, so a bad diff is bad input)."""


def _name(raw: str, strip: int | None) -> str | None:
    name = raw.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    if name.startswith('"') and name.endswith('"'):
        name = name[1:-1]
    parts = name.split("/")
    n = strip if strip is not None else (1 if parts[0] in ("a", "b") and len(parts) > 1 else 0)
    return "/".join(parts[n:])


def parse(text: str, strip: int | None = None) -> list[FileDiff]:
    files: list[FileDiff] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FileDiff(_name(line[4:], strip), _name(lines[i + 1][4:], strip)))
            i += 2
            continue
        m = _HUNK.match(line)
        if m:
            if not files:
                raise DiffError(f"hunk at diff line {i + 1} before any ---/+++ header")
            try:
                old_n, new_n = (int(count or 1) for count in m.group(2, 4))  # a count left out is 1
                hunk = Hunk(int(m.group(1)))
            except ValueError:  # a line number past Python's int-from-string limit (4300 digits)
                raise DiffError(f"hunk header at diff line {i + 1} has a line number too large to read") from None
            i += 1
            last = ""
            while i < len(lines) and (len(hunk.old) < old_n or len(hunk.new) < new_n or lines[i].startswith("\\")):
                body = lines[i]
                i += 1
                if body.startswith("\\"):  # "\ No newline at end of file": of the line before it
                    hunk.old_no_newline |= last in (" ", "-")
                    hunk.new_no_newline |= last in (" ", "+")
                    continue
                tag, content = (body[:1] or " "), body[1:]
                if tag not in " -+":
                    raise DiffError(f"unexpected line {i} in a hunk: {body[:60]!r}")
                if tag != "+":  # a context or removed line
                    hunk.old.append(content)
                if tag != "-":  # a context or added line
                    hunk.new.append(content)
                last = tag
            if len(hunk.old) != old_n or len(hunk.new) != new_n:
                raise DiffError(f"hunk at diff line {m.string!r} is truncated")
            files[-1].hunks.append(hunk)
            continue
        i += 1
    if not files:
        raise DiffError("no file headers (--- / +++) found: not a unified diff")
    return files


def _find(haystack: list[str], needle: list[str], near: int) -> int | None:
    if not needle:
        return min(max(near, 0), len(haystack))
    starts = [j for j in range(len(haystack) - len(needle) + 1) if haystack[j:j + len(needle)] == needle]
    return min(starts, key=lambda j: abs(j - near), default=None)


def apply_file(fd: FileDiff, lines: Lines | None) -> Lines | None:
    """Apply one file's hunks. Returns the new lines, or None for a deleted file."""
    if fd.old_path is None and lines is not None:  # (with the same content it is already applied: not tried)
        raise EditFailed("the diff creates this file, but it already exists with other content")
    if fd.old_path is not None and lines is None:
        raise EditFailed("file to patch does not exist")
    if fd.new_path is None:  # a deletion
        return None
    # a new file: its one hunk spliced into an empty file
    work = Lines(list(lines.text), list(lines.ends), lines.newline) if lines is not None else Lines([], [], "\n")
    offset = 0
    for hunk in fd.hunks:
        at = _find(work.text, hunk.old, hunk.old_start - 1 + offset)
        if at is None:
            anchor = next((h for h in hunk.old if h.strip()), "")
            best, line_no = closest(work.text, anchor) if anchor else ("", 0)
            raise EditFailed(f"hunk @@ -{hunk.old_start} @@ does not match", anchor=anchor,
                             closest=best, closest_line=line_no)
        offset = at - (hunk.old_start - 1) + len(hunk.new) - len(hunk.old)
        # apply now so later hunks are placed against the updated text
        at_end = at + len(hunk.old) == len(work.text)
        end_of_last = work.ends[-1] if at_end and work.ends else work.newline
        del work.text[at:at + len(hunk.old)]
        del work.ends[at:at + len(hunk.old)]
        work.insert(at, hunk.new)
        if at_end and hunk.new:  # the new last line ends as the diff says, else as the old last line did
            work.ends[-1] = "" if hunk.new_no_newline else work.newline if hunk.old_no_newline else end_of_last
    return work


def already_applied(fd: FileDiff, lines: Lines | None) -> bool:
    """True when every hunk's new lines are present and at least one old line sequence is not."""
    if fd.old_path is None:
        return lines is not None and lines.text == (fd.hunks[0].new if fd.hunks else [])
    if fd.new_path is None:
        return lines is None
    if lines is None:
        return False
    for hunk in fd.hunks:
        if hunk.old == hunk.new:
            continue
        if _find(lines.text, hunk.new, hunk.old_start - 1) is None:
            return False
        if _find(lines.text, hunk.old, hunk.old_start - 1) is not None and hunk.old:
            # old text still present too (e.g. a pure insertion whose context is also the result)
            if not set(hunk.old) <= set(hunk.new):
                return False
    return True
