"""Report quality on fixtures written here: what counts as CUDA API, warp-32 flags in warp code,
masks the extra map already dropped."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from porter.errors import ConfigError
from porter.hipify import hipify_tree
from porter.hipify.maps import builtin_map, load_map
from porter.hipify.scan import scan
from porter.hipify.torch_engine import torch_hipify

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hipify"
KERNEL = "csrc/layer_norm/layer_norm_kernel.cu"
OWN_FUNCTIONS = {"cuOnlineMean", "cuMergeMeans", "cuRowMean", "cuApplyNorm", "cuLaunchHelper", "cuLaunchCount"}


@pytest.fixture
def ops(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES / "ops", tmp_path / "src")
    return tmp_path / "src"


def scan_text(text: str, path: str = "k.cu") -> tuple[list[str], list[tuple[int, str]]]:
    """(unsupported names, [(line, warp rule)]) of one already-hipified text; names the text
    defines are dropped, as hipify_tree drops them tree-wide."""
    res = scan(text, path, builtin_map().compiled)
    return ([u.identifier for u in res.unsupported if u.identifier not in res.defines],
            [(w.line, w.identifier) for w in res.warp32])


# --- only CUDA's own names are CUDA API -----------------------------------------------------------

def test_kernel_own_cu_functions_are_not_cuda_api(ops: Path, tmp_path: Path) -> None:
    report = hipify_tree(ops, tmp_path / "out")
    out_text = "".join((tmp_path / "out/csrc/layer_norm" / name).read_text()
                       for name in ("layer_norm_kernel.cu", "layer_norm_host.cpp"))
    for name in OWN_FUNCTIONS:
        assert re.search(rf"\b{name}\b", out_text), name  # still there after hipify ...
    names = {u.identifier for u in report.unsupported}
    assert not names & OWN_FUNCTIONS  # ... and none of them is called CUDA API
    # A real driver call that torch does not map still is, with its place.
    [real] = [u for u in report.unsupported if u.path == KERNEL]
    assert real.identifier == "cuTensorMapEncodeTiled" and "CUDA driver API" in real.message
    assert (tmp_path / "out" / KERNEL).read_text().splitlines()[real.line - 1][real.column - 1:].startswith(
        "cuTensorMapEncodeTiled(")


def test_driver_pattern_covers_torchs_table_and_not_kernel_names() -> None:
    """The [unsupported] patterns match every cu*/CU* name of torch's own CUDA tables (CUDA's
    names), and none of the cu* names kernels give their own helpers."""
    rxs = [rx for rx, _ in builtin_map().compiled.unsupported_patterns]
    cuda_names = [k for k in torch_hipify().PYTORCH_MAP if re.fullmatch(r"(?:cu[A-Z]|CU[a-z_])\w*", k)]
    assert len(cuda_names) > 500
    assert [k for k in cuda_names if not any(rx.fullmatch(k) for rx in rxs)] == []
    for own in ("cuWelfordStep", "cuApplyNorm_", "cuChanMerge", "cuComputeGradInput", "cuLoadStrided", "cuRowMean"):
        assert not any(rx.fullmatch(own) for rx in rxs), own
    for real in ("cuMemcpyHtoD_v2", "cuTensorMapEncodeTiled", "cuLibraryLoadData", "cuFileRead", "CUtensorMap"):
        assert any(rx.fullmatch(real) for rx in rxs), real


@pytest.mark.parametrize("text, reported", [
    # a function with a body (template, qualifiers, parameters over several lines) is the tree's
    ("template <typename T>\n__device__ void cuMemcpyRow(\n    T* d,\n    const T* s) const noexcept {\n}\n"
     "void g() { cuMemcpyRow(a, b); }\n", []),
    # a variable of the tree
    ("static int cudaLaunches = 0;\nvoid g() { cudaLaunches += 1; }\n", []),
    # a re-declaration of a real API is no definition: its uses stay CUDA API
    ("extern int cuLibraryUnload(void* lib);\nvoid g() { cuLibraryUnload(0); }\n",
     ["cuLibraryUnload", "cuLibraryUnload"]),
    # calls, in conditions and as statements, are uses
    ("void g() {\n  if (cudaGraphInstantiateWithParams(a, b)) {\n  }\n"
     "  return cudaGraphInstantiateWithParams(c, d);\n}\n",
     ["cudaGraphInstantiateWithParams", "cudaGraphInstantiateWithParams"]),
])
def test_what_defines_a_name(text: str, reported: list[str]) -> None:
    assert scan_text(text)[0] == reported


def test_a_definition_in_another_file_counts(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.cu").write_text("void run() { cuModuleWarmup(); cuModuleGetLoadingMode(0); }\n")
    (src / "b.cpp").write_text("void cuModuleWarmup() {\n}\n")
    names = [u.identifier for u in hipify_tree(src, tmp_path / "out").unsupported]
    assert names == ["cuModuleGetLoadingMode"]


# --- warp-32 lane math wherever warp code is -------------------------------------------------------

def test_lane_math_in_a_file_that_only_uses_a_warp_shfl_macro(ops: Path, tmp_path: Path) -> None:
    source = (ops / KERNEL).read_text()
    assert "WARP_SHFL(" in source and "__shfl" not in source and "warpSize" not in source
    report = hipify_tree(ops, tmp_path / "out")
    flags = {(w.identifier, w.text) for w in report.warp32 if w.path == KERNEL}
    assert ("lane-arithmetic", "int partner = (threadIdx.x + (1 << step)) & 31;") in flags
    assert ("block-x-32", "const dim3 threads(32, 4, 1);") in flags


@pytest.mark.parametrize("line, rule", [
    ("int lane = threadIdx.x & 0x1f;", "lane-arithmetic"),
    ("int warp = threadIdx.x >> 5;", "lane-arithmetic"),
    ("v += WARP_SHFL_XOR(v, 4, 32);", "shfl-width-32"),
    ("constexpr int kThreadsPerWarp = 32;", "warp-size-32"),
    ("static constexpr int kWarpSize = 32;", "warp-size-32"),
])
def test_warp32_rules(line: str, rule: str) -> None:
    text = f"__device__ void f(float v) {{\n  {line}\n}}\n"
    assert scan_text(text) == ([], [(2, rule)])


def test_no_warp_code_no_flags() -> None:
    assert scan_text("void f(int* x, int i) {\n  x[i] = i % 32 + (i & 31);\n}\n") == ([], [])


def test_flag_is_reported_at_the_start_of_the_name() -> None:
    res = scan("static constexpr int kWarpSize = 32;\n", "k.cu", builtin_map().compiled)
    assert [(w.identifier, w.column) for w in res.warp32] == [("warp-size-32", 22)]


# --- masks the extra map already dropped -----------------------------------------------------------

def test_masks_already_mapped_are_not_flagged(ops: Path, tmp_path: Path) -> None:
    report = hipify_tree(ops, tmp_path / "out")
    masks = {(w.path, w.line) for w in report.warp32 if w.identifier == "full-mask"}
    softmax = (tmp_path / "out/csrc/softmax/softmax.h").read_text().splitlines()
    lanes = (tmp_path / "out/csrc/includes/lanes.h").read_text().splitlines()
    shfl_default = next(i for i, t in enumerate(softmax, 1) if "unsigned int mask = 0xffffffff) {" in t)
    ballot_default = next(i for i, t in enumerate(softmax, 1) if "all_positive" in t)
    # Left in the output (porter rewrites calls, not declarations), not flagged: the mask is dead.
    assert "  return __shfl_xor(value, laneMask, width);" in softmax
    assert ("csrc/softmax/softmax.h", shfl_default) not in masks
    assert ("csrc/includes/lanes.h", lanes.index("#define SHFL_MASK 0xffffffff") + 1) not in masks
    # Still used after hipify: flagged.
    assert ("csrc/softmax/softmax.h", ballot_default) in masks
    assert ("csrc/includes/lanes.h", lanes.index("#define LANE_MASK 0xffffffff") + 1) in masks
    assert len(masks) == 2


@pytest.mark.parametrize("body, flagged", [
    ("  unsigned mask = 0xffffffff;\n  v = __shfl_xor(v, 1);\n", False),
    ("  unsigned mask = 0xffffffff;\n  v = __shfl_xor(v, 1) & mask;\n", True),
    ("  for (unsigned m = 0xffffffff; m; m >>= 1) {\n    v = __shfl_xor(v, 1);\n  }\n", True),
    ("  if (__ballot(v > 0) == 0xffffffff) v = 0;\n", True),
])
def test_mask_bindings(body: str, flagged: bool) -> None:
    text = "__device__ void f(float v) {\n" + body + "}\n"
    assert any(r == "full-mask" for _, r in scan_text(text)[1]) is flagged


def test_mask_macro_used_only_by_guards_is_dead() -> None:
    text = "#ifndef FULL\n#define FULL 0xffffffff\n#endif\n__device__ void f(float v) { v = __shfl_xor(v, 1); }\n"
    res = scan(text, "k.cuh", builtin_map().compiled)
    assert res.warp32 == [] and [n for n, _ in res.pending_masks] == ["FULL"]


def test_bad_file_words(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('[warp32]\nfile_words = "warp"\n')
    with pytest.raises(ConfigError, match="file_words must be an array"):
        load_map(f)
