"""porter hipify through porter.cli.main: exit codes, --json, --check, --fail-on-unsupported, --map."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from porter.cli import main

# porter hipify is torch's own hipify plus porter's map: without torch these cannot run (they skip, saying so)
pytest.importorskip("torch.utils.hipify", reason="porter's hipify engine runs torch's hipify; torch is not installed")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hipify" / "tree"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "src")
    return tmp_path / "src"


def test_text_report(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["hipify", str(tree), "-o", str(tmp_path / "out")], capsys)
    assert code == 0
    assert "5 files scanned: 3 changed, 1 unchanged, 1 copied, 0 skipped; wrote 5" in out
    # Grouped per op folder, with counts, a verdict, and for one file the lines.
    assert "in 2 group(s)" in out
    assert "csrc/ops/  1 file(s): 1 CUDA API use(s)\n  verdict: CUDA intrinsics without a HIP equivalent" in out
    assert "  file: scale.cu\n  CUDA API: __nanosleep 1 (line 19)\n" in out
    assert "csrc/includes/  1 file(s): 2 warp-32 flag(s)" in out
    assert "warp-32: warp-size-32 1 (line 6), reduction-from-16 1 (line 13)" in out
    assert "__nanosleep: no __nanosleep in HIP; use __builtin_amdgcn_s_sleep" in out  # the hint, once
    assert "replacements (" in out and "__shfl_xor_sync 2" in out
    assert "==> hipify" in err
    assert re.search(r"^\[5/5\] \S+ \(\d+s\)$", err, re.M), err  # progress off a terminal: the last line always


def test_json_report(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["-q", "hipify", str(tree), "-o", str(tmp_path / "out"), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["summary"]["changed"] == 3
    assert doc["replacements"]["__HIP_PLATFORM_HCC__"] == 1


def test_check_exits_1_when_something_would_change(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["hipify", str(tree), "-o", str(tmp_path / "out"), "--check"], capsys)
    assert code == 1 and "5 file(s) of" in err and "would be written (missing or out of date)" in err
    assert not (tmp_path / "out").exists()
    assert run(["hipify", str(tree), "-o", str(tmp_path / "out")], capsys)[0] == 0
    assert run(["hipify", str(tree), "-o", str(tmp_path / "out"), "--check"], capsys)[0] == 0
    assert run(["hipify", str(tmp_path / "out"), "--in-place", "--check"], capsys)[0] == 0


def test_fail_on_unsupported(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["hipify", str(tree), "-o", str(tmp_path / "out"), "--fail-on-unsupported"], capsys)
    assert code == 1 and "__nanosleep" in err and "TIP:" in err


def test_user_map_silences_a_finding(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    m = tmp_path / "map.toml"
    m.write_text('[calls]\n__nanosleep = "__builtin_amdgcn_s_sleep(1)"\n')
    code, _, _ = run(["hipify", str(tree), "-o", str(tmp_path / "out"), "--map", str(m), "--fail-on-unsupported"],
                     capsys)
    assert code == 0
    assert "__builtin_amdgcn_s_sleep(1);" in (tmp_path / "out/csrc/ops/scale.cu").read_text()


@pytest.mark.parametrize("args, words", [
    (["MISSING"], "source tree not found"),
    (["SRC", "-o", "SRC/csrc/out"], "inside the source tree"),
    (["SRC", "--map", "NOPE.toml"], "nope.toml: not found"),
])
def test_bad_input_exits_2(tree: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str) -> None:
    argv = ["hipify"] + [a.replace("SRC", str(tree)).replace("MISSING", str(tree / "nope"))
                         .replace("NOPE.toml", str(tree / "nope.toml")) for a in args]
    code, _, err = run(argv, capsys)
    assert code == 2 and words in err and "TIP:" in err


def test_empty_tree_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    code, _, err = run(["hipify", str(tmp_path / "empty"), "-o", str(tmp_path / "out")], capsys)
    assert code == 4 and "no files" in err
