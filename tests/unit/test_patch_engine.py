"""The patch engine on fixture trees: atomic, idempotent, reversible, precise, safe, form-preserving."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from porter.errors import CheckFailed, ConfigError, NothingToDo
from porter.patching import apply, checked, plan, read_journal, resolve_sets, revert
from porter.patching import engine
from porter.patching.engine import PatchFailed
from porter.patching.model import load_file

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "patch"


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file (symlinks as their target text), the journal folder included."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def ds_tree(tmp_path: Path) -> Path:
    dest = tmp_path / "deepspeed"
    shutil.copytree(FIXTURES / "deepspeed", dest)
    return dest


@pytest.fixture
def mds_tree(tmp_path: Path) -> Path:
    dest = tmp_path / "megatron-deepspeed"
    shutil.copytree(FIXTURES / "megatron-deepspeed", dest)
    return dest


def write_set(path: Path, body: str) -> Path:
    path.write_text('[set]\ndescription = "test set"\n' + body)
    return path


# ---------------------------------------------------------------------------------------------
# shipped sets on fixture trees

@pytest.mark.parametrize("tree_fixture, ref", [("ds_tree", "deepspeed"), ("mds_tree", "megatron-deepspeed/rocm")])
def test_shipped_sets_apply_idempotent_and_revert_exactly(request: pytest.FixtureRequest, tree_fixture: str,
                                                         ref: str) -> None:
    tree: Path = request.getfixturevalue(tree_fixture)
    original = snapshot(tree)
    sets = resolve_sets(ref)
    done = apply(tree, sets)
    assert done.changed, "the shipped set changed nothing on its fixture tree"
    patched = snapshot(tree)
    assert (tree / ".porter" / "patches.json").is_file()

    again = apply(tree, resolve_sets(ref))
    assert again.changed == ()
    assert snapshot(tree) == patched
    assert all(r.status in ("already", "not-needed") for s in again.plan.sets for r in s.results)
    assert any(r.status == "already" for s in again.plan.sets for r in s.results)

    reverted = revert(tree)
    assert set(reverted.restored) == set(done.changed)
    assert snapshot(tree) == original
    assert not (tree / ".porter").exists()


def test_no_jit_patch_text_lands_where_expected(ds_tree: Path) -> None:
    apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    text = (ds_tree / "op_builder" / "builder.py").read_text()
    assert text.index("class PorterNoJitError(RuntimeError):") < text.index("class OpBuilder(ABC):")
    guard = text.index("    def jit_load(self, verbose=True):\n        _porter_refuse_jit(self.name)\n")
    assert guard > 0
    assert "porter ops build" in text
    compile(text, "builder.py", "exec")  # still valid Python


def test_explicit_arch_replaces_both_silent_32_fallbacks(ds_tree: Path) -> None:
    apply(ds_tree, resolve_sets("deepspeed/explicit-arch"))
    text = (ds_tree / "op_builder" / "builder.py").read_text()
    assert '"32"' not in text.split("def get_rocm_wavefront_size")[1].split("def load")[0]
    assert text.count("_porter_no_wavefront(") == 3  # the definition and two call sites
    compile(text, "builder.py", "exec")
    namespace: dict[str, object] = {}
    helpers = text[text.index("def _porter_rocm_archs"):text.index("class OpBuilder(ABC):")]
    exec("import os, re\n" + helpers, namespace)
    env = dict(os.environ)
    try:
        os.environ["PORTER_ROCM_ARCHS"] = "gfx90a,gfx942"
        os.environ.pop("PORTER_ROCM_WAVEFRONT_SIZE", None)
        assert namespace["_porter_rocm_archs"]() == "gfx90a;gfx942"  # type: ignore[operator]
        assert namespace["_porter_rocm_wavefront"]() == "64"  # type: ignore[operator]
        os.environ["PORTER_ROCM_ARCHS"] = "gfx90a;gfx1100"
        with pytest.raises(RuntimeError, match="mix wave32 and wave64"):
            namespace["_porter_rocm_wavefront"]()  # type: ignore[operator]
        with pytest.raises(RuntimeError, match="PORTER_ROCM_WAVEFRONT_SIZE=64"):
            namespace["_porter_no_wavefront"]("test")  # type: ignore[operator]
    finally:
        os.environ.clear()
        os.environ.update(env)


def test_megatron_hipified_tree_counts_guard_as_already_applied(mds_tree: Path) -> None:
    # hipify may have turned __HIP_PLATFORM_HCC__ into __HIP_PLATFORM_AMD__ already
    cu = mds_tree / "megatron" / "fused_kernels" / "scaled_softmax_cuda.cu"
    cu.write_text(cu.read_text().replace("__HIP_PLATFORM_HCC__", "__HIP_PLATFORM_AMD__"))
    done = apply(mds_tree, resolve_sets("megatron-deepspeed/rocm"))
    statuses = {(r.patch, r.file): r.status for r in done.plan.sets[0].results}
    assert statuses[("hip-platform-amd", "megatron/fused_kernels/scaled_softmax_cuda.cu")] == "already"
    assert statuses[("hip-platform-amd", "megatron/fused_kernels/scaled_masked_softmax_cuda.cu")] == "applied"
    assert "megatron/fused_kernels/scaled_softmax_cuda.cu" not in done.changed


def test_symlinked_alias_is_edited_once(ds_tree: Path) -> None:
    shutil.rmtree(ds_tree / "deepspeed" / "ops" / "op_builder")
    (ds_tree / "deepspeed" / "ops" / "op_builder").symlink_to("../../op_builder")
    done = apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    assert done.changed == ("op_builder/builder.py",)
    assert (ds_tree / "deepspeed" / "ops" / "op_builder").is_symlink()
    text = (ds_tree / "op_builder" / "builder.py").read_text()
    assert text.count("_porter_refuse_jit(self.name)") == 1


# ---------------------------------------------------------------------------------------------
# atomicity and precise failures

def test_second_patch_fails_first_is_rolled_back(ds_tree: Path, tmp_path: Path) -> None:
    original = snapshot(ds_tree)
    s = write_set(tmp_path / "two.toml", '''
[[patch]]
id = "first-ok"
why = "fine"
files = ["op_builder/builder.py"]
[[patch.edit]]
action = "insert_after"
anchor = "import os"
text = "import sys"

[[patch]]
id = "second-broken"
why = "anchor drifted upstream"
files = ["version.txt", "op_builder/builder.py"]
[[patch.edit]]
action = "replace"
anchor = "def get_rocm_wavefront_sizes():"
text = "x"
''')
    with pytest.raises(PatchFailed) as err:
        apply(ds_tree, [load_file(s)])
    assert snapshot(ds_tree) == original
    msg = err.value.message
    assert "second-broken" in msg and "op_builder/builder.py" in msg
    assert "def get_rocm_wavefront_sizes():" in msg
    assert "closest: line 36: 'def get_rocm_wavefront_size():'" in msg
    assert err.value.exit_code == 1


def test_write_failure_midway_restores_every_file(ds_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = snapshot(ds_tree)
    real_write = engine._write
    calls = {"n": 0}

    def flaky(path: Path, data: bytes | None, mode: int | None) -> None:
        calls["n"] += 1
        if calls["n"] == 4:  # backup 1, file 1, backup 2, then the second file fails
            raise OSError("disk full (simulated)")
        real_write(path, data, mode)

    monkeypatch.setattr(engine, "_write", flaky)
    with pytest.raises(OSError, match="disk full"):
        apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    monkeypatch.setattr(engine, "_write", real_write)
    assert snapshot(ds_tree) == original


def test_count_mismatch_names_lines(ds_tree: Path, tmp_path: Path) -> None:
    s = write_set(tmp_path / "count.toml", '''
[[patch]]
id = "too-many"
why = "x"
files = ["op_builder/builder.py"]
[[patch.edit]]
action = "delete"
anchor = "@staticmethod"
''')
    with pytest.raises(PatchFailed, match=r"anchor matched 2 lines \(expected 1\) at line\(s\) 21, 34"):
        apply(ds_tree, [load_file(s)])


def test_check_reports_all_failures_without_writing(ds_tree: Path, tmp_path: Path) -> None:
    s = write_set(tmp_path / "bad.toml", '''
[[patch]]
id = "a"
why = "x"
files = ["op_builder/builder.py", "missing.py"]
[[patch.edit]]
action = "insert_after"
anchor = "nothing like this line at all"
text = "y"
''')
    original = snapshot(ds_tree)
    p = plan(ds_tree, [load_file(s)])
    assert [(f.file, f.reason) for f in p.failed] == [("op_builder/builder.py", "anchor not found"),
                                                      ("missing.py", "file not found")]
    assert snapshot(ds_tree) == original


# ---------------------------------------------------------------------------------------------
# versions

GATED = """
[set]
description = "a set whose patch cannot tell need by itself, so its range is a gate"
versions = ">=0.14,<0.20"
version_from = [{ file = "version.txt", regex = '^(\\d+\\.\\d+\\.\\d+)' }]

[[patch]]
id = "gated"
why = "x"
files = ["op_builder/builder.py"]
[[patch.edit]]
action = "insert_after"
anchor = "import os"
text = "import sys"
"""


def test_gated_version_outside_range_names_both(ds_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "gated.toml").write_text(GATED)
    gated = load_file(tmp_path / "gated.toml")
    assert not gated.decides_need
    (ds_tree / "version.txt").write_text("0.12.6\n")
    with pytest.raises(ConfigError) as err:
        plan(ds_tree, [gated])
    assert ">=0.14,<0.20" in err.value.message and "0.12.6" in err.value.message
    assert "--target-version" in (err.value.hint or "")
    done = apply(ds_tree, [gated], target_version="0.19.0")
    assert done.changed
    assert read_journal(ds_tree)["sets"][0]["version"] == "0.19.0"


def test_gated_target_version_outside_range_is_refused(ds_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "gated.toml").write_text(GATED)
    with pytest.raises(ConfigError, match="--target-version 0.20.1 is outside"):
        plan(ds_tree, [load_file(tmp_path / "gated.toml")], target_version="0.20.1")


def test_gated_unreadable_version_asks_for_target_version(ds_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "gated.toml").write_text(GATED)
    (ds_tree / "version.txt").unlink()
    with pytest.raises(ConfigError, match="cannot read the local version") as err:
        plan(ds_tree, [load_file(tmp_path / "gated.toml")])
    assert "--target-version" in (err.value.hint or "")


def test_shipped_sets_record_versions_instead_of_gating(ds_tree: Path) -> None:
    # every shipped patch names its problem, so the set's range is a recorded fact
    (ds_tree / "version.txt").write_text("0.12.6\n")
    p = plan(ds_tree, resolve_sets("deepspeed/no-jit"))
    (note,) = p.sets[0].notes
    assert "verified on deepspeed >=0.14,<0.20" in note and "the tree is 0.12.6" in note
    assert p.sets[0].state == "would apply"
    assert plan(ds_tree, resolve_sets("deepspeed/no-jit"), target_version="0.20.1").sets[0].version == "0.20.1"
    with pytest.raises(ConfigError, match="not a PEP 440 version"):
        plan(ds_tree, resolve_sets("deepspeed/no-jit"), target_version="latest")
    apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    assert read_journal(ds_tree)["sets"][0]["version"] == "0.12.6"


def test_shipped_set_on_tree_without_version(ds_tree: Path) -> None:
    (ds_tree / "version.txt").unlink()
    p = plan(ds_tree, resolve_sets("deepspeed/no-jit"))
    assert p.sets[0].version == ""
    assert "no deepspeed version found in the tree (looked in version.txt)" in p.sets[0].notes[0]
    assert p.sets[0].state == "would apply"


def test_patch_level_range_skips_patch(ds_tree: Path, tmp_path: Path) -> None:
    s = write_set(tmp_path / "ranged.toml", '''
[[patch]]
id = "old-only"
why = "x"
versions = "<0.15"
files = ["op_builder/builder.py"]
[[patch.edit]]
action = "delete"
anchor = "import os"
''')
    p = plan(ds_tree, [load_file(s)], target_version="0.19.8")
    assert p.sets[0].results[0].status == "skipped"
    assert p.changes == ()


# ---------------------------------------------------------------------------------------------
# safety

@pytest.mark.parametrize("target", ["../outside.py", "/etc/passwd", "a/../../x.py"])
def test_paths_leading_out_are_refused(ds_tree: Path, tmp_path: Path, target: str) -> None:
    s = tmp_path / "escape.toml"
    s.write_text(f'''[set]
[[patch]]
id = "escape"
why = "x"
files = ["{target}"]
[[patch.edit]]
action = "insert_after"
anchor = "x"
text = "y"
''')
    with pytest.raises(ConfigError, match="leads outside the tree"):
        load_file(s)


def test_symlink_leading_out_is_refused(ds_tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("import os\n")
    (ds_tree / "evil.py").symlink_to(outside)
    s = write_set(tmp_path / "link.toml", '''
[[patch]]
id = "via-link"
why = "x"
files = ["evil.py"]
[[patch.edit]]
action = "insert_after"
anchor = "import os"
text = "import sys"
''')
    with pytest.raises(ConfigError, match="leads outside the tree"):
        apply(ds_tree, [load_file(s)])
    assert outside.read_text() == "import os\n"


def test_diff_escaping_the_tree_is_refused(ds_tree: Path, tmp_path: Path) -> None:
    d = tmp_path / "escape.patch"
    d.write_text("--- a/../x.py\n+++ b/../x.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(ConfigError, match="leads outside the tree"):
        apply(ds_tree, [load_file(d)])


def test_journal_dir_symlink_is_refused(ds_tree: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (ds_tree / ".porter").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="symlink"):
        apply(ds_tree, resolve_sets("deepspeed/no-jit"))


# ---------------------------------------------------------------------------------------------
# line endings and file form

LINE_SET = '''
[[patch]]
id = "edits"
why = "x"
files = ["f.txt"]
[[patch.edit]]
action = "insert_after"
anchor = "beta"
text = """
after-beta-1
after-beta-2
"""
[[patch.edit]]
action = "insert_before"
anchor = "alpha"
text = "before-alpha"
[[patch.edit]]
action = "replace"
anchor = "gamma"
text = "GAMMA"
[[patch.edit]]
action = "delete"
anchor = "delete-me"
'''


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("trailing", [True, False])
def test_line_endings_and_missing_final_newline_are_kept(tmp_path: Path, newline: str, trailing: bool) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    body = newline.join(["alpha", "delete-me", "gamma", "beta"]) + (newline if trailing else "")
    (tree / "f.txt").write_bytes(body.encode())
    s = write_set(tmp_path / "lines.toml", LINE_SET)
    apply(tree, [load_file(s)])
    want = newline.join(["before-alpha", "alpha", "GAMMA", "beta", "after-beta-1", "after-beta-2"])
    assert (tree / "f.txt").read_bytes() == (want + (newline if trailing else "")).encode()
    assert apply(tree, [load_file(s)]).changed == ()
    revert(tree)
    assert (tree / "f.txt").read_bytes() == body.encode()


def test_deleting_last_line_without_newline_keeps_form(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "f.txt").write_bytes(b"one\r\ntwo\r\nlast")
    s = write_set(tmp_path / "d.toml", '''
[[patch]]
id = "drop-last"
why = "x"
files = ["f.txt"]
[[patch.edit]]
action = "delete"
anchor = "last"
''')
    apply(tree, [load_file(s)])
    assert (tree / "f.txt").read_bytes() == b"one\r\ntwo"


def test_multiline_replace_uses_file_newline_and_regex_groups(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "f.py").write_bytes(b"def f():\r\n    value = 32\r\n")
    s = write_set(tmp_path / "r.toml", r'''
[[patch]]
id = "wrap"
why = "x"
files = ["f.py"]
[[patch.edit]]
action = "replace"
regex = true
anchor = '^(\s*)value = 32$'
applied_if = 'porter-wrapped'
text = '\1# porter-wrapped\n\1value = 64'
''')
    apply(tree, [load_file(s)])
    assert (tree / "f.py").read_bytes() == b"def f():\r\n    # porter-wrapped\r\n    value = 64\r\n"
    assert apply(tree, [load_file(s)]).changed == ()


def test_file_mode_is_kept(ds_tree: Path) -> None:
    f = ds_tree / "op_builder" / "builder.py"
    f.chmod(0o755)
    apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    assert stat.S_IMODE(f.stat().st_mode) == 0o755
    revert(ds_tree)
    assert stat.S_IMODE(f.stat().st_mode) == 0o755


# ---------------------------------------------------------------------------------------------
# revert

def test_revert_refuses_changed_file_unless_forced(ds_tree: Path) -> None:
    original = snapshot(ds_tree)
    apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    f = ds_tree / "op_builder" / "builder.py"
    f.write_text(f.read_text() + "# my own edit\n")
    with pytest.raises(CheckFailed, match="op_builder/builder.py changed since deepspeed/no-jit") as err:
        revert(ds_tree)
    assert "--force" in (err.value.hint or "")
    assert f.read_text().endswith("# my own edit\n")  # nothing was reverted
    done = revert(ds_tree, force=True)
    assert done.forced == ("op_builder/builder.py",)
    assert snapshot(ds_tree) == original


def test_revert_one_set_keeps_the_other(ds_tree: Path) -> None:
    original = snapshot(ds_tree)
    apply(ds_tree, resolve_sets("deepspeed/explicit-arch"))
    after_arch = snapshot(ds_tree)
    apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    revert(ds_tree, ["deepspeed/no-jit"])  # the upper set: a plain restore
    assert {k: v for k, v in snapshot(ds_tree).items() if not k.startswith(".porter")} == \
        {k: v for k, v in after_arch.items() if not k.startswith(".porter")}
    assert [e["set"] for e in read_journal(ds_tree)["sets"]] == ["deepspeed/explicit-arch"]
    revert(ds_tree, ["deepspeed"])
    assert snapshot(ds_tree) == original


def test_revert_with_nothing_applied(ds_tree: Path) -> None:
    with pytest.raises(NothingToDo):
        revert(ds_tree)


def test_revert_refuses_damaged_backup(ds_tree: Path) -> None:
    apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    entry = read_journal(ds_tree)["sets"][0]
    (ds_tree / entry["files"][0]["backup"]).write_text("not the original")
    with pytest.raises(CheckFailed, match="missing or damaged"):
        revert(ds_tree)


def test_journal_records_hashes(ds_tree: Path) -> None:
    before = hashlib.sha256((ds_tree / "op_builder/builder.py").read_bytes()).hexdigest()
    apply(ds_tree, resolve_sets("deepspeed/no-jit"))
    data = json.loads((ds_tree / ".porter" / "patches.json").read_text())
    rec = {f["path"]: f for f in data["sets"][0]["files"]}["op_builder/builder.py"]
    assert rec["before"] == before
    assert rec["after"] == hashlib.sha256((ds_tree / "op_builder/builder.py").read_bytes()).hexdigest()
    assert data["sets"][0]["version"] == "0.19.8"
    assert data["sets"][0]["patches"] == ["no-jit-feature-probes", "no-jit-guard"]


# ---------------------------------------------------------------------------------------------
# unified diffs

def test_unified_diff_applies_idempotently_and_reverts(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.c").write_bytes(b"int a;\r\nint b;\r\nint c;\r\n")
    d = tmp_path / "fix.patch"
    d.write_text("diff --git a/src/a.c b/src/a.c\n--- a/src/a.c\n+++ b/src/a.c\n@@ -1,3 +1,4 @@\n int a;\n"
                 "-int b;\n+long b;\n+int bb;\n int c;\n"
                 "--- /dev/null\n+++ b/src/new.h\n@@ -0,0 +1,2 @@\n+#pragma once\n+int n;\n")
    original = snapshot(tree)
    done = apply(tree, [load_file(d)])
    assert sorted(done.changed) == ["src/a.c", "src/new.h"]
    assert (tree / "src" / "a.c").read_bytes() == b"int a;\r\nlong b;\r\nint bb;\r\nint c;\r\n"
    assert (tree / "src" / "new.h").read_bytes() == b"#pragma once\nint n;\n"
    assert apply(tree, [load_file(d)]).changed == ()
    revert(tree)
    assert snapshot(tree) == original


def test_unified_diff_mismatch_reports_closest(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "a.c").write_text("int alpha;\nint beta2;\n")
    d = tmp_path / "x.patch"
    d.write_text("--- a/a.c\n+++ b/a.c\n@@ -1,2 +1,2 @@\n int alpha;\n-int beta;\n+int gamma;\n")
    with pytest.raises(PatchFailed, match="hunk @@ -1 @@ does not match") as err:
        apply(tree, [load_file(d)])
    assert "closest: line 1: 'int alpha;'" in err.value.message


def test_unified_diff_offset_and_no_newline(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "a.txt").write_bytes(b"x\ny\nz\none\ntwo")
    d = tmp_path / "x.patch"
    d.write_text("--- a.txt\n+++ a.txt\n@@ -1,2 +1,2 @@\n one\n-two\n\\ No newline at end of file\n"
                 "+TWO\n\\ No newline at end of file\n")
    apply(tree, [load_file(d)])
    assert (tree / "a.txt").read_bytes() == b"x\ny\nz\none\nTWO"


# ---------------------------------------------------------------------------------------------
# dry run and the data

def test_dry_run_writes_nothing_and_shows_diff(ds_tree: Path) -> None:
    original = snapshot(ds_tree)
    planned = checked(ds_tree, resolve_sets("deepspeed/no-jit"))
    assert snapshot(ds_tree) == original
    diff = planned.diff()
    assert "+++ b/op_builder/builder.py" in diff and "+        _porter_refuse_jit(self.name)" in diff


def test_shipped_sets_record_what_they_were_verified_against() -> None:
    for ref in ("deepspeed/no-jit", "deepspeed/explicit-arch", "megatron-deepspeed/rocm"):
        (s,) = resolve_sets(ref)
        assert s.verified and all(v.ref for v in s.verified)
        assert any(len(v.commit) == 40 for v in s.verified), f"{ref} records no upstream commit"
        assert all(p.why for p in s.patches)


def test_unknown_set_suggests_close_names() -> None:
    with pytest.raises(ConfigError, match="no patch set 'nojit'") as err:
        resolve_sets("deepspeed/nojit")
    assert "no-jit" in (err.value.hint or "")
    with pytest.raises(ConfigError, match="no shipped patch sets for project 'deepsped'") as err:
        resolve_sets("deepsped")
    assert "deepspeed" in (err.value.hint or "")


def test_set_with_unknown_key_is_refused(tmp_path: Path) -> None:
    s = write_set(tmp_path / "k.toml", '''
[[patch]]
id = "a"
why = "x"
files = ["f"]
[[patch.edit]]
action = "insert_after"
anchor = "x"
text = "y"
cout = 2
''')
    with pytest.raises(ConfigError, match="unknown key 'cout'"):
        load_file(s)
