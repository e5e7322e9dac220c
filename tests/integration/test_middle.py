"""The middle, end to end: the runner's failure paths, the executor through a real chroot, the same
refusal and output checks in every command, dry runs that write nothing, reproducible wheels."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from porter.codeobjects import archs_in
from porter.errors import CommandFailed, Interrupted, ToolError
from porter.run import Runner, make_env
from porter.toolchain.profile import load_toolchain
from tests.conftest import FIXTURES
from tests.integration.conftest import run_porter

KERNEL = """#include <hip/hip_runtime.h>
__global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i];
}
"""


# -- the runner ----------------------------------------------------------------------------------

def test_runner_timeout_names_it_and_kills_the_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    start = time.monotonic()
    with pytest.raises(CommandFailed, match="exit code -1") as exc:
        Runner().run(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], env=make_env(), timeout=1)
    assert time.monotonic() - start < 20 and "timed out after 1s" in exc.value.output
    _assert_gone(int(pid_file.read_text()))


def test_runner_program_not_found() -> None:
    with pytest.raises(ToolError, match="program not found: porter-no-such-program"):
        Runner().run(["porter-no-such-program", "--version"], env=make_env())


@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process, as in a terminal's foreground job, whatever the shell that
    started pytest did: a background job of a non-interactive shell inherits SIGINT ignored, Python then leaves it
    ignored, and the SIGINT below would do nothing. The disposition before is put back after."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_runner_ctrl_c_stops_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"

    def interrupt() -> None:
        for _ in range(100):
            if pid_file.is_file() and pid_file.read_text().strip():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(Interrupted, match="process group was stopped"):
        Runner().run(["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], env=make_env(), timeout=60)
    _assert_gone(int(pid_file.read_text()))


def _assert_gone(pid: int) -> None:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").is_file() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return  # a zombie waiting for its reaper: it no longer runs
        time.sleep(0.1)
    pytest.fail(f"process {pid} still runs")


# -- the executor through the trixie chroot --------------------------------------------------------

@pytest.mark.trixie
def test_chroot_compiles_a_source_that_lives_outside_it(trixie: Path, tmp_path: Path) -> None:
    tc = load_toolchain("debian-trixie-rocm", environ={"PORTER_TRIXIE_ROOT": str(trixie)})
    ex = tc.executor
    src = tmp_path / "axpy.hip"  # outside the chroot
    src.write_text(KERNEL)
    assert not ex.sees(src)
    inside_src = ex.visible(src)
    out_dir = ex.work_root / "test-out" if ex.work_root else tmp_path
    out_dir.mkdir(parents=True, exist_ok=True)
    obj = out_dir / f"axpy-{os.getpid()}.o"
    try:
        res = Runner().run(ex.argv(tc.compiler, "--offload-arch=gfx90a", "--offload-arch=gfx942", "-fPIC",
                                   "-c", inside_src, "-o", ex.inside(obj)),
                           env=make_env(dict(tc.env)), timeout=600)
        assert res.ok and archs_in(obj) == ["gfx90a", "gfx942"]
    finally:
        obj.unlink(missing_ok=True)


@pytest.mark.trixie
def test_trixie_dry_run_plan_names_only_paths_the_chroot_sees(trixie: Path, deepspeed_sdist: Path,
                                                              tmp_path: Path) -> None:
    cache = trixie / "var" / "cache" / "porter"
    before = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")) if cache.is_dir() else []
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "debian-trixie-rocm", "--ops",
                     "fused_adam", "--dry-run", "--json", "-o", str(tmp_path / "wh"),
                     env={"PORTER_TRIXIE_ROOT": str(trixie)})
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    steps = doc["plan"]["steps"]
    assert steps and all(s["argv"][:2] == ["chroot", str(trixie)] for s in steps)
    for s in steps:
        for arg in s["argv"][2:]:
            path = arg[2:] if arg.startswith(("-I", "-L")) else arg
            if path.startswith("/"):
                assert not path.startswith(str(trixie)) and not path.startswith(("/root", "/tmp", "/work")), arg
    device = next(s["argv"] for s in steps if s["kind"] == "compile" and "hipcc" in s["argv"])
    assert "--offload-arch=gfx90a" in device and "--offload-arch=gfx942" in device
    assert "ROCm build of torch" in doc["refusal"]
    after = sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")) if cache.is_dir() else []
    assert after == before  # a dry run writes nothing, not even into the chroot's cache
    assert not (tmp_path / "wh").exists()


# -- the same checks in every command ------------------------------------------------------------

def _commands(tmp_path: Path, out: str, deepspeed_sdist: Path) -> list[list[str]]:
    tree = tmp_path / "mds"
    if not tree.exists():
        shutil.copytree(FIXTURES / "patch" / "megatron-deepspeed", tree)
    return [
        ["ops", "build", "--source", str(deepspeed_sdist), "-t", "cpu", "--ops", "cpu_adam", "-o", out],
        ["wheel", "apex", "--source", str(FIXTURES / "apex-env"), "-t", "cpu", "-o", out],
        ["wheel", "flash-attn", "--source", str(FIXTURES / "flash-attn-mini"), "-t", "mi300x", "--backend",
         "triton", "-o", out],
        ["port", "megatron-deepspeed", str(tree), "-t", "frontier", "--dest", str(tmp_path / "ported"), "-o", out],
    ]


@pytest.mark.parametrize("which", [0, 1, 2, 3], ids=["ops", "apex", "flash-attn", "port"])
def test_unwritable_output_is_refused_before_any_work(which: int, tmp_path: Path, deepspeed_sdist: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for out in (str(blocker / "wheelhouse"), "/sys/kernel"):  # cannot be created / exists but takes no file
        argv = _commands(tmp_path, out, deepspeed_sdist)[which]
        start = time.monotonic()
        res = run_porter(*argv, env={"PORTER_CACHE_DIR": str(tmp_path / "cache")})
        assert res.returncode == 2, res.stderr[-2000:]
        assert out in res.stderr and ("cannot create" in res.stderr or "not writable" in res.stderr), res.stderr
        assert "Traceback" not in res.stderr and time.monotonic() - start < 60
        assert not (tmp_path / "ported").exists()


@pytest.mark.parametrize("which", [0, 1, 2, 3], ids=["ops", "apex", "flash-attn", "port"])
def test_dry_run_writes_nothing(which: int, tmp_path: Path, deepspeed_sdist: Path) -> None:
    out = tmp_path / "wh"
    argv = _commands(tmp_path, str(out), deepspeed_sdist)[which]
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run_porter(*argv, "--dry-run", env={"PORTER_CACHE_DIR": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no cache, no wheelhouse, no ported tree
    if which == 3:
        assert "# a real run here would be refused" in res.stdout  # frontier + CPU torch
