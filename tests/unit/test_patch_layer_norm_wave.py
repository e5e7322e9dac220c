"""megatron-deepspeed/rocm, patch layer-norm-wave-size: the BLOOM-era fused layer norm reduces its Welford sums
over 32 lanes (srcLaneB = (threadIdx.x+(1<<l))&31 through WARP_SHFL, blocks 32 wide), which a 64-lane wavefront
breaks. The patch reduces within blockDim.x lanes and launches blockDim.x = the device's warp size. Checked here on
the fixture tree shaped like the real kernel (tests/fixtures/megatron-older); the real tree's check is recorded in
rocm.toml's verified list."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest

from porter.patching import apply, plan, read_journal, resolve_sets, revert
from porter.patching.engine import PatchFailed

OLDER = Path(__file__).resolve().parent.parent / "fixtures" / "megatron-older"
KERNEL = "megatron/fused_kernels/layer_norm_cuda_kernel.cu"
PATCH = "layer-norm-wave-size"
SET = "megatron-deepspeed/rocm"


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def results(done_or_plan: object) -> dict[str, set[str]]:
    """Per file, the statuses of this patch's edits."""
    sets = getattr(done_or_plan, "plan", done_or_plan).sets  # type: ignore[attr-defined]
    out: dict[str, set[str]] = {}
    for r in sets[0].results:
        if r.patch == PATCH:
            out.setdefault(r.file, set()).add(r.status)
    return out


@pytest.fixture
def older(tmp_path: Path) -> Path:
    dest = tmp_path / "bloom"
    shutil.copytree(OLDER, dest)
    return dest


def test_the_fixture_has_the_32_lane_form_the_patch_looks_for(older: Path) -> None:
    text = (older / KERNEL).read_text()
    assert len(re.findall(r"srcLaneB = \(threadIdx\.x\+\(1<<l\)\)&31;", text)) == 2  # the template + at::Half
    assert len(re.findall(r"WARP_SHFL\(\w+, srcLaneB\)", text)) == 6
    assert len(re.findall(r"\bthreads\d?\(32,", text)) == 4
    assert '#include "ATen/cuda/DeviceUtils.cuh"' in text
    p = plan(older, resolve_sets(SET))
    assert results(p) == {KERNEL: {"would-apply"}}
    (first,) = [r for r in p.sets[0].results if r.patch == PATCH and r.edit == 1]
    assert first.evidence.startswith("line ") and "&31" in first.evidence  # the problem, shown by its line


def test_applies_reapplies_as_a_no_op_and_reverts_to_identical_bytes(older: Path) -> None:
    before = snapshot(older)
    done = apply(older, resolve_sets(SET))
    assert results(done) == {KERNEL: {"applied"}}
    assert KERNEL in done.changed
    assert PATCH in read_journal(older)["sets"][0]["patches"]
    patched = (older / KERNEL).read_bytes()
    text = patched.decode()
    # no 32-lane lane arithmetic, no 32-wide launch left
    assert "&31" not in text and not re.search(r"&\s*31\b", text)
    assert "threads(32" not in text and not re.search(r"\bthreads\d?\(\s*32\s*,", text)
    assert text.count("for (int l = 0;  (1<<l) < blockDim.x;  ++l)") == 2
    assert text.count("srcLaneB = (threadIdx.x+(1<<l))&(blockDim.x-1);") == 2
    assert len(re.findall(r"WARP_SHFL\(\w+, srcLaneB, blockDim\.x\)", text)) == 6
    for name, y in (("threads", 4), ("threads2", 4), ("threads3", 8), ("threads1", 4)):
        assert f"const dim3 {name}(at::cuda::getCurrentDeviceProperties()->warpSize,{y},1);" in text
    # the shared-memory sizes still follow the launch's own dims
    assert "2 * threads2.x * threads2.y * sizeof(U)" in text and "2 * threads3.x * threads3.y * sizeof(U)" in text

    # a second apply changes nothing
    after_first = snapshot(older)
    again = apply(older, resolve_sets(SET))
    assert again.changed == () and again.plan.sets[0].state == "applied"
    assert snapshot(older) == after_first

    revert(older)
    assert snapshot(older) == before
    assert not (older / ".porter").exists()


def test_the_patched_text_without_a_journal_counts_as_already_applied(older: Path, tmp_path: Path) -> None:
    """Edit by edit, the patch knows its result (each edit's applied_if), so a tree that got the same text some other
    way (a copy, an earlier port) converges: every edit 'already', nothing written."""
    apply(older, resolve_sets(SET))
    patched = (older / KERNEL).read_bytes()
    other = tmp_path / "copy"
    shutil.copytree(OLDER, other)
    (other / KERNEL).write_bytes(patched)
    p = plan(other, resolve_sets(SET))
    assert results(p) == {KERNEL: {"already"}}
    assert [r.edit for r in p.sets[0].results if r.patch == PATCH] == [1, 2, 3, 4]


def test_not_needed_where_the_tree_already_reduces_by_the_wave_size(older: Path) -> None:
    """A fork fixed its own way (lane modulo warpSize, at::cuda::warp_size() launches) has no &31 reduction: the
    patch is not needed there and the kernel is left alone."""
    kernel = older / KERNEL
    text = kernel.read_text()
    text = text.replace("for (int l = 0;  l <= 4;  ++l)", "for (int l = 0;  (1<<l) < warpSize;  ++l)")
    text = text.replace("(threadIdx.x+(1<<l))&31", "(threadIdx.x+(1<<l))&(warpSize-1)")
    text = re.sub(r"\b(threads\d?)\(32,", r"\1(at::cuda::warp_size(),", text)
    assert "&31" not in text and "threads(32" not in text
    kernel.write_text(text)
    done = apply(older, resolve_sets(SET))
    assert results(done) == {KERNEL: {"not-needed"}}
    (r,) = [r for r in done.plan.sets[0].results if r.patch == PATCH]
    assert r.reason.startswith("problem not present: no match for needed_if")
    assert kernel.read_text() == text and KERNEL not in done.changed
    assert PATCH in read_journal(older)["sets"][0]["not_needed"]


def test_a_fork_spelled_with_spaces_still_applies(older: Path) -> None:
    """The anchors are regexes over the lines, not byte copies: spacing inside the lane and launch lines may vary."""
    kernel = older / KERNEL
    text = kernel.read_text().replace("(threadIdx.x+(1<<l))&31", "(threadIdx.x + (1 << l)) & 31")
    text = text.replace("threads1(32,4,1)", "threads1(32, 4, 1)")
    kernel.write_text(text)
    apply(older, resolve_sets(SET))
    out = kernel.read_text()
    assert out.count("srcLaneB = (threadIdx.x + (1 << l))&(blockDim.x-1);") == 2
    assert "threads1(at::cuda::getCurrentDeviceProperties()->warpSize, 4, 1)" in out


def test_a_fork_with_one_welford_reduction_fails_precisely_and_writes_nothing(older: Path) -> None:
    """The problem is there but the kernel has another shape (one Welford reduction, not the template and its
    at::Half specialisation): the set fails naming the edit and its count, and the tree stays as it was."""
    kernel = older / KERNEL
    text = kernel.read_text()
    start = text.index("// at::Half rows are read two values per step")
    end = text.index("// the launch's dynamic shared memory")
    kernel.write_text(text[:start] + text[end:])
    before = snapshot(older)
    with pytest.raises(PatchFailed) as err:
        apply(older, resolve_sets(SET))
    assert snapshot(older) == before
    failures = [f for f in err.value.failures if f.patch == PATCH]
    assert failures and {f.file for f in failures} == {KERNEL}
    assert "anchor matched 1 lines (expected 2)" in failures[0].reason
    assert "layer-norm-wave-size" in err.value.message


def test_the_port_hipifies_first_and_the_patch_still_applies(older: Path) -> None:
    """porter port hipifies megatron/fused_kernels before it patches: the anchors are lines hipify leaves alone."""
    pytest.importorskip("torch.utils.hipify", reason="the port hipifies with torch's hipify; torch is not installed")
    from porter.components.megatron.port import port_megatron
    from porter.toolchain.profile import load_toolchain

    res = port_megatron(older, load_toolchain("frontier"), kernels=False)
    text = (res.out / KERNEL).read_text()
    assert "ATen/hip/DeviceUtils.cuh" in text and "hipLaunchKernelGGL" in text  # hipified
    assert "&31" not in text and "threads(32" not in text
    assert len(re.findall(r"WARP_SHFL\(\w+, srcLaneB, blockDim\.x\)", text)) == 6
    assert [p.state for p in res.patches if p.patch == PATCH] == ["applied"]
    # hipify's six warp-size-32 findings in the file end fixed by the patch, none left to review
    fixed = [g for g in res.hipify_groups if g.get("state") == "fixed"]
    assert len(fixed) == 6 and {g["by"] for g in fixed} == {f"megatron-deepspeed/rocm:{PATCH}"}
    assert not [g for g in res.hipify_groups if g.get("state") != "fixed" and g.get("warp32")]
