"""`porter ops build` with real g++, the real DeepSpeed sdists and a fresh venv."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from porter.artifacts.manifest import read_manifest

from porter.fs import sha256_file
from tests.conftest import fetch_sdist, require
from tests.integration.conftest import CPU_OPS, run_porter, sigkill, slow_cpu_profile, wait_for

ADAM_CHECK = r"""
import os, shutil, sys, torch
assert shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("ninja") is None
from deepspeed.ops.adam import DeepSpeedCPUAdam
from deepspeed.ops.op_builder import CPUAdamBuilder
torch.manual_seed(0)
p1 = torch.nn.Parameter(torch.randn(4096)); p2 = torch.nn.Parameter(p1.detach().clone())
o1 = DeepSpeedCPUAdam([p1], lr=1e-2, weight_decay=0.01, adamw_mode=True)
o2 = torch.optim.AdamW([p2], lr=1e-2, weight_decay=0.01)
for _ in range(20):
    g = torch.randn(4096); p1.grad = g.clone(); p2.grad = g.clone(); o1.step(); o2.step()
assert torch.allclose(p1, p2, atol=1e-5), (p1 - p2).abs().max()
assert not os.listdir(os.environ["TORCH_EXTENSIONS_DIR"]), "something was JIT-built"
print("ADAM-OK", CPUAdamBuilder().absolute_name())
"""


def test_cpu_ops_wheel_manifest_and_layout(cpu_ops_wheelhouse: Path, deepspeed_sdist: Path) -> None:
    (wheel,) = cpu_ops_wheelhouse.glob("*.whl")
    assert wheel.name == "deepspeed-0.19.8+cpu.x86.64.v2-cp311-cp311-linux_x86_64.whl"
    man = read_manifest(str(wheel) + ".porter.json")
    assert man["wheel"]["sha256"] == sha256_file(wheel)
    assert man["target"]["cpu_isa"] == "x86-64-v2" and man["torch"]["version"].startswith("2.13.0")
    assert sorted(o["name"] for o in man["ops"]) == sorted(CPU_OPS)
    with zipfile.ZipFile(wheel) as z:
        for ext in man["extensions"]:
            from porter.fs import sha256_bytes
            assert sha256_bytes(z.read(ext["path"])) == ext["sha256"]
        info = z.read("deepspeed/git_version_info_installed.py").decode()
    assert all(f"'{op}': True" in info for op in CPU_OPS) and "'async_io': False" in info
    # its SBOM (PEP 770): schema-valid CycloneDX naming the sdist it was built from and the patches porter made
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    from porter.artifacts.sbom import read_sbom

    with zipfile.ZipFile(wheel) as z:
        text = z.read("deepspeed-0.19.8+cpu.x86.64.v2.dist-info/sboms/porter.cdx.json").decode()
        assert "deepspeed-0.19.8+cpu.x86.64.v2.dist-info/sboms/porter.cdx.json,sha256=" in \
            z.read("deepspeed-0.19.8+cpu.x86.64.v2.dist-info/RECORD").decode()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    component = read_sbom(wheel)["metadata"]["component"]
    (source,) = component["pedigree"]["ancestors"]
    assert source["hashes"] == [{"alg": "SHA-256", "content": sha256_file(deepspeed_sdist)}]
    assert man["sources"]["sdist_sha256"] == sha256_file(deepspeed_sdist)
    patched = {p["resolves"][0]["id"] for p in component["pedigree"]["patches"]}
    assert patched == {f"{r['set']}/{r['id']}" for r in man["sources"]["patches"]} and patched


def test_wheel_loads_prebuilt_ops_with_no_compiler_and_matches_adamw(cpu_ops_wheelhouse: Path, torch_venv: Path,
                                                                     tmp_path: Path) -> None:
    (wheel,) = cpu_ops_wheelhouse.glob("*.whl")
    subprocess.run([str(torch_venv), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True)
    (tmp_path / "bin").mkdir()
    (tmp_path / "ext").mkdir()
    env = {"PATH": str(tmp_path / "bin"), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "HOME": str(tmp_path),
           "DS_ACCELERATOR": "cpu"}
    res = subprocess.run([str(torch_venv), "-c", ADAM_CHECK], capture_output=True, text=True, env=env, timeout=300)
    assert "ADAM-OK" in res.stdout, res.stdout + res.stderr
    report = subprocess.run([str(torch_venv), "-m", "deepspeed.env_report"], capture_output=True, text=True,
                            env=env, timeout=300).stdout
    for op in CPU_OPS:
        line = next(l for l in report.splitlines() if l.startswith(op + " "))
        assert "[YES]" in line, line  # ds_report's "installed" column


def test_warm_rerun_compiles_nothing(cpu_ops_wheelhouse: Path, deepspeed_sdist: Path) -> None:
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "--toolchain", "cpu",
                     "--ops", ",".join(CPU_OPS), "-o", str(cpu_ops_wheelhouse), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert [o["status"] for o in json.loads(res.stdout)["ops"]] == ["cached"] * 3


def test_older_deepspeed_release_works_unchanged(tmp_path: Path, ccache_remote: dict[str, str]) -> None:
    """0.16.4 (early 2025) has a different catalogue (no cpu_adagrad/cpu_lion on the cpu accelerator)."""
    sdist = fetch_sdist("deepspeed", "0.16.4")
    listing = run_porter("ops", "list", "--source", str(sdist), "-t", "cpu", "--json")
    names = {o["name"] for o in json.loads(listing.stdout)["ops"]}
    assert "cpu_adam" in names and "cpu_lion" not in names
    res = run_porter("ops", "build", "--source", str(sdist), "-t", "cpu", "--ops", "cpu_adam", "-o", str(tmp_path),
                     env=ccache_remote)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = tmp_path.glob("deepspeed-0.16.4+cpu.x86.64.v2-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert "deepspeed/ops/adam/cpu_adam_op.cpython-311-x86_64-linux-gnu.so" in z.namelist()


def test_partial_build_ships_the_good_ops(deepspeed_sdist: Path, tmp_path: Path, ccache_remote: dict[str, str]) -> None:
    """An op that fails (here: a profile flag g++ rejects for one op only is impossible, so we break one
    op's source in a copy of the tree) is reported with its log and left out; exit code 3."""
    import shutil
    import tarfile

    with tarfile.open(deepspeed_sdist) as tf:
        tf.extractall(tmp_path, filter="data")
    tree = tmp_path / "deepspeed-0.19.8"
    lion = tree / "csrc" / "lion" / "cpu_lion.cpp"
    lion.write_text(lion.read_text() + "\n#error porter test: this op must fail\n")
    wh = tmp_path / "wh"
    res = run_porter("ops", "build", "--source", str(tree), "-t", "cpu", "--ops", "cpu_lion,cpu_adagrad",
                     "-o", str(wh), "--json", env={"PORTER_CACHE_DIR": str(tmp_path / "cache"), **ccache_remote})
    assert res.returncode == 3, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    status = {o["name"]: o for o in doc["ops"]}
    assert status["cpu_lion"]["status"] == "failed" and status["cpu_adagrad"]["status"] == "built"
    assert "this op must fail" in Path(status["cpu_lion"]["log"]).read_text()
    (wheel,) = wh.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        info = z.read("deepspeed/git_version_info_installed.py").decode()
    assert "'cpu_lion': False" in info and "'cpu_adagrad': True" in info
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)


@pytest.mark.parametrize("signum, sigint", [(signal.SIGINT, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL),
                                             (signal.SIGTERM, signal.SIG_IGN)],
                         ids=["ctrl-c", "sigterm", "ctrl-c-ignored"])
def test_ctrl_c_stops_ninja_and_leaves_no_wheel(deepspeed_sdist: Path, tmp_path: Path, signum: int,
                                                sigint: signal.Handlers) -> None:
    """Ctrl-C, and SIGTERM (a Slurm time limit, scancel, timeout), stop the compilers too.

    porter starts with the SIGINT disposition each case names, whatever the shell that runs the tests did (a
    background job of a non-interactive shell inherits SIGINT ignored): SIG_DFL is a terminal's foreground job.
    ``ctrl-c-ignored`` is a background job of a script: porter keeps the inherited SIG_IGN, as Python itself does,
    so a Ctrl-C meant for the script's foreground command leaves the build alone; SIGTERM still stops it."""
    wh = tmp_path / "wh"
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "porter", "ops", "build", "--source", str(deepspeed_sdist),
                             "-t", "cpu", "--ops", "cpu_adam", "-o", str(wh)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PORTER_CACHE_DIR": str(cache)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    try:
        assert wait_for(lambda: list(cache.glob("wheels/*/build/build.ninja")), 120), "ninja never started"
        time.sleep(2)  # the compiler is running now
        if sigint == signal.SIG_IGN:
            proc.send_signal(signal.SIGINT)
            time.sleep(3)
            assert proc.poll() is None, "an inherited SIG_IGN for SIGINT was dropped: Ctrl-C stopped a background build"
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed assertion above: stop porter (it stops its compilers) before leaving
            proc.terminate()
            proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert not list(wh.glob("*.whl")) and not list(wh.glob(".porter-*"))
    left = subprocess.run(["pgrep", "-f", str(cache)], capture_output=True, text=True).stdout.strip()
    assert left == "", f"processes left behind: {left}"


@pytest.mark.slow
def test_kill_9_of_porter_leaves_no_compiler_and_the_rerun_builds(deepspeed_small_sdist: Path, tmp_path: Path) -> None:
    """Issue 22: a SIGKILL of porter (an OOM kill, 'kill -9' on a login node) once left ninja and its compilers
    running as orphans, writing into the cache while the next run started. Now the guardian of each command stops
    the group when porter dies, and the next run builds from what was published. (DeepSpeed with small op sources
    and a compiler that waits: what is tested is porter's, not DeepSpeed's.)"""
    wh, cache = tmp_path / "wh", tmp_path / "cache"
    profile, marks = slow_cpu_profile(tmp_path / "bin")
    (marks / "compile").write_text("600")
    argv = [sys.executable, "-m", "porter", "ops", "build", "--source", str(deepspeed_small_sdist), "-t", str(profile),
            "--ops", "cpu_adam", "-o", str(wh)]
    env = {**os.environ, "PORTER_CACHE_DIR": str(cache)}
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        assert wait_for(lambda: list(cache.glob("wheels/*/build/build.ninja")), 120), "ninja never started"
        assert wait_for(lambda: list(marks.glob("compile.*")), 60), "no compiler started"
        assert _compilers(cache)
    finally:
        sigkill(proc)
        (marks / "compile").unlink()
    assert wait_for(lambda: not _compilers(cache), 20), f"processes outlived porter: {_compilers(cache)}"
    assert not list(wh.glob("*.whl"))
    res = subprocess.run(argv + ["--json"], capture_output=True, text=True, env=env, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [o["status"] for o in json.loads(res.stdout)["ops"]] == ["built"]
    assert len(list(wh.glob("*.whl"))) == 1


def _compilers(cache: Path) -> str:
    return subprocess.run(["pgrep", "-a", "-f", str(cache)], capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("args,code,needle", [
    (["--ops", "cpu_adm"], 2, "did you mean cpu_adam"),
    (["--ops", "deepspeed_not_implemented"], 2, "cannot be built with this toolchain: a placeholder"),
])
def test_bad_op_names(deepspeed_sdist: Path, tmp_path: Path, args: list[str], code: int, needle: str) -> None:
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "cpu", "-o", str(tmp_path), *args)
    assert res.returncode == code and needle in res.stderr, res.stderr


def test_output_dir_not_writable(deepspeed_sdist: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "cpu", "--ops", "cpu_adam",
                     "-o", str(blocker / "wheelhouse"))
    assert res.returncode == 2 and "cannot create the wheelhouse" in res.stderr


def test_neither_project_and_missing_torch(tmp_path: Path, deepspeed_sdist: Path) -> None:
    res = run_porter("ops", "list", "--source", str(tmp_path))
    assert res.returncode == 2 and "not a DeepSpeed source tree" in res.stderr
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "bare")], check=True)
    res = run_porter("ops", "list", "--source", str(deepspeed_sdist), "--python", str(tmp_path / "bare/bin/python"))
    assert res.returncode == 2 and "torch is not installed" in res.stderr


def test_rocm_profile_with_cpu_torch_plans_but_refuses_to_build(deepspeed_sdist: Path, tmp_path: Path) -> None:
    plan = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "frontier", "--ops", "fused_adam",
                      "--dry-run")
    assert plan.returncode == 0, plan.stderr[-3000:]
    hipcc_lines = [l.split(" ", 1)[1] if l.split(" ", 1)[0].endswith("ccache") else l
                   for l in plan.stdout.splitlines() if l.startswith("hipcc ") or " hipcc " in l[:30]]
    assert len(hipcc_lines) == 2  # compile the hipified .hip, then link
    assert "--offload-arch=gfx90a" in hipcc_lines[0] and "-DROCM_WAVEFRONT_SIZE=64" in hipcc_lines[0]
    assert "multi_tensor_adam.hip" in hipcc_lines[0]  # torch's hipify really ran on a copy
    assert "# plan: 1 op(s), toolchain frontier" in plan.stdout
    only = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "frontier", "--ops", "fused_adam",
                      "--compile-only", "--dry-run")
    assert only.returncode == 0, only.stderr[-3000:]
    assert "# plan: 1 op(s), toolchain frontier" in only.stdout  # counted 0: a compile-only plan links nothing
    real = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "frontier", "--ops", "fused_adam",
                      "-o", str(tmp_path))
    assert real.returncode == 2 and "ROCm build of torch" in real.stderr
    assert not list(tmp_path.glob("*.whl"))
    assert "# a real run here would be refused: deepspeed 0.19.8 (op_builder build for +rocm7.1.gfx90a) needs the " \
        "ROCm build" in plan.stdout and plan.stdout.count("would be refused") == 1


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_h100_fused_adam_builds_and_imports_without_gpu(deepspeed_sdist: Path, tmp_path: Path) -> None:
    from tests.conftest import ROOT

    py = Path(os.environ.get("PORTER_CUDA_PYTHON") or ROOT / ".venv-cuda" / "bin" / "python")
    require("CUDA torch venv", py.exists(), "run 'make cuda-venv'")
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "cuda-h100", "--ops", "fused_adam",
                     "--python", str(py), "-o", str(tmp_path), "--json")
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    so = Path(doc["ops"][0]["so"])
    from porter.codeobjects import archs_in
    assert archs_in(so) == ["sm_90"]
    (tmp_path / "ext").mkdir()
    check = (f"import importlib.util, torch, os; s = importlib.util.spec_from_file_location('fused_adam_op', {str(so)!r}); "
             "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
             "assert hasattr(m, 'multi_tensor_adam'); assert not os.listdir(os.environ['TORCH_EXTENSIONS_DIR']); "
             "print('CUDA-OK', torch.cuda.is_available())")
    out = subprocess.run([str(py), "-c", check], capture_output=True, text=True, timeout=300,
                         env={"PATH": str(tmp_path), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    assert "CUDA-OK False" in out.stdout, out.stderr[-3000:]
