"""The RCCL network plugin built for real: the aws-ofi-nccl stand-in (tests/fixtures/aws-ofi-nccl-mini)
configured, compiled and linked in the ROCm 7.2 chroot against Debian's RCCL headers, libfabric and HIP
runtime, packaged, then loaded (dlopen) inside the chroot by ``porter net-plugin verify``. Nothing is run
against a NIC or a GPU. A plugin built without ROCm, and one built against another RCCL major than a site's,
are refused for that site.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, require, rocm7_root

pytestmark = [pytest.mark.integration, pytest.mark.rocm7]

FIXTURE = FIXTURES / "aws-ofi-nccl-mini"
SITES = Path(__file__).resolve().parents[2] / "porter" / "cluster" / "site" / "builtin"


def porter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True,
                          env={**os.environ, "PORTER_ROCM7_ROOT": str(rocm7_root())}, timeout=600)


@pytest.fixture(scope="module")
def root() -> Path:
    r = rocm7_root()
    require("sid ROCm 7 chroot", (r / "usr/bin/hipcc").exists(), "run 'make chroot-rocm7'")
    require(f"/proc inside {r}", (r / "proc/self").exists(), "run 'make chroot-rocm7' (it mounts /proc there)")
    for what in ("usr/include/rdma/fabric.h", "usr/include/rccl/rccl.h", "usr/bin/make"):
        require(f"{what} in {r}", (r / what).exists(), "run 'make chroot-rocm7' (libfabric-dev, librccl-dev, make)")
    return r


def rccl_header_version(root: Path) -> str:
    text = (root / "usr/include/rccl/rccl.h").read_text()
    return ".".join(re.search(rf"#define NCCL_{k} (\d+)", text).group(1)  # type: ignore[union-attr]
                    for k in ("MAJOR", "MINOR", "PATCH"))


@pytest.fixture(scope="module")
def rocm_package(root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:  # type: ignore[type-arg]
    out = tmp_path_factory.mktemp("netplugin-rocm")
    res = porter("net-plugin", "build", "--source", str(FIXTURE), "-t", "debian-rocm7", "-o", str(out), "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    return out, json.loads(res.stdout)


@pytest.fixture(scope="module")
def cpu_toolchain(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A toolchain without ROCm whose programs run in the same chroot (its libfabric, its g++)."""
    path = tmp_path_factory.mktemp("tc") / "chroot-cpu.toml"
    path.write_text(f'kind = "cpu"\ncompiler = "g++"\nlauncher = ["chroot", "{root}"]\nsetup = "make chroot-rocm7"\n')
    return path


def site_file(tmp: Path, rccl_major: int) -> Path:
    """Frontier's profile, naming the RCCL major version it runs."""
    text = (SITES / "frontier.toml").read_text()
    assert "[plugin]" in text and text.count("rccl_major = 2") == 1
    path = tmp / f"frontier-rccl{rccl_major}.toml"
    path.write_text(text.replace("rccl_major = 2", f"rccl_major = {rccl_major}"))
    return path


def test_build_compiles_and_links_against_the_chroots_rccl_libfabric_and_hip(root: Path, rocm_package) -> None:  # type: ignore[no-untyped-def]
    out, doc = rocm_package
    pkg = Path(doc["package"])
    assert pkg.parent == out and pkg.name == "aws-ofi-nccl-0.3.0-rocm7.2.gfx90a.gfx942.gfx950.tar.gz"
    assert sorted(p.name for p in out.iterdir()) == [pkg.name, pkg.name + ".porter.json"]  # no temp files left
    assert doc["device"] == "rocm"
    facts = doc["net_plugin"]
    assert facts["built_with_rocm"] is True
    version = rccl_header_version(root)
    assert facts["rccl"]["version"] == version and facts["rccl"]["major"] == int(version.split(".")[0])
    assert facts["rccl"]["net_api"] and 9 in facts["rccl"]["net_api"]
    assert facts["libfabric"]["version"].startswith("2.")
    assert facts["rocm"] == {"version": "7.2", "hip": facts["rocm"]["hip"]} and facts["rocm"]["hip"].startswith("7.2.")
    assert facts["net_api"] == [8, 9] and facts["collnet_api"] == [8]
    assert "--with-rocm=/usr" in facts["configure"]
    libs = facts["libraries"]
    assert sorted(libs) == ["librccl-net-ofi.so", "librccl-net.so"]
    for lib in libs.values():
        assert lib["hip_runtime"] is True and lib["net_api"] == [8, 9] and lib["collnet_api"] == [8]
        assert any(n.startswith("libfabric.so.1") for n in lib["links"])
        assert any(n.startswith("libamdhip64.so.7") for n in lib["links"])
        assert lib["names"]["ncclNetPlugin_v9"] == "MiniOFI"
    manifest = json.loads(Path(doc["manifest"]).read_text())
    assert manifest["component"] == "aws-ofi-nccl" and manifest["toolchain"]["name"] == "debian-rocm7"
    assert manifest["wheel"]["filename"] == pkg.name
    with tarfile.open(pkg) as tar:
        names = sorted(tar.getnames())
        inner = json.loads(tar.extractfile(f"{pkg.name[:-7]}/porter.json").read())  # type: ignore[union-attr]
    assert names == [f"{pkg.name[:-7]}/{n}" for n in ("lib/librccl-net-ofi.so", "lib/librccl-net.so",
                                                        "porter.cdx.json", "porter.json")]
    assert inner["target"]["net_plugin"]["rccl"] == facts["rccl"]
    from porter.artifacts.sbom import read_sbom  # the SBOM beside the manifest: the tree digest, no patches

    sbom = read_sbom(pkg)
    component = sbom["metadata"]["component"]
    assert component["purl"] == "pkg:generic/aws-ofi-nccl@0.3.0" and component["pedigree"].get("patches") is None
    source = {p["name"]: p["value"] for p in component["pedigree"]["ancestors"][0]["properties"]}
    assert source["porter:source:tree"] == manifest["sources"]["tree"]
    for e in manifest["extensions"]:
        assert e["path"] in names and len(e["sha256"]) == 64


def test_verify_loads_it_in_the_chroot_and_lists_its_plugin_symbols(rocm_package) -> None:  # type: ignore[no-untyped-def]
    _, doc = rocm_package
    res = porter("net-plugin", "verify", doc["package"], "-t", "debian-rocm7", "--site", "frontier", "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    rep = json.loads(res.stdout)
    assert rep["ok"] and rep["built_with_rocm"] is True and rep["problems"] == []
    assert "chroot" in rep["where"]
    assert rep["rccl_env"]["runtime"]["loads"] is True  # the chroot's librccl.so.1 answered ncclGetVersion
    assert rep["rccl_env"]["version"] == rep["rccl_built"]
    assert [lib["name"] for lib in rep["libraries"]] == ["librccl-net.so", "librccl-net-ofi.so"]
    for lib in rep["libraries"]:
        assert lib["loads"] and lib["net_api"] == [8, 9] and lib["collnet_api"] == [8]
        assert lib["rccl_uses"] == 9 and lib["hip_runtime"] is True
    text = porter("net-plugin", "verify", doc["package"], "-t", "debian-rocm7")
    assert text.returncode == 0
    assert "exports ncclNetPlugin_v8, ncclNetPlugin_v9, ncclCollNetPlugin_v8" in text.stdout


def test_verify_names_the_dependency_that_does_not_resolve(rocm_package) -> None:  # type: ignore[no-untyped-def]
    """On this host (no libfabric, no HIP runtime) the same library does not load: the report says why."""
    _, doc = rocm_package
    res = porter("net-plugin", "verify", doc["package"], "--json")
    rep = json.loads(res.stdout)
    if all(lib["loads"] for lib in rep["libraries"]):
        pytest.skip("this host has libfabric and the HIP runtime: nothing is missing")
    assert res.returncode == 1
    assert re.search(r"lib(fabric|amdhip64)\.so\.\d+: cannot open shared object file", rep["problems"][0])


def test_a_plugin_built_without_rocm_is_refused_for_a_rocm_site(root: Path, cpu_toolchain: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    refused = porter("net-plugin", "build", "--source", str(FIXTURE), "-t", str(cpu_toolchain), "-o", str(out),
                     "--site", "frontier")
    assert refused.returncode == 2, refused.stderr
    assert "no ROCm" in refused.stderr and "site frontier runs gfx90a" in refused.stderr
    assert not out.exists() or list(out.iterdir()) == []  # refused before any work
    built = porter("net-plugin", "build", "--source", str(FIXTURE), "-t", str(cpu_toolchain), "-o", str(out), "--json")
    assert built.returncode == 0, built.stderr
    doc = json.loads(built.stdout)
    assert doc["device"] == "none" and doc["net_plugin"]["built_with_rocm"] is False
    assert sorted(doc["net_plugin"]["libraries"]) == ["libnccl-net-ofi.so", "libnccl-net.so"]
    assert all(lib["hip_runtime"] is False for lib in doc["net_plugin"]["libraries"].values())
    res = porter("net-plugin", "verify", doc["package"], "-t", "debian-rocm7", "--site", "frontier", "--json")
    assert res.returncode == 1
    rep = json.loads(res.stdout)
    assert all(lib["loads"] for lib in rep["libraries"])  # it loads: the refusal is about the site
    assert len(rep["problems"]) == 1 and "no ROCm" in rep["problems"][0] and "gfx90a" in rep["problems"][0]
    # the bare library, no manifest: the same refusal, read from what it links
    with tarfile.open(doc["package"]) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/lib/libnccl-net.so"))
        member.name = "libnccl-net.so"
        tar.extract(member, tmp_path)
    bare = porter("net-plugin", "verify", str(tmp_path / "libnccl-net.so"), "-t", "debian-rocm7", "--site", "frontier")
    assert bare.returncode == 1 and "no ROCm" in bare.stdout and "no porter manifest" in bare.stdout


def test_a_plugin_built_against_another_rccl_major_is_refused(root: Path, rocm_package, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, doc = rocm_package
    major = doc["net_plugin"]["rccl"]["major"]
    other = site_file(tmp_path, major + 1)
    res = porter("net-plugin", "verify", doc["package"], "-t", "debian-rocm7", "--site", str(other))
    assert res.returncode == 1
    assert f"(major {major}), but site frontier-rccl{major + 1} runs RCCL major {major + 1}" in res.stdout
    out = tmp_path / "out"
    refused = porter("net-plugin", "build", "--source", str(FIXTURE), "-t", "debian-rocm7", "-o", str(out),
                     "--site", str(other))
    assert refused.returncode == 2 and f"runs RCCL major {major + 1}" in refused.stderr
    assert list(out.iterdir()) == []  # nothing built, nothing written
    same = porter("net-plugin", "verify", doc["package"], "-t", "debian-rocm7", "--site", str(site_file(tmp_path, major)))
    assert same.returncode == 0, same.stdout + same.stderr


def test_a_failing_configure_leaves_no_package(root: Path, cpu_toolchain: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = porter("net-plugin", "build", "--source", str(FIXTURE), "-t", str(cpu_toolchain), "-o", str(out),
                 "--configure-arg=--with-cuda=/usr/local/cuda")
    assert res.returncode == 1
    assert "this stand-in builds no CUDA plugin" in res.stderr and "configure failed" in res.stderr
    assert list(out.iterdir()) == []
