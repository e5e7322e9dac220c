"""deepspeed/no-jit on the real DeepSpeed 0.19.8 sdist, installed into a fresh venv.

With PORTER_NO_JIT=1 a JIT load of an op that is not prebuilt raises porter's error naming the op and
the porter command, and no compiler (nor ninja) is started. A fake c++ / g++ / ninja ... first on PATH
records every call; the control run without the variable shows that the recorder does see DeepSpeed's
JIT path reach for ninja, so the assertion can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FAKE_TOOLS = ("c++", "g++", "gcc", "cc", "clang", "clang++", "ninja", "nvcc", "hipcc", "ld")
IMPORT_DEPS = ["einops", "hjson", "msgpack", "numpy", "packaging", "psutil", "py-cpuinfo", "pydantic", "tqdm"]
LOAD = """
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("CPUAdamBuilder").load()
"""


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, **kw)  # type: ignore[call-overload]


def test_no_jit_refuses_to_compile(deepspeed_sdist: Path, tmp_path: Path, porter_cli: list[str]) -> None:
    with tarfile.open(deepspeed_sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    tree = tmp_path / "src" / "deepspeed-0.19.8"
    applied = run([*porter_cli, "patch", "apply", str(tree), "--set", "deepspeed/no-jit", "--json"])
    assert applied.returncode == 0, applied.stderr
    assert "_porter_refuse_jit(self.name)" in (tree / "deepspeed/ops/op_builder/builder.py").read_text()

    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    py = str(venv / "bin" / "python")
    for argv, env in (
        ([py, "-m", "pip", "install", "-q", "torch==2.13.0", "setuptools", "wheel", *IMPORT_DEPS], {}),
        ([py, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", str(tree)], {"DS_BUILD_OPS": "0"}),
    ):
        done = run(argv, env={**os.environ, **env})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    fake = tmp_path / "fakebin"
    fake.mkdir()
    calls = tmp_path / "compiler-calls.log"
    for tool in FAKE_TOOLS:
        (fake / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\nexit 1\n')
        (fake / tool).chmod(0o755)
    ext = tmp_path / "torch_extensions"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PORTER_", "DS_", "TORCH_"))}
    env = {**base, "PATH": f"{fake}:/usr/bin:/bin", "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(ext)}

    refused = run([py, "-c", LOAD], env={**env, "PORTER_NO_JIT": "1"}, cwd=tmp_path)
    assert refused.returncode != 0
    assert "PorterNoJitError" in refused.stderr
    assert "DeepSpeed op 'cpu_adam' is not prebuilt" in refused.stderr
    assert "porter ops build" in refused.stderr and "--ops cpu_adam" in refused.stderr
    assert not calls.exists(), f"a compiler ran despite PORTER_NO_JIT=1: {calls.read_text()}"
    assert not ext.exists() or not any(ext.iterdir())

    control = run([py, "-c", LOAD], env=env, cwd=tmp_path)
    assert control.returncode != 0  # the fake ninja fails on purpose
    assert "PorterNoJitError" not in control.stderr
    assert calls.exists() and "ninja" in calls.read_text(), "the recorder did not see DeepSpeed's JIT path"
