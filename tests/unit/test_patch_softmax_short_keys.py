"""The patch softmax-short-keys (megatron-deepspeed/rocm): older forks' softmax kernels load four elements per lane
at every key length, which overruns a lane's values wherever WARP_ITERATIONS < 4 (keys up to 64 with 32-lane warps,
up to 128 with 64-lane wavefronts). The fork form is made from the megatron-older fixture (whose kernels have the
later, fixed load width) by the one line real forks differ in (kojimano/Megatron-DeepSpeed-ABCI, the CSC LUMI
branch)."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest

from porter.patching import apply, plan, resolve_sets, revert
from tests.conftest import FIXTURES

FIXED = re.compile(r"constexpr int ELEMENTS_PER_LDG_STG = \(WARP_ITERATIONS < 4\) \? 1 : 4;")
PATCHED = "constexpr int ELEMENTS_PER_LDG_STG = (WARP_ITERATIONS < 4) ? 1 : 4;  // porter: one element per lane"
HEADERS = ("scaled_masked_softmax.h", "scaled_upper_triang_masked_softmax.h")
KERNELS = Path("megatron/fused_kernels")


def fork_form(dest: Path) -> Path:
    """megatron-older with the older forks' fixed load width of four (two kernels per header)."""
    shutil.copytree(FIXTURES / "megatron-older", dest)
    for name in HEADERS:
        path = dest / KERNELS / name
        text, n = FIXED.subn("constexpr int ELEMENTS_PER_LDG_STG = 4;", path.read_text())
        assert n == 2, (name, n)
        path.write_text(text)
    return dest


def digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".porter" not in p.parts}


def states(done_or_plan: object) -> dict[str, str]:
    sets = getattr(done_or_plan, "plan", done_or_plan).sets  # type: ignore[attr-defined]
    out: dict[str, set[str]] = {}
    for r in (r for sp in sets for r in sp.results if r.patch == "softmax-short-keys"):
        out.setdefault(r.file, set()).add(r.status)
    return {f: "/".join(sorted(v)) for f, v in out.items()}


@pytest.fixture
def fork(tmp_path: Path) -> Path:
    return fork_form(tmp_path / "fork")


def test_applies_to_both_kernels_of_both_headers_and_reverts_to_the_same_bytes(fork: Path) -> None:
    before = digest(fork)
    sets = resolve_sets("megatron-deepspeed/rocm")
    done = apply(fork, sets)
    assert states(done) == {f"{KERNELS}/{h}": "applied" for h in HEADERS}
    for name in HEADERS:
        text = (fork / KERNELS / name).read_text()
        assert text.count(PATCHED) == 2 and "ELEMENTS_PER_LDG_STG = 4;" not in text
    after = digest(fork)
    assert apply(fork, sets).changed == () and digest(fork) == after  # re-applying changes nothing
    revert(fork)
    assert digest(fork) == before


def test_not_needed_where_the_kernels_already_choose_the_load_width() -> None:
    got = states(plan(FIXTURES / "megatron-older", resolve_sets("megatron-deepspeed/rocm")))
    assert got == {f"{KERNELS}/{h}": "not-needed" for h in HEADERS}
