"""``ops_prebuild.measure``, the wrapper ninja runs each ``--compile-only`` compile through: a command that exits 0
without writing its object fails (Debian's hipcc 7 exits 0 when the shell it runs clang through is killed), and an
old object never passes for a new one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MEASURE = (sys.executable, "-m", "ops_prebuild.measure")
# what Debian's hipcc does when its ``sh -c`` child is killed by a signal: it reports the child's end as success
KILLED_CHILD_EXIT_0 = ("sh", "-c", "sh -c 'kill -TERM $$'; exit 0")


def _measure(obj: Path, *cmd: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    cost = Path(f"{obj}.cost.json")
    proc = subprocess.run([*MEASURE, str(cost), "--", *cmd], capture_output=True, text=True, timeout=60)
    return proc, json.loads(cost.read_text())


def test_exit_0_without_the_object_is_a_failure(tmp_path: Path) -> None:
    obj = tmp_path / "unit.cu.gfx90a.o"
    proc, cost = _measure(obj, *KILLED_CHILD_EXIT_0)
    assert proc.returncode == 1, proc
    assert f"exited 0 but wrote no {obj}" in proc.stderr
    assert cost["returncode"] == 1  # so its time is never taken for a finished unit's


def test_an_old_object_does_not_pass_for_the_new_one(tmp_path: Path) -> None:
    obj = tmp_path / "unit.cu.host.o"
    obj.write_bytes(b"from an earlier build")
    proc, cost = _measure(obj, *KILLED_CHILD_EXIT_0)
    assert proc.returncode == 1 and not obj.exists()


def test_a_compile_that_writes_its_object_passes_with_its_status(tmp_path: Path) -> None:
    obj = tmp_path / "unit.cu.host.o"
    proc, cost = _measure(obj, "sh", "-c", f"echo object > {obj}")
    assert proc.returncode == 0 and cost["returncode"] == 0 and obj.read_text() == "object\n", proc
    proc, cost = _measure(obj, "sh", "-c", "exit 3")
    assert proc.returncode == 3 and cost["returncode"] == 3 and "wrote no" not in proc.stderr
