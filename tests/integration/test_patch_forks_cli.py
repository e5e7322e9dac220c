"""``porter patch`` as a process: exit codes through ``main()`` on fork stand-ins and layered sets."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def porter(cli: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120)


def test_fork_without_rmsnorm_import_applies_the_rest(tmp_path: Path, porter_cli: list[str]) -> None:
    tree = tmp_path / "fork"
    shutil.copytree(FIXTURES / "patch-forks" / "megatron-no-rmsnorm", tree)
    check = porter(porter_cli, "patch", "check", str(tree), "--set", "megatron-deepspeed/rocm")
    assert check.returncode == 0, check.stderr
    assert "megatron-deepspeed/rocm (version 0.2.0): would apply" in check.stdout
    assert "patch 'apex-rmsnorm-clear-error', file megatron/model/__init__.py: not needed here" in check.stdout

    done = porter(porter_cli, "patch", "apply", str(tree), "--set", "megatron-deepspeed/rocm", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["sets"][0]["patches"]["apex-rmsnorm-clear-error"] == "not-needed"
    assert doc["sets"][0]["patches"]["fused-kernels-prebuilt"] == "applied"
    assert "megatron/model/__init__.py" not in doc["written"]

    again = porter(porter_cli, "patch", "apply", str(tree), "--set", "megatron-deepspeed/rocm")
    assert again.returncode == 4, again.stderr
    assert "nothing to do" in again.stderr


def test_layered_deepspeed_sets(tmp_path: Path, porter_cli: list[str]) -> None:
    tree = tmp_path / "ds"
    shutil.copytree(FIXTURES / "patch" / "deepspeed", tree)
    original = (tree / "op_builder/builder.py").read_bytes()
    sets = ["--set", "deepspeed/no-jit", "--set", "deepspeed/explicit-arch"]
    assert porter(porter_cli, "patch", "apply", str(tree), *sets).returncode == 0
    assert porter(porter_cli, "patch", "apply", str(tree), *sets).returncode == 4

    status = porter(porter_cli, "patch", "status", str(tree))
    assert status.returncode == 0 and "CHANGED" not in status.stdout
    assert "ok      op_builder/builder.py  (then deepspeed/explicit-arch)" in status.stdout

    revert = porter(porter_cli, "patch", "revert", str(tree), "--set", "deepspeed/no-jit")
    assert revert.returncode == 0, revert.stderr
    text = (tree / "op_builder/builder.py").read_text()
    assert "_porter_refuse_jit" not in text and "def _porter_rocm_archs():" in text
    assert porter(porter_cli, "patch", "revert", str(tree)).returncode == 0
    assert (tree / "op_builder/builder.py").read_bytes() == original
    assert porter(porter_cli, "patch", "revert", str(tree)).returncode == 4
