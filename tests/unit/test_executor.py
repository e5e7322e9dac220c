"""The executor: argv prefixes, host <-> in-root paths, staging, readiness (no subprocess)."""

from __future__ import annotations

import os

from pathlib import Path

import pytest

from porter.errors import ConfigError, ToolError
from porter.executor import HOST, build_python, make_executor
from porter.toolchain.profile import load_toolchain


def test_host_runs_as_given_and_sees_everything(tmp_path: Path) -> None:
    assert HOST.argv("g++", "-c", "x.cpp") == ["g++", "-c", "x.cpp"]
    assert HOST.visible(tmp_path / "a.cpp") == str(tmp_path / "a.cpp")
    HOST.preflight()  # nothing to check


def test_chroot_maps_paths_and_stages_what_it_cannot_see(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    ex = make_executor(("chroot", str(root)), setup="make chroot-x")
    assert ex.argv("hipcc", "--version") == ["chroot", str(root), "hipcc", "--version"]
    assert ex.inside(root / "usr" / "include") == "/usr/include"
    assert ex.work_root == root / "var" / "cache" / "porter"
    with pytest.raises(ConfigError, match="not inside the chroot"):
        ex.inside(tmp_path / "outside.cpp")
    src = tmp_path / "src" / "k.hip"
    src.parent.mkdir()
    src.write_text("// kernel\n")
    named = ex.visible(src, stage=False)  # a dry run names the place and writes nothing
    assert named.startswith("/var/cache/porter/staged/") and named.endswith("-k.hip")
    assert not (root / "var").exists()
    assert ex.visible(src) == named and (root / named.lstrip("/")).read_text() == "// kernel\n"
    (tmp_path / "src" / "inc").mkdir()
    (tmp_path / "src" / "inc" / "h.h").write_text("#pragma once\n")
    inc = ex.visible(tmp_path / "src" / "inc")
    assert (root / inc.lstrip("/") / "h.h").is_file()
    assert ex.visible(root / "usr" / "bin" / "hipcc") == "/usr/bin/hipcc"  # already inside: no copy


def test_chroot_readiness_names_the_fix(tmp_path: Path) -> None:
    missing = make_executor(("chroot", str(tmp_path / "nope")), setup="make chroot-rocm7")
    with pytest.raises(ToolError, match="does not exist") as exc:
        missing.preflight()
    assert "make chroot-rocm7" in (exc.value.hint or "")
    root = tmp_path / "root"
    root.mkdir()
    no_proc = make_executor(("chroot", str(root)), needs_proc=True, setup="make chroot-rocm7")
    with pytest.raises(ToolError, match="no /proc mounted") as exc:
        no_proc.preflight()
    assert f"mount -t proc proc {root}/proc" in (exc.value.hint or "")
    make_executor(("chroot", str(root))).preflight()  # a compiler that needs no /proc is fine


def test_rocm7_profile_needs_proc_and_trixie_does_not(tmp_path: Path) -> None:
    env = {"PORTER_ROCM7_ROOT": str(tmp_path / "r7"), "PORTER_TRIXIE_ROOT": str(tmp_path / "tx")}
    r7 = load_toolchain("debian-rocm7", environ=env).executor
    assert r7.kind == "chroot" and r7.needs_proc and r7.setup == "make chroot-rocm7"
    assert not load_toolchain("debian-trixie-rocm", environ=env).executor.needs_proc
    assert load_toolchain("frontier", environ={}).executor is HOST


def test_container_binds_its_work_folder(tmp_path: Path) -> None:
    ex = make_executor(("apptainer", "exec", "--rocm", "/images/rocm.sif"), work_root=tmp_path / "w")
    argv = ex.argv("hipcc", "-c", "a.hip")
    assert argv == ["apptainer", "exec", "--bind", f"{tmp_path}/w:{tmp_path}/w", "--rocm", "/images/rocm.sif",
                    "hipcc", "-c", "a.hip"]
    assert ex.visible(tmp_path / "w" / "x.o") == f"{tmp_path}/w/x.o"
    other = tmp_path / "elsewhere.hip"
    other.write_text("x")
    assert ex.visible(other).startswith(f"{tmp_path}/w/staged/")


def test_bad_launchers_are_named() -> None:
    with pytest.raises(ConfigError, match="chroot launcher"):
        make_executor(("chroot", "/a", "/b"))
    with pytest.raises(ConfigError, match="container launcher"):
        make_executor(("apptainer", "run", "img.sif"), work_root=Path("/w"))
    with pytest.raises(ConfigError, match="differs from the chroot"):
        make_executor(("chroot", "/a"), "/b")


def test_build_python_is_the_same_rule_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ex = make_executor(("chroot", str(tmp_path)))
    assert build_python(ex, "", "/usr/bin/python3") == (ex, "/usr/bin/python3")  # --python: inside the root
    assert build_python(ex, "/opt/py/bin/python", None) == (ex, "/opt/py/bin/python")  # the profile's
    found_ex, found = build_python(ex, "", None)
    assert found_ex is HOST and found  # neither: porter's own python, on the host
    monkeypatch.setenv("PORTER_PYTHON", "/env/python")
    assert build_python(ex, "", None) == (ex, "/env/python")


def test_nested_folders_are_staged_once(tmp_path: Path) -> None:
    """torch's include/ holds include/torch/csrc/api/include/: staged as two copies, one header would be two
    files, and clang's #pragma once (file identity) would let a .cu define torch's OrderedDict twice."""
    root = tmp_path / "root"
    root.mkdir()
    ex = make_executor(("chroot", str(root)))
    inc = tmp_path / "torch" / "include"
    api = inc / "torch" / "csrc" / "api" / "include"
    (api / "torch").mkdir(parents=True)
    (api / "torch" / "ordered_dict.h").write_text("#pragma once\n")
    within = (str(inc), str(api))
    named = [ex.visible(d, stage=False, within=within) for d in (api, inc)]  # the order does not matter
    assert named[0] == named[1] + "/torch/csrc/api/include"
    assert not (root / "var").exists()  # naming writes nothing
    staged = [ex.visible(d, within=within) for d in (api, inc)]
    assert staged == named
    copies = [p for p in (ex.work_root / "staged").iterdir() if not p.name.endswith((".lock", ".owner"))]
    assert len(copies) == 1  # one copy (beside it, the lock its copier held)
    one = root / staged[0].lstrip("/") / "torch" / "ordered_dict.h"
    assert one.is_file() and one.samefile(root / staged[1].lstrip("/") / "torch/csrc/api/include/torch/ordered_dict.h")


def test_a_chroot_keeps_each_host_cache_apart(tmp_path: Path) -> None:
    """Issue 22: two PORTER_CACHE_DIRs once shared one build folder inside the chroot, so one build's hipify
    removed the sources another was compiling."""
    from porter.executor import CACHE_OWNER, chroot_work_root

    root = tmp_path / "root"
    base = root / "var" / "cache" / "porter"
    assert chroot_work_root(root, None) == base
    assert chroot_work_root(root, Path(os.path.expanduser("~/.cache/porter"))) == base
    a, b = chroot_work_root(root, tmp_path / "a"), chroot_work_root(root, tmp_path / "b")
    assert a != b and a.parent == b.parent == base / "caches"
    assert chroot_work_root(root, tmp_path / "a") == a  # the same cache, the same folder
    inside = root / "scratch" / "cache"
    assert chroot_work_root(root, inside) == inside  # already where the chroot sees it
    ex = make_executor(("chroot", str(root)), work_root=tmp_path / "a")
    assert ex.work_root == a and ex.inside(a).startswith("/var/cache/porter/caches/")
    assert not root.exists()  # named, not made: a dry run writes nothing into the root
    root.mkdir()
    assert ex.work_dir(tmp_path) == a and (a / CACHE_OWNER).is_file()  # made, with its owner, on first use


def test_a_cache_made_again_at_the_same_path_is_a_new_cache_in_the_chroot(tmp_path: Path) -> None:
    """Session 7's CI failure: a test's cache folder (pytest-12/...) had the path of one from an earlier run whose
    chroot copy was still there, so the build folder held that run's objects and records. The copy is named by the
    host cache's id now, and copies whose host cache is gone are removed when a new one is made."""
    import shutil

    from porter.executor import CACHE_ID, chroot_work_root

    root, cache = tmp_path / "root", tmp_path / "cache"
    root.mkdir()
    first = chroot_work_root(root, cache, make=True)
    assert (cache / CACHE_ID).is_file() and first.is_dir() and chroot_work_root(root, cache, make=True) == first
    (first / "wheels").mkdir()
    kept = chroot_work_root(root, tmp_path / "kept", make=True)  # another live cache: its copy stays
    shutil.rmtree(cache)
    second = chroot_work_root(root, cache, make=True)
    assert second != first and second.is_dir()
    assert not first.exists() and kept.is_dir()  # the orphan went, the live one did not
    assert sorted(p.name for p in second.parent.iterdir()) == sorted([second.name, kept.name])
