"""``porter patch`` through click (in-process: no subprocess in the unit tier)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from porter.cli import cli
from porter.errors import ConfigError
from porter.patching.engine import PatchFailed

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "patch"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    dest = tmp_path / "ds"
    shutil.copytree(FIXTURES / "deepspeed", dest)
    return dest


def run(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(cli, ["-q", *args])
    return result.exit_code, result.stdout, result.exception


def test_list_all_and_json() -> None:
    code, out, _ = run("patch", "list")
    assert code == 0
    assert "deepspeed/no-jit" in out and "megatron-deepspeed/rocm" in out
    code, out, _ = run("patch", "list", "deepspeed", "--json")
    rows = json.loads(out)
    assert [r["set"] for r in rows] == ["deepspeed/no-jit", "deepspeed/explicit-arch", "deepspeed/rocm-sources"]
    assert rows[0]["patches"][0]["id"] == "no-jit-guard"


def test_check_apply_dry_run_apply_revert(tree: Path) -> None:
    code, out, _ = run("patch", "check", str(tree), "--set", "deepspeed/no-jit", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["ok"] and {r["status"] for r in doc["sets"][0]["results"]} == {"would-apply"}
    assert doc["sets"][0]["state"] == "would apply"

    before = (tree / "op_builder" / "builder.py").read_bytes()
    code, out, _ = run("patch", "apply", str(tree), "--set", "deepspeed/no-jit", "--dry-run")
    assert code == 0 and out.startswith("--- a/op_builder/builder.py")
    assert (tree / "op_builder" / "builder.py").read_bytes() == before

    code, out, _ = run("patch", "apply", str(tree), "-s", "deepspeed/no-jit", "--json")
    doc = json.loads(out)
    assert sorted(doc["written"]) == ["deepspeed/ops/op_builder/builder.py", "op_builder/builder.py"]

    code, out, _ = run("patch", "status", str(tree), "--json")
    assert json.loads(out)["sets"][0]["set"] == "deepspeed/no-jit"

    code, out, _ = run("patch", "revert", str(tree), "--json")
    assert code == 0 and json.loads(out)["reverted"] == ["deepspeed/no-jit"]
    assert (tree / "op_builder" / "builder.py").read_bytes() == before


def test_check_failure_is_a_patch_failure(tree: Path) -> None:
    # the problem (a JIT path) is present, the anchor (the class line) is not
    for f in ("op_builder/builder.py", "deepspeed/ops/op_builder/builder.py"):
        (tree / f).write_text("class Builder:\n    def jit_load(self, verbose=True):\n        pass\n")
    code, out, exc = run("patch", "check", str(tree), "--set", "deepspeed/no-jit")
    assert isinstance(exc, PatchFailed)
    assert "deepspeed/no-jit (version 0.19.8): would fail" in out
    assert "anchor not found" in out and "problem: line 2: 'def jit_load(self, verbose=True):'" in out
    assert exc.exit_code == 1


def test_version_outside_the_verified_range_is_a_warning(tree: Path) -> None:
    (tree / "version.txt").write_text("0.10.0\n")
    result = CliRunner().invoke(cli, ["patch", "apply", str(tree), "--set", "deepspeed/no-jit"])
    assert result.exit_code == 0, result.exception
    assert "WARNING: deepspeed/no-jit: deepspeed/no-jit was verified on deepspeed >=0.14,<0.20; the tree is " \
           "0.10.0" in result.stderr
    _, _, exc = run("patch", "apply", str(tree), "--set", "deepspeed/no-jit", "--target-version", "latest")
    assert isinstance(exc, ConfigError) and exc.exit_code == 2


def test_apply_needs_a_set(tree: Path) -> None:
    code, _, _ = run("patch", "apply", str(tree))
    assert code == 2
