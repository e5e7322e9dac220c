"""Bad input, generated: every parser of user input either accepts an input or refuses it with porter's own
error (a :class:`porter.errors.PorterError` with a message, and a hint where the parser gives one); no
other exception (TypeError, KeyError, ValueError, RecursionError, a TOML or JSON decoder's own error ...)
ever escapes one. Inputs come from hypothesis: structured-but-wrong documents (the right keys with wrong
types, missing keys, nested junk, huge and negative numbers, unicode, NUL bytes, empty strings, deep
nesting), mutations of the shipped valid documents, and random text and bytes.

Each parser gets at least 1000 examples over its tests (``fuzz(parser, n)``; a test checks the sums), and
the file runs in well under a minute. No hypothesis database is written (``database=None``), nothing
depends on the caller's environment, and no example starts a subprocess (the unit tier's autouse fixture
would fail it) or touches the network.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import signal
import tomllib
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter.artifacts import labels
from porter.artifacts.manifest import SCHEMA, read_manifest
from porter.cluster.slurm.matrix import load_matrix
from porter.cluster.site.profiles import load_site
from porter.errors import PorterError
from porter.patching import udiff
from porter.patching.model import load_file, parse_set
from porter.toolchain.archs import ARCHS
from porter.toolchain.profile import FIELDS, load_toolchain, preset_names

FUZZ = settings(deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])


EXAMPLES: dict[str, int] = {}
"""Examples per parser, over all its tests (``test_every_parser_gets_1000_examples`` checks the sums)."""


def fuzz(parser: str, examples: int) -> settings:
    EXAMPLES[parser] = EXAMPLES.get(parser, 0) + examples
    return settings(FUZZ, max_examples=examples)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_every_parser_gets_1000_examples() -> None:
    assert set(EXAMPLES) == {"toolchain", "patch set", "unified diff", "manifest", "label", "matrix", "site", "cli"}
    assert all(n >= 1000 for n in EXAMPLES.values()), EXAMPLES


# -- the contract -------------------------------------------------------------------------------------------

def refused_or_accepted(call: Callable[[], Any]) -> Any:
    """Run one parse: it returns, or raises a PorterError with a message (anything else fails the test)."""
    try:
        return call()
    except PorterError as exc:
        assert isinstance(exc.message, str) and exc.message.strip(), f"empty message: {exc!r}"
        assert exc.hint is None or (isinstance(exc.hint, str) and exc.hint.strip()), f"empty hint: {exc!r}"
        return exc


# -- generic strategies ---------------------------------------------------------------------------------------

HUGE_DIGITS = "1" * 4400   # past CPython's int-from-string limit (4300 digits)
NASTY_STRINGS = [
    "", " ", "\t", "\n", "\x00", "a\x00b", "~", "~\x00", "~nosuchuser\x00/x", "~/x", "${HOME}", "${X:-~\x00}",
    "${", "..", "../..", "/", "//", "/dev/null", "C:\\x", "a" * 300, "\u202e", "\U0001f4a5", "ü", "\ufeff",
    HUGE_DIGITS, "0." + HUGE_DIGITS, "0+" + HUGE_DIGITS, "-1", "0", "1e999", "nan", "true", "[", "]", "{", "=",
    "'", '"', "\\", "*", "(", "((((", "a{99999999999}", "x" * 5 + "{4294967295}",
]
nasty = st.sampled_from(NASTY_STRINGS)
text = st.one_of(nasty, st.text(max_size=16), st.text(st.characters(max_codepoint=0x7f), max_size=12))
ints = st.one_of(st.integers(-3, 5), st.integers(-(2 ** 63), 2 ** 63 - 1), st.sampled_from([10 ** 30, -(10 ** 30)]))
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = st.one_of(text, ints, floats, st.booleans())
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(text, inner, max_size=3)), max_leaves=4)


def valid_or_junk(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly the right shape (so that documents get past the first checks), else junk."""
    return st.one_of(valid, valid, valid, junk)


def str_list(items: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.lists(items, max_size=4)


def shaped(fields: dict[str, st.SearchStrategy[Any]], required: tuple[str, ...] = ()) -> st.SearchStrategy[dict[str, Any]]:
    """A table with any subset of ``fields`` (each valid or junk; ``required`` ones mostly there), and in one
    table of four an unknown key too."""
    def table(present: bool) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries({k: valid_or_junk(v) for k, v in fields.items() if present and k in required},
                                     optional={k: valid_or_junk(v) for k, v in fields.items()
                                               if not present or k not in required})
    doc = st.one_of(table(True), table(True), table(True), table(False))
    unknown = st.one_of(st.just({}), st.just({}), st.just({}), st.dictionaries(text, junk, min_size=1, max_size=1))
    return st.tuples(doc, unknown).map(lambda t: {**t[1], **t[0]})


def _paths(node: Any, trail: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*trail, k)
            yield from _paths(v, (*trail, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*trail, i)
            yield from _paths(v, (*trail, i))


@st.composite
def mutated(draw: st.DrawFn, bases: list[dict[str, Any]]) -> dict[str, Any]:
    """One of the valid documents ``bases`` with a few things broken: a value replaced by junk, a key
    deleted or renamed, an unknown key added, a value wrapped in a list or a table."""
    doc: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(bases)))
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for k in path[:-1]:
            parent = parent[k]
        key = path[-1]
        op = draw(st.sampled_from(["junk", "junk", "delete", "rename", "add", "wrap", "empty"]))
        if op == "junk":
            parent[key] = draw(junk)
        elif op == "delete":
            del parent[key]
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(text)] = parent.pop(key)
        elif op == "add" and isinstance(parent, dict):
            parent[draw(text)] = draw(junk)
        elif op == "wrap":
            parent[key] = draw(st.sampled_from([[parent[key]], {"x": parent[key]}]))
        elif op == "empty":
            parent[key] = draw(st.sampled_from(["", [], {}, 0]))
    return doc


# -- TOML and JSON writers (the generated documents must reach the parsers' own checks) -----------------------

def toml_str(s: str) -> str:
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out) + '"'


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{toml_str(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"


def dump_toml(doc: dict[str, Any]) -> str:
    return "".join(f"{toml_str(str(k))} = {toml_value(v)}\n" for k, v in doc.items())


def deep_line(keys: list[str]) -> st.SearchStrategy[str]:
    """``KEY.x.x.x... = 1`` (a table thousands deep, which a TOML parser builds without recursing) and
    ``KEY = [[[[...]]]]`` / ``{x = {x = ...}}`` (which it parses recursively)."""
    key = st.sampled_from(keys)
    depth = st.sampled_from([2, 60, 300, 1200])  # 1200: past the recursion limit (1000), from any stack depth
    dotted = st.builds(lambda k, n: f"{k}." + ".".join(["x"] * n) + " = 1\n", key, depth)
    arrays = st.builds(lambda k, n: f"{k} = " + "[" * n + "]" * n + "\n", key, depth)
    tables = st.builds(lambda k, n: f"{k} = " + "{x = " * n + "1" + "}" * n + "\n", key, depth)
    huge = st.builds(lambda k, form: f"{k} = {form}\n", key,
                     st.sampled_from([HUGE_DIGITS, "0x" + "f" * 4400, "1" + "0" * 400, "1e999", "-inf", "nan",
                                      "1979-05-27T07:32:00Z", "00:00:00"]))
    return st.one_of(dotted, arrays, tables, huge)


TOML_FRAGMENTS = ["[", "]", "[[", "]]", "=", " = ", '"', "'", '"""', "'''", "\n", "\\", "{", "}", ",", ".", "#",
                  "true", "1", "-1", "1.5", "nan", "inf", "0x1f", "1979-05-27", "[]", "{}", "a", "key", "\u00e9",
                  "\x00", "\r", "\t", HUGE_DIGITS]


def sometimes(lines: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A line to append to one document in four."""
    return st.one_of(st.just(""), st.just(""), st.just(""), lines)


def toml_text(keys: list[str]) -> st.SearchStrategy[str]:
    """Random text: pure noise, TOML-ish noise made of tokens and the parser's own key names, and
    single lines that nest deep or hold huge numbers."""
    tokens = st.sampled_from(TOML_FRAGMENTS + keys + [f"[{k}]\n" for k in keys] + [f"{k} = " for k in keys])
    return st.one_of(st.text(max_size=200), st.lists(st.one_of(tokens, st.text(max_size=4)), max_size=30).map("".join),
                     deep_line(keys))


def raw_bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=200), st.sampled_from([b"\xff\xfe", b"name = \"\xc3\x28\"\n",
                                                                 b"\x80" * 10, "é".encode("latin-1")]))


# -- files --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the module, whose files each example replaces (a function-scoped fixture is not reset
    between hypothesis examples)."""
    return tmp_path_factory.mktemp("bad-input")


def write(path: Path, content: str | bytes) -> Path:
    """Write one example's file. A new file each time: truncating one in place makes ext4 flush it to disk
    on close (auto_da_alloc), milliseconds per example."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_bytes(content.encode("utf-8", "surrogatepass"))
    return path


def shipped_toml(package: str, *parts: str) -> dict[str, Any]:
    res = resources.files(package)
    for p in parts:
        res = res.joinpath(p)
    return tomllib.loads(res.read_text(encoding="utf-8"))


# ==========================================================================================================
# toolchain profiles and presets: porter.toolchain.profile.load_toolchain

ARCH_NAMES = sorted(ARCHS)
arch_spec = st.one_of(st.sampled_from(ARCH_NAMES),
                      st.builds(lambda a, f: f"{a}:{f}", st.sampled_from(ARCH_NAMES),
                                st.sampled_from(["xnack-", "xnack+", "sramecc+", "sramecc-", "xnack", "", "xnack-:xnack+",
                                                 "sramecc+:xnack-"])),
                      st.sampled_from(["9.0", "90", "90a", "8.6", "1000", "gfx", "GFX90A", "sm_", ""]), text)
PRESETS = preset_names()
TC_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": text, "description": text, "root": text, "cxx": text, "hip_cxx": text, "launcher_root": text,
    "setup": text, "python": text,
    "kind": st.sampled_from(["rocm", "cuda", "cpu", "ROCm", ""]),
    "toolkit_version": st.one_of(st.sampled_from(["5.7", "6.2", "7.2", "13.0", "7", ""]), text),
    "compiler": st.one_of(st.sampled_from(["hipcc", "nvcc", "g++", ""]), text),
    "compiler_version": st.one_of(st.sampled_from([">=5.7,<5.8", "==7.2.*", ">=" + HUGE_DIGITS, "5.7", ""]), text),
    "archs": st.one_of(str_list(arch_spec), st.sampled_from(["gfx90a,gfx942", "gfx90a gfx1100", " , "])),
    "cpu_isa": st.one_of(st.sampled_from(["x86-64-v2", "x86-64-v3", "znver4", "native", "Znver4", "-march"]), text),
    "cflags": str_list(text), "defines": str_list(text), "launcher": str_list(text),
    "env": st.dictionaries(text, text, max_size=3),
    "extends": st.one_of(st.sampled_from(PRESETS), text),
}
assert set(TC_FIELDS) == set(FIELDS) | {"extends"}
TC_KEYS = sorted(TC_FIELDS)
TC_BASES = [shipped_toml("porter.toolchain", "presets", f"{p}.toml") for p in PRESETS]
tc_document = st.one_of(shaped(TC_FIELDS, required=("kind", "compiler")), mutated(TC_BASES))
environ: st.SearchStrategy[dict[str, str]] = st.one_of(st.just({}), st.dictionaries(
    st.sampled_from([f"PORTER_{k.upper()}" for k in FIELDS] + ["HOME", "X", "ROCM_PATH"]), text, max_size=4))
overrides = st.fixed_dictionaries({}, optional={
    "archs": st.one_of(st.lists(arch_spec, max_size=3).map(tuple), junk),
    "cpu_isa": st.one_of(st.none(), text, junk),
    "compiler": st.one_of(text, junk),
    "kind": st.one_of(text, junk),
    "env": st.one_of(st.dictionaries(text, text, max_size=2), junk),
}).flatmap(lambda d: st.one_of(st.just(d), st.dictionaries(text, junk, max_size=1).map(lambda e: {**e, **d})))


@fuzz("toolchain", 600)
@given(doc=tc_document, extra=sometimes(deep_line(TC_KEYS)), env=environ)
def test_toolchain_documents(scratch: Path, doc: dict[str, Any], extra: str, env: dict[str, str]) -> None:
    path = write(scratch / "tc" / "profile.toml", dump_toml(doc) + extra)
    refused_or_accepted(lambda: load_toolchain(path, environ=env))


@fuzz("toolchain", 250)
@given(content=st.one_of(toml_text(TC_KEYS), raw_bytes()))
def test_toolchain_text(scratch: Path, content: str | bytes) -> None:
    path = write(scratch / "tc" / "noise.toml", content)
    refused_or_accepted(lambda: load_toolchain(path, environ={}))


@fuzz("toolchain", 150)
@given(base=st.sampled_from(PRESETS), over=overrides, env=environ)
def test_toolchain_overrides_and_environment(base: str, over: dict[str, Any], env: dict[str, str]) -> None:
    refused_or_accepted(lambda: load_toolchain(base, overrides=over, environ=env))


@fuzz("toolchain", 150)
@given(ref=st.one_of(text, st.sampled_from(PRESETS), st.builds(lambda t: t + ".toml", text)))
def test_toolchain_refs(ref: str) -> None:
    refused_or_accepted(lambda: load_toolchain(ref, environ={}))


# ==========================================================================================================
# patch sets (porter.patching.model.parse_set, load_file) and unified diffs (porter.patching.udiff.parse)

VALID_DIFF = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
regex = st.one_of(st.sampled_from(["^def f", "(a)(b)", "[", "(?<=a+)b", "a{4294967295}", "(" * 1200 + ")" * 1200,
                                   "x**", "\\", "(?P<n>a)(?P=n)", ""]), text)
relpath = st.one_of(st.sampled_from(["a.py", "op_builder/builder.py", "../x", "/etc/x", "C:/x", "a/../../b",
                                     "", "a\\..\\b", "*.py"]), text)
edit_table = shaped({"action": st.sampled_from(["replace", "insert_before", "insert_after", "delete", "swap"]),
                     "anchor": text, "regex": st.booleans(), "count": ints, "text": text, "applied_if": regex},
                    required=("action", "anchor", "text"))
need = st.one_of(regex, shaped({"regex": regex, "files": str_list(relpath)}, required=("regex",)))
spec = st.one_of(st.sampled_from([">=0.14,<0.20", "==0.19.*", "~=1.0", ">=" + HUGE_DIGITS, "1.0", "<<1", ""]), text)
diff_name = st.one_of(st.sampled_from(["ok.patch", "binary.patch", "missing.patch", "", ".", "..", "sub",
                                       "/dev/null", "a\x00b.patch", "../bad-input0/ok.patch"]), text)
patch_table = st.one_of(
    shaped({"id": st.one_of(st.sampled_from(["p1", "p2", "no-jit-guard", "-x", "a b"]), text), "why": text,
            "files": str_list(relpath), "edit": st.lists(valid_or_junk(edit_table), max_size=3),
            "versions": spec, "needed_if": need}, required=("id", "why", "files", "edit")),
    shaped({"id": st.sampled_from(["d1", "d2"]), "why": text, "diff": diff_name, "strip": ints,
            "versions": spec, "needed_if": need}, required=("id", "why", "diff")),
)
set_head = shaped({"description": text, "versions": spec, "project": text, "name": text,
                   "verified": st.lists(valid_or_junk(shaped({"ref": text, "commit": text, "date": text,
                                                              "note": text}, required=("ref",))), max_size=2),
                   "version_from": st.lists(valid_or_junk(shaped({"file": relpath, "regex": regex},
                                                                 required=("file", "regex"))), max_size=2)})
set_document = shaped({"set": set_head, "patch": st.lists(valid_or_junk(patch_table), max_size=3)}, required=("patch",))
SET_BASES = [shipped_toml("porter.patchsets", "deepspeed", f"{n}.toml") for n in
             ("no-jit", "explicit-arch", "rocm-sources")]
SET_KEYS = ["set", "patch", "set.verified", "patch.edit", "set.version_from"]


@pytest.fixture(scope="module")
def set_folder(scratch: Path) -> Path:
    folder = scratch / "sets"
    write(folder / "ok.patch", VALID_DIFF)
    write(folder / "binary.patch", b"--- a/x\n+++ b/x\n\xff\xfe\x80\n")
    (folder / "sub").mkdir(exist_ok=True)
    return folder


@fuzz("patch set", 600)
@given(doc=st.one_of(set_document, mutated(SET_BASES)),
       extra=sometimes(deep_line(SET_KEYS)))
def test_patch_set_documents(set_folder: Path, doc: dict[str, Any], extra: str) -> None:
    text_ = dump_toml(doc) + extra
    refused_or_accepted(lambda: parse_set(text_, project="p", name="n", where="p/n.toml", base=set_folder))


@fuzz("patch set", 250)
@given(content=toml_text(SET_KEYS + ["[[patch]]\n", "[[patch.edit]]\n", "id", "files", "anchor", "action"]))
def test_patch_set_text(set_folder: Path, content: str) -> None:
    refused_or_accepted(lambda: parse_set(content, project="p", name="n", where="p/n.toml", base=set_folder))


@fuzz("patch set", 150)
@given(content=st.one_of(set_document.map(dump_toml), toml_text(SET_KEYS), raw_bytes()),
       suffix=st.sampled_from([".toml", ".patch", ".diff", ".txt", ""]))
def test_patch_set_files(set_folder: Path, content: str | bytes, suffix: str) -> None:
    path = write(set_folder / f"user{suffix}", content)
    refused_or_accepted(lambda: load_file(path))


hunk_line = st.one_of(st.builds(lambda tag, body: tag + body, st.sampled_from([" ", "-", "+", "\\", "", "?"]),
                                st.text(max_size=10)),
                      st.sampled_from(["\\ No newline at end of file", "--- a/x", "+++ b/x", "@@ -1 +1 @@"]))
number = st.one_of(st.integers(0, 5).map(str), st.sampled_from([HUGE_DIGITS, "9" * 30, "\u0661", "-1", ""]))
header = st.builds(lambda a, b, c, d: f"@@ -{a}{',' + b if b else ''} +{c}{',' + d if d else ''} @@",
                   number, number, number, number)
file_header = st.builds(lambda a, b: f"--- {a}\n+++ {b}", st.sampled_from(["a/x.py", "/dev/null", '"a/q x"', "a", ""])
                        | text, st.sampled_from(["b/x.py", "/dev/null", "b/", "x\ty"]) | text)
diff_text = st.lists(st.one_of(file_header, header, hunk_line), max_size=25).map("\n".join)


@fuzz("unified diff", 700)
@given(content=diff_text, strip=st.one_of(st.none(), st.integers(-2, 5)))
def test_unified_diff_structured(content: str, strip: int | None) -> None:
    refused_or_accepted(lambda: udiff.parse(content, strip))


@fuzz("unified diff", 300)
@given(content=st.one_of(st.text(max_size=300), st.builds(lambda a, b: a + b, st.just(VALID_DIFF), st.text(max_size=40))))
def test_unified_diff_text(content: str) -> None:
    refused_or_accepted(lambda: udiff.parse(content))


# ==========================================================================================================
# manifests: porter.artifacts.manifest.read_manifest

json_value = st.recursive(st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=False, allow_infinity=False),
                                    text),
                          lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
                          max_leaves=4)
manifest_doc = shaped({
    "schema": st.one_of(st.just(SCHEMA), st.just(SCHEMA), text), "porter_version": text, "component": text,
    "version": text, "wheel": st.fixed_dictionaries({}, optional={"filename": text, "sha256": text}),
    "python_tag": text, "toolchain": st.dictionaries(text, json_value, max_size=3),
    "target": st.fixed_dictionaries({}, optional={"kind": text, "archs": str_list(text), "label": text}),
    "torch": st.dictionaries(text, json_value, max_size=2), "sources": st.dictionaries(text, text, max_size=2),
    "extensions": st.lists(valid_or_junk(st.fixed_dictionaries({"module": text, "path": text, "sha256": text})),
                           max_size=3),
    "ops": st.lists(valid_or_junk(st.fixed_dictionaries({"name": text, "status": text})), max_size=3),
    "build": st.dictionaries(text, json_value, max_size=2),
}, required=("schema", "component", "version", "wheel", "target", "extensions"))
json_text = st.one_of(st.text(max_size=200), json_value.map(json.dumps),
                      st.integers(1, 5000).map(lambda n: "[" * n + "]" * n),
                      st.integers(1, 5000).map(lambda n: '{"a":' * n + "1" + "}" * n),
                      st.just('{"schema": "' + SCHEMA + '", "x": ' + HUGE_DIGITS + "}"),
                      st.sampled_from(["NaN", "-Infinity", '{"schema": NaN}', "\ufeff{}", '"\\ud800"']))


@fuzz("manifest", 600)
@given(doc=manifest_doc)
def test_manifest_documents(scratch: Path, doc: dict[str, Any]) -> None:
    path = write(scratch / "m" / "x.whl.porter.json", json.dumps(doc))
    got = refused_or_accepted(lambda: read_manifest(path))
    if isinstance(got, dict):  # accepted: what its readers index is there, with the right types
        assert isinstance(got["wheel"], dict) and isinstance(got["target"], dict)
        assert isinstance(got["extensions"], list) and all(isinstance(e, dict) for e in got["extensions"])
        assert isinstance(got.get("ops", []), list) and all(isinstance(o, dict) for o in got.get("ops", []))


@fuzz("manifest", 400)
@given(content=st.one_of(json_text, raw_bytes()))
def test_manifest_text(scratch: Path, content: str | bytes) -> None:
    path = write(scratch / "m" / "y.whl.porter.json", content)
    refused_or_accepted(lambda: read_manifest(path))


# ==========================================================================================================
# wheel labels: porter.artifacts.labels.parse (a Label, None for a label porter does not write, or ConfigError)

label_segment = st.one_of(st.sampled_from(["rocm", "rocm5", "rocm5.7", "cu", "cu130", "cpu", "gfx90a", "gfx942",
                                           "sm90", "sm90a", "x86", "64", "v2", "7", "2", "", HUGE_DIGITS]),
                          st.text(st.sampled_from("abcgfxmsu0123456789_-+. "), max_size=8))
label_text = st.lists(label_segment, max_size=6).flatmap(
    lambda segs: st.sampled_from([".", "-", "_", "+"]).map(lambda sep: sep.join(segs)))


@fuzz("label", 700)
@given(local=label_text)
def test_label_parse_structured(local: str) -> None:
    got = refused_or_accepted(lambda: labels.parse(local))
    assert got is None or isinstance(got, (labels.Label, PorterError))


@fuzz("label", 300)
@given(local=text)
def test_label_parse_text(local: str) -> None:
    refused_or_accepted(lambda: labels.parse(local))


# ==========================================================================================================
# matrix files: porter.cluster.slurm.matrix.load_matrix

component_entry = shaped({
    "name": st.sampled_from(["deepspeed", "apex", "flash-attn", "megatron-deepspeed", "nope"]) | text,
    "versions": str_list(st.sampled_from(["0.19.8", "0.19.7", "1!2.0rc1", HUGE_DIGITS, "x"]) | text),
    "sources": str_list(st.sampled_from(["src/apex", "missing", "a\x00b", "~nosuchuser\x00", "x==1"]) | text),
    "toolchains": str_list(st.sampled_from(["cpu", "mi300x", "tc.toml", "broken.toml", "a\x00.toml", "x/y"]) | text),
    "ops": str_list(st.sampled_from(["cpu_adam", "fused_adam"]) | text),
    "args": str_list(st.sampled_from(["--pch", "-j4", "--source=x", "--debug-info=lines"]) | text),
    "tag": text,
}, required=("name",))
slurm_table = shaped({"partition": text, "account": text, "qos": text, "time": text, "mem": text, "index_time": text,
                      "cpus_per_task": ints, "max_parallel": ints, "sbatch_args": str_list(text)})
matrix_doc = st.one_of(
    shaped({"name": text, "dir": st.sampled_from(["out", "", "\x00", "~nosuchuser\x00"]) | text,
            "wheelhouse": text, "toolchains": str_list(st.sampled_from(["cpu", "tc.toml", "frontier"]) | text),
            "python": text, "jobs": ints, "component": st.lists(valid_or_junk(component_entry), max_size=3),
            "slurm": slurm_table}, required=("dir", "toolchains", "component")),
    mutated([{"name": "m", "dir": "out", "toolchains": ["cpu", "tc.toml"],
             "component": [{"name": "deepspeed", "versions": ["0.19.8"], "ops": ["cpu_adam"]},
                           {"name": "apex", "sources": ["src/apex"], "toolchains": ["mi300x"]}],
             "slurm": {"partition": "batch", "time": "2:00:00", "cpus_per_task": 16}}]),
)
MATRIX_KEYS = ["name", "dir", "toolchains", "jobs", "component", "slurm", "slurm.cpus_per_task", "slurm.sbatch_args"]


@pytest.fixture(scope="module")
def matrix_folder(scratch: Path) -> Path:
    folder = scratch / "matrix"
    write(folder / "tc.toml", 'extends = "cpu"\ncpu_isa = "x86-64-v3"\n')
    write(folder / "broken.toml", "kind = \n")
    (folder / "src" / "apex").mkdir(parents=True, exist_ok=True)
    return folder


@fuzz("matrix", 700)
@given(doc=matrix_doc, extra=sometimes(deep_line(MATRIX_KEYS)), cli_dir=st.booleans())
def test_matrix_documents(matrix_folder: Path, doc: dict[str, Any], extra: str, cli_dir: bool) -> None:
    path = write(matrix_folder / "m.toml", dump_toml(doc) + extra)
    refused_or_accepted(lambda: load_matrix(path, directory=matrix_folder / "out" if cli_dir else None, environ={},
                                            python="/usr/bin/python3"))


@fuzz("matrix", 300)
@given(content=st.one_of(toml_text(MATRIX_KEYS + ["[[component]]\n", "[slurm]\n"]), raw_bytes()))
def test_matrix_text(matrix_folder: Path, content: str | bytes) -> None:
    path = write(matrix_folder / "noise.toml", content)
    refused_or_accepted(lambda: load_matrix(path, environ={}, python="/usr/bin/python3"))


# ==========================================================================================================
# site profiles: porter.cluster.site.profiles.load_site

SITE_NAMES = ["frontier", "lumi-g", "mi300x"]
SITE_BASES = [shipped_toml("porter.cluster.site", "builtin", f"{n}.toml") for n in SITE_NAMES]
site_doc = st.one_of(
    shaped({"name": text, "description": text, "source": text, "toolchain": text,
            "node": shaped({"gpus": ints, "gcds_per_gpu": ints, "device_memory_gib": st.one_of(floats, ints),
                            "arch": arch_spec, "cores": ints, "cores_per_gcd": ints, "numa_of_gcd": st.lists(ints, max_size=8),
                            "nics": str_list(text), "gcds_per_nic": ints, "cpu_bind": text, "gpu_bind": text,
                            "local_dir": text, "nvme": text, "nvme_sbatch": str_list(text)},
                           required=("gpus", "device_memory_gib", "arch", "cores", "cores_per_gcd")),
            "runtime": shaped({"modules": str_list(text), "env": st.dictionaries(text, text, max_size=3),
                               "miopen_dir": text, "master_port": ints}),
            "scheduler": shaped({"partition": text, "qos": text, "time": text, "sbatch_args": str_list(text),
                                 "request_gpus": st.booleans(), "max_nodes": ints}),
            "plugin": shaped({"name": text, "version": text, "module": text, "library": text, "env_var": text,
                              "rccl_major": ints}, required=("name",))}, required=("source", "node")),
    mutated(SITE_BASES),
)
SITE_KEYS = ["name", "source", "node", "runtime", "scheduler", "plugin", "node.gpus", "node.numa_of_gcd",
             "node.device_memory_gib", "runtime.env", "scheduler.sbatch_args", "plugin.rccl_major"]


@fuzz("site", 600)
@given(doc=site_doc, extra=sometimes(deep_line(SITE_KEYS)))
def test_site_documents(scratch: Path, doc: dict[str, Any], extra: str) -> None:
    path = write(scratch / "sites" / "site.toml", dump_toml(doc) + extra)
    refused_or_accepted(lambda: load_site(path))


@fuzz("site", 250)
@given(content=st.one_of(toml_text(SITE_KEYS + ["[node]\n", "[runtime.env]\n"]), raw_bytes()))
def test_site_text(scratch: Path, content: str | bytes) -> None:
    path = write(scratch / "sites" / "noise.toml", content)
    refused_or_accepted(lambda: load_site(path))


@fuzz("site", 150)
@given(ref=st.one_of(text, st.sampled_from(SITE_NAMES), st.builds(lambda t: t + ".toml", text)))
def test_site_refs(ref: str) -> None:
    refused_or_accepted(lambda: load_site(ref))


# ==========================================================================================================
# a device or a folder where a file is named is refused, never read (a diff = "/dev/zero" would be read forever)

@pytest.mark.skipif(not Path("/dev/null").exists(), reason="needs /dev/null")
def test_devices_and_folders_are_not_read(tmp_path: Path) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: load_matrix("/dev/null", environ={}), lambda: load_matrix(tmp_path, environ={}),
        lambda: load_toolchain("/dev/null", environ={}), lambda: load_site("/dev/null"),
        lambda: load_file(Path("/dev/null")), lambda: read_manifest(tmp_path),
        lambda: parse_set('[[patch]]\nid = "d"\nwhy = "w"\ndiff = "/dev/null"\n', project="p", name="n",
                          where="n.toml", base=tmp_path),
        lambda: parse_set('[[patch]]\nid = "d"\nwhy = "w"\ndiff = "."\n', project="p", name="n",
                          where="n.toml", base=tmp_path),
    ]
    for call in calls:
        assert isinstance(refused_or_accepted(call), PorterError)


# ==========================================================================================================
# CLI option values: porter.cli.main in-process; the exit code is porter's, stderr holds no traceback

EXIT_CODES = {0, 1, 2, 3, 4}
option_text = st.one_of(text, st.builds(lambda t: "-" + t, text), st.builds(lambda t: "--" + t, text))


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    from porter.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code
            else:  # main always exits
                raise AssertionError("porter.cli.main returned instead of exiting")
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code is None:
        code = 0
    assert isinstance(code, int), f"exit code {code!r}"
    return code, out.getvalue(), err.getvalue()


def assert_clean(argv: list[str]) -> None:
    code, _, err = run_cli(argv)
    assert code in EXIT_CODES, f"exit {code} for {argv!r}:\n{err}"
    assert "Traceback" not in err, err


@pytest.fixture(scope="module")
def cli_folder(scratch: Path) -> Path:
    folder = scratch / "cli"
    write(folder / "tc.toml", 'extends = "mi300x"\narchs = ["gfx90a"]\n')
    write(folder / "bad.toml", 'kind = "rocm"\ncompiler = "hipcc"\narchs = "gfx90a:xnack+:xnack-"\n')
    write(folder / "site.toml", 'source = "x"\n[node]\ngpus = 1\n')
    (folder / "tree").mkdir(exist_ok=True)
    return folder


DIR = "\x00DIR\x00"
"""Stands for the test's folder in a generated argv (the strategies are built once, before the fixture)."""


@st.composite
def ops_build_argv(draw: st.DrawFn) -> list[str]:
    """``porter ops build --dry-run`` with generated -t/--arch/--cpu-isa/--ops/-j/--shard: the options are
    parsed and the toolchain resolved; the (absent) source stops it before any work."""
    argv = ["ops", "build", "--source", f"{DIR}/no-such-source", "--dry-run", "-o", f"{DIR}/wh"]
    if draw(st.booleans()):
        argv += ["-t", draw(st.one_of(st.sampled_from(PRESETS), st.sampled_from(
            [f"{DIR}/tc.toml", f"{DIR}/bad.toml", f"{DIR}/none.toml", DIR]), option_text))]
    for a in draw(st.lists(st.one_of(arch_spec, str_list(arch_spec).map(",".join)), max_size=2)):
        argv += ["--arch", a]
    if draw(st.booleans()):
        argv += ["--cpu-isa", draw(st.one_of(st.sampled_from(["x86-64-v3", "znver4"]), option_text))]
    if draw(st.booleans()):
        argv += ["--ops", draw(st.one_of(st.sampled_from(["cpu_adam,cpu_lion", ",,", ""]), option_text))]
    if draw(st.booleans()):
        argv += ["-j", draw(st.one_of(st.integers(-2, 64).map(str), st.just(HUGE_DIGITS), option_text))]
    if draw(st.booleans()):
        argv += ["--shard", draw(st.one_of(st.sampled_from(["0/4", "3/4", "4/4", "-1/2", "1/0", "1/2/3", "/",
                                                             HUGE_DIGITS + "/2"]), option_text))]
    if draw(st.booleans()):
        argv += ["--debug-info", draw(st.one_of(st.sampled_from(["full", "lines", "none"]), option_text))]
    if draw(st.booleans()):
        argv.append("--json")
    return argv


def placed(argv: list[str], folder: Path) -> list[str]:
    return [a.replace(DIR, str(folder)) for a in argv]


@fuzz("cli", 600)
@given(argv=ops_build_argv())
def test_cli_ops_build_options(cli_folder: Path, argv: list[str]) -> None:
    assert_clean(placed(argv, cli_folder))


ref_argv = option_text.flatmap(lambda ref: st.sampled_from([
    ["toolchain", "show", ref], ["toolchain", "show", ref, "--json"],
    ["toolchain", "show", f"{DIR}/tc.toml"], ["toolchain", "show", f"{DIR}/bad.toml"],
    ["site", "show", ref], ["site", "show", f"{DIR}/site.toml"],
    ["patch", "check", f"{DIR}/tree", "--set", ref],
    ["patch", "check", f"{DIR}/tree", "--set", "deepspeed/no-jit", "--target-version", ref],
    ["toolchain", ref], [ref],
]))


@fuzz("cli", 400)
@given(argv=ref_argv)
def test_cli_refs(cli_folder: Path, argv: list[str]) -> None:
    """Commands that take a profile, a site or a patch set by name or file, and validate it first."""
    assert_clean(placed(argv, cli_folder))


def test_launch_plan_answers_a_huge_layer_count_at_once() -> None:
    """Found by hand beside the generated inputs: the layout search listed divisors in n steps, so
    --layers 1000000000 hung."""
    from porter.cluster.site.launch import _divisors

    assert _divisors(12) == [1, 2, 3, 4, 6, 12] and _divisors(1) == [1] and _divisors(49) == [1, 7, 49]
    assert len(_divisors(10**9)) == 100 and _divisors(10**9)[-1] == 10**9
