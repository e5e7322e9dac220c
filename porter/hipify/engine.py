"""Hipify a tree: torch's translation + porter's extra map, reports, and an incremental cache.

Every regular file under SRC gets a counterpart at the same relative path under OUT:

* source files (torch's extensions: .cu .cuh .c .cc .cpp .h .in .hpp) are translated; a file the
  translation changes gets torch's breadcrumb first line (C-like extensions), a file it leaves alone
  is copied byte-identical;
* a source file that already starts with torch's breadcrumb, or is not UTF-8, is copied
  byte-identical and reported as skipped;
* other files are copied byte-identical;
* symlinks are never followed: one pointing inside the tree is recreated, one pointing outside is
  left out and reported.

The cache ``OUT/.porter-hipify.json`` records, per file, the sha256 of the source, the stat of what
was written and the findings; a re-run hashes the sources, and redoes only what changed.

``check`` without an output directory checks SRC itself: would hipify change any of its files? On a
tree porter already hipified the answer is no (0 files would change).

The report's findings are also grouped per op folder or file (:meth:`HipifyReport.groups`), each
group with counts and a one-line verdict from the map's ``[[verdicts]]``.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from porter import __version__
from porter.errors import ConfigError, NothingToDo, PorterError
from porter.hipify import torch_engine
from porter.hipify.maps import CompiledMap, ExtraMap, Verdict, combined_map
from porter.hipify.scan import SCAN_VERSION, Finding, ScanResult, scan, uses_name
from porter.log import Logger, quiet_logger
from porter.fs import atomic_path, atomic_write_text, sha256_bytes

CACHE_NAME = ".porter-hipify.json"
CACHE_SCHEMA = "porter.hipify-cache/2"

STATUSES = CHANGED, UNCHANGED, COPIED, SKIPPED = "changed", "unchanged", "copied", "skipped"
ALREADY_HIPIFIED = "already hipified (starts with torch's hipify breadcrumb)"


@dataclass(frozen=True)
class FileResult:
    path: str                 # POSIX path relative to SRC (and OUT)
    status: str               # changed | unchanged | copied | skipped
    reason: str = ""          # why skipped
    write: bool = False       # the destination was (with check: would be) written by this run
    cached: bool = False      # taken from the cache without translating again
    replacements: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "status": self.status, "write": self.write, "cached": self.cached}
        if self.reason:
            d["reason"] = self.reason
        if self.replacements:
            d["replacements"] = dict(self.replacements)
        return d


UNMAPPED_VERDICT = ("unmapped", "CUDA names without a HIP mapping: port them by hand or add them with --map")
WARP32_VERDICT = ("warp32", "translates; warp-size-32 assumptions for 64-lane wavefronts (every CDNA Instinct arch: "
                              "gfx90a, gfx942, gfx950): a build for one fixes, proves safe or refuses each "
                              "(docs/emulate.md)")
# More files than this directly in one folder (a flat folder of kernel instantiations) are grouped
# by verdict instead of one group each.
MAX_FILE_GROUPS = 8


@dataclass(frozen=True)
class FindingGroup:
    """The findings of one op folder, one file, or the files of a flat folder that share a verdict."""

    name: str       # "ops/attn/" (a folder), "ops/norm.cu" (a file), "src/ [cutlass]" (files of src/)
    folder: str     # the folder its files are shown relative to ("" at the top), ending with "/"
    is_dir: bool    # more than one file can belong to it
    unsupported: tuple[Finding, ...]
    warp32: tuple[Finding, ...]
    verdict_id: str
    verdict: str

    @property
    def files(self) -> Counter[str]:
        """Findings per file (tree-relative paths), most first."""
        return Counter(f.path for f in self.unsupported + self.warp32)

    @property
    def names(self) -> Counter[str]:
        """Unsupported uses per CUDA name."""
        return Counter(f.identifier for f in self.unsupported)

    @property
    def rules(self) -> Counter[str]:
        """warp32 flags per rule id."""
        return Counter(f.identifier for f in self.warp32)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "verdict_id": self.verdict_id, "verdict": self.verdict,
                "unsupported": len(self.unsupported), "warp32": len(self.warp32),
                "files": dict(self.files.most_common()), "names": dict(self.names.most_common()),
                "rules": dict(self.rules.most_common())}


def _verdict(uses: Sequence[Finding], verdicts: Sequence[tuple[Verdict, re.Pattern[str]]]) -> tuple[int, str, str]:
    """(rank, id, text): the first verdict matching one of the unsupported names; else "unmapped"
    for unsupported names no verdict matches, "warp32" for warp flags only."""
    if not uses:
        return len(verdicts) + 1, *WARP32_VERDICT
    idents = {u.identifier for u in uses}
    for i, (v, rx) in enumerate(verdicts):
        if any(rx.search(n) for n in idents):
            return i, v.id, v.verdict
    return len(verdicts), *UNMAPPED_VERDICT


def group_findings(unsupported: Sequence[Finding], warp32: Sequence[Finding],
                   verdicts: Sequence[tuple[Verdict, re.Pattern[str]]] = ()) -> list[FindingGroup]:
    """Findings grouped per op. Below the deepest folder that holds every finding, each sub-folder
    is one group (narrowed to the deepest folder holding all of its findings) and each file there
    is one group -- unless more than :data:`MAX_FILE_GROUPS` files lie there, which are then grouped
    by verdict. Most decisive verdict first, then most findings."""
    by_file: dict[str, tuple[list[Finding], list[Finding]]] = {}
    for i, found in enumerate((unsupported, warp32)):
        for f in found:
            by_file.setdefault(f.path, ([], []))[i].append(f)
    if not by_file:
        return []
    dirs = [posixpath.dirname(p) for p in by_file]
    common = posixpath.commonpath(dirs) if all(dirs) else ""
    common = common + "/" if common else ""

    # group name -> (folder, is_dir, files)
    members: dict[str, tuple[str, bool, list[str]]] = {}
    loose: list[str] = []
    sub: dict[str, list[str]] = {}
    for path in sorted(by_file):
        rest = path[len(common):]
        if "/" in rest:
            sub.setdefault(rest.split("/", 1)[0], []).append(path)
        else:
            loose.append(path)
    for files in sub.values():
        folder = posixpath.commonpath([posixpath.dirname(f) for f in files]) + "/"
        members[folder] = (folder, True, files)
    many = len(loose) > MAX_FILE_GROUPS  # then one group per verdict, else one per file
    buckets: dict[str, list[str]] = {}
    for path in loose:
        buckets.setdefault(_verdict(by_file[path][0], verdicts)[1] if many else path, []).append(path)
    base = common or "./"
    for key, files in buckets.items():
        members[key if not many else base if len(buckets) == 1 else f"{base} [{key}]"] = (common, many, files)

    ranked: list[tuple[int, int, str, FindingGroup]] = []
    for name, (folder, is_dir, files) in members.items():
        uses = [u for f in files for u in by_file[f][0]]
        flags = [w for f in files for w in by_file[f][1]]
        rank, vid, text = _verdict(uses, verdicts)
        ranked.append((rank, -(len(uses) + len(flags)), name,
                       FindingGroup(name, folder, is_dir, tuple(uses), tuple(flags), vid, text)))
    return [g for *_, g in sorted(ranked, key=lambda r: r[:3])]


@dataclass(frozen=True)
class HipifyReport:
    src: Path
    out: Path
    in_place: bool
    check: bool
    files: tuple[FileResult, ...]
    unsupported: tuple[Finding, ...]
    warp32: tuple[Finding, ...]
    seconds: float
    torch_hipify_version: str
    maps: tuple[str, ...]
    removed: tuple[str, ...] = field(default=())  # stale outputs removed (their source is gone)
    verdicts: tuple[tuple[Verdict, re.Pattern[str]], ...] = field(default=(), repr=False)

    def of(self, status: str) -> list[FileResult]:
        """The files of one of the :data:`STATUSES`."""
        return [f for f in self.files if f.status == status]

    @property
    def changed(self) -> list[FileResult]:
        return self.of(CHANGED)

    @property
    def skipped(self) -> list[FileResult]:
        return self.of(SKIPPED)

    @property
    def written(self) -> list[FileResult]:
        """Files whose destination this run wrote (with ``check``: would write)."""
        return [f for f in self.files if f.write]

    @property
    def cached(self) -> int:
        return sum(f.cached for f in self.files)

    @property
    def replacements(self) -> Counter[str]:
        return sum((Counter(dict(f.replacements)) for f in self.files), Counter())

    def groups(self) -> list[FindingGroup]:
        """The findings per op folder or file, each group with its verdict (see :func:`group_findings`)."""
        return group_findings(self.unsupported, self.warp32, self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "porter.hipify-report/1",
            "src": str(self.src), "out": str(self.out), "in_place": self.in_place, "check": self.check,
            "torch_hipify_version": self.torch_hipify_version, "maps": list(self.maps),
            "summary": {"scanned": len(self.files), **{st: len(self.of(st)) for st in STATUSES},
                        "written": len(self.written), "cached": self.cached, "removed": len(self.removed),
                        "unsupported": len(self.unsupported), "warp32": len(self.warp32),
                        "seconds": round(self.seconds, 3)},
            "replacements": dict(self.replacements.most_common()),
            "skipped": [{"path": f.path, "reason": f.reason} for f in self.skipped],
            "unsupported": [f.to_dict() for f in self.unsupported],
            "warp32": [f.to_dict() for f in self.warp32],
            "groups": [g.to_dict() for g in self.groups()],
            "files": [f.to_dict() for f in self.files],
            "removed": list(self.removed),
        }


def _read_only(path: Path) -> bool:
    return not (path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) or not os.access(path, os.W_OK)


def _validate(src: Path, out: Path | None, in_place: bool, check: bool) -> tuple[Path, Path]:
    if not src.exists():
        raise ConfigError(f"source tree not found: {src}", hint="pass the directory with the CUDA sources")
    if not src.is_dir():
        raise ConfigError(f"source is not a directory: {src}", hint="pass the directory that holds the file")
    src = src.resolve()
    if in_place:
        if out is not None and out.resolve() != src:
            raise ConfigError("--in-place and an output directory exclude each other",
                              hint="drop -o/--output, or drop --in-place")
        out = src
    else:
        out = src.with_name(src.name + "-hip") if out is None else out.resolve()
        if out == src:
            raise ConfigError(f"output directory is the source tree: {out}",
                              hint="pass --in-place to hipify the tree itself, or another -o directory")
        if out.is_relative_to(src):
            raise ConfigError(f"output directory {out} is inside the source tree {src}",
                              hint="put the output next to the source (the default is SRC-hip), never inside it")
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise ConfigError(f"output path exists and is not a directory: {out}", hint="pass a directory to -o")
        if not check and _read_only(out):
            raise ConfigError(f"output directory is read-only: {out}",
                              hint=f"make it writable (chmod u+w {out}) or choose another -o directory")
        if not in_place and not (out / CACHE_NAME).is_file() and any(out.iterdir()):
            raise ConfigError(f"output directory {out} is not empty and was not written by porter hipify",
                              hint="pass a new or empty directory; porter only updates trees it wrote")
    else:
        parent = next((p for p in out.parents if p.exists()), None)
        if not check and parent is not None and _read_only(parent):
            raise ConfigError(f"cannot create the output directory {out}: {parent} is read-only",
                              hint="choose an output directory in a writable place")
    return src, out


def _load_cache(out: Path, key: str) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((out / CACHE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != CACHE_SCHEMA or data.get("key") != key:
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def _walk(src: Path) -> Iterator[tuple[str, Path, str]]:
    """(rel, path, kind) in a stable order; kind: file | dir | link | other. Links are not followed
    (os.walk does not go down a link to a folder)."""
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for d in dirnames:
            p = base / d
            yield p.relative_to(src).as_posix(), p, "link" if p.is_symlink() else "dir"
        for name in sorted(filenames):
            p = base / name
            rel = p.relative_to(src).as_posix()
            if rel != CACHE_NAME:
                yield rel, p, "link" if p.is_symlink() else "file" if p.is_file() else "other"


@dataclass
class _State:
    src: Path
    out: Path
    in_place: bool
    check: bool
    cmap: CompiledMap
    breadcrumb: str
    cache: dict[str, dict[str, Any]]
    new_cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: list[FileResult] = field(default_factory=list)
    found: list[ScanResult] = field(default_factory=list)
    """The findings of the files so far: each file's :func:`scan` (or its cache record's)."""


def _write(dest: Path, data: bytes, mode: int, atomic: bool) -> None:
    """Atomic (temp + rename) in place; out of tree a plain write is enough: a file cut short by a
    crash does not match its cache record, so the next run writes it again."""
    try:
        with atomic_path(dest) if atomic else nullcontext(dest) as path:
            path.write_bytes(data)
            os.chmod(path, stat.S_IMODE(mode))
    except PermissionError as exc:
        raise ConfigError(f"cannot write {dest}: {exc.strerror}",
                          hint="make the output directory writable or choose another -o directory") from None
    except OSError as exc:
        raise PorterError(f"cannot write {dest}: {exc.strerror or exc}",
                          hint="check free space and permissions of the output directory") from None


def _dest_matches(dest: Path, rec: dict[str, Any]) -> bool:
    try:
        st = dest.stat()
    except OSError:
        return False
    return st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns")


def _process_file(s: _State, rel: str, path: Path) -> None:
    data = path.read_bytes()
    digest = sha256_bytes(data)
    dest = s.out / rel
    rec = s.cache.get(rel)
    if rec is not None and rec.get("src") == digest and _dest_matches(dest, rec):
        s.new_cache[rel] = rec
        s.results.append(FileResult(rel, rec["status"], rec.get("reason", ""), False, True,
                                    tuple((k, int(v)) for k, v in rec.get("replacements", {}).items())))
        s.found.append(ScanResult([Finding(**d) for d in rec.get("unsupported", [])],
                                  [Finding(**d) for d in rec.get("warp32", [])], set(rec.get("defines", [])),
                                  [(str(n), Finding(**d)) for n, d in rec.get("pending_masks", [])]))
        return

    counts: Counter[str] = Counter()
    status, reason, out_data, scan_text = _translated(s, rel, data, counts)
    found = scan(scan_text, rel, s.cmap) if scan_text is not None else ScanResult()
    s.found.append(found)

    if s.in_place:
        write = out_data is not data
    else:
        try:
            write = dest.read_bytes() != out_data if dest.is_file() and not dest.is_symlink() else True
        except OSError:
            write = True
    if write and not s.check:
        if dest.is_symlink():
            dest.unlink()
        _write(dest, out_data, path.stat().st_mode, atomic=s.in_place)
    s.results.append(FileResult(rel, status, reason, write, False, tuple(counts.most_common())))
    if not s.check:
        try:
            st = dest.stat()
        except OSError:
            return
        if s.in_place and status == CHANGED:
            # The tree now holds the output: a re-run reads it back as an already hipified file.
            status, reason, digest, counts = SKIPPED, ALREADY_HIPIFIED, sha256_bytes(out_data), Counter()
        s.new_cache[rel] = {"src": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                            "status": status, "reason": reason, "replacements": dict(counts),
                            "unsupported": [f.to_dict() for f in found.unsupported],
                            "warp32": [f.to_dict() for f in found.warp32], "defines": sorted(found.defines),
                            "pending_masks": [[n, f.to_dict()] for n, f in found.pending_masks]}


def _translated(s: _State, rel: str, data: bytes, counts: Counter[str]) -> tuple[str, str, bytes, str | None]:
    """One file through torch's hipify and porter's map: its status, why, the bytes to write and the text to scan
    (None: not source, or not UTF-8)."""
    if not rel.endswith(torch_engine.SOURCE_EXTENSIONS):
        return COPIED, "", data, None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return SKIPPED, f"not UTF-8 (byte {exc.start}); copied unchanged", data, None
    # torch reads with universal newlines; so does porter, to produce the same text.
    norm = text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
    if norm.startswith(s.breadcrumb):
        return SKIPPED, ALREADY_HIPIFIED, data, norm
    new = s.cmap.apply(torch_engine.transform_text(norm, rel, counts), counts)
    if new == norm:
        return UNCHANGED, "", data, norm
    if rel.endswith(torch_engine.BREADCRUMB_EXTENSIONS):
        new = s.breadcrumb + new
    return CHANGED, "", new.encode("utf-8"), new


def _settle_pending_masks(s: _State, entries: list[tuple[str, Path, str]]) -> list[Finding]:
    """The full masks bound to a name their own file no longer uses (``#define FULL_MASK``) that
    another file still uses after hipify. Rare: only files whose source names one are translated
    again."""
    pending = [m for r in s.found for m in r.pending_masks]
    if not pending:
        return []
    names = {n for n, _ in pending}
    used: set[str] = set()
    for rel, path, kind in entries:
        if kind != "file" or not rel.endswith(torch_engine.SOURCE_EXTENSIONS):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        present = [n for n in names - used if n.encode() in data]
        if not present:
            continue
        text = _translated(s, rel, data, Counter())[3]  # what hipify makes of it (None: not UTF-8)
        if text is not None:
            used.update(n for n in present if uses_name(text, n))
    return [f for n, f in pending if n in used]


def _process_link(s: _State, rel: str, path: Path) -> FileResult:
    target_text = os.readlink(path)
    target = Path(os.path.realpath(path))
    if not target.is_relative_to(s.src):
        return FileResult(rel, SKIPPED, f"symlink to {target_text} points outside the tree; not followed")
    if s.in_place:
        return FileResult(rel, SKIPPED, f"symlink to {target_text} (inside the tree)")
    dest = s.out / rel
    link_text = target_text
    if os.path.isabs(target_text):
        link_text = os.path.relpath(s.out / target.relative_to(s.src), dest.parent)
    write = not (dest.is_symlink() and os.readlink(dest) == link_text)
    if write and not s.check:
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        try:
            os.symlink(link_text, dest)
        except OSError as exc:
            raise PorterError(f"cannot create the symlink {dest}: {exc.strerror or exc}",
                              hint="check the permissions of the output directory") from None
    return FileResult(rel, SKIPPED, f"symlink to {target_text} (inside the tree; recreated)", write)


def hipify_tree(src: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                in_place: bool = False, check: bool = False,
                extra_maps: Iterable[str | os.PathLike[str] | ExtraMap] = (),
                log: Logger | None = None, use_cache: bool = True) -> HipifyReport:
    """Hipify the tree ``src`` into ``out`` (default ``<src>-hip``) or, with ``in_place``, into itself.

    ``extra_maps``: TOML files (or :class:`ExtraMap` objects) added on top of porter's built-in map.
    ``check``: compute everything, write nothing; the report's ``written`` lists what would change.
    Without ``out``, a check is of ``src`` itself (as with ``in_place``): which of its files would
    hipify change? ``-o OUT`` checks instead whether OUT is up to date.
    Raises :class:`ConfigError` for bad input and :class:`NothingToDo` for a tree without files.
    """
    log = log or quiet_logger()
    start = time.perf_counter()
    if check and out is None:
        in_place = True
    src_path, out_path = _validate(Path(src), Path(out) if out is not None else None, in_place, check)
    emap = combined_map([m if isinstance(m, ExtraMap) else Path(m) for m in extra_maps])
    version = torch_engine.torch_hipify_version()  # fails early (ToolError) when torch is missing
    key = sha256_bytes(json.dumps([__version__, SCAN_VERSION, version, emap.digest(), in_place]).encode())
    state = _State(src=src_path, out=out_path, in_place=in_place, check=check, cmap=emap.compiled,
                   breadcrumb=torch_engine.breadcrumb(),
                   cache=_load_cache(out_path, key) if use_cache and out_path.is_dir() else {})

    with log.step(f"hipify {src_path} -> {'(in place)' if in_place else out_path}") as step:
        entries = list(_walk(src_path))
        total, done = sum(kind != "dir" for _, _, kind in entries), 0
        if not total:
            raise NothingToDo(f"no files under {src_path}", hint="pass the directory that holds the CUDA sources")
        if not check and not in_place:
            out_path.mkdir(parents=True, exist_ok=True)
        for rel, path, kind in entries:
            if kind == "dir":
                if not check and not in_place:
                    (out_path / rel).mkdir(exist_ok=True)
                continue
            done += 1
            step.progress(done, total, rel)
            if kind == "file":
                _process_file(state, rel, path)
            elif kind == "link":
                state.results.append(_process_link(state, rel, path))
            else:
                state.results.append(FileResult(rel, SKIPPED, "not a regular file (device, fifo or socket)"))

        removed = [] if in_place else [rel for rel, rec in state.cache.items()
                                       if rel not in state.new_cache and _dest_matches(out_path / rel, rec)]
        if not check:
            for rel in removed:
                (out_path / rel).unlink()
        if not check and use_cache and (state.new_cache != state.cache or not (out_path / CACHE_NAME).is_file()):
            doc = {"schema": CACHE_SCHEMA, "key": key, "porter_version": __version__,
                   "torch_hipify_version": version, "src": str(src_path),
                   "files": state.new_cache}
            atomic_write_text(out_path / CACHE_NAME, json.dumps(doc, separators=(",", ":")))

    defines = {d for r in state.found for d in r.defines}
    unsupported = tuple(f for r in state.found for f in r.unsupported if f.identifier not in defines)
    # A mask macro (or file-scope constant) its own file no longer uses counts if another file does.
    order = {f.path: i for i, f in enumerate(state.results)}
    warp32 = sorted([f for r in state.found for f in r.warp32] + _settle_pending_masks(state, entries),
                    key=lambda f: (order.get(f.path, len(order)), f.line, f.column))
    return HipifyReport(src=src_path, out=out_path, in_place=in_place, check=check, files=tuple(state.results),
                        unsupported=unsupported, warp32=tuple(warp32),
                        seconds=time.perf_counter() - start,
                        torch_hipify_version=version,
                        maps=emap.sources, removed=tuple(removed), verdicts=emap.compiled.verdicts)
