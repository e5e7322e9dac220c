"""porter image build for real: a Debian bookworm userspace with a CPU torch (make image-base) plus a wheelhouse
(the session's DeepSpeed 0.19.8 CPU-ops wheel, its dependencies) becomes a SIF, packed by Apptainer 1.4.5 in the sid
chroot. porter installs and verifies the wheels inside the image's own userspace at build time; the image is read
back (labels, definition, its root file system's files). No GPU: nothing runs on one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require
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

    tmp = apptainer_root / "tmp" / f"porter-test-{os.getpid()}"
    tmp.mkdir()
    try:
        (tmp / "node.sif").write_bytes(out.read_bytes())
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
        sbom = (tmp / "x" / "opt" / "porter" / "sbom.cdx.json").read_text()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
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
