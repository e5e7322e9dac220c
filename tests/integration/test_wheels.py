"""porter wheel apex|flash-attn end to end: real pip builds of fixture trees (g++, hipcc) and the real
flash-attn sdist (Triton backend), real venv installs, and the refusals."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from porter.artifacts import labels
from porter.codeobjects import archs_in
from porter.toolchain.profile import load_toolchain
from porter.artifacts.manifest import manifest_path, read_manifest
from porter.fs import sha256_file
from tests.conftest import FIXTURES

APEX_ENV = FIXTURES / "apex-env"
APEX_FLAGS = FIXTURES / "apex-flags"
FA = FIXTURES / "flash-attn-mini"
CP = f"cp{sys.version_info.major}{sys.version_info.minor}"


def porter(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=900)


def only_wheel(house: Path) -> Path:
    wheels = sorted(house.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


# apex's own loader, as a training script reaches it; a JIT build (a compiler on the node) is a failure
LOAD_THROUGH_APEX = """
import torch.utils.cpp_extension as ext
def refuse(*a, **k):
    raise SystemExit("JIT: apex would start the compiler")
ext.load = refuse
from apex.git_version_info import installed_ops
from apex.op_builder.apex_c import ApexCBuilder
m = ApexCBuilder().load()
print(m.__file__.rsplit("/", 2)[-2:], installed_ops, m.flat_len([[1, 2], [3]]))
"""


def test_apex_op_builder_regime_builds_on_the_engine_and_loads_without_a_compiler(tmp_path: Path,
                                                                                torch_venv: Path) -> None:
    house = tmp_path / "house"
    r = porter("wheel", "apex", "--source", str(APEX_ENV), "-t", "cpu", "-o", str(house), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # the ops compile and link on porter's engine: setup.py is asked for the Python side only
    assert doc["plan"]["env"]["APEX_BUILD_APEX_C"] is None and doc["plan"]["env"]["APEX_BUILD_CPP_OPS"] is None
    assert not any(k.startswith("APEX_BUILD") for k in doc["env"])
    assert any("compiled and linked by porter's AOT engine" in n for n in doc["plan"]["notes"])
    assert "LINK apex_C" in r.stderr and "apex 1.14.0a0's Python side beside the engine" in r.stderr
    whl = only_wheel(house)
    assert whl.name == f"apex-1.14.0a0+cpu.x86.64.v2-{CP}-{CP}-linux_x86_64.whl"
    m = read_manifest(manifest_path(whl))
    assert m["component"] == "apex" and m["wheel"]["sha256"] == sha256_file(whl)
    assert [e["module"] for e in m["extensions"]] == ["apex.apex_C"] and m["torch"]["kind"] == "cpu"
    assert m["target"]["regime"] == "env" and [(o["name"], o["status"]) for o in m["ops"]] == [("apex_C", "built")]
    assert m["build"]["debug_info"] == "full" and Path(m["ops"][0]["log"]).is_file()  # as every engine build's
    with zipfile.ZipFile(whl) as z:
        assert "installed_ops={'apex_C': True, 'fused_demo_cuda': False}" in \
            z.read("apex/git_version_info_installed.py").decode()
        assert "apex/op_builder/builder.py" in z.namelist()  # upstream's symlink, packaged as a folder
    # the user's tree was not touched by the build
    assert not (APEX_ENV / "build").exists() and not list(APEX_ENV.glob("*.egg-info"))
    assert not (APEX_ENV / "apex" / "git_version_info_installed.py").exists()
    assert (APEX_ENV / "apex" / "op_builder").is_symlink()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(torch_venv), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    mine = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(mine, "node-torch.pth").write_text(site + "\n")  # the node's torch, not reinstalled
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)], check=True)
    out = subprocess.run([str(py), "-c", LOAD_THROUGH_APEX], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    suffix = f"cpython-{sys.version_info.major}{sys.version_info.minor}-x86_64-linux-gnu.so"
    assert out.stdout.split() == ["['apex',", f"'apex_C.{suffix}']", "{'apex_C':", "True,",
                                  "'fused_demo_cuda':", "False}", "3"], out.stdout
    # an op the wheel does not carry goes to apex's JIT, which the node refuses here: the check can fail
    jit = LOAD_THROUGH_APEX.replace("apex.op_builder.apex_c import ApexCBuilder", "apex.op_builder.fused_demo "
                                    "import FusedDemoBuilder as ApexCBuilder")
    out = subprocess.run([str(py), "-c", jit], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode != 0 and "JIT: apex would start the compiler" in out.stderr


def test_apex_flags_regime_cpu_wheel(tmp_path: Path) -> None:
    house = tmp_path / "house"
    r = porter("wheel", "apex", "--source", str(APEX_FLAGS), "-t", "cpu", "-o", str(house))
    assert r.returncode == 0, r.stderr
    whl = only_wheel(house)
    assert "--build-option=--cpp_ext" in r.stderr and whl.name.startswith("apex-1.7.0+cpu.x86.64.v2-")
    with zipfile.ZipFile(whl) as zf:
        assert any(n.startswith("apex_C.cpython-") for n in zf.namelist())


def test_wrong_regime_gives_an_empty_wheel_and_porter_refuses_it(tmp_path: Path) -> None:
    house = tmp_path / "house"
    # the old flags on a current tree: upstream drops them silently and builds nothing
    r = porter("wheel", "apex", "--source", str(APEX_ENV), "-t", "cpu", "-o", str(house), "--regime", "flags")
    assert r.returncode == 1
    assert "holds no prebuilt extension" in r.stderr and "silently drops --cpp_ext" in r.stderr
    assert not house.exists() or not list(house.glob("*.whl"))
    # the env switches on an old tree: ignored there, same refusal
    r = porter("wheel", "apex", "--source", str(APEX_FLAGS), "-t", "cpu", "-o", str(house), "--regime", "env")
    assert r.returncode == 1 and "holds no prebuilt extension" in r.stderr and "predates APEX_BUILD_*" in r.stderr
    assert not house.exists() or not list(house.glob("*.whl"))


def test_patch_set_is_applied_to_the_work_copy_only(tmp_path: Path) -> None:
    house = tmp_path / "house"
    diff = FIXTURES / "apex-patches" / "mark-patched.diff"
    r = porter("wheel", "apex", "--source", str(APEX_ENV), "-t", "cpu", "-o", str(house), "--patch-set", str(diff))
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(only_wheel(house)) as zf:
        patched = zf.read("apex/__init__.py")
        assert b"PATCHED_BY_PORTER = True" in patched
    assert "PATCHED_BY_PORTER" not in (APEX_ENV / "apex" / "__init__.py").read_text()
    # the manifest and the wheel's SBOM list the patch, with the file's sha256 before and after
    from porter.artifacts.sbom import read_sbom

    (record,) = read_manifest(manifest_path(only_wheel(house)))["sources"]["patches"]
    assert record["files"] == [{"path": "apex/__init__.py", "after": hashlib.sha256(patched).hexdigest(),
                                "before": hashlib.sha256((APEX_ENV / "apex" / "__init__.py").read_bytes()).hexdigest()}]
    wheel = read_sbom(only_wheel(house))["metadata"]["component"]
    assert [i["id"] for p in wheel["pedigree"]["patches"] for i in p["resolves"]] == [f"{record['set']}/{record['id']}"]


@pytest.mark.rocm
def test_flash_attn_fixture_ck_with_hipcc_code_objects(tmp_path: Path, hipcc: str) -> None:
    """FA's knobs on a fixture tree: host module by g++, device object by Debian hipcc for GPU_ARCHS.

    The fixture needs no ROCm torch, so porter's torch check is switched off here (real FA needs one)."""
    house = tmp_path / "house"
    r = porter("wheel", "flash-attn", "--source", str(FA), "-t", "debian-rocm", "--arch", "gfx90a",
               "-o", str(house), "--no-torch-check", env={"HIP_PLATFORM": "amd"})
    assert r.returncode == 0, r.stderr
    whl = only_wheel(house)
    assert whl.name.startswith(f"flash_attn-2.8.0.post2+rocm5.2.gfx90a-{CP}-")
    m = read_manifest(manifest_path(whl))
    (ext,) = m["extensions"]
    assert ext["module"] == "flash_attn_2_cuda" and ext["archs"] == ["gfx90a"]
    with zipfile.ZipFile(whl) as zf:
        (tmp_path / "ext.so").write_bytes(zf.read(ext["path"]))
    assert archs_in(tmp_path / "ext.so") == ["gfx90a"]
    assert "GPU_ARCHS=gfx90a" in r.stderr and "FLASH_ATTENTION_FORCE_BUILD=TRUE" in r.stderr


def test_flash_attn_fixture_without_device_code_is_refused(tmp_path: Path) -> None:
    """No hipcc (HIPCC points nowhere): the fixture links a host-only module, without gfx90a code objects."""
    house = tmp_path / "house"
    r = porter("wheel", "flash-attn", "--source", str(FA), "-t", "frontier", "-o", str(house),
               "--no-torch-check", env={"HIPCC": str(tmp_path / "no-hipcc")})
    assert r.returncode == 1, r.stderr
    assert "has no code objects for gfx90a (it holds: none)" in r.stderr
    assert not house.exists() or not list(house.glob("*.whl"))


def test_real_flash_attn_sdist_triton_wheel(tmp_path: Path, flash_attn_sdist: Path) -> None:
    """Upstream builds the Triton backend with any torch: a real, pure-Python wheel from the PyPI sdist."""
    house = tmp_path / "house"
    r = porter("wheel", "flash-attn", "--source", str(flash_attn_sdist), "--backend", "triton", "-t", "mi300x",
               "-o", str(house))
    assert r.returncode == 0, r.stderr
    whl = only_wheel(house)
    label = labels.make(load_toolchain("mi300x"))
    assert whl.name == f"flash_attn-2.8.3.post2+{label}-py3-none-any.whl"
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
    assert "flash_attn/flash_attn_triton_amd/__init__.py" in names and not [n for n in names if n.endswith(".so")]
    m = read_manifest(manifest_path(whl))
    assert m["sources"]["sdist"] == flash_attn_sdist.name and m["target"]["backend"] == "triton"


def test_real_flash_attn_sdist_ck_refuses_cpu_torch_and_dry_run_shows_plan(flash_attn_sdist: Path,
                                                                           tmp_path: Path) -> None:
    r = porter("wheel", "flash-attn", "--source", str(flash_attn_sdist), "-t", "mi300x", "-o", str(tmp_path))
    assert r.returncode == 2 and "needs the ROCm build of torch" in r.stderr and "2.13.0" in r.stderr
    assert "pip wheel" not in r.stderr  # refused before building
    r = porter("wheel", "flash-attn", "--source", str(flash_attn_sdist), "-t", "mi300x", "--dry-run")
    assert r.returncode == 0, r.stderr  # a dry run shows the plan and what a real run would refuse
    assert "# a real run here would be refused: flash-attn 2.8.3.post2" in r.stdout
    for piece in ("BUILD_TARGET=rocm", "GPU_ARCHS=gfx942", "FLASH_ATTENTION_FORCE_BUILD=TRUE", "MAX_JOBS=",
                  "pip wheel --no-deps --no-build-isolation", "code objects for gfx942"):
        assert piece in r.stdout
    r = porter("wheel", "flash-attn", "--source", str(flash_attn_sdist), "-t", "debian-rocm", "--dry-run")
    assert r.returncode == 2 and "does not support gfx908" in r.stderr


# -- what verify requires, per regime and ops (issue 12: APEX/FA verification truth) ----------------

def test_apex_host_only_op_in_a_rocm_wheel_is_not_refused_for_lacking_gfx_code(tmp_path: Path) -> None:
    """apex_C is host code: a ROCm-labelled wheel holding only it verifies (no code objects are expected)."""
    house = tmp_path / "house"
    r = porter("wheel", "apex", "--source", str(APEX_ENV), "--toolchain", "frontier", "--ops", "cpp",
               "--no-torch-check", "-o", str(house))
    assert r.returncode == 0, r.stderr
    whl = only_wheel(house)
    assert whl.name.startswith(f"apex-1.14.0a0+{labels.make(load_toolchain('frontier'))}-{CP}-")
    (ext,) = read_manifest(manifest_path(whl))["extensions"]
    assert ext["module"] == "apex.apex_C" and ext.get("host_only") is True and "archs" not in ext


def test_apex_cpu_dry_run_says_upstreams_setup_py_must_fail(tmp_path: Path) -> None:
    """A tree whose setup.py reads torch.version.hip at import (as ROCm/apex does) fails there with a CPU
    torch even for its host-only ops: the dry run says so, the real run refuses before pip runs."""
    tree = FIXTURES / "apex-rocm"
    r = porter("wheel", "apex", "--source", str(tree), "-t", "cpu", "--dry-run")
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("# a real run here would be refused: apex 1.16.0a0")
    assert "reads torch.version.hip at import (setup.py line 17)" in last
    r = porter("wheel", "apex", "--source", str(tree), "-t", "cpu", "-o", str(tmp_path / "house"))
    assert r.returncode == 2 and "torch.version.hip at import" in r.stderr and "pip wheel" not in r.stderr


def test_real_flash_attn_triton_is_not_refused_for_archs_only_ck_restricts(flash_attn_sdist: Path) -> None:
    r = porter("wheel", "flash-attn", "--source", str(flash_attn_sdist), "-t", "debian-rocm", "--backend", "triton",
               "--dry-run")
    assert r.returncode == 0, r.stderr  # gfx908 is outside the CK list only
    assert "GPU_ARCHS=" in r.stdout and "gfx908: outside the CK backend's GPU_ARCHS list" in r.stdout


@pytest.mark.rocm
def test_flash_attn_wheel_applies_ck_rocm7_to_its_work_copy(tmp_path: Path, hipcc: str) -> None:
    """A tree whose composable_kernel predates ROCm 7: the wheel build applies flash-attn/ck-rocm7 (a rocm build
    set) to its work copy and records it in the manifest and the SBOM; the tree stays as it was."""
    import shutil

    from porter.artifacts.sbom import read_sbom

    tree = tmp_path / "fa"
    shutil.copytree(FA, tree)
    arch = "csrc/composable_kernel/include/ck_tile/core/arch/arch.hpp"
    (tree / arch).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / "flash-attn-ck-pre-rocm7" / arch, tree / arch)
    before = (tree / arch).read_bytes()
    house = tmp_path / "house"
    r = porter("wheel", "flash-attn", "--source", str(tree), "-t", "debian-rocm", "--arch", "gfx90a",
               "-o", str(house), "--no-torch-check", env={"HIP_PLATFORM": "amd"})
    assert r.returncode == 0, r.stderr
    assert "building from a patched copy of the source (flash-attn/ck-rocm7" in r.stderr
    assert (tree / arch).read_bytes() == before
    m = read_manifest(manifest_path(only_wheel(house)))
    assert [(p["set"], p["id"], p["state"]) for p in m["sources"]["patches"]] == \
        [("flash-attn/ck-rocm7", "ck-constexpr-warp-size", "applied")]
    wheel = read_sbom(only_wheel(house))["metadata"]["component"]
    assert [i["id"] for p in wheel["pedigree"]["patches"] for i in p["resolves"]] == \
        ["flash-attn/ck-rocm7/ck-constexpr-warp-size"]
