"""Patch sets as data: frozen models and their TOML loader.

A project folder (``patches/<project>/``) holds ``manifest.toml`` (how to read the project's version
from a tree, and the sets in order) and one TOML file per set. A set lists patches in order; a patch
either carries anchored edits or names a plain unified-diff ``.patch`` file.

An anchored edit finds the lines that contain a literal string (or match a regex), checks that the
number of matching lines is the expected ``count``, then replaces the matched text, inserts lines
before or after each matching line, or deletes the matching lines. Line numbers are never used.

A patch names the problem it fixes as something detectable (``needed_if``: a regex, searched in each
of the patch's own files or in the files some globs select). Where the problem is absent the patch is
"not needed here", which is reported and is not an error; so a fork without the problem does not fail
the set. A set whose every patch has ``needed_if`` decides need by itself: its version range is then a
recorded fact (what it was verified on), not a gate.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, get_args

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from porter.errors import ConfigError, shown
from porter.fs import exists, read_user_text
from porter.userdata import check_keys, parse_toml, whole_number

Action = Literal["replace", "insert_before", "insert_after", "delete"]
ACTIONS: tuple[str, ...] = get_args(Action)
PROJECTS_PACKAGE = "porter.patchsets"


@dataclass(frozen=True, kw_only=True)
class Edit:
    """One anchored edit of one file."""

    action: Action
    """replace (the matched text), insert_before / insert_after (each matching line), delete (the lines)."""
    anchor: str
    """A literal substring of the line(s) to find, or a Python regex when ``regex`` is true."""
    regex: bool = False
    """Treat ``anchor`` as a regex (searched in each line; ``replace`` may use ``\\1`` references)."""
    count: int = 1
    """How many lines must match; any other number is a precise failure."""
    text: str = ""
    """Replacement text (replace) or the lines to insert (insert_*); unused for delete."""
    applied_if: str = ""
    """Regex that, when it matches the file, means this edit is already in place (overrides the default
    detection: inserted lines already beside the anchor, or the replacement present instead of the anchor)."""


@dataclass(frozen=True, kw_only=True)
class Need:
    """The problem a patch fixes, as something detectable: a regex that matches while the problem is present."""

    regex: str
    """Python regex, searched (MULTILINE) in the whole text of a file."""
    files: tuple[str, ...] = ()
    """Tree-relative globs of the files to search. Empty: each of the patch's own files, decided per file
    (a file where the regex does not match, or that is absent, is not edited)."""


@dataclass(frozen=True, kw_only=True)
class Patch:
    """One named change: anchored edits applied to each file in ``files``, or a unified diff."""

    id: str
    why: str
    files: tuple[str, ...] = ()
    """Tree-relative paths (``/`` separated). Paths that are symlink aliases of one file are edited once."""
    edits: tuple[Edit, ...] = ()
    diff: str = ""
    """Text of a unified diff (from ``diff = "x.patch"``); its own headers name the files."""
    diff_name: str = ""
    strip: int | None = None
    """Leading path components to drop from diff headers (None: 1 when they start with a/ and b/)."""
    versions: str = ""
    """PEP 440 specifier of the project versions this patch was verified for (empty: the set's range). A
    gate only for a patch without ``needed_if``; otherwise a recorded fact."""
    needed_if: Need | None = None
    """The problem this patch fixes; None: always needed (the version ranges decide)."""

    @property
    def kind(self) -> str:
        return "diff" if self.diff else "edits"

    @property
    def digest(self) -> str:
        """sha256 of the patch's own data: its diff's text, or (anchored edits) its id, files, edits and
        ``needed_if`` as canonical JSON. A wheel's manifest names each applied patch by it."""
        if self.diff:
            return hashlib.sha256(self.diff.encode()).hexdigest()
        data = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("why", "diff", "diff_name", "strip")}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class VersionSource:
    """Where a tree states its version: a file and a regex whose groups are joined with dots."""

    file: str
    regex: str


@dataclass(frozen=True, kw_only=True)
class Verified:
    """An upstream state a set was checked against."""

    ref: str
    commit: str = ""
    date: str = ""
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class PatchSet:
    project: str
    name: str
    description: str
    versions: str
    """PEP 440 specifier the tree's version must satisfy (override with ``--target-version``)."""
    patches: tuple[Patch, ...]
    version_from: tuple[VersionSource, ...] = ()
    verified: tuple[Verified, ...] = ()
    origin: str = "shipped"
    """``shipped`` or the path of the user's set file."""
    digest: str = ""
    """sha256 of the set's source data (its TOML and diffs), recorded in the journal."""

    @property
    def ref(self) -> str:
        return f"{self.project}/{self.name}"

    @property
    def decides_need(self) -> bool:
        """Every patch names its problem (``needed_if``): the version range is a recorded fact, not a gate."""
        return bool(self.patches) and all(p.needed_if is not None for p in self.patches)


# --------------------------------------------------------------------------------------------
# loading

def _table(value: Any, where: str, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {what} must be a table, not {shown(value)}",
                          hint=f"write {what} as a TOML table ([[...]] or {{ key = value }})")
    return value


def _tables(value: Any, where: str, what: str) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: {what} must be a list of tables, not {shown(value)}",
                          hint="write each entry as a [[...]] table or an inline { key = value } table")
    return [_table(v, f"{where} {what} {i + 1}", "the entry") for i, v in enumerate(value)]


def _regex(rx: str, where: str, what: str, flags: int = 0) -> None:
    try:
        re.compile(rx, flags)
    except (re.error, OverflowError, RecursionError) as exc:  # a{99999999999}: OverflowError; ((((...: too deep
        detail = str(exc) if isinstance(exc, re.error) else (
            "a repeat count is too large" if isinstance(exc, OverflowError) else "nested too deeply")
        raise ConfigError(f"{where}: invalid regex{f' in {what}' if what else ''}: {detail}",
                          hint="a Python regular expression (re module syntax)") from None


def _spec(value: str, where: str) -> str:
    hint = "use a PEP 440 specifier such as '>=0.16,<0.20'"
    try:
        for one in SpecifierSet(value):
            one.contains("0", prereleases=True)  # reads its version now, as a later check would
    except InvalidSpecifier:
        raise ConfigError(f"{where}: invalid version range {value!r}", hint=hint) from None
    except ValueError:  # a number past Python's int-from-string limit (4300 digits)
        raise ConfigError(f"{where}: invalid version range {value!r}: a number in it is too long", hint=hint) from None
    return value


def _str(data: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: missing key {key!r}", hint=f"add {key} = \"...\"")
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string, not {type(value).__name__}")
    return value


def check_relpath(path: str, where: str) -> str:
    """A tree-relative path: no absolute paths, no ``..``, ``/`` separators."""
    p = path.replace("\\", "/")
    if not p or p.startswith("/") or re.match(r"^[A-Za-z]:", p) or ".." in p.split("/"):
        raise ConfigError(f"{where}: path {path!r} leads outside the tree",
                          hint="patch targets must be relative paths inside the tree, without '..'")
    return p


def _edit(data: Mapping[str, Any], where: str) -> Edit:
    check_keys(data, {"action", "anchor", "regex", "count", "text", "applied_if"}, where)
    action = _str(data, "action", where)
    if action not in ACTIONS:
        raise ConfigError(f"{where}: unknown action {action!r}", hint=f"one of: {', '.join(ACTIONS)}")
    anchor = _str(data, "anchor", where)
    if not anchor.strip():
        raise ConfigError(f"{where}: empty anchor", hint="anchor on a short distinctive line")
    regex = data.get("regex", False)
    count = data.get("count", 1)
    if not isinstance(regex, bool):
        raise ConfigError(f"{where}: regex must be true or false")
    if not whole_number(count, 1):
        raise ConfigError(f"{where}: count must be a positive integer, not {shown(count)}",
                          hint="the number of lines the anchor must match, e.g. count = 1")
    text = _str(data, "text", where, "")
    if action != "delete" and "text" not in data:
        raise ConfigError(f"{where}: action {action} needs text", hint="add text = '''...'''")
    applied_if = _str(data, "applied_if", where, "")
    if regex:
        _regex(anchor, where, "anchor")
    if applied_if:
        _regex(applied_if, where, "applied_if")
    return Edit(action=action, anchor=anchor, regex=regex, count=count, text=text,  # type: ignore[arg-type]
                applied_if=applied_if)


def _need(raw: Any, where: str) -> Need:
    """``needed_if = 'regex'`` or ``needed_if = { regex = '...', files = ['glob', ...] }``."""
    where = f"{where} needed_if"
    if isinstance(raw, str):
        raw = {"regex": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a regex string or a table {{ regex = '...', files = [...] }}")
    check_keys(raw, {"regex", "files"}, where)
    rx = _str(raw, "regex", where)
    if not rx.strip():
        raise ConfigError(f"{where}: empty regex", hint="match a short distinctive line that shows the problem")
    _regex(rx, where, "", re.MULTILINE)
    files = raw.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ConfigError(f"{where}: files must be a list of tree-relative globs")
    return Need(regex=rx, files=tuple(check_relpath(f, where) for f in files))


def _patch(data: Mapping[str, Any], where: str, base: Traversable | Path | None) -> Patch:
    check_keys(data, {"id", "why", "files", "edit", "diff", "strip", "versions", "needed_if"}, where)
    pid = _str(data, "id", where)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", pid):
        raise ConfigError(f"{where}: patch id {pid!r} must be letters, digits, '.', '_' or '-'")
    where = f"{where} (patch {pid})"
    why = _str(data, "why", where)
    versions = _spec(_str(data, "versions", where, ""), where)
    need = _need(data["needed_if"], where) if "needed_if" in data else None
    if "diff" in data:
        if "edit" in data or "files" in data:
            raise ConfigError(f"{where}: a patch has either a diff or files + edits, not both")
        name = _str(data, "diff", where)
        if base is None:
            raise ConfigError(f"{where}: diff {name!r} has no folder to be read from")
        diff_text = _read_diff(base, name, where)
        strip = data.get("strip")
        if strip is not None and not (isinstance(strip, bool) or whole_number(strip, 0)):
            raise ConfigError(f"{where}: strip must be a non-negative integer",
                              hint="the leading path components to drop from the diff's headers, e.g. strip = 1")
        return Patch(id=pid, why=why, diff=diff_text, diff_name=name, strip=strip, versions=versions,
                     needed_if=need)
    files = data.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise ConfigError(f"{where}: files must be a non-empty list of tree-relative paths")
    edits = data.get("edit")
    if not isinstance(edits, list) or not edits:
        raise ConfigError(f"{where}: no [[patch.edit]] entries", hint="add at least one edit, or diff = \"x.patch\"")
    return Patch(id=pid, why=why, files=tuple(check_relpath(f, where) for f in files),
                 edits=tuple(_edit(_table(e, f"{where} edit {i + 1}", "[[patch.edit]]"), f"{where} edit {i + 1}")
                             for i, e in enumerate(edits)), versions=versions,
                 needed_if=need)


def _read_diff(base: Traversable | Path, name: str, where: str) -> str:
    """The text of a set's ``diff = "x.patch"``: a regular UTF-8 file beside the set (never a device such as
    /dev/zero, which would be read forever, nor a folder)."""
    hint = "name a unified-diff file in the set's folder, e.g. diff = \"fix.patch\""
    try:
        if "\0" in name or not base.joinpath(name).is_file():
            raise ConfigError(f"{where}: diff {name!r} is not a file in {base}", hint=hint)
        return base.joinpath(name).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: diff {name!r} is not UTF-8 text ({exc.reason} at byte {exc.start})",
                          hint=hint) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot read diff {name!r}: {exc}", hint=hint) from None


def parse_set(text: str, *, project: str, name: str, where: str, base: Traversable | Path | None,
              version_from: tuple[VersionSource, ...] = (), origin: str = "shipped") -> PatchSet:
    data = parse_toml(text, where)
    check_keys(data, {"set", "patch"}, where)
    head = _table(data.get("set", {}), where, "[set]")
    check_keys(head, {"description", "versions", "verified", "project", "name", "version_from"}, f"{where} [set]")
    project = _str(head, "project", where, project)
    name = _str(head, "name", where, name)
    verified: list[Verified] = []
    for i, v in enumerate(_tables(head.get("verified", []), where, "verified")):
        check_keys(v, {"ref", "commit", "date", "note"}, f"{where} verified {i + 1}")
        verified.append(Verified(ref=_str(v, "ref", where), commit=_str(v, "commit", where, ""),
                                 date=_str(v, "date", where, ""), note=_str(v, "note", where, "")))
    if "version_from" in head:
        version_from = _version_sources(head["version_from"], where)
    raw = data.get("patch", [])
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: the set has no [[patch]] entries", hint="add at least one [[patch]] table")
    patches = tuple(_patch(_table(p, f"{where} patch {i + 1}", "[[patch]]"), f"{where} patch {i + 1}", base)
                    for i, p in enumerate(raw))
    ids = [p.id for p in patches]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup:
        raise ConfigError(f"{where}: patch id {dup!r} is used twice")
    digest = hashlib.sha256(text.encode() + b"".join(p.diff.encode() for p in patches)).hexdigest()
    return PatchSet(project=project, name=name, description=_str(head, "description", where, ""),
                    versions=_spec(_str(head, "versions", where, ""), where), patches=patches,
                    version_from=version_from, verified=tuple(verified), origin=origin, digest=digest)


def _version_sources(raw: Any, where: str) -> tuple[VersionSource, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: version_from must be a list of {{file, regex}} tables")
    out = []
    for i, v in enumerate(_tables(raw, where, "version_from")):
        check_keys(v, {"file", "regex"}, f"{where} version_from {i + 1}")
        rx = _str(v, "regex", where)
        _regex(rx, where, "version_from")
        out.append(VersionSource(file=check_relpath(_str(v, "file", where), where), regex=rx))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class Project:
    name: str
    version_from: tuple[VersionSource, ...]
    sets: tuple[str, ...]
    build: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Toolchain kind -> the sets porter's AOT engine applies to its own copy of the sources before building for
    that kind (``[project] build = { rocm = [...] }``); the source itself is never changed. A set named only here
    is not one of ``sets`` (what ``--set PROJECT`` applies), but ``--set PROJECT/NAME`` applies it to a tree."""

    @property
    def all_sets(self) -> tuple[str, ...]:
        """``sets``, then the sets named only under ``build``."""
        extra = [n for names in self.build.values() for n in names if n not in self.sets]
        return (*self.sets, *dict.fromkeys(extra))


def _root() -> Traversable:
    return resources.files(PROJECTS_PACKAGE)


def project_names() -> list[str]:
    return sorted(p.name for p in _root().iterdir() if p.is_dir() and p.joinpath("manifest.toml").is_file())


def _unknown(message: str, name: str, known: Sequence[str], listing: str) -> ConfigError:
    """The refusal of an unknown name, suggesting the close ones and listing the known ones."""
    close = difflib.get_close_matches(name, known, n=3)
    return ConfigError(message, hint=(f"did you mean {', '.join(close)}? " if close else "")
                       + f"{listing}: {', '.join(known) or '(none)'}")


def load_project(name: str) -> Project:
    manifest = _root().joinpath(name).joinpath("manifest.toml")
    if not manifest.is_file():
        raise _unknown(f"no shipped patch sets for project {name!r}", name, project_names(), "known projects")
    where = f"patches/{name}/manifest.toml"
    data = parse_toml(manifest.read_text(encoding="utf-8"), where)
    check_keys(data, {"project"}, where)
    head = data.get("project", {})
    check_keys(head, {"description", "upstream", "version_from", "sets", "build"}, f"{where} [project]")
    sets = head.get("sets", [])
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise ConfigError(f"{where}: sets must be a list of set names")
    build = head.get("build", {})
    if not isinstance(build, dict) or not all(isinstance(v, list) and all(isinstance(n, str) for n in v)
                                              for v in build.values()):
        raise ConfigError(f"{where}: build must map a toolchain kind to a list of set names")
    return Project(name=name, version_from=_version_sources(head.get("version_from", []), where), sets=tuple(sets),
                   build={str(k): tuple(v) for k, v in build.items()})


def load_shipped(project: str, name: str) -> PatchSet:
    proj = load_project(project)
    if name not in proj.all_sets:
        raise _unknown(f"project {project!r} has no patch set {name!r}", name, proj.all_sets, "its sets")
    folder = _root().joinpath(project)
    return parse_set(folder.joinpath(f"{name}.toml").read_text(encoding="utf-8"), project=project, name=name,
                     where=f"patches/{project}/{name}.toml", base=folder, version_from=proj.version_from)


def load_file(path: Path) -> PatchSet:
    """A user's set: a set TOML file, or a plain unified-diff ``.patch`` / ``.diff`` file."""
    if not exists(path, file=True):  # also a name too long for the file system, a NUL byte
        raise ConfigError(f"patch set file not found: {path}",
                          hint="pass a set TOML file, a .patch/.diff file, or a shipped set (porter patch list)")
    text = read_user_text(path, str(path), kind="a patch set (TOML) or a unified diff")
    if path.suffix in (".patch", ".diff"):
        patch = Patch(id=path.stem, why=f"user diff {path.name}", diff=text, diff_name=path.name)
        return PatchSet(project="local", name=path.stem, description=f"unified diff {path.name}", versions="",
                        patches=(patch,), origin=str(path.resolve()), digest=patch.digest)
    return parse_set(text, project="local", name=path.stem, where=str(path), base=path.parent,
                     origin=str(path.resolve()))


def resolve_sets(ref: str) -> list[PatchSet]:
    """``PROJECT/NAME`` (a shipped set), ``PROJECT`` (all its sets, in order), or a file path."""
    as_path = Path(ref)
    if as_path.suffix in (".toml", ".patch", ".diff") or as_path.is_file():
        return [load_file(as_path)]
    if "/" in ref:
        return [load_shipped(*ref.split("/", 1))]
    proj = load_project(ref)
    if not proj.sets:
        raise ConfigError(f"project {ref!r} ships no patch sets")
    return [load_shipped(ref, s) for s in proj.sets]
