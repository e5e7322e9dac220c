"""Apply, check and revert patch sets on a tree: all or nothing, idempotent, journaled, reversible.

Every patch of every requested set is first applied in memory. Only when all of them succeed are the
files written (each atomically, original bytes kept under ``.porter/originals/``), and the journal
``.porter/patches.json`` records sha256 before and after per file. If anything fails while writing, the
files already written are put back, so the tree is byte-identical to before.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from porter import __version__
from porter.errors import CheckFailed, ConfigError, PorterError
from porter.fs import atomic_path, atomic_write_json, sha256_bytes
from porter.patching import udiff
from porter.patching.model import Patch, PatchSet, VersionSource, check_relpath
from porter.patching.text import EditFailed, Lines, apply_edit

JOURNAL_DIR = ".porter"
JOURNAL = f"{JOURNAL_DIR}/patches.json"
ORIGINALS = f"{JOURNAL_DIR}/originals"
SCHEMA = "porter.patches/1"

Status = Literal["applied", "already", "skipped", "failed"]


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

    def describe(self) -> str:
        head = f"{self.set}: patch {self.patch!r}" + (f" edit {self.edit}" if self.edit else "")
        head += f", file {self.file}" if self.file else ""
        if self.status != "failed":
            return f"{head}: {self.status}" + (f" ({self.reason})" if self.reason else "")
        text = f"{head}: {self.reason}"
        if self.anchor:
            text += f"\n    anchor:  {self.anchor!r}"
        if self.closest:
            text += f"\n    closest: line {self.closest_line}: {self.closest.strip()!r}"
        elif self.anchor and self.reason == "anchor not found":
            text += "\n    closest: (no similar line)"
        return text

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"set": self.set, "patch": self.patch, "file": self.file, "status": self.status}
        for key in ("edit", "reason", "anchor", "closest", "closest_line"):
            if getattr(self, key):
                d[key] = getattr(self, key)
        return d


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
        lines = []
        for line in out:
            if not line.endswith("\n"):
                line += "\n\\ No newline at end of file\n"
            lines.append(line)
        return "".join(lines)


@dataclass(frozen=True)
class SetPlan:
    ref: str
    origin: str
    digest: str
    version: str
    results: tuple[PatchResult, ...]
    changes: tuple[FileChange, ...]

    @property
    def failed(self) -> tuple[PatchResult, ...]:
        return tuple(r for r in self.results if r.status == "failed")


@dataclass(frozen=True)
class Plan:
    tree: Path
    sets: tuple[SetPlan, ...]

    @property
    def failed(self) -> tuple[PatchResult, ...]:
        return tuple(r for s in self.sets for r in s.failed)

    @property
    def changes(self) -> tuple[FileChange, ...]:
        """Net change per file across all sets (first before, last after)."""
        merged: dict[str, FileChange] = {}
        for s in self.sets:
            for c in s.changes:
                first = merged.get(c.path)
                merged[c.path] = FileChange(c.path, first.before if first else c.before, c.after,
                                            first.mode if first else c.mode)
        return tuple(merged.values())

    def diff(self) -> str:
        return "".join(c.diff() for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {"tree": str(self.tree), "sets": [
            {"set": s.ref, "version": s.version, "origin": s.origin,
             "changed": [c.path for c in s.changes], "results": [r.to_dict() for r in s.results]}
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
    full = root / rel
    real = full.resolve()
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


def _decode(data: bytes) -> Lines:
    return Lines.parse(data.decode("utf-8", "surrogateescape"))


def _encode(lines: Lines) -> bytes:
    return lines.render().encode("utf-8", "surrogateescape")


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


def _in_range(version: str, spec: str) -> bool:
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        raise ConfigError(f"version {version!r} is not a PEP 440 version",
                          hint="pass --target-version with a version such as 0.19.8") from None


def resolve_version(root: Path, pset: PatchSet, target_version: str | None) -> str:
    if target_version:
        _in_range(target_version, ">=0")  # validates it
        if pset.versions and not _in_range(target_version, pset.versions):
            raise ConfigError(f"{pset.ref} is for {pset.project} {pset.versions}; --target-version "
                              f"{target_version} is outside that range",
                              hint="pick a set for that version, or a version in the range")
        return target_version
    found = detect_version(root, pset.version_from)
    if found is None:
        if not pset.versions:
            return ""
        files = ", ".join(s.file for s in pset.version_from) or "(none declared)"
        raise ConfigError(f"cannot read the {pset.project} version of {root} (looked in {files})",
                          hint=f"is this a {pset.project} tree? If it is, pass --target-version X")
    version, source = found
    if pset.versions and not _in_range(version, pset.versions):
        raise ConfigError(f"{pset.ref} is for {pset.project} {pset.versions}, but the tree is version "
                          f"{version} (from {source})",
                          hint=f"use --target-version to apply it anyway (e.g. --target-version "
                               f"{_example(pset.versions)}) once you have checked the patch fits")
    return version


def _example(spec: str) -> str:
    for s in SpecifierSet(spec):
        if s.operator in (">=", "==", "~="):
            return s.version
    return "X"


# --------------------------------------------------------------------------------------------
# planning

def _plan_patch(root: Path, pset: PatchSet, patch: Patch, state: dict[str, bytes | None],
                modes: dict[str, int | None]) -> list[PatchResult]:
    results: list[PatchResult] = []

    def load(rel: str, real: Path) -> bytes | None:
        if rel not in state:
            state[rel] = _read(real)
            modes[rel] = real.stat().st_mode & 0o7777 if state[rel] is not None else None
        return state[rel]

    if patch.kind == "diff":
        try:
            files = udiff.parse(patch.diff, patch.strip)
        except udiff.DiffError as exc:
            return [PatchResult(pset.ref, patch.id, patch.diff_name, "failed", reason=f"bad diff: {exc}")]
        for n, fd in enumerate(files, 1):
            rel, real = safe_path(root, fd.path, f"{pset.ref} patch {patch.id}")
            data = load(rel, real)
            lines = _decode(data) if data is not None else None
            if udiff.already_applied(fd, lines):
                results.append(PatchResult(pset.ref, patch.id, rel, "already", edit=n))
                continue
            try:
                new, _ = udiff.apply_file(fd, lines)
            except EditFailed as exc:
                results.append(PatchResult(pset.ref, patch.id, rel, "failed", edit=n, reason=exc.reason,
                                           anchor=exc.anchor, closest=exc.closest, closest_line=exc.closest_line))
                continue
            state[rel] = _encode(new) if new is not None else None
            if modes.get(rel) is None and new is not None:
                modes[rel] = 0o644
            results.append(PatchResult(pset.ref, patch.id, rel, "applied", edit=n))
        return results

    seen: set[str] = set()
    for name in patch.files:
        rel, real = safe_path(root, name, f"{pset.ref} patch {patch.id}")
        if rel in seen:  # a symlink alias of a file this patch already edits
            continue
        seen.add(rel)
        data = load(rel, real)
        if data is None:
            results.append(PatchResult(pset.ref, patch.id, rel, "failed", reason="file not found"))
            continue
        lines = _decode(data)
        changed = False
        for n, edit in enumerate(patch.edits, 1):
            try:
                did = apply_edit(edit, lines)
            except EditFailed as exc:
                results.append(PatchResult(pset.ref, patch.id, rel, "failed", edit=n, reason=exc.reason,
                                           anchor=exc.anchor, closest=exc.closest, closest_line=exc.closest_line))
                continue
            changed = changed or did
            results.append(PatchResult(pset.ref, patch.id, rel, "applied" if did else "already", edit=n))
        if changed:
            state[rel] = _encode(lines)
    return results


def plan(tree: str | os.PathLike[str], sets: Sequence[PatchSet], *, target_version: str | None = None) -> Plan:
    """Apply ``sets`` in memory, in order; report every edit (applied / already / skipped / failed)."""
    root = tree_root(tree)
    _check_journal_dir(root)
    state: dict[str, bytes | None] = {}
    modes: dict[str, int | None] = {}
    set_plans: list[SetPlan] = []
    journal = {e["set"]: e for e in read_journal(root)["sets"]}
    for pset in sets:
        version = resolve_version(root, pset, target_version)
        entry = journal.get(pset.ref)
        if entry is not None and entry.get("digest") == pset.digest and _matches_after(root, entry, state):
            results_j = tuple(PatchResult(pset.ref, pid, "", "already", reason="recorded in the journal")
                              for pid in entry.get("patches", []))
            set_plans.append(SetPlan(pset.ref, pset.origin, pset.digest, version, results_j, ()))
            continue
        before = dict(state)
        results: list[PatchResult] = []
        for patch in pset.patches:
            if patch.versions and version and not _in_range(version, patch.versions):
                results.append(PatchResult(pset.ref, patch.id, "", "skipped",
                                           reason=f"for {pset.project} {patch.versions}, tree is {version}"))
                continue
            results.extend(_plan_patch(root, pset, patch, state, modes))
        changes = []
        for rel, data in state.items():
            prev = before[rel] if rel in before else _read(root / rel)
            if data != prev:
                changes.append(FileChange(rel, prev, data, modes.get(rel)))
        set_plans.append(SetPlan(pset.ref, pset.origin, pset.digest, version, tuple(results), tuple(changes)))
    return Plan(root, tuple(set_plans))


def _matches_after(root: Path, entry: dict[str, Any], state: dict[str, bytes | None]) -> bool:
    """Every file the journal entry changed still has the bytes it had right after applying."""
    for rec in entry.get("files", []):
        rel, real = safe_path(root, rec["path"], "journal")
        data = state[rel] if rel in state else _read(real)
        if (sha256_bytes(data) if data is not None else None) != rec.get("after"):
            return False
    return True


def _check_journal_dir(root: Path) -> None:
    d = root / JOURNAL_DIR
    if d.is_symlink() or (d.exists() and not d.resolve().is_relative_to(root)):
        raise ConfigError(f"{d} is a symlink; porter keeps its journal only in a real folder inside the tree",
                          hint=f"remove {d}")


def failure_message(failures: Sequence[PatchResult]) -> str:
    head = f"{len(failures)} patch edit(s) cannot be applied; nothing was changed"
    return head + "\n" + "\n".join("  " + f.describe().replace("\n", "\n  ") for f in failures)


# --------------------------------------------------------------------------------------------
# journal

def read_journal(tree: str | os.PathLike[str]) -> dict[str, Any]:
    root = tree_root(tree)
    path = root / JOURNAL
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


def _slug(ref: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", ref)


@dataclass
class _Txn:
    """File writes that can be undone: each write remembers what was there before."""

    root: Path
    undo: list[tuple[Path, bytes | None, int | None]] = field(default_factory=list)

    def write(self, path: Path, data: bytes | None, mode: int | None) -> None:
        old = _read(path)
        old_mode = path.stat().st_mode & 0o7777 if old is not None else None
        self.undo.append((path, old, old_mode))
        _write(path, data, mode)

    def rollback(self) -> None:
        for path, data, mode in reversed(self.undo):
            try:
                _write(path, data, mode)
            except OSError:
                pass


def _write(path: Path, data: bytes | None, mode: int | None) -> None:
    if data is None:
        path.unlink(missing_ok=True)
        return
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
        os.chmod(tmp, mode if mode is not None else 0o644)


def _cleanup_journal_dir(root: Path) -> None:
    d = root / JOURNAL_DIR
    for sub in (root / ORIGINALS, d):
        try:
            sub.rmdir()
        except OSError:
            pass


@dataclass(frozen=True)
class Applied:
    plan: Plan
    changed: tuple[str, ...]
    """Files written (tree-relative)."""


def apply(tree: str | os.PathLike[str], sets: Sequence[PatchSet], *, target_version: str | None = None,
          dry_run: bool = False) -> Applied:
    """Apply all ``sets`` or none. Returns the plan and the files written (none when already applied)."""
    p = plan(tree, sets, target_version=target_version)
    if p.failed:
        raise PatchFailed(failure_message(p.failed), p.failed,
                          hint="the upstream file changed: update the anchor in the set, or check the tree "
                               "is the project and version the set is for")
    if dry_run or not any(s.changes for s in p.sets):
        return Applied(p, ())
    root = p.tree
    journal = read_journal(root)
    entries: list[dict[str, Any]] = journal["sets"]
    txn = _Txn(root)
    created_dirs = [d for d in (root / JOURNAL_DIR, root / ORIGINALS) if not d.exists()]
    try:
        for sp in p.sets:
            if not sp.changes:
                continue
            entry = next((e for e in entries if e["set"] == sp.ref), None)
            if entry is None:
                entry = {"set": sp.ref, "files": []}
                entries.append(entry)
            entry.update({"origin": sp.origin, "digest": sp.digest, "version": sp.version,
                          "applied_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                          "porter_version": __version__,
                          "patches": sorted({r.patch for r in sp.results if r.status in ("applied", "already")})})
            known = {f["path"]: f for f in entry["files"]}
            for c in sp.changes:
                rec = known.get(c.path)
                if rec is None:
                    backup = None
                    if c.before is not None:
                        backup = f"{ORIGINALS}/{_slug(sp.ref)}/{c.path}"
                        txn.write(root / backup, c.before, 0o644)
                    rec = {"path": c.path, "before": sha256_bytes(c.before) if c.before is not None else None,
                           "backup": backup, "mode": c.mode}
                    entry["files"].append(rec)
                rec["after"] = sha256_bytes(c.after) if c.after is not None else None
                (root / c.path).parent.mkdir(parents=True, exist_ok=True)
                txn.write(root / c.path, c.after, c.mode)
        with_journal = {"schema": SCHEMA, "sets": entries}
        txn.undo.append((root / JOURNAL, _read(root / JOURNAL), 0o644))
        atomic_write_json(root / JOURNAL, with_journal)
    except BaseException:
        txn.rollback()
        for d in reversed(created_dirs):
            shutil.rmtree(d, ignore_errors=True)
        raise
    return Applied(p, tuple(c.path for c in p.changes))


# --------------------------------------------------------------------------------------------
# revert

@dataclass(frozen=True)
class Reverted:
    sets: tuple[str, ...]
    restored: tuple[str, ...]
    changes: tuple[FileChange, ...]
    forced: tuple[str, ...] = ()

    def diff(self) -> str:
        return "".join(c.diff() for c in self.changes)


def revert(tree: str | os.PathLike[str], refs: Sequence[str] | None = None, *, force: bool = False,
           dry_run: bool = False) -> Reverted:
    """Restore the original bytes of every file the named sets (default: all) changed, newest first."""
    root = tree_root(tree)
    _check_journal_dir(root)
    journal = read_journal(root)
    entries: list[dict[str, Any]] = journal["sets"]
    if refs:
        names = [e["set"] for e in entries]

        def hit(name: str, ref: str) -> bool:  # a project name selects all its sets
            return name == ref or name.startswith(ref.rstrip("/") + "/")

        missing = [r for r in refs if not any(hit(n, r) for n in names)]
        if missing:
            raise ConfigError(f"set {missing[0]} is not applied to {root}",
                              hint=f"applied sets: {', '.join(names) or '(none)'}")
        chosen = [e for e in entries if any(hit(e["set"], r) for r in refs)]
    else:
        chosen = list(entries)
    if not chosen:
        from porter.errors import NothingToDo

        raise NothingToDo(f"no patch sets are applied to {root}", hint="nothing to revert")
    # newest first; for each file the oldest chosen entry's original is what ends up restored
    restore: dict[str, tuple[bytes | None, int | None]] = {}
    changes: dict[str, FileChange] = {}
    forced: list[str] = []
    current: dict[str, bytes | None] = {}
    for entry in reversed(chosen):
        for rec in entry["files"]:
            rel, real = safe_path(root, rec["path"], f"journal entry {entry['set']}")
            if rel not in current:
                current[rel] = _read(real)
                now = current[rel]
                now_sha = sha256_bytes(now) if now is not None else None
                if now_sha != rec["after"]:
                    if not force:
                        raise CheckFailed(
                            f"{rel} changed since {entry['set']} was applied (sha256 {_short(now_sha)}, "
                            f"journal says {_short(rec['after'])}); not reverting anything",
                            hint="keep your edits and revert by hand, or pass --force to restore the "
                                 "original anyway (your later edits to that file are lost)")
                    forced.append(rel)
            original: bytes | None = None
            if rec["before"] is not None:
                _, backup = safe_path(root, rec["backup"], "journal backup")
                original = _read(backup)
                if original is None or sha256_bytes(original) != rec["before"]:
                    raise CheckFailed(f"the saved original of {rel} ({rec['backup']}) is missing or damaged",
                                      hint="restore the file from version control; the journal cannot")
            restore[rel] = (original, rec.get("mode"))
    for rel, (data, _) in restore.items():
        changes[rel] = FileChange(rel, current[rel], data, None)
    reverted_refs = tuple(e["set"] for e in reversed(chosen))
    if dry_run:
        return Reverted(reverted_refs, tuple(restore), tuple(changes.values()), tuple(forced))
    txn = _Txn(root)
    keep = [e for e in entries if e not in chosen]
    try:
        for rel, (data, mode) in restore.items():
            txn.write(root / rel, data, mode)
        if keep:
            txn.undo.append((root / JOURNAL, _read(root / JOURNAL), 0o644))
            atomic_write_json(root / JOURNAL, {"schema": SCHEMA, "sets": keep})
        else:
            txn.write(root / JOURNAL, None, None)
    except BaseException:
        txn.rollback()
        raise
    for e in chosen:
        shutil.rmtree(root / ORIGINALS / _slug(e["set"]), ignore_errors=True)
    _cleanup_journal_dir(root)
    return Reverted(reverted_refs, tuple(restore), tuple(changes.values()), tuple(forced))


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "(no file)"


__all__ = ["Applied", "FileChange", "Plan", "PatchFailed", "PatchResult", "PorterError", "Reverted", "SetPlan",
           "apply", "plan", "read_journal", "revert", "safe_path", "detect_version"]
