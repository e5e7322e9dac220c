"""Apply, check and revert patch sets on a tree: all or nothing, idempotent, journaled, reversible, layered.

Every patch of every requested set is first applied in memory. A patch whose problem (``needed_if``) is
absent from a file is "not needed" there and leaves that file alone; that is reported, not an error.
Only when every needed edit succeeds are the files written (each atomically, original bytes kept under
``.porter/originals/``); the journal ``.porter/patches.json`` records sha256 before and after per file,
and a sequence number per file record, so it knows the order of the sets layered on one file. If anything
fails while writing, the files already written are put back, so the tree is byte-identical to before.

Layers: a set below another on the same file is intact when each later layer starts from the bytes the
one below left and the file holds what the top layer left. Reverting a lower set restores the bytes from
before it and re-applies the sets above it; when one of those cannot be re-applied, the revert is refused
and names it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import difflib
import itertools
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from porter import __version__
from porter.errors import CheckFailed, ConfigError, NothingToDo
from porter.fs import atomic_path, atomic_write_json, sha256_bytes
from porter.patching import udiff
from porter.patching.model import Patch, PatchSet, VersionSource, check_relpath, resolve_sets
from porter.patching.text import EditFailed, Lines, apply_edit

JOURNAL_DIR = ".porter"
JOURNAL = f"{JOURNAL_DIR}/patches.json"
ORIGINALS = f"{JOURNAL_DIR}/originals"
SCHEMA = "porter.patches/1"

Status = Literal["would-apply", "applied", "already", "not-needed", "skipped", "failed"]
"""One edit of one file: ``would-apply`` (planned, not written), ``applied`` (written), ``already`` (in place),
``not-needed`` (the patch's problem is absent there), ``skipped`` (outside a patch's version gate), ``failed``."""

WORDS: dict[str, str] = {"would-apply": "would apply", "applied": "applied", "already": "already applied",
                         "not-needed": "not needed here", "skipped": "skipped", "failed": "failed"}
RANK = ("failed", "would-apply", "applied", "already", "not-needed", "skipped")


class PatchFailed(CheckFailed):
    """One or more patches cannot be applied; nothing was written."""

    def __init__(self, message: str, failures: Sequence[PatchResult], *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.failures = tuple(failures)


@dataclass(frozen=True)
class PatchResult:
    set: str
    patch: str
    file: str
    status: Status
    edit: int = 0
    """1-based edit (or hunk file) number within the patch; 0 for the whole patch."""
    reason: str = ""
    anchor: str = ""
    closest: str = ""
    closest_line: int = 0
    evidence: str = ""
    """Where the patch's problem (``needed_if``) was found: ``line N: 'text'`` (with the file for globs)."""

    def describe(self) -> str:
        head = f"{self.set}: patch {self.patch!r}" + (f" edit {self.edit}" if self.edit else "")
        head += f", file {self.file}" if self.file else ""
        if self.status != "failed":
            return f"{head}: {WORDS[self.status]}" + (f" ({self.reason})" if self.reason else "")
        text = f"{head}: {self.reason}"
        if self.evidence:
            text += f"\n    problem: {self.evidence} (so the patch is needed)"
        if self.anchor:
            text += f"\n    anchor:  {self.anchor!r}"
        if self.closest:
            text += f"\n    closest: line {self.closest_line}: {self.closest.strip()!r}"
        elif self.anchor and self.reason == "anchor not found":
            text += "\n    closest: (no similar line)"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Every field that is set (``set``, ``patch``, ``file`` and ``status`` always)."""
        return {k: v for k, v in asdict(self).items() if v or k in ("set", "patch", "file", "status")}


@dataclass(frozen=True)
class FileChange:
    path: str
    before: bytes | None
    after: bytes | None
    mode: int | None

    def diff(self) -> str:
        a = self.before.decode("utf-8", "surrogateescape") if self.before is not None else ""
        b = self.after.decode("utf-8", "surrogateescape") if self.after is not None else ""
        out = difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                   "/dev/null" if self.before is None else f"a/{self.path}",
                                   "/dev/null" if self.after is None else f"b/{self.path}")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)


@dataclass(frozen=True)
class PatchRecord:
    """One patch a plan applies (or the tree's journal says was applied), as a wheel's manifest lists it."""

    set: str
    patch: str
    sha256: str
    """Of the patch's own data (:attr:`Patch.digest`)."""
    why: str
    files: tuple[tuple[str, str | None, str | None], ...] = ()
    """(file, sha256 before, sha256 after) per file this patch changed (None: no such file)."""
    earlier: bool = False
    """Applied before this plan, per the tree's journal: its files are the set's, not known per patch."""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"set": self.set, "id": self.patch, "sha256": self.sha256, "why": self.why,
                             "state": "applied-earlier" if self.earlier else "applied"}
        if not self.earlier:
            d["files"] = [{"path": f, "before": b, "after": a} for f, b, a in self.files]
        return d


@dataclass(frozen=True)
class SetPlan:
    ref: str
    origin: str
    digest: str
    version: str
    results: tuple[PatchResult, ...]
    changes: tuple[FileChange, ...]
    notes: tuple[str, ...] = ()
    """Facts worth a warning: a version outside the verified range, a version that could not be read."""
    journaled: bool = False
    """The journal records this set (same data) and its files are intact: nothing was re-planned."""
    applied: tuple[PatchRecord, ...] = ()
    """Each patch that changes a file (journaled: each patch the journal records as applied)."""

    @property
    def state(self) -> str:
        """``would fail``, ``would apply``, ``applied``, ``already in place`` (not by porter) or ``not needed``:
        by its most telling result (a journaled set's results are all ``already`` or ``not-needed``)."""
        top = "applied" if self.journaled else min((r.status for r in self.results), key=RANK.index, default="")
        return {"failed": "would fail", "would-apply": "would apply", "applied": "applied",
                "already": "already in place"}.get(top, "not needed")

    def patch_states(self) -> dict[str, str]:
        """Per patch id, its most telling status over all its files and edits (failed first)."""
        out: dict[str, str] = {}
        for r in self.results:
            out[r.patch] = min(out.get(r.patch, r.status), r.status, key=RANK.index)
        return out


@dataclass(frozen=True)
class Plan:
    tree: Path
    sets: tuple[SetPlan, ...]

    @property
    def failed(self) -> tuple[PatchResult, ...]:
        return tuple(r for s in self.sets for r in s.results if r.status == "failed")

    @property
    def changes(self) -> tuple[FileChange, ...]:
        """Net change per file across all sets (first before, last after)."""
        merged: dict[str, FileChange] = {}
        for s in self.sets:
            for c in s.changes:
                first = merged.get(c.path)
                merged[c.path] = replace(first, after=c.after) if first else c
        return tuple(merged.values())

    def diff(self) -> str:
        return "".join(c.diff() for c in self.changes)

    def records(self) -> list[dict[str, Any]]:
        """Every patch the plan applies (and every one the tree's journal says a set of it applied earlier), in
        order, with the sha256 of its data and of each file it changes before and after: what a wheel built
        from the patched tree carries in its manifest's ``sources.patches``."""
        return [p.to_dict() for s in self.sets for p in s.applied]

    def to_dict(self) -> dict[str, Any]:
        return {"tree": str(self.tree), "sets": [
            {"set": s.ref, "version": s.version, "origin": s.origin, "state": s.state, "notes": list(s.notes),
             "patches": s.patch_states(), "changed": [c.path for c in s.changes],
             "results": [r.to_dict() for r in s.results]}
            for s in self.sets]}


# --------------------------------------------------------------------------------------------
# paths

def tree_root(tree: str | os.PathLike[str]) -> Path:
    root = Path(tree)
    if not root.is_dir():
        raise ConfigError(f"tree not found or not a directory: {root}", hint="pass the source tree's top folder")
    return root.resolve()


def safe_path(root: Path, rel: str, where: str = "") -> tuple[str, Path]:
    """Resolve a tree-relative path; refuse anything (``..``, absolute, symlinks) leading outside."""
    rel = check_relpath(rel, where or "patch")
    real = (root / rel).resolve()
    if not real.is_relative_to(root):
        raise ConfigError(f"{where + ': ' if where else ''}{rel} leads outside the tree (resolves to {real})",
                          hint="porter never writes outside the tree; remove the symlink or fix the path")
    return real.relative_to(root).as_posix(), real


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a file") from None


def _sha(data: bytes | None) -> str | None:
    return sha256_bytes(data) if data is not None else None


@dataclass
class _Work:
    """The tree as a plan sees it: each file read once, then edited in memory."""

    root: Path
    state: dict[str, bytes | None] = field(default_factory=dict)
    modes: dict[str, int | None] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# versions

def detect_version(root: Path, sources: Iterable[VersionSource]) -> tuple[str, str] | None:
    """(version, file it came from), or None when no source file states one."""
    for src in sources:
        _, path = safe_path(root, src.file, "version_from")
        if not path.is_file():
            continue
        m = re.search(src.regex, path.read_text(encoding="utf-8", errors="replace"), re.MULTILINE)
        if m:
            groups = [g for g in m.groups() if g is not None] or [m.group(0)]
            return ".".join(g.strip() for g in groups), src.file
    return None


def _in_range(version: str, spec: str, strict: bool = True) -> bool | None:
    """Whether ``version`` is in ``spec``; when ``version`` is not a PEP 440 version: refused (``strict``) or None."""
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except ValueError:  # InvalidVersion, or a number past Python's int-from-string limit (4300 digits)
        if not strict:
            return None
        raise ConfigError(f"version {version!r} is not a PEP 440 version",
                          hint="pass --target-version with a version such as 0.19.8") from None


def set_version(root: Path, pset: PatchSet, target_version: str | None) -> tuple[str, list[str]]:
    """The version recorded for ``pset`` on this tree, and notes.

    A set whose every patch names its problem (``needed_if``) decides need by itself: its range is what it
    was verified on, so a version outside it, or none found, is a note, not an error. Other sets are gated:
    the tree's version (or ``target_version``) must be in their range.
    """
    gated = not pset.decides_need
    if target_version:
        _in_range(target_version, ">=0")  # validates it
        version, source = target_version, "--target-version"
    else:
        found = detect_version(root, pset.version_from)
        if found is None:
            files = ", ".join(s.file for s in pset.version_from)
            if gated and pset.versions:
                raise ConfigError(f"cannot read the {pset.project} version of {root} (looked in "
                                  f"{files or '(none declared)'})",
                                  hint=f"is this a {pset.project} tree? If it is, pass --target-version X")
            if gated or not pset.version_from:
                return "", []
            return "", [f"no {pset.project} version found in the tree (looked in {files}); "
                        "each patch decides by its needed_if whether it is needed"]
        version, source = found
    if not pset.versions:
        return version, []
    inside = _in_range(version, pset.versions, gated)
    if inside:
        return version, []
    if gated and target_version:
        raise ConfigError(f"{pset.ref} is for {pset.project} {pset.versions}; --target-version "
                          f"{target_version} is outside that range",
                          hint="pick a set for that version, or a version in the range")
    if gated:
        example = next((s.version for s in SpecifierSet(pset.versions) if s.operator in (">=", "==", "~=")), "X")
        raise ConfigError(f"{pset.ref} is for {pset.project} {pset.versions}, but the tree is version "
                          f"{version} (from {source})",
                          hint=f"use --target-version to apply it anyway (e.g. --target-version {example}) once "
                               "you have checked the patch fits")
    if inside is None:
        return version, [f"version {version!r} (from {source}) is not a PEP 440 version; "
                         "each patch decides by its needed_if whether it is needed"]
    return version, [f"{pset.ref} was verified on {pset.project} {pset.versions}; the tree is {version} "
                     f"(from {source}): each patch decides by its needed_if whether it is needed"]


# --------------------------------------------------------------------------------------------
# planning

def _evidence(pattern: re.Pattern[str], data: bytes | None) -> str:
    """``line N: 'text'`` of the line where ``pattern`` first matches; "" if it does not (or there is no file)."""
    if data is None:
        return ""
    text = data.decode("utf-8", "surrogateescape")
    m = pattern.search(text)
    if m is None:
        return ""
    number = text.count("\n", 0, m.start()) + 1
    line = text[text.rfind("\n", 0, m.start()) + 1:].partition("\n")[0]
    return f"line {number}: {line.strip()[:120]!r}"


def _glob_evidence(work: _Work, globs: Iterable[str], pattern: re.Pattern[str], where: str) -> str:
    """The first place, in the files ``needed_if.files`` selects, where the patch's problem shows."""
    for glob in globs:
        for path in sorted(work.root.glob(glob)):
            if not path.is_file():
                continue
            try:
                rel, real = safe_path(work.root, path.relative_to(work.root).as_posix(), where)
            except ConfigError:  # a symlink leading out of the tree: not the tree's evidence
                continue
            ev = _evidence(pattern, work.state[rel] if rel in work.state else _read(real))
            if ev:
                return f"{rel} {ev}"
    return ""


Step = tuple[int, bool | EditFailed]
"""One edit (or hunk file) tried on a file: its number, and whether it changed the file, or why it failed."""


def _try_file(patch: Patch, fd: udiff.FileDiff | None, n: int, lines: Lines | None) -> tuple[list[Step], Lines | None]:
    """The patch tried on one file's lines: its anchored edits in order (``lines`` edited in place), or part ``n`` of
    its diff, in place already or applied (its new lines; None: the diff deletes the file)."""
    if fd is not None:
        if udiff.already_applied(fd, lines):
            return [(n, False)], lines
        try:
            return [(n, True)], udiff.apply_file(fd, lines)
        except EditFailed as exc:
            return [(n, exc)], lines
    if lines is None:
        return [(0, EditFailed("file not found"))], None
    steps: list[Step] = []
    for i, edit in enumerate(patch.edits, 1):
        try:
            steps.append((i, apply_edit(edit, lines)))
        except EditFailed as exc:
            steps.append((i, exc))
    return steps, lines


def _plan_patch(work: _Work, pset: PatchSet, patch: Patch, only: set[str] | None = None) -> list[PatchResult]:
    """One patch on the in-memory tree, file by file. ``only``: restrict it to these files (re-applying on a
    revert)."""
    where = f"{pset.ref} patch {patch.id}"
    need = patch.needed_if
    pattern = re.compile(need.regex, re.MULTILINE) if need is not None else None
    # needed_if with files: the globs decide for the whole patch; without: each file for itself
    patch_evidence = _glob_evidence(work, need.files, pattern, where) if need and need.files and pattern else ""
    targets: list[tuple[int, str, udiff.FileDiff | None]] = [(0, name, None) for name in patch.files]
    if patch.kind == "diff":
        try:
            targets = [(n, fd.new_path or fd.old_path or "", fd) for n, fd in enumerate(udiff.parse(patch.diff,
                                                                                                     patch.strip), 1)]
        except udiff.DiffError as exc:
            return [PatchResult(pset.ref, patch.id, patch.diff_name, "failed", reason=f"bad diff: {exc}")]
    results: list[PatchResult] = []
    seen: set[str] = set()
    for n, name, fd in targets:
        rel, real = safe_path(work.root, name, where)
        if fd is None and rel in seen:  # a symlink alias of a file this patch already edits
            continue
        seen.add(rel)
        if only is not None and rel not in only:
            continue
        if rel not in work.state:  # read once, then edited in memory
            work.state[rel] = _read(real)
            work.modes[rel] = real.stat().st_mode & 0o7777 if work.state[rel] is not None else None
        data = work.state[rel]
        evidence = _evidence(pattern, data) if pattern is not None and need and not need.files else patch_evidence
        lines = Lines.parse(data.decode("utf-8", "surrogateescape")) if data is not None else None
        steps, new = _try_file(patch, fd, n, lines)
        trial = [PatchResult(pset.ref, patch.id, rel, "failed", edit=i, reason=step.reason, anchor=step.anchor,
                             closest=step.closest, closest_line=step.closest_line, evidence=evidence)
                 if isinstance(step, EditFailed) else
                 PatchResult(pset.ref, patch.id, rel, "would-apply" if step else "already", edit=i,
                             evidence=evidence if step else "") for i, step in steps]
        if need is not None and not evidence and not all(r.status == "already" for r in trial):
            # the problem is absent (and the fix is not what removed it): leave the file alone
            globs = f" in {', '.join(need.files)}" if need.files else ""
            why = ("file absent, so the problem is too" if not need.files and data is None
                   else f"problem not present: no match for needed_if {need.regex!r}{globs}")
            results.append(PatchResult(pset.ref, patch.id, rel, "not-needed", edit=n, reason=why))
            continue
        results.extend(trial)
        if any(step is True for _, step in steps):
            work.state[rel] = new.render().encode("utf-8", "surrogateescape") if new is not None else None
            if work.modes.get(rel) is None and new is not None:
                work.modes[rel] = 0o644
    return results


def _plan_set(work: _Work, pset: PatchSet, version: str,
              only: set[str] | None = None) -> tuple[list[PatchResult], list[str], list[PatchRecord]]:
    results: list[PatchResult] = []
    notes: list[str] = []
    applied: list[PatchRecord] = []
    for patch in pset.patches:
        gated = patch.needed_if is None
        inside = _in_range(version, patch.versions, gated) if patch.versions and version else True
        if gated and not inside:
            results.append(PatchResult(pset.ref, patch.id, "", "skipped",
                                       reason=f"for {pset.project} {patch.versions}, tree is {version}"))
            continue
        if inside is False and only is None:  # needed_if decides
            notes.append(f"patch {patch.id} was verified on {pset.project} {patch.versions}, the tree is "
                         f"{version}: its needed_if decides")
        seen = dict(work.state)
        results.extend(_plan_patch(work, pset, patch, only))
        files = tuple((rel, _sha(prev), _sha(data)) for rel, prev, data in _changed(work, seen))
        if files:
            applied.append(PatchRecord(pset.ref, patch.id, patch.digest, patch.why, files))
    return results, notes, applied


def _changed(work: _Work, before: dict[str, bytes | None]) -> list[tuple[str, bytes | None, bytes | None]]:
    """(file, bytes before, bytes now) per file whose bytes differ from ``before``, a snapshot of ``work.state``
    (a file not in it: as on disk)."""
    return [(rel, prev, data) for rel, data in work.state.items()
            if data != (prev := before[rel] if rel in before else _read(work.root / rel))]


def _check_target(work: _Work, pset: PatchSet) -> None:
    """Refuse a tree that holds none of the files a set edits: it is not the project's tree."""
    names = [f for p in pset.patches if p.kind == "edits" for f in p.files]
    for name in names:
        rel, real = safe_path(work.root, name, pset.ref)
        if (work.state[rel] is not None) if rel in work.state else real.is_file():
            return
    if names:
        shown = ", ".join(dict.fromkeys(names))
        raise ConfigError(f"none of the files {pset.ref} patches exists in {work.root} ({shown})",
                          hint=f"is this a {pset.project} tree? Pass its top folder")


def plan(tree: str | os.PathLike[str], sets: Sequence[PatchSet], *, target_version: str | None = None) -> Plan:
    """Apply ``sets`` in memory, in order; report every edit (would-apply / already / not-needed / skipped /
    failed). Nothing is written."""
    root, entries, layers = _journal(tree)
    work = _Work(root)
    set_plans: list[SetPlan] = []
    journal = {e["set"]: e for e in entries}
    for pset in sets:
        version, notes = set_version(root, pset, target_version)
        entry = journal.get(pset.ref)
        journaled = entry is not None and entry.get("digest") == pset.digest \
            and all(f.unchanged for f in _file_states(work, layers, entry))
        changes: tuple[FileChange, ...] = ()
        if entry is not None and journaled:
            results = [PatchResult(pset.ref, pid, "", "already" if key == "patches" else "not-needed",
                                   reason="recorded in the journal")
                       for key in ("patches", "not_needed") for pid in entry.get(key, [])]
            digests = {p.id: (p.digest, p.why) for p in pset.patches}
            applied = [PatchRecord(pset.ref, pid, *digests[pid], earlier=True)
                       for pid in entry.get("patches", []) if pid in digests]
        else:
            _check_target(work, pset)
            before = dict(work.state)
            results, more, applied = _plan_set(work, pset, version)
            notes += more
            changes = tuple(FileChange(rel, prev, data, work.modes.get(rel))
                            for rel, prev, data in _changed(work, before))
        set_plans.append(SetPlan(pset.ref, pset.origin, pset.digest, version, tuple(results), changes, tuple(notes),
                                 journaled, tuple(applied)))
    return Plan(root, tuple(set_plans))


def failure_message(failures: Sequence[PatchResult], head: str = "") -> str:
    head = head or f"{len(failures)} patch edit(s) cannot be applied; nothing was changed"
    return head + "\n" + "\n".join("  " + f.describe().replace("\n", "\n  ") for f in failures)


# --------------------------------------------------------------------------------------------
# journal and layers

def read_journal(tree: str | os.PathLike[str]) -> dict[str, Any]:
    path = tree_root(tree) / JOURNAL
    if not path.exists():
        return {"schema": SCHEMA, "sets": []}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"patch journal {path} is corrupt: {exc}",
                          hint="restore it from a backup; porter cannot revert without it") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("sets"), list):
        raise ConfigError(f"{path} is not a {SCHEMA} journal", hint="do not edit the journal by hand")
    return data


Layer = tuple[dict[str, Any], dict[str, Any]]
"""(journal entry of a set, its record of one file)."""


def _journal(tree: str | os.PathLike[str]) -> tuple[Path, list[dict[str, Any]], dict[str, list[Layer]]]:
    """The tree's root, its journal's entries and, per file, the sets that changed it, oldest first (by the
    record's ``seq``; older journals: entry order)."""
    root = tree_root(tree)
    d = root / JOURNAL_DIR
    if d.is_symlink() or (d.exists() and not d.resolve().is_relative_to(root)):
        raise ConfigError(f"{d} is a symlink; porter keeps its journal only in a real folder inside the tree",
                          hint=f"remove {d}")
    entries: list[dict[str, Any]] = read_journal(root)["sets"]
    out: dict[str, list[Layer]] = {}
    for entry in entries:
        for rec in entry["files"]:
            out.setdefault(rec["path"], []).append((entry, rec))
    # a stable sort: records with the same seq keep the journal's entry order
    return root, entries, {path: sorted(stack, key=lambda layer: int(layer[1].get("seq", 0)))
                           for path, stack in out.items()}


def _layer_state(layers: list[Layer], index: int, now: str | None) -> tuple[str, str]:
    """State of layer ``index`` of a file whose bytes now have sha256 ``now``: ``ok``, ``changed`` or
    ``missing``, and why. The sets above it count as porter's own edits, not as changes."""
    for j in range(index, len(layers) - 1):
        (low, low_rec), (high, high_rec) = layers[j], layers[j + 1]
        if high_rec.get("before") != low_rec.get("after"):
            return "changed", f"edited after {low['set']} was applied and before {high['set']} was"
    top, top_rec = layers[-1]
    if now != top_rec.get("after"):
        if now is None:
            return "missing", "the file is gone"
        return "changed", f"edited since {top['set']} was applied"
    return "ok", ""


@dataclass(frozen=True)
class FileState:
    path: str
    state: Literal["ok", "changed", "missing"]
    detail: str = ""
    below: tuple[str, ...] = ()
    """Sets applied earlier to this file."""
    above: tuple[str, ...] = ()
    """Sets applied later to this file (their edits are porter's, not changes)."""

    @property
    def unchanged(self) -> bool:
        return self.state == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "state": self.state, "unchanged": self.unchanged, **asdict(self)}


@dataclass(frozen=True)
class SetState:
    set: str
    version: str
    applied_at: str
    origin: str
    patches: tuple[str, ...]
    not_needed: tuple[str, ...]
    files: tuple[FileState, ...]

    @property
    def state(self) -> str:
        """``applied`` (every file as porter left it) or ``changed``."""
        return "applied" if all(f.unchanged for f in self.files) else "changed"

    def to_dict(self) -> dict[str, Any]:
        return {"set": self.set, "state": self.state, **asdict(self), "files": [f.to_dict() for f in self.files]}


def _file_states(work: _Work, layers: dict[str, list[Layer]], entry: dict[str, Any]) -> Iterator[FileState]:
    """Each file of the journal's ``entry``, its bytes as ``work`` holds them, and the sets below and above it."""
    for rec in entry["files"]:
        stack = layers[rec["path"]]
        index = next(i for i, (e, _) in enumerate(stack) if e is entry)
        rel, real = safe_path(work.root, rec["path"], "journal")
        state, detail = _layer_state(stack, index, _sha(work.state[rel] if rel in work.state else _read(real)))
        yield FileState(rec["path"], state, detail,  # type: ignore[arg-type]
                        tuple(e["set"] for e, _ in stack[:index]), tuple(e["set"] for e, _ in stack[index + 1:]))


def journal_status(tree: str | os.PathLike[str]) -> tuple[SetState, ...]:
    """Each applied set, oldest first, with each of its files' state, layers understood."""
    root, entries, layers = _journal(tree)
    work = _Work(root)
    return tuple(SetState(entry["set"], entry.get("version", ""), entry.get("applied_at", ""), entry.get("origin", ""),
                          tuple(entry.get("patches", [])), tuple(entry.get("not_needed", [])),
                          tuple(_file_states(work, layers, entry))) for entry in entries)


def _slug(ref: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", ref)


Write = tuple[str, bytes | None, int | None]
"""(tree-relative path, its new bytes (None: removed), mode)."""


def _commit(root: Path, writes: Iterable[Write], entries: list[dict[str, Any]]) -> None:
    """Make the ``writes`` of an apply or a revert, then the journal of ``entries`` (none: no journal), all or
    none: on an exception each written path gets back what was there before and the journal folders this
    created are removed."""
    created = [d for d in (root / JOURNAL_DIR, root / ORIGINALS) if not d.exists()]
    undo: list[tuple[Path, bytes | None, int | None]] = []
    try:
        for rel, data, mode in [*writes, (JOURNAL, None, None)]:
            path = root / rel
            old = _read(path)
            undo.append((path, old, path.stat().st_mode & 0o7777 if old is not None else None))
            if rel == JOURNAL and entries:
                atomic_write_json(path, {"schema": SCHEMA, "sets": entries})
            else:
                _write(path, data, mode)
    except BaseException:
        for path, data, mode in reversed(undo):
            with contextlib.suppress(OSError):
                _write(path, data, mode)
        for d in reversed(created):
            shutil.rmtree(d, ignore_errors=True)
        raise


def _write(path: Path, data: bytes | None, mode: int | None) -> None:
    if data is None:
        path.unlink(missing_ok=True)
        return
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
        os.chmod(tmp, mode if mode is not None else 0o644)


# --------------------------------------------------------------------------------------------
# apply

@dataclass(frozen=True)
class Applied:
    plan: Plan
    changed: tuple[str, ...]
    """Files written (tree-relative)."""


def checked(tree: str | os.PathLike[str], sets: Sequence[PatchSet], *, target_version: str | None = None) -> Plan:
    """The plan of ``sets`` on ``tree``, refused when a needed patch cannot be applied (a dry run of :func:`apply`:
    nothing is written, its results stay ``would-apply``)."""
    p = plan(tree, sets, target_version=target_version)
    if p.failed:
        raise PatchFailed(failure_message(p.failed), p.failed,
                          hint="the upstream file changed where the problem is present: update the anchor in "
                               "the set, or check the tree is the project and version the set is for")
    return p


def apply(tree: str | os.PathLike[str], sets: Sequence[PatchSet], *, target_version: str | None = None) -> Applied:
    """Apply all needed patches of ``sets`` or none. Returns the plan and the files written (none when
    already applied or not needed)."""
    p = checked(tree, sets, target_version=target_version)
    if not any(s.changes for s in p.sets):
        return Applied(p, ())
    root, entries, layers = _journal(p.tree)
    for sp in p.sets:  # a set cannot change a file again underneath a set applied on top of it there
        for c in sp.changes:
            stack = layers.get(c.path, [])
            mine = [i for i, (e, _) in enumerate(stack) if e["set"] == sp.ref]
            if mine and mine[-1] < len(stack) - 1:
                above = [e["set"] for e, _ in stack[mine[-1] + 1:]]
                raise CheckFailed(f"{sp.ref} would change {c.path} again, but {', '.join(above)} was applied on "
                                  "top of it there; nothing was changed",
                                  hint=f"revert the set(s) above first (porter patch revert {root} --set "
                                       f"{above[-1]}), then apply them again after {sp.ref}")
    seq = itertools.count(1 + max((int(rec.get("seq", 0)) for e in entries for rec in e["files"]), default=0))
    by_set = {e["set"]: e for e in entries}
    writes: list[Write] = []
    for sp in p.sets:
        if not sp.changes:
            continue
        entry = by_set.setdefault(sp.ref, {"set": sp.ref, "files": []})
        states = sp.patch_states()
        entry.update({"origin": sp.origin, "digest": sp.digest, "version": sp.version,
                      "applied_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                      "porter_version": __version__,
                      "patches": sorted(k for k, v in states.items() if v in ("would-apply", "already")),
                      "not_needed": sorted(k for k, v in states.items() if v == "not-needed")})
        known = {f["path"]: f for f in entry["files"]}
        for c in sp.changes:
            rec = known.get(c.path)
            if rec is None:
                backup = f"{ORIGINALS}/{_slug(sp.ref)}/{c.path}" if c.before is not None else None
                if backup is not None:
                    writes.append((backup, c.before, 0o644))
                rec = {"path": c.path, "before": _sha(c.before), "backup": backup, "mode": c.mode, "seq": next(seq)}
                entry["files"].append(rec)
            rec["after"] = _sha(c.after)
            writes.append((c.path, c.after, c.mode))
    _commit(root, writes, list(by_set.values()))
    done = tuple(replace(s, results=tuple(replace(r, status="applied") if r.status == "would-apply" else r
                                          for r in s.results)) for s in p.sets)  # its would-apply edits were written
    return Applied(replace(p, sets=done), tuple(c.path for c in p.changes))


# --------------------------------------------------------------------------------------------
# revert

@dataclass(frozen=True)
class Reverted:
    """What :func:`revert` writes (:func:`plan_revert`, a dry run, writes nothing)."""

    sets: tuple[str, ...]
    restored: tuple[str, ...]
    changes: tuple[FileChange, ...]
    forced: tuple[str, ...]
    reapplied: tuple[str, ...]
    """Sets applied on top of a reverted one on a shared file, re-applied there after the revert."""
    root: Path
    writes: list[Write]
    """The restored files and the re-applied sets' new backups."""
    keep: list[dict[str, Any]]
    """The journal's entries after the revert."""
    drop: list[str]
    """Backups no longer needed (tree-relative): the reverted sets' folders, the re-applied sets' stale ones."""

    def diff(self) -> str:
        return "".join(c.diff() for c in self.changes)


SetLoader = Callable[[dict[str, Any]], "PatchSet | None"]


def load_recorded(entry: dict[str, Any]) -> PatchSet | None:
    """The set a journal entry records, when porter can still load it with the very data it applied."""
    origin = entry.get("origin", "shipped")
    try:  # a shipped set by its name, a user's by its file
        pset = resolve_sets(entry["set"] if origin == "shipped" else origin)[0]
    except ConfigError:
        return None
    return pset if pset.digest == entry.get("digest") else None


def _backup(root: Path, rel: str, rec: dict[str, Any]) -> bytes | None:
    """The bytes a journal record saved from before its set (None: its set created the file)."""
    if rec["before"] is None:
        return None
    _, backup = safe_path(root, rec["backup"], "journal backup")
    original = _read(backup)
    if original is None or sha256_bytes(original) != rec["before"]:
        raise CheckFailed(f"the saved original of {rel} ({rec['backup']}) is missing or damaged",
                          hint="restore the file from version control; the journal cannot")
    return original


def plan_revert(tree: str | os.PathLike[str], refs: Sequence[str] | None = None, *, force: bool = False,
                load_set: SetLoader | None = None) -> Reverted:
    """What restoring the bytes from before the named sets (default: all) writes, on every file they changed.

    On a file where another set was applied on top of a reverted one, that set is re-applied (loaded by
    ``load_set``, default: from where the journal says it came, with the same data) on the restored bytes, and
    its journal record and backup follow the new bytes. When it cannot be loaded or no longer applies, the error
    names it.
    """
    root, entries, layers = _journal(tree)
    chosen = _chosen(root, entries, refs)
    chosen_ids = {id(e) for e in chosen}
    chosen_names = ", ".join(e["set"] for e in chosen)
    loader = load_set or load_recorded
    loaded: dict[int, PatchSet] = {}
    changes: list[FileChange] = []
    writes: list[Write] = []
    drop = [f"{ORIGINALS}/{_slug(e['set'])}" for e in chosen]
    forced: list[str] = []
    reapplied: dict[str, None] = {}
    for path in dict.fromkeys(rec["path"] for e in reversed(chosen) for rec in e["files"]):
        rel, real = safe_path(root, path, "journal")
        stack = layers[path]
        now = _read(real)
        top, top_rec = stack[-1]
        if _sha(now) != top_rec.get("after"):
            if not force:
                raise CheckFailed(
                    f"{rel} changed since {top['set']} was applied (sha256 {_short(_sha(now))}, journal says "
                    f"{_short(top_rec.get('after'))}); not reverting anything",
                    hint="keep your edits and revert by hand, or pass --force to restore the original anyway "
                         "(your later edits to that file are lost)")
            forced.append(rel)
        low = min(i for i, (e, _) in enumerate(stack) if id(e) in chosen_ids)
        data = _backup(root, rel, stack[low][1])
        mode = stack[low][1].get("mode")
        for entry, rec in stack[low + 1:]:
            if id(entry) in chosen_ids:
                continue
            before, data = data, _reapply(root, rel, entry, data, mode, loader, loaded, chosen_names)
            reapplied[entry["set"]] = None
            backup = f"{ORIGINALS}/{_slug(entry['set'])}/{path}" if before is not None and before != data else None
            drop += [rec["backup"]] if backup is None and rec.get("backup") else []
            if before == data:  # no longer changes this file: it is not a layer there any more
                entry["files"].remove(rec)
                continue
            if backup is not None:
                writes.append((backup, before, 0o644))
            rec.update({"before": _sha(before), "after": _sha(data), "backup": backup})
        changes.append(FileChange(rel, now, data, None))
        writes.append((rel, data, mode))
    return Reverted(tuple(e["set"] for e in reversed(chosen)), tuple(c.path for c in changes), tuple(changes),
                    tuple(forced), tuple(reapplied), root, writes, [e for e in entries if id(e) not in chosen_ids],
                    drop)


def revert(tree: str | os.PathLike[str], refs: Sequence[str] | None = None, *, force: bool = False,
           load_set: SetLoader | None = None) -> Reverted:
    """Restore the bytes from before the named sets (:func:`plan_revert`); when a step fails, nothing is changed."""
    done = plan_revert(tree, refs, force=force, load_set=load_set)
    _commit(done.root, done.writes, done.keep)
    for rel in done.drop:
        if (done.root / rel).is_dir():
            shutil.rmtree(done.root / rel, ignore_errors=True)
        else:
            (done.root / rel).unlink(missing_ok=True)
    for sub in (done.root / ORIGINALS, done.root / JOURNAL_DIR):  # when nothing is left in them
        with contextlib.suppress(OSError):
            sub.rmdir()
    return done


def _chosen(root: Path, entries: list[dict[str, Any]], refs: Sequence[str] | None) -> list[dict[str, Any]]:
    """The journal's entries of the sets ``refs`` names (a project name: all its sets; none: every set)."""
    names = [e["set"] for e in entries]

    def hit(name: str, ref: str) -> bool:
        return name == ref or name.startswith(ref.rstrip("/") + "/")

    missing = [r for r in refs or () if not any(hit(n, r) for n in names)]
    if missing:
        raise ConfigError(f"set {missing[0]} is not applied to {root}",
                          hint=f"applied sets: {', '.join(names) or '(none)'}")
    chosen = [e for e in entries if not refs or any(hit(e["set"], r) for r in refs)]
    if not chosen:
        raise NothingToDo(f"no patch sets are applied to {root}", hint="nothing to revert")
    return chosen


def _reapply(root: Path, rel: str, entry: dict[str, Any], data: bytes | None, mode: int | None,
             loader: SetLoader, loaded: dict[int, PatchSet], reverting: str) -> bytes | None:
    """Re-apply the set of ``entry`` to one file whose bytes are now ``data``; its new bytes."""
    ref = entry["set"]
    hint = (f"revert it too (porter patch revert {root} --set {ref} --set {reverting.split(', ')[0]}), "
            f"then apply {ref} again if you want it")
    pset = loaded.get(id(entry)) or loader(entry)
    if pset is None:
        raise CheckFailed(f"cannot revert {reverting} alone: {ref} was applied on top of it on {rel}, and porter "
                          f"cannot load {ref} as it was applied (its set data changed or its file is gone); "
                          "nothing was changed", hint=hint)
    loaded[id(entry)] = pset
    work = _Work(root, state={rel: data}, modes={rel: mode})
    results, _, _ = _plan_set(work, pset, entry.get("version", ""), only={rel})
    failures = [r for r in results if r.status == "failed"]
    if failures:
        raise CheckFailed(failure_message(failures, f"cannot revert {reverting} alone: {ref}, applied on top of it "
                                                    f"on {rel}, does not apply without it; nothing was changed"),
                          hint=hint)
    return work.state[rel]


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "(no file)"

