"""FlashAttention's ck-rocm7 patch set: named for every rocm build of a tree whose composable_kernel has the
pre-ROCm-7 get_warp_size(); left out where the tree has no such file; applied once (a second plan is empty)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ops_prebuild.source import Source, build_sets, patched_source
from porter.patching import load_project, plan
from tests.conftest import FIXTURES

TREE = FIXTURES / "flash-attn-ck-pre-rocm7"
ARCH = "csrc/composable_kernel/include/ck_tile/core/arch/arch.hpp"


def test_the_set_is_named_for_rocm_builds_of_trees_that_have_the_header() -> None:
    assert load_project("flash-attn").build == {"rocm": ("ck-rocm7",)}
    assert [s.ref for s in build_sets("flash-attn", "rocm", TREE)] == ["flash-attn/ck-rocm7"]
    assert build_sets("flash-attn", "cpu", TREE) == []
    # a tree without composable_kernel's header (the Triton backend's, the fixture CK build's) is built as it is
    assert build_sets("flash-attn", "rocm", FIXTURES / "flash-attn-mini") == []


def test_the_patch_makes_the_wave_size_a_constant_of_the_arch_and_converges(tmp_path: Path) -> None:
    tree = tmp_path / "fa"
    shutil.copytree(TREE, tree)
    sets = build_sets("flash-attn", "rocm", tree)
    first = plan(tree, sets)
    assert not first.failed
    assert [(r.patch, r.status) for s in first.sets for r in s.results] == [("ck-constexpr-warp-size", "would-apply")]
    for change in first.changes:
        (tree / change.path).write_bytes(change.after or b"")
    text = (tree / ARCH).read_text()
    assert "return warpSize;" not in text
    body = text.split("get_warp_size()")[1]
    assert "#if defined(__HIP_DEVICE_COMPILE__) && !defined(__GFX9__)\n    return 32;\n#else\n    return 64;" in body
    again = plan(tree, sets)
    assert not again.failed and not [c for c in again.changes if c.after != c.before]


def test_the_build_compiles_a_patched_copy_and_leaves_the_tree_alone(tmp_path: Path) -> None:
    tree = tmp_path / "fa"
    shutil.copytree(TREE, tree)
    before = (tree / ARCH).read_bytes()
    patched = patched_source(Source("flash-attn", "2.6.3", tree, str(tree)), build_sets("flash-attn", "rocm", tree),
                             tmp_path / "cache")
    assert patched.applied == ("flash-attn/ck-rocm7: ck-constexpr-warp-size",) and not patched.warning
    assert (tree / ARCH).read_bytes() == before
    assert "__GFX9__" in (patched.source.tree / ARCH).read_text()


def test_two_trees_of_one_name_or_an_edited_tree_never_share_a_patched_copy(tmp_path: Path) -> None:
    """The gauntlet calls every checkout 'tree', and a site edits its fork: a patched copy keyed only by the patched
    files' content handed one tree's copy to the other (its other files included), and kept an edited tree's
    old files."""
    import os

    a, b = tmp_path / "a" / "tree", tmp_path / "b" / "tree"
    shutil.copytree(TREE, a)
    shutil.copytree(TREE, b)
    (b / "flash_attn" / "extra.py").write_text("only in b\n")
    cache = tmp_path / "cache"

    def copy_of(tree: Path) -> Path:
        return patched_source(Source("flash-attn", "2.6.3", tree, str(tree)), build_sets("flash-attn", "rocm", tree),
                              cache).source.tree

    ca, cb = copy_of(a), copy_of(b)
    assert ca != cb and not (ca / "flash_attn" / "extra.py").exists()
    assert (cb / "flash_attn" / "extra.py").read_text() == "only in b\n"
    assert copy_of(a) == ca  # the same tree, unchanged: its copy is reused
    (a / "flash_attn" / "__init__.py").write_text('__version__ = "2.6.3"\nEDITED = True\n')
    os.utime(a / "flash_attn" / "__init__.py", ns=(1, 1))
    edited = copy_of(a)
    assert edited != ca and "EDITED" in (edited / "flash_attn" / "__init__.py").read_text()
