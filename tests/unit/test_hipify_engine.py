"""hipify_tree on small trees written here: layout, idempotence, cache, reports, bad input."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from porter.errors import ConfigError, NothingToDo
from porter.hipify import CACHE_NAME, hipify_tree
from porter.hipify.torch_engine import breadcrumb

# porter hipify is torch's own hipify plus porter's map: without torch these cannot run (they skip, saying so)
pytest.importorskip("torch.utils.hipify", reason="porter's hipify engine runs torch's hipify; torch is not installed")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hipify" / "tree"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(FIXTURE, src)
    return src


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file's bytes, porter's own cache record left out."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != CACHE_NAME}


def test_out_of_tree_by_default_and_src_untouched(tree: Path) -> None:
    before = snapshot(tree)
    report = hipify_tree(tree)
    out = tree.with_name("src-hip")
    assert report.out == out.resolve()
    assert snapshot(tree) == before
    files = {f.path: f for f in report.files}
    assert files["csrc/ops/scale.cu"].status == "changed"
    assert files["csrc/includes/reduce.cuh"].status == "changed"
    assert files["csrc/cpu/cpu_add.cpp"].status == "unchanged"
    assert files["README.txt"].status == "copied"
    # Same relative paths; untouched and non-source files byte-identical (CRLF kept).
    assert (out / "csrc/cpu/cpu_add.cpp").read_bytes() == (tree / "csrc/cpu/cpu_add.cpp").read_bytes()
    assert (out / "README.txt").read_bytes() == (tree / "README.txt").read_bytes()
    scale = (out / "csrc/ops/scale.cu").read_text()
    assert scale.startswith(breadcrumb())
    assert "hipLaunchKernelGGL" in scale and "hipStream_t" in scale and "__HIP_PLATFORM_AMD__" in scale
    reduce = (out / "csrc/includes/reduce.cuh").read_text()
    assert "__shfl_down(__shfl_xor(v, 1), width)" in reduce
    assert "// __shfl_xor_sync in a comment" in reduce  # a name with no call: not rewritten
    assert report.replacements["__shfl_xor_sync"] == 2
    assert report.replacements["cudaStream_t"] == 3
    assert report.replacements["<<<...>>> kernel launch"] == 1
    assert len(report.written) == 5


def test_second_run_changes_nothing_and_uses_the_cache(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    hipify_tree(tree, out)
    first = snapshot(out)
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = hipify_tree(tree, out)
    assert snapshot(out) == first
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == mtimes
    assert again.written == [] and again.cached == len(again.files) == 5
    # Same report from the cache as from the first run.
    assert [f.format() for f in again.warp32] == [f.format() for f in hipify_tree(tree, out, use_cache=False).warp32]


def test_hipifying_the_output_again_changes_nothing(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    hipify_tree(tree, out)
    before = snapshot(out)
    report = hipify_tree(out, in_place=True)
    assert report.written == []
    assert snapshot(out) == before
    assert {f.path for f in report.skipped} == {"csrc/ops/scale.cu", "csrc/includes/reduce.cuh",
                                                 "csrc/ops/scale_binding.cpp"}


def test_in_place_rewrites_the_tree_once(tree: Path) -> None:
    first = hipify_tree(tree, in_place=True)
    assert len(first.written) == 3
    assert "hipStream_t" in (tree / "csrc/ops/scale.cu").read_text()
    assert (tree / CACHE_NAME).is_file()
    second = hipify_tree(tree, in_place=True)
    assert second.written == []
    assert hipify_tree(tree, in_place=True, check=True).written == []


def test_check_writes_nothing_and_lists_what_would_change(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = hipify_tree(tree, out, check=True)
    assert not out.exists()
    assert len(report.written) == 5
    hipify_tree(tree, out)
    assert hipify_tree(tree, out, check=True).written == []
    (tree / "csrc/ops/scale.cu").write_text("cudaMalloc(&p, 4);\n")
    assert [f.path for f in hipify_tree(tree, out, check=True).written] == ["csrc/ops/scale.cu"]
    assert in_place_check_needed(tree)


def in_place_check_needed(tree: Path) -> bool:
    return bool(hipify_tree(tree, in_place=True, check=True).written)


def test_changed_source_is_redone_and_removed_source_is_removed(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    hipify_tree(tree, out)
    (tree / "csrc/ops/scale.cu").write_text("void f() { cudaDeviceSynchronize(); }\n")
    (tree / "csrc/cpu/cpu_add.cpp").unlink()
    report = hipify_tree(tree, out)
    assert [f.path for f in report.written] == ["csrc/ops/scale.cu"]
    assert report.removed == ("csrc/cpu/cpu_add.cpp",)
    assert not (out / "csrc/cpu/cpu_add.cpp").exists()
    assert "hipDeviceSynchronize" in (out / "csrc/ops/scale.cu").read_text()


def test_output_edited_by_hand_is_rewritten(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    hipify_tree(tree, out)
    good = (out / "csrc/ops/scale.cu").read_bytes()
    (out / "csrc/ops/scale.cu").write_text("edited\n")
    report = hipify_tree(tree, out)
    assert [f.path for f in report.written] == ["csrc/ops/scale.cu"]
    assert (out / "csrc/ops/scale.cu").read_bytes() == good


def test_a_new_map_invalidates_the_cache(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    hipify_tree(tree, out)
    m = tmp_path / "map.toml"
    m.write_text('[identifiers]\ncudaCheckThing = "hipCheckThing"\n')
    report = hipify_tree(tree, out, extra_maps=[m])
    assert report.cached == 0
    assert "hipCheckThing(x)" in (out / "csrc/ops/scale.cu").read_text()
    assert report.maps[-1] == str(m)


def test_unsupported_report_has_locations_hints_and_skips_tree_definitions(tree: Path, tmp_path: Path) -> None:
    report = hipify_tree(tree, tmp_path / "out")
    found = [(u.path, u.line, u.column, u.identifier) for u in report.unsupported]
    # scale.cu line 19 after the breadcrumb and the added hip_runtime include lines: see the output file
    out_lines = (tmp_path / "out/csrc/ops/scale.cu").read_text().splitlines()
    (path, line, col, ident), = found
    assert (path, ident) == ("csrc/ops/scale.cu", "__nanosleep")
    assert out_lines[line - 1][col - 1:].startswith("__nanosleep(100)")
    assert "__builtin_amdgcn_s_sleep" in report.unsupported[0].message
    # cudaCheckThing is a macro of the tree itself (scale_binding.cpp): not a CUDA API.
    assert "cudaCheckThing" not in {u.identifier for u in report.unsupported}


def test_warp32_assumptions_are_flagged_not_rewritten(tree: Path, tmp_path: Path) -> None:
    report = hipify_tree(tree, tmp_path / "out")
    flags = {(w.path, w.identifier, w.text) for w in report.warp32}
    assert ("csrc/includes/reduce.cuh", "warp-size-32", "#define WARP_SIZE 32") in flags
    # FULL_MASK only fed __shfl_*_sync masks, which the extra map dropped: dead after hipify, not flagged.
    assert not any(i == "full-mask" for _, i, _ in flags)
    assert any(i == "reduction-from-16" for _, i, _ in flags)
    text = (tmp_path / "out/csrc/includes/reduce.cuh").read_text()
    assert "#define WARP_SIZE 32" in text and "0xffffffff" in text
    for w in report.warp32:
        assert text.splitlines()[w.line - 1].strip() == w.text


def test_non_utf8_source_is_copied_and_reported(tree: Path, tmp_path: Path) -> None:
    latin1 = "// caf\xe9\ncudaMalloc(&p, 4);\n".encode("latin-1")
    (tree / "csrc/ops/legacy.cu").write_bytes(latin1)
    report = hipify_tree(tree, tmp_path / "out")
    assert (tmp_path / "out/csrc/ops/legacy.cu").read_bytes() == latin1
    skipped = {f.path: f.reason for f in report.skipped}
    assert "not UTF-8" in skipped["csrc/ops/legacy.cu"]


def test_symlinks_are_not_followed(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.cu").write_text("cudaMalloc(&p, 4);\n")
    (tree / "csrc/escape.cu").symlink_to(outside / "secret.cu")
    (tree / "csrc/escape_dir").symlink_to(outside, target_is_directory=True)
    (tree / "csrc/alias.cuh").symlink_to("includes/reduce.cuh")
    (tree / "csrc/abs_alias.cuh").symlink_to(tree / "csrc/includes/reduce.cuh")
    out = tmp_path / "out"
    report = hipify_tree(tree, out)
    skipped = {f.path: f.reason for f in report.skipped}
    assert "outside the tree; not followed" in skipped["csrc/escape.cu"]
    assert "outside the tree; not followed" in skipped["csrc/escape_dir"]
    assert not (out / "csrc/escape.cu").exists() and not (out / "csrc/escape_dir").exists()
    assert os.readlink(out / "csrc/alias.cuh") == "includes/reduce.cuh"
    assert (out / "csrc/abs_alias.cuh").resolve() == (out / "csrc/includes/reduce.cuh").resolve()
    assert "__shfl_xor(" in (out / "csrc/alias.cuh").read_text()
    assert (outside / "secret.cu").read_text() == "cudaMalloc(&p, 4);\n"


def test_json_report_is_serialisable(tree: Path, tmp_path: Path) -> None:
    d = hipify_tree(tree, tmp_path / "out").to_dict()
    doc = json.loads(json.dumps(d))
    assert doc["summary"]["scanned"] == 5 and doc["summary"]["changed"] == 3
    assert doc["unsupported"][0]["identifier"] == "__nanosleep"
    assert {"path", "line", "column", "identifier", "message"} <= set(doc["warp32"][0])


# --- bad input -----------------------------------------------------------------------------------

def test_src_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="source tree not found"):
        hipify_tree(tmp_path / "nope")


def test_src_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "a.cu"
    f.write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        hipify_tree(f)


def test_out_inside_src(tree: Path) -> None:
    with pytest.raises(ConfigError, match="inside the source tree") as info:
        hipify_tree(tree, tree / "csrc" / "hip")
    assert not (tree / "csrc" / "hip").exists()
    assert info.value.hint


def test_out_is_src(tree: Path) -> None:
    with pytest.raises(ConfigError, match="output directory is the source tree") as info:
        hipify_tree(tree, tree)
    assert "--in-place" in (info.value.hint or "")


def test_in_place_with_another_out(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exclude each other"):
        hipify_tree(tree, tmp_path / "o", in_place=True)


def test_read_only_out(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="read-only") as info:
            hipify_tree(tree, out)
        assert "chmod" in (info.value.hint or "")
        assert list(out.iterdir()) == []
    finally:
        out.chmod(0o755)


def test_out_not_written_by_porter(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "precious.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not written by porter hipify"):
        hipify_tree(tree, out)
    assert (out / "precious.txt").read_text() == "keep"


def test_empty_tree(tmp_path: Path) -> None:
    src = tmp_path / "empty"
    (src / "sub").mkdir(parents=True)
    with pytest.raises(NothingToDo, match="no files"):
        hipify_tree(src, tmp_path / "out")
    assert NothingToDo.exit_code == 4


def test_read_only_source_file_mode_is_kept(tree: Path, tmp_path: Path) -> None:
    p = tree / "csrc/ops/scale.cu"
    p.chmod(0o444)
    hipify_tree(tree, tmp_path / "out")
    assert stat.S_IMODE((tmp_path / "out/csrc/ops/scale.cu").stat().st_mode) == 0o444
