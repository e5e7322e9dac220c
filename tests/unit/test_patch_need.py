"""Per-patch need (``needed_if``): a fork without a patch's problem does not fail the set; a fork with the
problem but without the anchor fails precisely and changes nothing."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from porter.errors import ConfigError
from porter.patching import apply, plan, read_journal, resolve_sets, revert
from porter.patching.engine import PatchFailed
from porter.patching.model import load_file, load_project, load_shipped, project_names

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
KERNELS = ("scaled_masked_softmax_cuda.cu", "scaled_softmax_cuda.cu", "scaled_upper_triang_masked_softmax_cuda.cu")


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def tree(tmp_path: Path, name: str) -> Path:
    """A copy of a fixture tree: ``megatron-deepspeed`` / ``deepspeed`` (upstream-like) or a fork."""
    src = FIXTURES / "patch" / name if (FIXTURES / "patch" / name).is_dir() else FIXTURES / "patch-forks" / name
    dest = tmp_path / name
    shutil.copytree(src, dest)
    return dest


def states(done_or_plan: object) -> dict[str, str]:
    sets = getattr(done_or_plan, "plan", done_or_plan).sets  # type: ignore[attr-defined]
    return sets[0].patch_states()  # type: ignore[no-any-return]


# the patches these stand-ins (tests/fixtures/patch) have the problems of; the set's later patches fix files the
# stand-ins do not have (apex optimizers, dataset helpers: see tests/fixtures/training), so they are not needed here
STAND_IN = ("fused-kernels-prebuilt", "hip-platform-amd", "apex-layer-norm-clear-error", "apex-rmsnorm-clear-error")


def stand_in_states(done_or_plan: object) -> dict[str, str]:
    all_states = states(done_or_plan)
    assert {v for k, v in all_states.items() if k not in STAND_IN} == {"not-needed"}
    return {k: v for k, v in all_states.items() if k in STAND_IN}


def by_file(results: object, patch: str) -> dict[str, str]:
    return {r.file: r.status for r in results if r.patch == patch}  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# the shipped data

def test_every_shipped_patch_names_its_problem() -> None:
    for project in project_names():
        for name in load_project(project).all_sets:
            pset = load_shipped(project, name)
            assert pset.decides_need, f"{pset.ref}: a patch without needed_if"
            for patch in pset.patches:
                assert patch.needed_if is not None and patch.needed_if.regex.strip()
                assert len(patch.needed_if.regex) < 80, f"{patch.id}: needed_if is a short line, not a block"


# ---------------------------------------------------------------------------------------------
# forks of Megatron-DeepSpeed

def test_upstream_like_tree_needs_every_patch(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-deepspeed")
    p = plan(t, resolve_sets("megatron-deepspeed/rocm"))
    assert set(stand_in_states(p).values()) == {"would-apply"}
    hcc = [r for r in p.sets[0].results if r.patch == "hip-platform-amd"]
    assert all(r.evidence == "line 3: '#ifndef __HIP_PLATFORM_HCC__'" for r in hcc)


def test_fork_without_apex_rmsnorm_import(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-no-rmsnorm")
    before = (t / "megatron/model/__init__.py").read_bytes()
    done = apply(t, resolve_sets("megatron-deepspeed/rocm"))
    assert stand_in_states(done) == {"fused-kernels-prebuilt": "applied", "hip-platform-amd": "applied",
                            "apex-layer-norm-clear-error": "applied", "apex-rmsnorm-clear-error": "not-needed"}
    (r,) = [r for r in done.plan.sets[0].results if r.patch == "apex-rmsnorm-clear-error"]
    assert r.file == "megatron/model/__init__.py"
    assert r.reason.startswith("problem not present: no match for needed_if")
    assert "not needed here" in r.describe()
    assert (t / "megatron/model/__init__.py").read_bytes() == before
    assert "megatron/model/__init__.py" not in done.changed
    assert "porter: apex is required here" in (t / "megatron/model/fused_layer_norm.py").read_text()
    entry = read_journal(t)["sets"][0]
    assert "apex-rmsnorm-clear-error" in entry["not_needed"]
    assert "apex-rmsnorm-clear-error" not in entry["patches"]
    again = plan(t, resolve_sets("megatron-deepspeed/rocm"))
    assert again.sets[0].state == "applied"
    assert states(again)["apex-rmsnorm-clear-error"] == "not-needed"


def test_fork_kernel_without_hcc_guard(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-no-hcc-guard")
    cu = t / "megatron/fused_kernels/scaled_softmax_cuda.cu"
    before = cu.read_bytes()
    done = apply(t, resolve_sets("megatron-deepspeed/rocm"))
    assert by_file(done.plan.sets[0].results, "hip-platform-amd") == {
        "megatron/fused_kernels/scaled_masked_softmax_cuda.cu": "applied",
        "megatron/fused_kernels/scaled_softmax_cuda.cu": "not-needed",
        "megatron/fused_kernels/scaled_upper_triang_masked_softmax_cuda.cu": "applied"}
    assert cu.read_bytes() == before
    assert "#ifndef __HIP_PLATFORM_AMD__" in (t / "megatron/fused_kernels/scaled_masked_softmax_cuda.cu").read_text()
    assert states(done)["hip-platform-amd"] == "applied"


def test_no_kernel_has_the_guard_then_the_patch_is_not_needed(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-no-hcc-guard")
    for name in KERNELS:
        f = t / "megatron/fused_kernels" / name
        f.write_text("// stand-in\n#include <cuda_fp16.h>\n")
    done = apply(t, resolve_sets("megatron-deepspeed/rocm"))
    assert states(done)["hip-platform-amd"] == "not-needed"
    assert not any(c.startswith("megatron/fused_kernels/scaled") for c in done.changed)
    assert "hip-platform-amd" in read_journal(t)["sets"][0]["not_needed"]


def test_fork_without_package_info_still_applies_with_a_note(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-no-package-info")
    done = apply(t, resolve_sets("megatron-deepspeed/rocm"))
    assert done.plan.sets[0].version == ""
    assert "no megatron-deepspeed version found in the tree (looked in megatron/core/package_info.py)" in \
        done.plan.sets[0].notes[0]
    assert set(stand_in_states(done).values()) == {"applied"}


def test_problem_present_anchor_missing_fails_precisely_and_writes_nothing(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-deepspeed")
    init = t / "megatron/model/__init__.py"
    # the fork imports RMSNorm deeper in a block: the problem is there, the anchored line is not
    init.write_text(init.read_text().replace("    from apex.normalization import MixedFusedRMSNorm as RMSNorm",
                                             "    if True:\n        from apex.normalization import "
                                             "MixedFusedRMSNorm as RMSNorm"))
    original = snapshot(t)
    with pytest.raises(PatchFailed) as err:
        apply(t, resolve_sets("megatron-deepspeed/rocm"))
    assert snapshot(t) == original
    (failure,) = err.value.failures
    assert (failure.patch, failure.file, failure.reason) == ("apex-rmsnorm-clear-error",
                                                             "megatron/model/__init__.py", "anchor not found")
    msg = err.value.message
    assert "megatron-deepspeed/rocm: patch 'apex-rmsnorm-clear-error' edit 1, file megatron/model/__init__.py" in msg
    assert "problem: line 9: 'from apex.normalization import MixedFusedRMSNorm as RMSNorm'" in msg
    assert "anchor:  '^    from apex\\\\.normalization import MixedFusedRMSNorm as RMSNorm\\\\s*$'" in msg
    assert "closest: line 9:" in msg


def test_already_fixed_by_hipify_counts_as_already_not_as_not_needed(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-deepspeed")
    for name in KERNELS:
        f = t / "megatron/fused_kernels" / name
        f.write_text(f.read_text().replace("__HIP_PLATFORM_HCC__", "__HIP_PLATFORM_AMD__"))
    p = plan(t, resolve_sets("megatron-deepspeed/rocm"))
    assert set(by_file(p.sets[0].results, "hip-platform-amd").values()) == {"already"}


# ---------------------------------------------------------------------------------------------
# DeepSpeed: a version range becomes a recorded fact

def test_no_match_branch_decided_by_need_not_version(tmp_path: Path) -> None:
    t = tree(tmp_path, "deepspeed")
    (t / "version.txt").write_text("0.16.9\n")  # outside the patch's ">=0.18.9", but the branch is there
    p = plan(t, resolve_sets("deepspeed/explicit-arch"))
    assert states(p)["explicit-arch-no-match"] == "would-apply"
    assert any("patch explicit-arch-no-match was verified on deepspeed >=0.18.9, the tree is 0.16.9" in n
               for n in p.sets[0].notes)

    t2 = tree(tmp_path / "b", "deepspeed")  # 0.19.8, but a fork without the branch
    for f in ("op_builder/builder.py", "deepspeed/ops/op_builder/builder.py"):
        path = t2 / f
        path.write_text(path.read_text().replace('match.group(1) if match else "32"', "match.group(1)"))
    done = apply(t2, resolve_sets("deepspeed/explicit-arch"))
    assert states(done) == {"explicit-arch-helpers": "applied", "explicit-arch-use": "applied",
                            "explicit-arch-no-match": "not-needed"}


def test_builder_without_rocm_probes_needs_no_explicit_arch(tmp_path: Path) -> None:
    t = tree(tmp_path, "deepspeed")
    for f in ("op_builder/builder.py", "deepspeed/ops/op_builder/builder.py"):
        (t / f).write_text("from abc import ABC\n\n\nclass OpBuilder(ABC):\n    def jit_load(self, verbose=True):\n"
                           "        pass\n")
    p = plan(t, resolve_sets("deepspeed/explicit-arch"))
    assert p.sets[0].state == "not needed" and p.changes == ()
    assert apply(t, resolve_sets("deepspeed/explicit-arch")).changed == ()
    assert not (t / ".porter").exists()


def test_not_a_project_tree_is_refused(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-deepspeed")
    with pytest.raises(ConfigError, match="none of the files deepspeed/no-jit patches exists") as err:
        plan(t, resolve_sets("deepspeed/no-jit"))
    assert "is this a deepspeed tree?" in (err.value.hint or "")


# ---------------------------------------------------------------------------------------------
# the format: per file, or globs for the whole patch; diffs too

def write(path: Path, body: str) -> Path:
    path.write_text('[set]\ndescription = "test"\n' + body)
    return path


def test_glob_need_decides_for_the_whole_patch(tmp_path: Path) -> None:
    t = tmp_path / "t"
    (t / "conf").mkdir(parents=True)
    (t / "a.py").write_text("import os\n")
    (t / "b.py").write_text("import os\n")
    (t / "conf" / "x.cfg").write_text("jit = true\n")
    s = write(tmp_path / "g.toml", '''
[[patch]]
id = "no-jit-config"
why = "x"
files = ["a.py", "b.py"]
needed_if = { regex = '^jit = true', files = ["conf/*.cfg"] }
[[patch.edit]]
action = "insert_after"
anchor = "import os"
text = "import sys"
''')
    p = plan(t, [load_file(s)])
    assert {r.file: (r.status, r.evidence) for r in p.sets[0].results} == {
        "a.py": ("would-apply", "conf/x.cfg line 1: 'jit = true'"),
        "b.py": ("would-apply", "conf/x.cfg line 1: 'jit = true'")}
    (t / "conf" / "x.cfg").write_text("jit = false\n")
    p = plan(t, [load_file(s)])
    assert [r.status for r in p.sets[0].results] == ["not-needed", "not-needed"]
    assert "in conf/*.cfg" in p.sets[0].results[0].reason
    (t / "b.py").unlink()
    (t / "conf" / "x.cfg").write_text("jit = true\n")
    assert [(r.file, r.reason) for r in plan(t, [load_file(s)]).failed] == [("b.py", "file not found")]


def test_per_file_need_on_a_unified_diff(tmp_path: Path) -> None:
    t = tmp_path / "t"
    t.mkdir()
    (t / "a.c").write_text("int a;\nint b;\n")
    (tmp_path / "fix.patch").write_text("--- a/a.c\n+++ b/a.c\n@@ -1,2 +1,2 @@\n int a;\n-int b;\n+long b;\n")
    s = write(tmp_path / "d.toml", '''
[[patch]]
id = "widen"
why = "x"
diff = "fix.patch"
needed_if = '^int b;'
''')
    assert plan(t, [load_file(s)]).sets[0].results[0].status == "would-apply"
    (t / "a.c").write_text("int a;\nshort b;\n")
    (r,) = plan(t, [load_file(s)]).sets[0].results
    assert r.status == "not-needed"
    apply(t, [load_file(s)])
    assert (t / "a.c").read_text() == "int a;\nshort b;\n"


@pytest.mark.parametrize("value, message", [
    ("'('", "invalid regex"),
    ("''", "empty regex"),
    ("{ regex = 'x', file = 'a' }", "unknown key 'file'"),
    ("{ regex = 'x', files = ['../a'] }", "leads outside the tree"),
    ("3", "must be a regex string or a table"),
])
def test_bad_needed_if_is_refused(tmp_path: Path, value: str, message: str) -> None:
    s = write(tmp_path / "bad.toml", f'''
[[patch]]
id = "p"
why = "x"
files = ["a.py"]
needed_if = {value}
[[patch.edit]]
action = "delete"
anchor = "x"
''')
    with pytest.raises(ConfigError, match=message):
        load_file(s)


def test_revert_after_partial_need_restores_exactly(tmp_path: Path) -> None:
    t = tree(tmp_path, "megatron-no-hcc-guard")
    original = snapshot(t)
    apply(t, resolve_sets("megatron-deepspeed/rocm"))
    revert(t)
    assert snapshot(t) == original
