"""porter image build for real: a Debian bookworm userspace with a CPU torch (make image-base) plus a wheelhouse
(the session's DeepSpeed 0.19.8 CPU-ops wheel, its dependencies) becomes a SIF, packed by Apptainer 1.4.5 in the sid
chroot. porter installs and verifies the wheels inside the image's own userspace at build time; the image is read
back (labels, definition, its root file system's files). No GPU: nothing runs on one."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, require, rocm7_root
from tests.integration.conftest import run_porter
from tests.integration.test_install import _runtime_requirements

pytestmark = [pytest.mark.integration, pytest.mark.rocm7, pytest.mark.slow]


@pytest.fixture
def apptainer_root(rocm7: Path) -> Path:
    require("apptainer in the sid chroot", (rocm7 / "usr/bin/apptainer").exists(), "run 'make chroot-rocm7'")
    from porter.image.build import mount_point

    require(f"{rocm7} a mount point (apptainer packs only there)", mount_point(rocm7), "run 'make chroot-rocm7'")
    return rocm7


@pytest.fixture
def image_base() -> Path:
    root = Path(os.environ.get("PORTER_IMAGE_BASE") or "/var/lib/porter/image-base")
    require("the image base (bookworm + a CPU torch)", (root / "opt/venv/bin/python").exists(), "run 'make image-base'")
    return root


def test_an_image_with_the_wheelhouse_installed_and_verified_inside(apptainer_root: Path, image_base: Path,
                                                                    cpu_ops_wheelhouse: Path, tmp_path: Path) -> None:
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    for built in cpu_ops_wheelhouse.glob("deepspeed-*"):  # the session's wheel (its cpu_lion among its ops)
        shutil.copy2(built, wh / built.name)
    (whl,) = wh.glob("deepspeed-*.whl")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(wh),
                          *_runtime_requirements(whl)], capture_output=True, text=True)
    require("DeepSpeed's dependency wheels", got.returncode == 0, got.stderr[-500:])
    out = tmp_path / "out" / "node.sif"
    res = run_porter("image", "build", "--base", str(image_base), "--wheelhouse", str(wh), "-o", str(out), "-t", "cpu",
                     "--site", "lumi-g", "--apptainer-root", str(apptainer_root), "--compression", "zstd", "--json",
                     timeout=3000)
    assert res.returncode == 0, res.stderr[-5000:]
    doc = json.loads(res.stdout)
    assert doc["image"] == str(out) and out.is_file() and doc["definition"] == str(out.with_suffix(".def"))
    assert "porter install, inside the image" in res.stderr and "porter verify, inside the image" in res.stderr
    assert doc["tested"] and "the image's own %test" in res.stderr  # run from the packed SIF's files
    assert sorted(p.name for p in out.parent.iterdir()) == ["node.def", "node.porter-tools", "node.sif"]  # no temp
    site_def = out.with_suffix(".def").read_text()
    assert f"From: {image_base}" in site_def and "%post" in site_def and "-m porter install /opt/porter/wheelhouse" \
        in site_def
    info = run_porter("image", "inspect", str(out), "--apptainer-root", str(apptainer_root), "--json")
    assert info.returncode == 0, info.stderr[-3000:]
    shown = json.loads(info.stdout)
    manifest = json.loads(Path(f"{whl}.porter.json").read_text())
    assert shown["labels"]["org.porter.wheel.deepspeed"] == f"{whl.name} sha256:{manifest['wheel']['sha256']}"
    assert shown["labels"]["org.porter.toolchain"] == manifest["target"]["label"]
    assert "-m porter verify --python /opt/venv/bin/python" in shown["test"]
    assert "%post" not in shown["definition"]  # porter ran the install steps; apptainer only packed
    # the image's root file system: the op's module where pip put it, porter's install record, porter itself, and
    # the image's combined SBOM (schema-valid, naming the installed wheel and its source's sha256)
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    files, superblock, sbom = read_back(apptainer_root, out)
    assert "Compression zstd" in superblock, superblock  # --compression reached mksquashfs
    site = "squashfs-root/opt/venv/lib/python3.11/site-packages"
    assert f"{site}/deepspeed/ops/lion/cpu_lion_op.cpython-311-x86_64-linux-gnu.so" in files
    assert "squashfs-root/opt/venv/share/porter/installed/deepspeed.json" in files
    assert "squashfs-root/opt/porter/lib/porter/__init__.py" in files
    assert doc["installed"] == [whl.name] and shown["labels"]["org.porter.sbom"] == "/opt/porter/sbom.cdx.json"
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(sbom) is None
    bom = json.loads(sbom)
    assert bom["metadata"]["component"]["type"] == "container"
    (wheel,) = [c for c in bom["components"] if c["bom-ref"] == "deepspeed/wheel"]
    assert manifest["sources"]["sdist_sha256"] in json.dumps(wheel["pedigree"])


def read_back(apptainer_root: Path, image: Path) -> tuple[str, str, str]:
    """The image's root file system as its squashfs partition holds it: the file listing, the superblock, and
    the combined SBOM's text (apptainer and unsquashfs of the sid chroot)."""
    tmp = apptainer_root / "tmp" / f"porter-test-{os.getpid()}"
    tmp.mkdir()
    try:
        (tmp / "node.sif").write_bytes(image.read_bytes())
        listing = subprocess.run(["chroot", str(apptainer_root), "apptainer", "sif", "list", f"/tmp/{tmp.name}/node.sif"],
                                 capture_output=True, text=True, check=True).stdout
        part = next(ln.split("|")[0].strip() for ln in listing.splitlines() if "Squashfs" in ln)
        inner = f"/tmp/{tmp.name}"
        subprocess.run(["chroot", str(apptainer_root), "sh", "-c",
                        f"apptainer sif dump {part} {inner}/node.sif > {inner}/fs && "
                        f"unsquashfs -q -d {inner}/x {inner}/fs opt/porter/sbom.cdx.json"], check=True,
                       capture_output=True)
        files = subprocess.run(["chroot", str(apptainer_root), "unsquashfs", "-l", f"{inner}/fs"],
                               capture_output=True, text=True, check=True).stdout
        superblock = subprocess.run(["chroot", str(apptainer_root), "unsquashfs", "-s", f"{inner}/fs"],
                                    capture_output=True, text=True, check=True).stdout
        return files, superblock, (tmp / "x" / "opt" / "porter" / "sbom.cdx.json").read_text()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_no_apptainer_is_an_error_with_the_definition_written(tmp_path: Path) -> None:
    """Without apptainer (a root with none): ERROR naming what to install, a TIP naming the definition file,
    which is written; no image, nothing half-written. The tools come from a folder given (no index needed)."""
    from tests.fixtures.install.wheels import compile_ext, deepspeed_wheel

    wh = tmp_path / "wh"
    deepspeed_wheel(wh, {"cpu_adam": compile_ext(tmp_path / "op.so", "cpu_adam_op").read_bytes()})
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "porter-0.1.0-py3-none-any.whl").write_bytes(b"")
    empty, base = tmp_path / "no-apptainer", tmp_path / "base"
    empty.mkdir()
    base.mkdir()
    out = tmp_path / "out" / "node.sif"
    res = run_porter("image", "build", "--base", str(base), "--wheelhouse", str(wh), "-o", str(out), "-t", "cpu",
                     "--apptainer-root", str(empty), "--tools", str(tools))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"no apptainer in {empty}" in res.stderr and "apt-get install apptainer" in res.stderr
    assert "TIP:" in res.stderr and str(out.with_suffix(".def")) in res.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["node.def"]


def test_a_sif_base_is_unpacked_to_its_root_file_system(apptainer_root: Path, tmp_path: Path) -> None:
    """A site's .sif as the base: porter reads its squashfs partition (apptainer sif dump) and unpacks it
    (unsquashfs), both without running the image, which a chroot does not allow."""
    from porter.image.build import Apptainer, unpack_base
    from porter.log import quiet_logger
    from porter.run import Runner

    work = apptainer_root / "var" / "cache" / "porter" / "images" / f"test-{os.getpid()}"
    try:
        (work / "src" / "opt" / "venv" / "bin").mkdir(parents=True)
        (work / "src" / "opt" / "venv" / "bin" / "python").write_text("#!/bin/sh\n")
        inside = "/" + str(work.relative_to(apptainer_root))
        subprocess.run(["chroot", str(apptainer_root), "apptainer", "build", "--force", f"{inside}/base.sif",
                        f"{inside}/src"], capture_output=True, check=True)
        base = tmp_path / "site-base.sif"
        base.write_bytes((work / "base.sif").read_bytes())
        (work / "root").mkdir()
        unpack_base(base, "sif", work / "root", Apptainer(apptainer_root), Runner(quiet_logger()))
        assert (work / "root" / "opt" / "venv" / "bin" / "python").read_text() == "#!/bin/sh\n"
        assert sorted(p.name for p in work.iterdir()) == ["base.sif", "root", "src"]  # its temp files gone
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def test_a_chroot_as_the_base_is_copied_without_its_mounts_caches_or_the_copy_itself(tmp_path: Path) -> None:
    """porter's own ROCm chroot as the base, with apptainer running in that same chroot: the image's work folder
    lies inside the base (cp -a refused "a directory into itself" after copying the rest), /proc is mounted there,
    and var/cache/porter holds gigabytes of porter's builds. The copy is the userspace only."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system inside the base needs root")
    from porter.image.build import Apptainer, unpack_base
    from porter.log import quiet_logger
    from porter.run import Runner

    base = tmp_path / "chroot"
    for rel, text in (("usr/bin/python3", "#!/bin/sh\n"), ("etc/os-release", "ID=debian\n"),
                      ("var/cache/porter/wheels/big.o", "x"), ("tmp/pytest-1/x", "x"), ("var/tmp/y", "y"),
                      ("var/cache/apt/keep", "kept")):
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(text)
    os.symlink("usr/bin", base / "bin")
    (base / "proc").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(base / "proc")], check=True)
    try:
        (base / "proc" / "cpuinfo").write_text("a mounted file system's file\n")
        into = base / "var" / "lib" / "images" / ".node.image.1" / "root"  # the work folder inside the base
        into.mkdir(parents=True)
        unpack_base(base, "root", into, Apptainer(None), Runner(quiet_logger()))
    finally:
        subprocess.run(["umount", str(base / "proc")], check=True)
    copied = sorted(str(p.relative_to(into)) for p in into.rglob("*"))
    assert copied == ["bin", "etc", "etc/os-release", "proc", "tmp", "usr", "usr/bin", "usr/bin/python3", "var",
                      "var/cache", "var/cache/apt", "var/cache/apt/keep", "var/lib", "var/lib/images", "var/tmp"], copied
    assert os.readlink(into / "bin") == "usr/bin" and (into / "usr/bin/python3").read_text() == "#!/bin/sh\n"


@pytest.fixture
def rocm_runtime_base() -> Path:
    root = Path(os.environ.get("PORTER_IMAGE_BASE_ROCM") or "/var/lib/porter/image-base-rocm")
    require("the ROCm runtime image base (sid + ROCm 7.2's HIP runtime, RCCL and libfabric)",
            (root / "opt/venv/bin/python").exists() and (root / "usr/lib/x86_64-linux-gnu/librccl.so.1").exists(),
            "run 'make image-base-rocm'")
    return root


@pytest.fixture
def net_plugin_package(tmp_path: Path) -> Path:
    """The aws-ofi-nccl stand-in built in the sid chroot: linked against its RCCL, libfabric and HIP runtime."""
    res = run_porter("net-plugin", "build", "--source", str(FIXTURES / "aws-ofi-nccl-mini"), "-t", "debian-rocm7",
                     "-o", str(tmp_path / "plugin"), "--json", env={"PORTER_ROCM7_ROOT": str(rocm7_root())})
    assert res.returncode == 0, res.stderr[-3000:]
    (package,) = (tmp_path / "plugin").glob("*.tar.gz")
    return package


def test_an_image_of_the_rocm_runtime_root_loads_the_network_plugin_inside(
        apptainer_root: Path, rocm_runtime_base: Path, net_plugin_package: Path, tmp_path: Path) -> None:
    """porter's ROCm runtime root (what a node has: HIP, RCCL, libfabric; no compiler) plus the plugin: the build
    loads it inside the image's userspace from where NCCL_NET_PLUGIN points, the image's %test loads it again."""
    out = tmp_path / "out" / "rocm.sif"
    res = run_porter("image", "build", "--base", str(rocm_runtime_base), "--net-plugin", str(net_plugin_package),
                     "-o", str(out), "-t", "debian-rocm7", "--site", "lumi-g", "--apptainer-root", str(apptainer_root),
                     "--compression", "zstd", "--json", timeout=3000)
    assert res.returncode == 0, res.stderr[-5000:]
    doc = json.loads(res.stdout)
    assert doc["image"] == str(out) and out.is_file() and doc["tested"] and doc["installed"] == []
    assert "porter net-plugin verify, inside the image" in res.stderr and "porter install" not in res.stderr
    # the load inside the image mapped the image's own HIP runtime, as RCCL's load on a node would
    assert re.search(r"librccl-net\.so: loads; exports ncclNetPlugin_v\d", res.stderr), res.stderr[-3000:]
    mapped = [ln for ln in res.stderr.splitlines() if "loaded with" in ln]
    assert len(mapped) == 2 and all("libamdhip64.so.7" in ln and "libfabric.so.1" in ln for ln in mapped)  # build, %test
    assert res.stderr.count("verify ok for site lumi-g") == 2
    # the installed library found its package's manifest beside it (<package>/porter.json): what it was built with
    assert res.stderr.count("built with ROCm: True; against RCCL 2.") == 2
    info = run_porter("image", "inspect", str(out), "--apptainer-root", str(apptainer_root), "--json")
    assert info.returncode == 0, info.stderr[-3000:]
    shown = json.loads(info.stdout)
    sha = hashlib.sha256(net_plugin_package.read_bytes()).hexdigest()
    assert shown["labels"]["org.porter.net-plugin"] == f"{net_plugin_package.name} sha256:{sha}"
    top = net_plugin_package.name[: -len(".tar.gz")]
    assert f"export NCCL_NET_PLUGIN=/opt/porter/net-plugin/{top}/lib/librccl-net.so" in shown["definition"]
    assert f"net-plugin verify /opt/porter/net-plugin/{top}/lib/librccl-net.so --site lumi-g" in shown["test"]
    files, _, sbom = read_back(apptainer_root, out)
    assert f"squashfs-root/opt/porter/net-plugin/{top}/lib/librccl-net.so" in files
    bom = json.loads(sbom)
    (plugin,) = [c for c in bom["components"] if c["bom-ref"] == "aws-ofi-nccl/wheel"]
    assert plugin["purl"].startswith("pkg:generic/aws-ofi-nccl@")


def test_a_base_the_plugin_cannot_load_in_is_refused_with_nothing_written(
        apptainer_root: Path, image_base: Path, net_plugin_package: Path, tmp_path: Path) -> None:
    """bookworm has no RCCL, no libfabric and no ROCm 7 runtime: the load inside the image fails the build, names
    what does not resolve, and leaves no image and no private folder behind."""
    out = tmp_path / "out" / "node.sif"
    res = run_porter("image", "build", "--base", str(image_base), "--net-plugin", str(net_plugin_package),
                     "-o", str(out), "-t", "debian-rocm7", "--apptainer-root", str(apptainer_root), timeout=3000)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "ERROR: porter net-plugin verify, inside the image: failed with exit code 1; no image was written" \
        in res.stderr and "TIP: it ran 'env PYTHONPATH=/opt/porter/lib" in res.stderr
    assert "librccl-net.so does not load" in res.stderr and "libfabric.so.1" in res.stderr
    assert "Traceback" not in res.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["node.def", "node.porter-tools"]  # no image, no temp
