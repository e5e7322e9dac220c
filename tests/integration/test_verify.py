"""porter verify on real .so files: Debian hipcc multi-arch code objects, and a real JIT attempt caught.

No ROCm build of torch exists on this machine, so the ROCm env carries a torch *distribution stub*
that declares hip 5.7 (see ``make_venv``); everything else is real: hipcc's .so files, pip, imports
(a HIP .so loads without a GPU), the ELF reader.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from porter.codeobjects import archs_in, read_code_objects
from tests.fixtures.install.wheels import (ROCM_TORCH_BUILT, SOABI_SUFFIX, compile_ext, deepspeed_wheel, make_venv)

def porter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.rocm
def test_hipcc_multi_arch_and_single_arch_so(tmp_path: Path, hipcc: str) -> None:
    multi = compile_ext(tmp_path / "multi.so", "fused_adam_op", compiler=hipcc, offload_archs=["gfx90a", "gfx908"])
    single = compile_ext(tmp_path / "single.so", "fused_lamb_op", compiler=hipcc, offload_archs=["gfx908"])
    assert archs_in(multi) == ["gfx908", "gfx90a"]
    assert {c.target for c in read_code_objects(multi)} == {"gfx908", "gfx90a"}
    assert archs_in(single) == ["gfx908"]
    wh = tmp_path / "wh"
    whl = deepspeed_wheel(wh, {"fused_adam": multi.read_bytes(), "fused_lamb": single.read_bytes()},
                          label="rocm5.7.gfx90a.gfx908", kind="rocm", rocm_version="5.7", torch=ROCM_TORCH_BUILT,
                          archs={"fused_adam": ["gfx90a", "gfx908"], "fused_lamb": ["gfx908"]})
    py = make_venv(tmp_path / "venv", torch="rocm-stub")
    res = porter("install", str(wh), "--python", str(py), "--arch", "gfx90a")
    assert res.returncode == 0, res.stderr
    assert whl.name in res.stdout

    res = porter("verify", "--python", str(py), "--arch", "gfx90a")
    assert res.returncode == 1, res.stdout + res.stderr
    lamb = f"deepspeed/ops/adam/fused_lamb_op{SOABI_SUFFIX}"
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("ERROR: deepspeed:")]
    assert len(errors) == 1, res.stderr
    assert lamb in errors[0] and "expected code for gfx90a, found code for gfx908" in errors[0]

    res = porter("verify", "--python", str(py), "--arch", "gfx908", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    mods = {m["module"].rsplit(".", 1)[1]: m for m in doc["components"][0]["modules"]}
    assert mods["fused_adam_op"]["archs"] == ["gfx908", "gfx90a"] and mods["fused_adam_op"]["import"] == "ok"
    assert mods["fused_lamb_op"]["archs"] == ["gfx908"] and mods["fused_lamb_op"]["import"] == "ok"

    res = porter("verify", "--python", str(py), "--arch", "gfx942")  # MI300X: none of the code fits
    assert res.returncode == 1 and res.stderr.count("expected code for gfx942") == 2


def test_a_jit_attempt_at_import_is_caught(tmp_path: Path) -> None:
    """DeepSpeed-style: the package probes ninja and builds into TORCH_EXTENSIONS_DIR at import."""
    so = compile_ext(tmp_path / "x.so", "cpu_adam_op")
    wh = tmp_path / "wh"
    from tests.fixtures.install import wheels

    files = wheels.deepspeed_files({"cpu_adam": so.read_bytes()}, {"cpu_adam": True})
    files["deepspeed/__init__.py"] = (
        b"import os, subprocess\n"
        b"subprocess.run(['ninja', '--version'], capture_output=True)\n"
        b"d = os.path.join(os.environ.get('TORCH_EXTENSIONS_DIR', '/nonexistent'), 'cpu_adam')\n"
        b"os.makedirs(d, exist_ok=True)\n")
    whl = wheels.make_wheel(wh, "deepspeed", "0.19.8+cpu.x86.64.v2", files)
    wheels.make_manifest(whl, component="deepspeed", version="0.19.8+cpu.x86.64.v2",
                         extensions=wheels.extensions_for(files))
    py = make_venv(tmp_path / "venv")
    assert porter("install", str(wh), "--python", str(py)).returncode == 0
    res = porter("verify", "--python", str(py))
    assert res.returncode == 1
    assert "compiler calls: expected 0, found 1: ninja --version" in res.stderr
    assert "TORCH_EXTENSIONS_DIR: expected empty (no JIT build), found cpu_adam" in res.stderr


_NEEDS_C10 = """#include <Python.h>
namespace c10 { struct Allocator; Allocator* GetCPUAllocator(); }
static PyModuleDef def = {PyModuleDef_HEAD_INIT, "needs_c10", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit_needs_c10(void) { return c10::GetCPUAllocator() ? PyModule_Create(&def) : nullptr; }
"""


def test_a_top_level_torch_extension_imports_in_the_check_as_it_does_in_use(tmp_path: Path) -> None:
    """Seen on a GPU node (the CUDA twin, benchmarks/cuda_twin.py): porter verify failed every Megatron fused kernel
    (top-level modules such as scaled_masked_softmax_cuda) with 'libc10.so: cannot open shared object file'. A
    torch extension names torch's libraries without a path of its own and finds them once torch is imported, as
    Megatron does before it imports a kernel. The import check imports torch first, as every user does."""
    import sysconfig

    import torch

    from porter.probe import run_probe
    from porter.run import Runner, make_env

    so = tmp_path / f"needs_c10{sysconfig.get_config_var('EXT_SUFFIX')}"
    (tmp_path / "needs_c10.cpp").write_text(_NEEDS_C10)
    subprocess.run(["g++", "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], str(tmp_path / "needs_c10.cpp"),
                    "-L", str(Path(torch.__file__).parent / "lib"), "-lc10", "-o", str(so)], check=True)
    env = make_env({"PYTHONPATH": str(tmp_path)})
    alone = subprocess.run([sys.executable, "-c", "import needs_c10"], capture_output=True, text=True, env=env,
                           cwd=tmp_path)
    assert alone.returncode != 0 and "libc10.so" in alone.stderr  # what verify saw: torch not imported
    data = run_probe("imports", [json.dumps(["needs_c10"]), "[]"], python=sys.executable, runner=Runner(), env=env,
                     cwd=str(tmp_path))
    assert data["modules"] == {"needs_c10": None}
