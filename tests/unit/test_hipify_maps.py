"""porter's extra map: argument-aware call rewrites, identifier swaps, TOML validation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from porter.errors import ConfigError
from porter.hipify.maps import builtin_map, combined_map, load_map, split_call
from porter.hipify.scan import scan


def apply(text: str, counts: Counter[str] | None = None) -> str:
    return builtin_map().compiled.apply(text, counts)


def test_sync_intrinsics_drop_the_mask_argument() -> None:
    src = ("a = __shfl_sync(0xffffffff, v, 0);\n"
           "b = __shfl_xor_sync(mask, v, 1, 16);\n"
           "c = __shfl_up_sync(FULL, v, d);\n"
           "d = __shfl_down_sync(m, v, d);\n"
           "e = __ballot_sync(0xffffffffu, x > 0);\n"
           "f = __any_sync(m, p) + __all_sync(m, p);\n"
           "g = __activemask();\n")
    counts: Counter[str] = Counter()
    assert apply(src, counts) == ("a = __shfl(v, 0);\n"
                                  "b = __shfl_xor(v, 1, 16);\n"
                                  "c = __shfl_up(v, d);\n"
                                  "d = __shfl_down(v, d);\n"
                                  "e = __ballot(x > 0);\n"
                                  "f = __any(p) + __all(p);\n"
                                  "g = __ballot(1);\n")
    assert counts["__shfl_xor_sync"] == 1 and counts["__activemask"] == 1 and counts["__any_sync"] == 1


def test_mask_expressions_with_commas_calls_and_nesting() -> None:
    src = "v += __shfl_xor_sync(make_mask(a, (b, c)), __shfl_down_sync(m[i, j], f(v, 2), 1), w);"
    assert apply(src) == "v += __shfl_xor(__shfl_down(f(v, 2), 1), w);"


def test_arguments_keep_their_layout_across_lines() -> None:
    src = "x = __shfl_xor_sync(0xffffffff,\n                    val,  // the value\n                    lane);"
    assert apply(src) == "x = __shfl_xor(val,  // the value\n                    lane);"


def test_too_few_arguments_and_lookalikes_are_left_alone() -> None:
    src = "a = __shfl_sync(v); b = obj.__shfl_sync(m, v, 1); c = my__shfl_sync(m, v, 1); d = __shfl_sync;"
    assert apply(src) == src


def test_unbalanced_call_is_left_alone() -> None:
    src = "a = __shfl_xor_sync(m, v, (1;"
    assert apply(src) == src


def test_hcc_platform_macro_becomes_amd() -> None:
    src = "#if defined(__HIP_PLATFORM_HCC__) && !defined(MY__HIP_PLATFORM_HCC__X)\n"
    assert apply(src) == "#if defined(__HIP_PLATFORM_AMD__) && !defined(MY__HIP_PLATFORM_HCC__X)\n"


def test_rewrite_is_idempotent() -> None:
    src = "v = __shfl_xor_sync(0xffffffff, v, 1); u = __activemask();\n#ifdef __HIP_PLATFORM_HCC__\n"
    once = apply(src)
    assert apply(once) == once


def test_split_call_skips_strings_and_comments() -> None:
    text = 'f(a, ")", /* , */ \',\', b)'
    spans, close = split_call(text, 1)  # type: ignore[misc]
    assert close == len(text) - 1
    assert [text[s:e].strip() for s, e in spans] == ["a", '")"', "/* , */ ','", "b"]


def test_user_map_adds_and_overrides(tmp_path: Path) -> None:
    user = tmp_path / "mine.toml"
    user.write_text('[identifiers]\ncudaFooBar = "hipFooBar"\n"__HIP_PLATFORM_HCC__" = "USE_ROCM"\n'
                    '[calls]\nmy_sync = "my({1}, {3...})"\n'
                    '[unsupported.names]\nmyCudaThing = "port it"\n')
    cmap = combined_map([user]).compiled
    assert cmap.apply("cudaFooBar(); __HIP_PLATFORM_HCC__; my_sync(a, b, c, d)") == \
        "hipFooBar(); USE_ROCM; my(a, c, d)"
    assert cmap.apply("__shfl_sync(m, v, 0)") == "__shfl(v, 0)"  # built-ins still apply
    assert [(f.identifier, f.message) for f in scan("myCudaThing(x);", "a.cu", cmap).unsupported] == \
        [("myCudaThing", "port it")]


@pytest.mark.parametrize("body, words", [
    ('[identifers]\na = "b"\n', "unknown key 'identifers' \\(did you mean 'identifiers'\\?\\)"),
    ('[identifiers]\n"not an ident" = "b"\n', "is not a C identifier"),
    ('[identifiers]\na = 1\n', "value must be a string"),
    ('[calls]\nf = "g({x})"\n', "brace"),
    ('[calls]\nf = "g({0})"\n', "numbered from 1"),
    ('[[unsupported.patterns]]\npattern = "cuda("\nhint = "h"\n', "bad regex"),
    ('[[unsupported.patterns]]\npattern = "x"\n', "missing key 'hint'"),
    ('[[warp32.rules]]\nid = "r"\npattern = "x"\nmessage = "m"\nextra = 1\n', "unknown key 'extra'"),
    ('[identifiers\n', "invalid TOML"),
])
def test_bad_map_files_name_the_problem(tmp_path: Path, body: str, words: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(ConfigError, match=words) as info:
        load_map(f)
    assert str(f) in info.value.message
    assert info.value.hint


def test_a_map_file_that_is_not_utf8_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "latin1.toml"
    f.write_bytes('[identifiers]\ncaf\xe9 = "b"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8 text") as info:
        load_map(f)
    assert str(f) in info.value.message and info.value.hint


def test_missing_map_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping file .*nope.toml: not found") as info:
        load_map(tmp_path / "nope.toml")
    assert info.value.hint == "pass the path of a mapping TOML file (--map)"
    with pytest.raises(ConfigError, match="mapping file .*: not a file"):
        load_map(tmp_path)


def test_builtin_map_digest_changes_with_content(tmp_path: Path) -> None:
    user = tmp_path / "m.toml"
    user.write_text('[identifiers]\na = "b"\n')
    assert builtin_map().digest() == builtin_map().digest()
    assert combined_map([user]).digest() != builtin_map().digest()
