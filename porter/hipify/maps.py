"""porter's extra mappings (data in ``extra_map.toml``, plus user files given with ``--map``).

Loading validates everything up front: unknown tables or keys, bad regexes and bad templates are
:class:`~porter.errors.ConfigError` naming the file and the key.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import astuple, dataclass, field, replace
from functools import cached_property
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, ClassVar

from porter.errors import ConfigError
from porter.fs import read_user_text
from porter.userdata import check_keys, parse_toml

BUILTIN_MAP = Path(__file__).with_name("extra_map.toml")

_TEMPLATE_REF = re.compile(r"\{(\d+)(\.\.\.)?\}")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
_TABLES = {"identifiers", "calls", "unsupported", "warp32", "verdicts"}


@dataclass(frozen=True)
class PatternHint:
    pattern: str
    hint: str


@dataclass(frozen=True)
class WarpRule:
    id: str
    pattern: str
    message: str
    context: str | None = None  # a regex the matched line must also contain


@dataclass(frozen=True)
class Verdict:
    """The one-line verdict of a report group whose unsupported names match ``match``."""
    id: str
    match: str    # a regex searched in each unsupported finding's identifier
    verdict: str


@dataclass(frozen=True)
class ExtraMap:
    """One mapping file. Merge several with :meth:`merged`; later entries win on the same key."""

    identifiers: tuple[tuple[str, str], ...] = ()
    calls: tuple[tuple[str, str], ...] = ()
    unsupported_patterns: tuple[PatternHint, ...] = ()
    unsupported_names: tuple[tuple[str, str], ...] = ()
    warp_file_pattern: str | None = None
    warp_file_words: tuple[str, ...] = ()  # lower case; a file containing one in any case is warp code
    warp_rules: tuple[WarpRule, ...] = ()
    verdicts: tuple[Verdict, ...] = ()  # in priority order: a group gets the first that matches
    sources: tuple[str, ...] = ()

    # What makes two entries of a table the same entry when maps are merged: an entry of both keeps the earlier
    # map's place and takes the later map's value.
    _MERGE_KEYS: ClassVar[dict[str, Callable[[Any], Hashable]]] = {
        "identifiers": itemgetter(0), "calls": itemgetter(0), "unsupported_patterns": attrgetter("pattern"),
        "unsupported_names": itemgetter(0), "warp_file_words": str, "warp_rules": attrgetter("id")}

    def merged(self, other: ExtraMap) -> ExtraMap:
        # The later file's verdicts come first (they win a group); an id it repeats replaces the earlier one.
        ids = {v.id for v in other.verdicts}
        verdicts = other.verdicts + tuple(v for v in self.verdicts if v.id not in ids)
        keyed = {name: tuple({key(x): x for x in getattr(self, name) + getattr(other, name)}.values())
                 for name, key in self._MERGE_KEYS.items()}
        return replace(self, **keyed, warp_file_pattern=other.warp_file_pattern or self.warp_file_pattern,
                       verdicts=verdicts, sources=self.sources + other.sources)

    def digest(self) -> str:
        """A hash of the mapping content (part of the incremental cache key): every field but the last two.
        Verdicts are left out: they only label the report's groups, which are made fresh on every run."""
        return hashlib.sha256(json.dumps(astuple(self)[:-2]).encode()).hexdigest()

    @cached_property
    def compiled(self) -> CompiledMap:
        def words(names: Sequence[str]) -> str:
            return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))

        idents = dict(self.identifiers)
        calls = dict(self.calls)
        ident_re = re.compile(rf"\b(?:{words(list(idents))})\b") if idents else None
        call_re = re.compile(rf"(?<![\w.>:])({words(list(calls))})\s*\(") if calls else None
        names = dict(self.unsupported_names)
        prefixes = sorted({n[:2] for n in names})
        names_re = re.compile(rf"(?:{'|'.join(re.escape(p) for p in prefixes)})\w*") if names else None
        res = tuple((*_fast(p.pattern), p.hint) for p in self.unsupported_patterns)
        warp_file_re = re.compile(self.warp_file_pattern) if self.warp_file_pattern else None
        rules = tuple(Rule(r, *_fast(r.pattern), re.compile(r.context) if r.context else None) for r in self.warp_rules)
        verdicts = tuple((v, re.compile(v.match)) for v in self.verdicts)
        return CompiledMap(idents, ident_re, calls, call_re, res, names_re, names, warp_file_re,
                           rules, self.warp_file_words, verdicts)


def _fail(path: Path, msg: str) -> ConfigError:
    return ConfigError(f"{path}: {msg}", hint="see docs/hipify.md for the mapping file format")


def _str_table(path: Path, data: Any, table: str) -> dict[str, str]:
    """A table of C identifier = string."""
    if not isinstance(data, dict):
        raise _fail(path, f"[{table}] must be a table of \"name\" = \"value\"")
    for k, v in data.items():
        if not isinstance(v, str):
            raise _fail(path, f"[{table}] {k!r}: value must be a string, not {type(v).__name__}")
        if not _IDENT.match(k):
            raise _fail(path, f"[{table}] {k!r} is not a C identifier")
    return data


def _table(path: Path, data: dict[str, Any], table: str, keys: set[str]) -> dict[str, Any]:
    sub = data.get(table, {})
    if not isinstance(sub, dict):
        raise _fail(path, f"[{table}] must be a table")
    check_keys(sub, keys, f"{path}: [{table}]")
    return sub


def _entries(path: Path, items: Any, array: str, required: tuple[str, ...],
             optional: tuple[str, ...] = ()) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, entry) per table of an array of tables (``[[array]]``) with the ``required`` keys."""
    for i, item in enumerate(items):
        where = f"[[{array}]] #{i + 1}"
        if not isinstance(item, dict):
            raise _fail(path, f"{where} must be a table with {', '.join(required[:-1])} and {required[-1]}")
        check_keys(item, required + optional, f"{path}: {where}", required=required)
        yield where, item


def _regex(path: Path, where: str, pattern: Any) -> str:
    if not isinstance(pattern, str):
        raise _fail(path, f"{where}: pattern must be a string")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise _fail(path, f"{where}: bad regex {pattern!r}: {exc}") from None
    return pattern


def load_map(path: str | Path) -> ExtraMap:
    path = Path(path)
    text = read_user_text(path, f"mapping file {path}", kind="a mapping TOML file (--map)")
    data = parse_toml(text, f"mapping file {path}")
    check_keys(data, _TABLES, f"{path}: top level")
    identifiers = _str_table(path, data.get("identifiers", {}), "identifiers")
    calls = _str_table(path, data.get("calls", {}), "calls")
    for k, tmpl in calls.items():
        stripped = _TEMPLATE_REF.sub("", tmpl)
        if "{" in stripped or "}" in stripped:
            raise _fail(path, f"[calls] {k!r}: template {tmpl!r} has a brace that is not {{N}} or {{N...}}")
        if any(int(m.group(1)) < 1 for m in _TEMPLATE_REF.finditer(tmpl)):
            raise _fail(path, f"[calls] {k!r}: arguments are numbered from 1")

    unsupported = _table(path, data, "unsupported", {"patterns", "names"})
    pats = [PatternHint(_regex(path, where, item["pattern"]), str(item["hint"]))
            for where, item in _entries(path, unsupported.get("patterns", []), "unsupported.patterns",
                                        ("pattern", "hint"))]
    names = _str_table(path, unsupported.get("names", {}), "unsupported.names")

    warp = _table(path, data, "warp32", {"file_pattern", "file_words", "rules"})
    file_pattern = _regex(path, "[warp32] file_pattern", warp["file_pattern"]) if "file_pattern" in warp else None
    file_words = warp.get("file_words", [])
    if not isinstance(file_words, list) or not all(isinstance(w, str) and w for w in file_words):
        raise _fail(path, "[warp32] file_words must be an array of non-empty strings")
    rules: list[WarpRule] = []
    for where, item in _entries(path, warp.get("rules", []), "warp32.rules", ("id", "pattern", "message"),
                                ("context",)):
        context = _regex(path, where, item["context"]) if "context" in item else None
        rules.append(WarpRule(str(item["id"]), _regex(path, where, item["pattern"]), str(item["message"]), context))

    verdict_items = data.get("verdicts", [])
    if not isinstance(verdict_items, list):
        raise _fail(path, "verdicts must be an array of tables: [[verdicts]] with id, match and verdict")
    verdicts = [Verdict(str(item["id"]), _regex(path, where, item["match"]), str(item["verdict"]))
                for where, item in _entries(path, verdict_items, "verdicts", ("id", "match", "verdict"))]

    return ExtraMap(identifiers=tuple(identifiers.items()), calls=tuple(calls.items()),
                    unsupported_patterns=tuple(pats), unsupported_names=tuple(names.items()),
                    warp_file_pattern=file_pattern, warp_file_words=tuple(w.lower() for w in file_words),
                    warp_rules=tuple(rules), verdicts=tuple(verdicts),
                    sources=(str(path),))


def builtin_map() -> ExtraMap:
    return load_map(BUILTIN_MAP)


def combined_map(user_maps: Iterable[str | Path | ExtraMap] = ()) -> ExtraMap:
    result = builtin_map()
    for m in user_maps:
        result = result.merged(m if isinstance(m, ExtraMap) else load_map(m))
    return result


# --- applying a map --------------------------------------------------------------------------------

_OPEN = {"(": ")", "[": "]", "{": "}"}


def split_call(text: str, open_paren: int) -> tuple[list[tuple[int, int]], int] | None:
    """Top-level argument spans of the call whose ``(`` is at ``open_paren``, and the ``)`` index.

    Nested (), [] and {} and string/char literals and comments are skipped. None if unbalanced.
    """
    args: list[tuple[int, int]] = []
    stack: list[str] = []
    start = open_paren + 1
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == "/" and i + 1 < n and text[i + 1] in "/*":
            end = text.find("\n" if text[i + 1] == "/" else "*/", i + 2)
            if end < 0:
                return None
            i = end + (1 if text[i + 1] == "/" else 2)
            continue
        if c in _OPEN:
            stack.append(_OPEN[c])
        elif c in ")]}":
            if stack:
                if stack.pop() != c:
                    return None
            elif c == ")":
                args.append((start, i))
                return args, i
            else:
                return None
        elif c == "," and not stack:
            args.append((start, i))
            start = i + 1
        i += 1
    return None


def _fast(pattern: str) -> tuple[re.Pattern[str], bool]:
    """``pattern`` compiled without a leading ``\\b`` (checked by the caller: True), so the regex engine can
    skip ahead by first character instead of trying every position: several times faster."""
    boundary = pattern.startswith("\\b")
    return re.compile(pattern[2:] if boundary else pattern), boundary


def left_boundary_ok(text: str, pos: int) -> bool:
    return pos == 0 or not (text[pos - 1].isalnum() or text[pos - 1] == "_")


@dataclass(frozen=True)
class Rule:
    """A compiled warp32 rule."""
    rule: WarpRule
    rx: re.Pattern[str]
    boundary: bool
    context: re.Pattern[str] | None


@dataclass(frozen=True)
class CompiledMap:
    identifiers: dict[str, str]
    ident_re: re.Pattern[str] | None
    calls: dict[str, str]
    call_re: re.Pattern[str] | None
    # One regex per pattern (each alone lets the engine skip ahead by its first characters; an
    # alternation of all of them is several times slower), without a leading \\b (checked after).
    unsupported_res: tuple[tuple[re.Pattern[str], bool, str], ...]
    names_re: re.Pattern[str] | None                # candidates for unsupported_names (by prefix)
    unsupported_names: dict[str, str]
    warp_file_re: re.Pattern[str] | None
    warp_rules: tuple[Rule, ...] = field(default=())
    warp_file_words: tuple[str, ...] = field(default=())
    verdicts: tuple[tuple[Verdict, re.Pattern[str]], ...] = field(default=())

    def is_warp_code(self, masked: str) -> bool:
        """Whether the warp32 rules apply to a file: it contains one of ``file_words`` (in any case)
        or matches ``file_pattern``; every file when the map has neither."""
        if self.warp_file_re is None and not self.warp_file_words:
            return True
        low = masked.lower() if self.warp_file_words else ""
        return any(w in low for w in self.warp_file_words) or (self.warp_file_re is not None
                                                                and self.warp_file_re.search(masked) is not None)

    def apply(self, text: str, counts: Counter[str] | None = None) -> str:
        """Call rewrites, then identifier swaps. Counts replacements by CUDA name."""
        counts = Counter() if counts is None else counts
        if self.call_re is not None and any(n in text for n in self.calls):
            # Right to left: a call nested in another's arguments is rewritten first, and positions
            # before the current match stay valid.
            for mt in reversed(list(self.call_re.finditer(text))):
                name = mt.group(1)
                split = split_call(text, mt.end() - 1)
                if split is None:
                    continue
                spans, close = split
                if len(spans) == 1 and not text[spans[0][0]:spans[0][1]].strip():
                    spans = []
                new = _render(self.calls[name], text, spans)
                if new is None:
                    continue
                text = text[:mt.start()] + new + text[close + 1:]
                counts[name] += 1
        if self.ident_re is not None and any(n in text for n in self.identifiers):
            def repl(mt: re.Match[str]) -> str:
                counts[mt.group(0)] += 1
                return self.identifiers[mt.group(0)]
            text = self.ident_re.sub(repl, text)
        return text


def _render(template: str, text: str, spans: list[tuple[int, int]]) -> str | None:
    need = max((int(m.group(1)) for m in _TEMPLATE_REF.finditer(template)), default=0)
    if need > len(spans):
        return None

    def ref(m: re.Match[str]) -> str:
        k = int(m.group(1)) - 1
        if m.group(2):
            return text[spans[k][0]:spans[-1][1]].lstrip()
        return text[spans[k][0]:spans[k][1]].strip()

    return _TEMPLATE_REF.sub(ref, template)
