"""Report quality on fixtures written here: what counts as CUDA API, warp-32 flags in warp code,
masks the extra map already dropped, idempotence on porter's own output, the grouped report."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from porter.cli import main
from porter.errors import ConfigError
from porter.hipify import hipify_tree
from porter.hipify.engine import MAX_FILE_GROUPS, FindingGroup, group_findings
from porter.hipify.maps import builtin_map, combined_map, load_map
from porter.hipify.scan import Finding, scan
from porter.hipify.torch_engine import torch_hipify

# porter hipify is torch's own hipify plus porter's map: without torch these cannot run (they skip, saying so)
pytest.importorskip("torch.utils.hipify", reason="porter's hipify engine runs torch's hipify; torch is not installed")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hipify"
KERNEL = "csrc/layer_norm/layer_norm_kernel.cu"
OWN_FUNCTIONS = {"cuOnlineMean", "cuMergeMeans", "cuRowMean", "cuApplyNorm", "cuLaunchHelper", "cuLaunchCount"}


@pytest.fixture
def ops(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURES / "ops", tmp_path / "src")
    return tmp_path / "src"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


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
    rxs = [re.compile(p.pattern) for p in builtin_map().unsupported_patterns]
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


# --- grouped text report, full --json -------------------------------------------------------------

def test_grouped_text_report(ops: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["hipify", str(ops), "-o", str(tmp_path / "out")], capsys)
    assert code == 0
    assert ("findings: 11 use(s) of CUDA APIs without a HIP equivalent, 7 warp-size-32 assumption(s) (flagged, "
            "not rewritten) in 5 group(s)") in out
    assert "in 5 group(s)" in out
    heads = [line for line in out.splitlines() if re.match(r"^csrc/\S+/  ", line)]
    assert heads == ["csrc/attention/  1 file(s): 5 CUDA API use(s), 2 warp-32 flag(s)",
                     "csrc/gds/  1 file(s): 5 CUDA API use(s)",
                     "csrc/layer_norm/  1 file(s): 1 CUDA API use(s), 2 warp-32 flag(s)",
                     "csrc/softmax/  1 file(s): 2 warp-32 flag(s)",
                     "csrc/includes/  1 file(s): 1 warp-32 flag(s)"]
    verdicts = [line for line in out.splitlines() if line.startswith("  verdict: ")]
    assert len(verdicts) == len(heads)
    assert verdicts[0].startswith("  verdict: CUTLASS/CuTe: NVIDIA-only, use CK")
    assert verdicts[1].startswith("  verdict: GPUDirect Storage (cuFile): NVIDIA-only")
    assert verdicts[2].startswith("  verdict: CUDA driver API without a mapping")
    assert "  CUDA API: cutlass::half_t 2 (lines 13, 15), cutlass::gemm 1 (line 5)" in out
    assert "  warp-32: lane-arithmetic 1 (line 36), block-x-32 1 (line 55)" in out
    # No per-finding lines: the whole report stays short.
    assert len(out.splitlines()) < 40


def test_json_keeps_every_finding_and_adds_the_groups(ops: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["-q", "hipify", str(ops), "-o", str(tmp_path / "out"), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert len(doc["unsupported"]) == 11 and len(doc["warp32"]) == 7
    assert all({"path", "line", "column", "identifier", "message", "text"} <= set(u) for u in doc["unsupported"])
    groups = {g["name"]: g for g in doc["groups"]}
    assert groups["csrc/gds/"]["verdict_id"] == "gpudirect-storage"
    assert groups["csrc/gds/"]["names"]["cuFileRead"] == 1
    assert groups["csrc/attention/"]["files"] == {"csrc/attention/attention.cu": 7}
    assert sum(g["unsupported"] for g in doc["groups"]) == 11
    assert sum(g["warp32"] for g in doc["groups"]) == 7


def finding(path: str, ident: str, kind: str = "unsupported") -> Finding:
    return Finding(kind, path, 1, 1, ident, "m", "t")


def test_groups_per_op_folder_and_file() -> None:
    verdicts = builtin_map().compiled.verdicts
    groups = group_findings(
        [finding("csrc/attn/kernels/fwd.h", "asm"), finding("csrc/attn/kernels/bwd.h", "cutlass::gemm"),
         finding("csrc/attn/kernels/bwd.h", "cutlass::arch"), finding("csrc/gds/py/op.cpp", "cuFileRead"),
         finding("csrc/top.cu", "cudaFooBar")],
        [finding("csrc/attn/kernels/fwd.h", "full-mask", "warp32"), finding("csrc/norm/ln.cu", "block-x-32", "warp32")],
        verdicts)
    assert [(g.name, g.verdict_id) for g in groups] == [
        ("csrc/attn/kernels/", "cutlass"),        # CUTLASS wins over PTX in the same op
        ("csrc/gds/py/", "gpudirect-storage"),    # narrowed to the folder that holds its findings
        ("csrc/top.cu", "runtime-api"),           # a file at the top level is its own group
        ("csrc/norm/", "warp32")]
    attn: FindingGroup = groups[0]
    assert attn.files == {"csrc/attn/kernels/bwd.h": 2, "csrc/attn/kernels/fwd.h": 2}
    assert attn.names == {"asm": 1, "cutlass::gemm": 1, "cutlass::arch": 1} and attn.rules == {"full-mask": 1}
    assert group_findings([], []) == []


def test_a_flat_folder_of_many_files_is_grouped_by_verdict() -> None:
    verdicts = builtin_map().compiled.verdicts
    kernels = [finding(f"src/fwd_hdim{d}_sm80.cu", "cutlass::half_t") for d in range(32, 32 * 11, 32)]
    groups = group_findings(kernels + [finding("src/philox.cuh", "asm")],
                            [finding("src/mask.h", "lane-arithmetic", "warp32")], verdicts)
    assert [(g.name, g.verdict_id, len(g.files)) for g in groups] == [
        ("src/ [cutlass]", "cutlass", 10), ("src/ [ptx]", "ptx", 1), ("src/ [warp32]", "warp32", 1)]
    assert all(g.is_dir and g.folder == "src/" for g in groups)
    # As many files as MAX_FILE_GROUPS stay one group each.
    assert [g.name for g in group_findings(kernels[:MAX_FILE_GROUPS], [], verdicts)] == \
        sorted(k.path for k in kernels[:MAX_FILE_GROUPS])
    [one] = group_findings(kernels, [], verdicts)
    assert one.name == "src/" and len(one.unsupported) == 10


def test_a_user_map_verdict_comes_first(tmp_path: Path) -> None:
    m = tmp_path / "m.toml"
    m.write_text('[[verdicts]]\nid = "ours"\nmatch = "^asm$"\nverdict = "our PTX: see docs/rocm.md"\n')
    verdicts = combined_map([m]).compiled.verdicts
    [g] = group_findings([finding("a/x.cu", "asm"), finding("a/x.cu", "cutlass::gemm")], [], verdicts)
    assert (g.verdict_id, g.verdict) == ("ours", "our PTX: see docs/rocm.md")
    assert [v.id for v, _ in verdicts][:2] == ["ours", "cutlass"]


@pytest.mark.parametrize("body, words", [
    ('[[verdicts]]\nid = "x"\nmatch = "("\nverdict = "v"\n', "bad regex"),
    ('[[verdicts]]\nid = "x"\nmatch = "a"\n', "missing key 'verdict'"),
    ('verdicts = "x"\n', "array of tables"),
])
def test_bad_verdicts(tmp_path: Path, body: str, words: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(ConfigError, match=words):
        load_map(f)


# --- idempotent on its own output -----------------------------------------------------------------

def test_second_hipify_check_says_nothing_would_change(ops: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert run(["hipify", str(ops), "-o", str(out)], capsys)[0] == 0
    # A check of the CUDA tree itself: it would change (and nothing is written).
    before = {p: p.read_bytes() for p in ops.rglob("*") if p.is_file()}
    code, _, err = run(["hipify", str(ops), "--check"], capsys)
    assert code == 1 and "7 file(s) would change" in err
    assert {p: p.read_bytes() for p in ops.rglob("*") if p.is_file()} == before
    # A check of porter's output: nothing would change, and no SRC-hip is asked for.
    code, stdout, err = run(["hipify", str(out), "--check"], capsys)
    assert code == 0 and "would change" not in err
    assert "would write 0" in stdout and "(checked in place)" in stdout
    assert not out.with_name("out-hip").exists()


def test_in_place_without_cache_then_check_changes_nothing(ops: Path) -> None:
    """As port does it: in place, no cache; a later check reads the tree itself."""
    first = hipify_tree(ops, in_place=True, use_cache=False)
    assert len(first.written) == 7
    again = hipify_tree(ops, check=True)
    assert again.in_place and again.written == []
    assert {f.path for f in again.skipped} == {f.path for f in first.written}
