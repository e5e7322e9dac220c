"""porter hipify on real trees (DeepSpeed 0.19.8 and flash-attn sdists) and through real hipcc."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from porter.cli import main
from porter.hipify import hipify_tree
from porter.hipify.maps import builtin_map
from porter.hipify.torch_engine import SOURCE_EXTENSIONS, torch_hipify

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hipify"


def unpack(sdist: Path, into: Path, inner: str) -> Path:
    """Extract only ``<top>/<inner>/...`` from an sdist."""
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if f"/{inner}/" in m.name]
        tf.extractall(into, members=members, filter="data")
    found = list(into.glob(f"*/{inner}"))
    assert found, f"{inner} not in {sdist.name}"
    return found[0]


def torch_hipify_tree(src: Path, out: Path) -> None:
    hp = torch_hipify()
    hp.HIPIFY_FINAL_RESULT.clear()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        hp.hipify(project_directory=str(src), output_directory=str(out), is_pytorch_extension=False,
                  show_progress=False)


def test_deepspeed_csrc(deepspeed_sdist: Path, tmp_path: Path) -> None:
    src = unpack(deepspeed_sdist, tmp_path / "ds", "csrc")
    out = tmp_path / "csrc-hip"
    report = hipify_tree(src, out)
    assert len(report.files) == 174
    assert len(report.changed) > 60 and report.skipped == []

    # Identical to torch's own hipify, apart from porter's extra mappings.
    torch_hipify_tree(src, tmp_path / "torch-out")
    hp = torch_hipify()
    extras = builtin_map().compiled
    by_extras = []
    for f in report.files:
        if not f.path.endswith(SOURCE_EXTENSIONS):
            continue
        theirs = (tmp_path / "torch-out" / hp.get_hip_file_path(f.path, False)).read_text()
        theirs = theirs.removeprefix(hp.HIPIFY_C_BREADCRUMB)
        mine = (out / f.path).read_text().removeprefix(hp.HIPIFY_C_BREADCRUMB)
        assert mine == extras.apply(theirs), f.path
        if mine != theirs:
            by_extras.append(f.path)
    assert "includes/type_shim.h" in by_extras

    shim = (out / "includes/type_shim.h").read_text()
    assert "__shfl_down_sync" not in shim and "final + __shfl_down(final, i)" in shim
    # The unsupported report names GPUDirect Storage (cuFile) and CUTLASS with file:line:column.
    names = {u.identifier for u in report.unsupported}
    assert "cuFileRead" in names and any(n.startswith("cutlass::") for n in names)
    u = next(u for u in report.unsupported if u.identifier == "cuFileRead")
    assert (out / u.path).read_text().splitlines()[u.line - 1][u.column - 1:].startswith("cuFileRead")
    # A hard-coded warp size is flagged where it is, not rewritten; DeepSpeed's hw_warp_size = 32 is the CUDA arm of
    # an #ifdef __HIP_PLATFORM_AMD__ (ROCm builds take ROCM_WAVEFRONT_SIZE), so no ROCm build compiles it: no finding.
    flag = next(w for w in report.warp32 if w.path == "includes/context.h")
    assert "#define WARP_SIZE 32" in flag.text and "#define WARP_SIZE 32" in (out / "includes/context.h").read_text()
    assert not [w for w in report.warp32 if w.path == "includes/ds_kernel_utils.h"]
    assert "hw_warp_size = 32" in (out / "includes/ds_kernel_utils.h").read_text()

    # Only CUDA's own names: DeepSpeed's own cuFileGetErrorString (a template in gds/) is not CUDA API.
    assert "std::string cuFileGetErrorString(T status)" in (src / "gds/py_lib/deepspeed_gds_utils.h").read_text()
    assert "cuFileGetErrorString" not in names
    assert not [n for n in names if n.startswith("cu") and n[2:3].isupper() and not n.startswith("cuFile")]
    # Lane math written as `& 0x1f` is flagged too.
    assert any(w.path == "transformer/softmax_kernels.cu" and "threadIdx.x & 0x1f" in w.text for w in report.warp32)

    # Grouped per op, with a verdict each; the groups hold every finding.
    groups = {g.name: g for g in report.groups()}
    assert groups["deepspeed4science/evoformer_attn/"].verdict_id == "cutlass"
    assert groups["gds/py_lib/"].verdict_id == "gpudirect-storage"
    assert 4 <= len(groups) <= 10
    assert sum(len(g.unsupported) for g in groups.values()) == len(report.unsupported)
    assert sum(len(g.warp32) for g in groups.values()) == len(report.warp32)
    assert len(groups["deepspeed4science/evoformer_attn/"].unsupported) > 0.8 * len(report.unsupported)

    again = hipify_tree(src, out)
    assert again.written == [] and again.cached == 174
    assert hipify_tree(out, in_place=True, check=True).written == []
    # `porter hipify OUT --check` checks OUT itself: nothing would change.
    assert hipify_tree(out, check=True).written == []


def test_deepspeed_text_report_is_grouped(deepspeed_sdist: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    src = unpack(deepspeed_sdist, tmp_path / "ds", "csrc")
    with pytest.raises(SystemExit) as info:
        main(["hipify", str(src), "-o", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert info.value.code in (0, None)
    lines = out.splitlines()
    heads = [line for line in lines if line and not line.startswith(" ") and "  " in line]
    verdicts = [line for line in lines if line.startswith("  verdict: ")]
    assert len(heads) == len(verdicts) >= 4
    assert "deepspeed4science/evoformer_attn/" in heads[0]
    assert verdicts[0] == "  verdict: CUTLASS/CuTe: NVIDIA-only, use CK (composable_kernel) or a Triton kernel " \
                          "instead of porting"
    assert len(lines) < 60  # 500+ findings, grouped
    with pytest.raises(SystemExit) as info:
        main(["hipify", str(tmp_path / "out"), "--check"])
    assert info.value.code in (0, None)
    assert "would write 0" in capsys.readouterr().out


def test_flash_attn_csrc(flash_attn_sdist: Path, tmp_path: Path) -> None:
    # csrc/flash_attn holds the CUDA FlashAttention-2 kernels (CUTLASS/CuTe based); the vendored
    # cutlass and composable_kernel trees (100 MB) are left out to keep CI lean.
    src = unpack(flash_attn_sdist, tmp_path / "fa", "csrc/flash_attn")
    report = hipify_tree(src, tmp_path / "out")
    assert len(report.files) > 80 and len(report.changed) > 70
    assert report.replacements["cudaStream_t"] > 50
    names = {u.identifier for u in report.unsupported}
    # What makes FA2's CUDA path unportable is reported, not hidden: CuTe/CUTLASS and PTX asm.
    assert {"cute::copy", "cutlass::half_t", "asm"} <= names
    lanes = [w for w in report.warp32 if w.identifier == "lane-arithmetic"]
    assert any("threadIdx.x % 32" in w.text for w in lanes)
    assert hipify_tree(src, tmp_path / "out").written == []


def hipcc_compile(hipcc: str, source: Path, obj: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    return subprocess.run([hipcc, "--offload-arch=gfx90a", "-c", str(source), "-o", str(obj)],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.rocm
def test_kernel_compiles_after_porter_but_not_after_torch_alone(hipcc: str, tmp_path: Path,
                                                               porter_cli: list[str]) -> None:
    src = tmp_path / "kernel"
    shutil.copytree(FIXTURES / "kernel", src)
    # porter, as a user runs it.
    proc = subprocess.run(porter_cli + ["hipify", str(src), "-o", str(tmp_path / "porter-out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "warp_reduce.cu  1 warp-32 flag(s)" in proc.stdout
    assert "lane-arithmetic 1 (line 22)" in proc.stdout  # threadIdx.x % 32 flagged
    ported = tmp_path / "porter-out" / "warp_reduce.cu"
    text = ported.read_text()
    assert "__HIP_PLATFORM_AMD__" in text and "_sync(" not in text and "hip/hip_fp16.h" in text
    ok = hipcc_compile(hipcc, ported, tmp_path / "porter.o")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "porter.o").stat().st_size > 0

    # torch.utils.hipify alone: the *_sync intrinsics stay and HIP has no such functions.
    torch_hipify_tree(src, tmp_path / "torch-out")
    torch_only = tmp_path / "torch-out" / "hip" / "warp_reduce.hip"
    bad = hipcc_compile(hipcc, torch_only, tmp_path / "torch.o")
    assert bad.returncode != 0
    assert "use of undeclared identifier '__shfl_xor_sync'" in bad.stderr
    assert "use of undeclared identifier '__activemask'" in bad.stderr


def test_cli_as_a_process_on_bad_input(tmp_path: Path, porter_cli: list[str]) -> None:
    proc = subprocess.run(porter_cli + ["hipify", str(tmp_path / "missing")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == 2 and "source tree not found" in proc.stderr
    assert proc.stdout == ""
