"""The RCCL network plugin from a tree as users clone it, with the older aws-ofi-rccl interface:
tests/fixtures/aws-ofi-rccl-mini has autogen.sh, configure.ac and Makefile.am files but no configure. porter
copies it, runs autogen.sh (autoreconf) inside the ROCm 7.2 chroot, then ``configure --with-hip=/usr
--with-rccl=/usr --disable-tests`` and ``make`` / ``make install`` in src/ only, against Debian's RCCL headers,
libfabric and HIP runtime there; the package is then loaded (dlopen) there by ``porter net-plugin verify``.
Nothing is run against a NIC or a GPU.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.integration.test_netplugin import cpu_toolchain, porter, rccl_header_version, root  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.rocm7]

FIXTURE = FIXTURES / "aws-ofi-rccl-mini"
PACKAGE = "aws-ofi-rccl-0.4.0-rocm7.2.gfx90a.gfx942.gfx950.tar.gz"


def listing(top: Path) -> list[str]:
    return sorted(str(Path(d, n).relative_to(top)) for d, _, names in os.walk(top) for n in names)


def clone_of_fixture(tmp: Path) -> Path:
    """A copy of the fixture, as a user's clone: autotools' outputs are never in it."""
    src = tmp / "aws-ofi-rccl"
    shutil.copytree(FIXTURE, src)
    assert not (src / "configure").exists() and (src / "autogen.sh").is_file() and (src / "configure.ac").is_file()
    return src


@pytest.fixture(scope="module")
def clone_package(root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("netplugin-clone")
    src, out = clone_of_fixture(tmp), tmp / "out"
    res = porter("net-plugin", "build", "--source", str(src), "-t", "debian-rocm7", "-o", str(out), "--json")
    assert res.returncode == 0, res.stderr[-6000:] + res.stdout
    assert "==> autogen aws-ofi-rccl 0.4.0" in res.stderr
    return src, out, json.loads(res.stdout)


def test_a_clone_is_autogen_configured_compiled_and_linked_in_the_chroot(
        root: Path, clone_package: tuple[Path, Path, dict[str, Any]]) -> None:  # noqa: F811
    src, out, doc = clone_package
    assert (doc["project"], doc["version"], doc["device"]) == ("aws-ofi-rccl", "0.4.0", "rocm")
    steps = {s["what"]: s["argv"] for s in doc["steps"]}
    assert list(steps) == ["autogen", "configure", "make", "install"]
    for argv in steps.values():
        assert argv[:2] == ["chroot", str(root)]  # autoreconf, configure and make all ran in the chroot
    assert steps["autogen"][-2:] == ["sh", "./autogen.sh"]
    assert steps["make"][-2].endswith("/src/src")  # src/ only: the tests need MPI
    configure = steps["configure"]
    assert {"--with-hip=/usr", "--with-rccl=/usr", "--disable-tests"} <= set(configure)
    assert not any(a.startswith("--with-rocm") for a in configure)
    # the user's tree is never touched: no configure, Makefile.in, aclocal.m4 or autom4te.cache appear in it
    assert listing(src) == listing(FIXTURE)

    pkg = Path(doc["package"])
    assert pkg.parent == out and pkg.name == PACKAGE
    assert sorted(p.name for p in out.iterdir()) == [PACKAGE, PACKAGE + ".porter.json"]
    facts = doc["net_plugin"]
    assert facts["project"] == "aws-ofi-rccl" and facts["version"] == "0.4.0"
    assert facts["built_with_rocm"] is True and facts["device"] == "rocm"
    version = rccl_header_version(root)
    assert facts["rccl"]["version"] == version and facts["rccl"]["major"] == int(version.split(".")[0])
    assert facts["libfabric"]["version"].startswith("2.")
    assert facts["rocm"]["version"] == "7.2" and facts["rocm"]["hip"].startswith("7.2.")
    assert facts["net_api"] == [8, 9] and facts["collnet_api"] == []
    # libtool installs librccl-net.so.0.0.0 plus links; the package holds the file under the name RCCL dlopens
    assert list(facts["libraries"]) == ["librccl-net.so"]
    lib = facts["libraries"]["librccl-net.so"]
    assert lib["hip_runtime"] is True and lib["net_api"] == [8, 9]
    assert lib["names"] == {"ncclNetPlugin_v8": "MiniRCCL", "ncclNetPlugin_v9": "MiniRCCL"}
    assert any(n.startswith("libfabric.so.1") for n in lib["links"])
    assert any(n.startswith("libamdhip64.so.7") for n in lib["links"])
    top = PACKAGE[: -len(".tar.gz")]
    with tarfile.open(pkg) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == [f"{top}/lib/librccl-net.so", f"{top}/porter.cdx.json", f"{top}/porter.json"]
        assert members[f"{top}/lib/librccl-net.so"].isfile()  # the library itself, not libtool's link
        data = tar.extractfile(f"{top}/lib/librccl-net.so").read()  # type: ignore[union-attr]
    assert data[:4] == b"\x7fELF" and b"librccl-net.so.0" in data  # its SONAME: libtool's versioned name
    manifest = json.loads(Path(doc["manifest"]).read_text())
    assert manifest["component"] == "aws-ofi-rccl" and manifest["wheel"]["filename"] == PACKAGE
    assert [e["path"] for e in manifest["extensions"]] == [f"{top}/lib/librccl-net.so"]


def test_verify_loads_the_clone_build_in_the_chroot_for_frontier(
        clone_package: tuple[Path, Path, dict[str, Any]]) -> None:
    _, _, doc = clone_package
    res = porter("net-plugin", "verify", doc["package"], "-t", "debian-rocm7", "--site", "frontier", "--json")
    assert res.returncode == 0, res.stderr + res.stdout
    rep = json.loads(res.stdout)
    assert rep["ok"] and rep["problems"] == [] and rep["site"] == "frontier"
    assert rep["built_with_rocm"] is True and rep["rccl_built"] == doc["net_plugin"]["rccl"]["version"]
    assert rep["rccl_env"]["runtime"]["loads"] is True
    assert [lib["name"] for lib in rep["libraries"]] == ["librccl-net.so"]
    lib = rep["libraries"][0]
    assert lib["loads"] and lib["net_api"] == [8, 9] and lib["collnet_api"] == []
    assert lib["rccl_uses"] == 9 and lib["hip_runtime"] is True
    text = porter("net-plugin", "verify", doc["package"], "-t", "debian-rocm7")
    assert text.returncode == 0 and "librccl-net.so: loads; exports ncclNetPlugin_v8, ncclNetPlugin_v9;" in text.stdout


def test_the_clones_tests_need_mpi_so_enabling_them_fails_configure(root: Path, tmp_path: Path) -> None:  # noqa: F811
    """Why porter passes --disable-tests: with the tests on, configure stops (no mpi.h in the chroot), after
    autogen.sh ran there; nothing is packaged."""
    out = tmp_path / "out"
    res = porter("net-plugin", "build", "--source", str(clone_of_fixture(tmp_path)), "-t", "debian-rocm7",
                 "-o", str(out), "--configure-arg=--enable-tests")
    assert res.returncode == 1
    assert "mpi.h not found" in res.stderr and "configure failed" in res.stderr
    assert list(out.iterdir()) == []


def test_aws_ofi_rccl_is_refused_for_a_toolchain_without_rocm(cpu_toolchain: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "out"
    res = porter("net-plugin", "build", "--source", str(clone_of_fixture(tmp_path)), "-t", str(cpu_toolchain),
                 "-o", str(out))
    assert res.returncode == 2 and "aws-ofi-rccl builds for ROCm only" in res.stderr
    assert not out.exists() or list(out.iterdir()) == []
