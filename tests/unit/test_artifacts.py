"""Labels, the one wheel writer and the manifest builder (no subprocess)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from porter.archive import DamagedFile
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from porter.artifacts import labels
from porter.artifacts.manifest import build_manifest, target_of
from porter.artifacts.wheelfile import WheelSpec, read_wheel, rewrite_wheel, write_wheel
from porter.errors import CheckFailed, ConfigError
from porter.install.wheelhouse import validate_record
from porter.toolchain.profile import load_toolchain, preset_names
from porter.torch_facts import TorchInfo

CP = "cp311-cp311-linux_x86_64"


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_label_is_in_normal_form_and_parses_back(name: str) -> None:
    tc = load_toolchain(name, environ={})
    label = labels.make(tc)
    version = f"1.2.3+{label}"
    assert str(Version(version)) == version  # the file name's version is what packaging prints
    back = labels.parse(label)
    assert back is not None and back.kind == tc.kind
    if tc.kind == "cpu":
        assert back.cpu_isa == tc.cpu_isa
    else:
        assert back.archs == tc.arch_names
    if tc.kind == "rocm":
        assert back.toolkit == tc.toolkit_version


def test_labels_parse_only_porter_labels() -> None:
    assert labels.parse("cpu.x86_64_v2") == labels.Label("cpu", "", (), "x86-64-v2")  # normalized first
    assert labels.parse("rocm7.2.gfx90a.gfx942.gfx950") == labels.Label("rocm", "7.2", ("gfx90a", "gfx942", "gfx950"))
    assert labels.parse("cu130.sm90") == labels.Label("cuda", "130", ("sm_90",))
    for other in ("git1234", "rocm7.2", "cpu", "ubuntu.22.04", "rocm6.2.linux"):
        assert labels.parse(other) is None, other
    assert labels.with_label("0.19.8+abc", "cpu.x86.64.v2") == "0.19.8+cpu.x86.64.v2"
    with pytest.raises(ConfigError, match="not a PEP 440"):
        labels.with_label("not a version", "cpu.x86.64.v2")


def _write(dest: Path, so: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    return write_wheel(dest, WheelSpec("megatron-fused-kernels", "0.2.0+rocm7.2.gfx942", CP),
                       {"k_cuda.cpython-311-x86_64-linux-gnu.so": so, "{dist_info}/porter.json": b"{}"},
                       summary="test")


def test_same_inputs_give_a_byte_identical_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    so = tmp_path / "k.so"
    so.write_bytes(b"\x7fELF stand-in")
    first = _write(tmp_path / "a", so)
    os.utime(so, (time.time() + 3600, time.time() + 3600))  # another mtime changes nothing
    second = _write(tmp_path / "b", so)
    assert first.name == second.name == f"megatron_fused_kernels-0.2.0+rocm7.2.gfx942-{CP}.whl"
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    third = _write(tmp_path / "c", so)
    assert third.read_bytes() != first.read_bytes()
    with zipfile.ZipFile(third) as zf:
        assert zf.getinfo("k_cuda.cpython-311-x86_64-linux-gnu.so").date_time[:3] == (2023, 11, 14)
        names = zf.namelist()
    assert names[-1].endswith(".dist-info/RECORD") and names[0] == "k_cuda.cpython-311-x86_64-linux-gnu.so"
    validate_record(first)  # pypa/installer's own check passes


def test_record_mismatch_is_refused(tmp_path: Path) -> None:
    so = tmp_path / "k.so"
    so.write_bytes(b"\x7fELF stand-in")
    good = _write(tmp_path / "a", so)
    bad = tmp_path / "bad" / good.name
    bad.parent.mkdir()
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, b"\x7fELF swapped" if info.filename.endswith(".so") else data)
    with pytest.raises(DamagedFile, match="RECORD does not match"):
        validate_record(bad)


def test_rewrite_renames_dist_info_and_keeps_files(tmp_path: Path) -> None:
    src = write_wheel(tmp_path, WheelSpec("apex", "1.14.0a0", CP), {"apex/__init__.py": b"x = 1\n"},
                      metadata=b"Metadata-Version: 2.1\nName: apex\nVersion: 1.14.0a0\nRequires-Dist: packaging\n")
    out = rewrite_wheel(src, tmp_path / "o", version="1.14.0a0+rocm7.1.gfx90a", tag=CP,
                        add={"{dist_info}/porter.json": b"{}"})
    _, version, _, tags = parse_wheel_filename(out.name)
    assert str(version) == "1.14.0a0+rocm7.1.gfx90a" and {str(t) for t in tags} == {CP}
    w = read_wheel(out)
    assert w.dist_info == "apex-1.14.0a0+rocm7.1.gfx90a.dist-info" and w.files["apex/__init__.py"] == b"x = 1\n"
    metadata = w.files[f"{w.dist_info}/METADATA"]
    assert b"Version: 1.14.0a0+rocm7.1.gfx90a" in metadata and b"Requires-Dist: packaging" in metadata
    assert f"{w.dist_info}/porter.json" in w.files
    validate_record(out)


def test_temp_files_live_beside_the_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EXDEV: with TMPDIR on another filesystem (/dev/shm on login nodes) the wheel still lands by rename."""
    shm = Path("/dev/shm")
    other = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path / "other"
    monkeypatch.setattr(tempfile, "tempdir", str(other))
    so = tmp_path / "k.so"
    so.write_bytes(b"\x7fELF")
    out = _write(tmp_path / "house", so)
    assert out.parent == tmp_path / "house" and not list(other.iterdir())
    assert sorted(p.name for p in (tmp_path / "house").iterdir()) == [out.name]


def test_one_target_section_for_every_component() -> None:
    tc = load_toolchain("debian-trixie-rocm", environ={"PORTER_TRIXIE_ROOT": "/x"},
                        overrides={"archs": ("gfx90a:xnack-", "gfx942")})
    t = target_of(tc)
    assert t == {"kind": "rocm", "archs": ["gfx90a", "gfx942"], "arch_specs": ["gfx90a:xnack-", "gfx942"],
                 "wavefront": 64, "cpu_isa": "x86-64-v2", "toolkit_version": "5.7",
                 "label": "rocm5.7.gfx90a.gfx942"}
    m = build_manifest(component="apex", version="1.0+rocm5.7.gfx90a.gfx942", tc=tc,
                       torch=TorchInfo("2.13.0+cpu"), python_tag="cp311", sources={}, extensions=[],
                       target={"regime": "env"})
    assert m["target"]["regime"] == "env" and m["target"]["toolkit_version"] == "5.7"
    assert m["torch"] == {"version": "2.13.0+cpu", "kind": "cpu", "hip": None, "cuda": None, "cxx11_abi": True}
    json.dumps(m)
