from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
import os

import pytest

from porter.run import Result, Runner
from porter.toolchain.discover import detect, to_toml, version_of


@pytest.mark.parametrize("kind,out,version", [
    ("hipcc", "HIP version: 5.7.31921-0\nDebian clang version 17.0.6\n", "5.7.31921"),
    ("nvcc", "Cuda compilation tools, release 13.0, V13.0.88\n", "13.0"),
    ("clang", "AMD clang version 17.0.0 (roc-6.2.0)\n", "17.0.0"),
    ("g++", "12.2.0\n", "12.2.0"),
    ("hipcc", "garbage", "unknown"),
])
def test_version_parsing(kind: str, out: str, version: str) -> None:
    assert version_of(kind, out) == version


@dataclass
class FakeRunner(Runner):
    """Answers by program name; records what ran."""
    answers: dict[str, str] = field(default_factory=dict)
    ran: list[list[str]] = field(default_factory=list)

    def run(self, argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
            cwd: str | os.PathLike[str] | None = None, timeout: float | None = None, check: bool = True,
            hint: str | None = None) -> Result:
        args = [os.fspath(a) for a in argv]
        self.ran.append(args)
        return Result(args, 0, self.answers.get(Path(args[0]).name, ""), 0.0)


def _exe(path: Path) -> str:
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_detect_with_rocm_path_and_a_visible_gpu(tmp_path: Path) -> None:
    rocm = tmp_path / "rocm" / "bin"
    rocm.mkdir(parents=True)
    for name in ("hipcc", "rocminfo"):
        _exe(rocm / name)
    runner = FakeRunner(answers={"hipcc": "HIP version: 6.2.41133-dd7f95766\n",
                                 "rocminfo": "  Name:                    gfx942\n  Name:   gfx942\n"})
    found = detect(runner, environ={"ROCM_PATH": str(tmp_path / "rocm"), "PATH": ""})
    assert found["programs"]["hipcc"] == {"path": str(rocm / "hipcc"), "version": "6.2.41133"}
    assert found["gpus"] == [{"arch": "gfx942", "source": "rocminfo"}] * 2
    prop = found["proposal"]
    assert (prop["kind"], prop["toolkit_version"], prop["archs"]) == ("rocm", "6.2", ["gfx942"])
    assert 'archs = ["gfx942"]' in to_toml(prop) and "[env]" in to_toml(prop)


def test_detect_with_nothing_proposes_cpu(tmp_path: Path) -> None:
    found = detect(FakeRunner(), environ={"PATH": str(tmp_path)})
    assert found["programs"] == {} and found["proposal"]["kind"] == "cpu"
