"""Issue 18: a wheel from the default ``porter ops build``, installed with ``porter install`` into a fresh venv (a
compute node's stand-in), starts no compiler at import and at op load: real DeepSpeed sdists, real g++ builds.

What ran a compiler before: DeepSpeed's ``has_function`` feature probe (async_io's libaio check compiles and links a
``test.c`` with the C compiler), reached through every op's ``is_compatible()``: in 0.18.8 on ``import deepspeed``
(``deepspeed.git_version_info`` builds ``compatible_ops``), in 0.19.8 on the first read of
``deepspeed.ops.__compatible_ops__`` (``deepspeed.comm``'s shared-memory op set-up on the CPU accelerator, and
``ds_report``). The node run here does both, then loads cpu_adam through DeepSpeedCPUAdam and takes a step, with
``porter verify``'s trap compilers first on PATH and as CC/CXX (:func:`porter.install.verify.trap_compilers`) and
nothing of porter's set (no PORTER_NO_JIT): zero trapped calls. The control run, with
``PORTER_FEATURE_PROBES=compile`` (upstream's probe), shows the trap does see the probe, so the zero can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from porter.install.verify import classify_call, trap_compilers, trapped_env
from tests.conftest import fetch_sdist, require
from tests.integration.conftest import run_porter

pytestmark = pytest.mark.slow

NODE = r"""
import os, torch
import deepspeed                                   # 0.18: every op's is_compatible() runs here
from deepspeed.ops.adam import DeepSpeedCPUAdam
p = torch.nn.Parameter(torch.randn(256))
opt = DeepSpeedCPUAdam([p], lr=1e-3)               # loads the prebuilt cpu_adam
p.grad = torch.randn(256)
opt.step()
import deepspeed.ops
compatible = deepspeed.ops.__compatible_ops__      # 0.19: the probes run on this first read
assert not os.listdir(os.environ["TORCH_EXTENSIONS_DIR"]), "something was JIT-built"
print("NODE-OK", deepspeed.__version__, "async_io", compatible.get("async_io"))
"""


def requirements(wheel: Path) -> list[str]:
    """The wheel's unconditional runtime requirements but torch (the venv has CPU torch already)."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    reqs = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    return [r for r in reqs if ";" not in r and not r.lower().startswith("torch")]


@pytest.fixture(scope="module")
def node_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with CPU torch (from local disk), this module's own: a compute node's python."""
    root = tmp_path_factory.mktemp("node-venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    py = root / "bin" / "python"
    done = subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return py


def install(wheelhouse: Path, py: Path) -> Path:
    """``porter install`` of the wheelhouse's one DeepSpeed wheel (its dependencies first: porter installs offline)."""
    (wheel,) = wheelhouse.glob("deepspeed-*.whl")
    deps = subprocess.run([str(py), "-m", "pip", "install", "-q", *requirements(wheel)], capture_output=True,
                          text=True)
    assert deps.returncode == 0, deps.stderr[-2000:]
    res = run_porter("install", str(wheelhouse), "--python", str(py))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return wheel


def on_the_node(py: Path, work: Path, script: str = NODE, **extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                                                list[str]]:
    """Run ``script`` with verify's trap compilers; return the run and the trapped calls."""
    work.mkdir()
    bin_dir, log = trap_compilers(work)
    ext = work / "torch_extensions"
    ext.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PORTER_", "DS_", "TORCH_"))}
    env.update({k: v for k, v in trapped_env(bin_dir, ext).items() if v is not None})
    env.update({"DS_ACCELERATOR": "cpu", "HOME": str(work), **extra})
    res = subprocess.run([str(py), "-c", script], capture_output=True, text=True, env=env, cwd=work, timeout=600)
    return res, [c for c in log.read_text().splitlines() if c.strip()]


def check_no_compiler(wheelhouse: Path, py: Path, tmp_path: Path, version: str) -> None:
    wheel = install(wheelhouse, py)
    with zipfile.ZipFile(wheel) as z:
        assert "porter_feature_probes=" in z.read("deepspeed/git_version_info_installed.py").decode()

    res, calls = on_the_node(py, tmp_path / "default")
    assert f"NODE-OK {version}" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
    assert calls == [], f"compiler calls at import / op load: {calls}"

    control, seen = on_the_node(py, tmp_path / "control", PORTER_FEATURE_PROBES="compile")
    assert f"NODE-OK {version}" in control.stdout, control.stderr[-4000:]
    assert seen and all(classify_call(c) == "probe" for c in seen), seen  # the trap sees upstream's probe

    verify = run_porter("verify", "--python", str(py), "--json")
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
    doc = json.loads(verify.stdout)
    (ds,) = [c for c in doc["components"] if c["component"] == "deepspeed"]
    assert ds["feature_probes"] == [] and not doc["notes"] and ds["loader"]["cpu_adam"] is None, ds


def test_deepspeed_0198_wheel_starts_no_compiler(cpu_ops_wheelhouse: Path, node_python: Path, tmp_path: Path) -> None:
    """The session's default build of 0.19.8's three CPU ops."""
    check_no_compiler(cpu_ops_wheelhouse, node_python, tmp_path, "0.19.8")


def test_deepspeed_0188_wheel_starts_no_compiler(node_python: Path, tmp_path: Path,
                                                 ccache_remote: dict[str, str]) -> None:
    """0.18.8 (the release issue 18 names) probes at every ``import deepspeed``; a default build of cpu_adam."""
    sdist = fetch_sdist("deepspeed", "0.18.8")
    wheelhouse = tmp_path / "wh"
    res = run_porter("ops", "build", "--source", str(sdist), "--toolchain", "cpu", "--ops", "cpu_adam",
                     "-o", str(wheelhouse), env=ccache_remote)
    assert res.returncode == 0, res.stderr[-4000:]
    check_no_compiler(wheelhouse, node_python, tmp_path, "0.18.8")


AIO_NODE = r"""
import os
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("AsyncIOBuilder").load()   # 0.19.8: loads pin_memory first, then itself
assert not os.listdir(os.environ["TORCH_EXTENSIONS_DIR"]), "something was JIT-built"
print("AIO-OK")
"""


def test_deepspeed_0198_async_io_alone_brings_pin_memory(deepspeed_sdist: Path, node_python: Path, tmp_path: Path,
                                                         ccache_remote: dict[str, str]) -> None:
    """``--ops async_io``: 0.19.8's async_io loads pin_memory first (the pinned-tensor manager is in pin_memory's .so),
    so porter builds pin_memory with it, as DeepSpeed's setup.py does; before, the node compiled pin_memory at the
    first load. Loaded here with the trap compilers, nothing of porter's set: zero calls."""
    require("libaio's headers (DeepSpeed's async_io)", Path("/usr/include/libaio.h").exists(),
            "apt-get install libaio-dev")
    wheelhouse = tmp_path / "wh"
    # --pch: its 13 host units in two flag sets share two precompiled torch headers (200 s cold alone here, 133 s)
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "--toolchain", "cpu", "--ops", "async_io",
                     "--pch", "-o", str(wheelhouse), "--json", env=ccache_remote)
    assert res.returncode == 0, res.stderr[-4000:]
    assert [o["name"] for o in json.loads(res.stdout)["ops"]] == ["async_io", "pin_memory"]
    assert "also building pin_memory: async_io loads it at run time" in res.stderr
    install(wheelhouse, node_python)
    run, calls = on_the_node(node_python, tmp_path / "node", AIO_NODE)
    assert "AIO-OK" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]
    assert calls == [], f"compiler calls at load: {calls}"
    # porter verify loads DeepSpeed's ops as DeepSpeed does, before importing modules: async_io_op alone does not
    # import (pin_memory's symbols are not global yet), which failed verify on every --all-compatible 0.19.8 wheel
    verify = run_porter("verify", "--python", str(node_python), "--json")
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
    (ds,) = [c for c in json.loads(verify.stdout)["components"] if c["component"] == "deepspeed"]
    assert ds["loader"] == {"async_io": None, "pin_memory": None}, ds
