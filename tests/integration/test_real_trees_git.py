"""The gauntlet's checkout from mirrors, with real git: a submodule a git snapshot lacks comes from its own
project's mirror at the commit the tree pins, and a mirror without that commit skips the target, saying which."""

from __future__ import annotations

import subprocess
from typing import Any
from pathlib import Path

import pytest

from tests.unit.test_real_trees import rt

pytestmark = pytest.mark.integration

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
       "-c", "protocol.file.allow=always"]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _mirrors(tmp_path: Path) -> tuple[Path, str]:
    """<mirrors>/o+sub/repo (two commits) and <mirrors>/o+top/repo, whose main pins sub's first commit."""
    sub, top = tmp_path / "src-sub", tmp_path / "src-top"
    sub.mkdir()
    _git(sub, "init", "-q")
    (sub / "gen.py").write_text("print('generated')\n")
    _git(sub, "add", ".")
    _git(sub, "commit", "-qm", "one")
    pin = _git(sub, "rev-parse", "HEAD")
    (sub / "later.txt").write_text("after the pin\n")
    _git(sub, "add", ".")
    _git(sub, "commit", "-qm", "two")
    top.mkdir()
    _git(top, "init", "-q")
    (top / "setup.py").write_text("# the superproject\n")
    _git(top, "submodule", "add", "-q", str(sub), "third/sub")
    _git(top / "third" / "sub", "checkout", "-q", pin)
    _git(top, "add", ".")
    _git(top, "commit", "-qm", "pin")
    mirrors = tmp_path / "mirrors"
    for name, src in (("o+sub", sub), ("o+top", top)):
        subprocess.run([*GIT, "clone", "-q", "--bare", str(src), str(mirrors / name / "repo")], check=True)
    return mirrors, pin


def _runner(mirrors: Path, tmp_path: Path, targets: list[Any]) -> Any:
    return rt.Runner(targets=targets, mirrors=mirrors, work=tmp_path / "work", porter=["porter"], env={}, jobs=None,
                     timeout=60, results=tmp_path / "r.json", report=tmp_path / "r.md")


TARGET = """
[[target]]
id = "top"
repo = "o/top"
ref = "main"
command = "fa-ck-sample"
toolchain = "debian-rocm7"
paths = ["setup.py"]
submodules = {"third/sub" = "o/sub"}
requires = ["third/sub/gen.py"]
"""


def test_a_submodule_comes_from_its_mirror_at_the_pinned_commit(tmp_path: Path) -> None:
    mirrors, pin = _mirrors(tmp_path)
    (t,) = rt.parse_targets(TARGET)
    folder = tmp_path / "work" / "top"
    src, source, why = _runner(mirrors, tmp_path, [t]).prepare(t, folder)
    assert why == "" and source["submodules"] == {"third/sub": f"o/sub@{pin}"}
    tree = Path(src)
    assert (tree / "third/sub/gen.py").read_text() == "print('generated')\n"
    assert not (tree / "third/sub/later.txt").exists()  # the pinned commit, not the mirror's newest


def test_a_mirror_without_the_pinned_commit_skips_the_target_saying_which(tmp_path: Path) -> None:
    mirrors, pin = _mirrors(tmp_path)
    sub = mirrors / "o+sub" / "repo"
    subprocess.run(["rm", "-rf", str(sub)], check=True)  # a snapshot taken before the pin: only an unrelated commit
    other = tmp_path / "other"
    other.mkdir()
    _git(other, "init", "-q")
    (other / "x").write_text("x\n")
    _git(other, "add", ".")
    _git(other, "commit", "-qm", "x")
    subprocess.run([*GIT, "clone", "-q", "--bare", str(other), str(sub)], check=True)
    (t,) = rt.parse_targets(TARGET)
    _, source, why = _runner(mirrors, tmp_path, [t]).prepare(t, tmp_path / "work" / "top")
    assert why.startswith(f"o/sub's snapshot lacks {pin[:9]}, the commit o/top@") and why.endswith("pins at third/sub")
    (no_sub,) = rt.parse_targets(TARGET.replace('"third/sub" = "o/sub"', '"setup.py" = "o/sub"'))
    assert "setup.py is no submodule of o/top@" in _runner(mirrors, tmp_path, [no_sub]).prepare(
        no_sub, tmp_path / "work" / "top2")[2]
