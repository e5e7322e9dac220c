"""The SBOM every porter wheel carries (PEP 770), and the patch records it lists (no subprocess)."""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from porter.artifacts import sbom
from porter.artifacts.manifest import build_manifest, carried
from porter.artifacts.wheelfile import WheelSpec, rewrite_wheel, write_wheel
from porter.cli import cli
from porter.errors import ConfigError
from porter.log import Logger
from porter.patching import apply, plan
from porter.patching.model import parse_set
from porter.toolchain.profile import load_toolchain
from porter.torch_facts import TorchInfo

CP = "cp311-cp311-linux_x86_64"
SDIST = "5" * 64
VERSION = "0.18.9+rocm5.7.gfx90a.gfx942"
PATCH = {"set": "deepspeed/rocm-sources", "id": "hip-arch", "sha256": "b" * 64, "why": "the arch list is CUDA's",
         "state": "applied", "files": [{"path": "op_builder/builder.py", "before": "c" * 64, "after": "d" * 64}]}


def _carried(**sources: Any) -> bytes:
    """The manifest a wheel carries, as :func:`carried` writes it."""
    tc = load_toolchain("debian-trixie-rocm", environ={"PORTER_TRIXIE_ROOT": "/x"},
                        overrides={"archs": ("gfx90a:xnack-", "gfx942")})
    torch = TorchInfo("2.13.0+rocm6.2", hip="6.2.41133", cxx11_abi=False, python_tag="cp311")
    m = build_manifest(component="deepspeed", version=VERSION, tc=tc, torch=torch, python_tag="cp311",
                       sources={"sdist_sha256": SDIST, "origin": "deepspeed==0.18.9", "version": "0.18.9",
                                "patches": [PATCH], **sources},
                       extensions=[{"module": "deepspeed.ops.adam.fused_adam_op", "sha256": "e" * 64,
                                    "path": "deepspeed/ops/adam/fused_adam_op.cpython-311-x86_64-linux-gnu.so",
                                    "op": "fused_adam", "archs": ["gfx90a", "gfx942"]}],
                       ops=[{"name": "fused_adam", "status": "built", "seconds": 3.0}])
    return carried(m)


def _manifest(**sources: Any) -> dict[str, Any]:
    return dict(json.loads(_carried(**sources)))


def _doc(manifest: dict[str, Any] | None = None, epoch: int = 315532800) -> bytes:
    return sbom.document(manifest or _manifest(), name="deepspeed", version=VERSION, epoch=epoch)


def _validate(data: bytes) -> None:
    pytest.importorskip("jsonschema")
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode())
    assert error is None, str(error)[:2000]


def _props(component: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in component.get("properties", [])}


def test_the_document_is_valid_cyclonedx() -> None:
    data = _doc()
    _validate(data)
    doc = json.loads(data)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == sbom.SPEC
    assert doc["metadata"]["timestamp"].startswith("1980-01-01T00:00:00")


def test_it_names_the_source_patches_toolchain_archs_torch_and_porter() -> None:
    doc = json.loads(_doc())
    wheel = doc["metadata"]["component"]
    assert (wheel["name"], wheel["version"]) == ("deepspeed", VERSION)
    assert wheel["purl"] == "pkg:pypi/deepspeed@0.18.9%2Brocm5.7.gfx90a.gfx942"
    source = wheel["pedigree"]["ancestors"][0]
    assert (source["name"], source["version"]) == ("deepspeed", "0.18.9")
    assert source["hashes"] == [{"alg": "SHA-256", "content": SDIST}]
    assert _props(source)["porter:source:origin"] == "deepspeed==0.18.9"
    [patch] = wheel["pedigree"]["patches"]
    assert patch["type"] == "unofficial"
    assert patch["resolves"][0]["id"] == "deepspeed/rocm-sources/hip-arch"
    assert patch["resolves"][0]["description"] == PATCH["why"]
    props = _props(wheel)
    assert props["porter:patch:deepspeed/rocm-sources/hip-arch:sha256"] == "b" * 64
    assert props["porter:patch:deepspeed/rocm-sources/hip-arch:file:op_builder/builder.py"] == \
        f"{'c' * 64} -> {'d' * 64}"
    assert props["porter:target:archs"] == "gfx90a,gfx942" and props["porter:target:wavefront"] == "64"
    assert props["porter:target:cpu_isa"] == "x86-64-v2" and props["porter:target:toolkit_version"] == "5.7"
    tools = {t["bom-ref"]: t for t in doc["metadata"]["tools"]["components"]}
    assert tools["tool:porter"]["name"] == "porter" and tools["tool:porter"]["version"]
    assert tools["tool:compiler"]["name"] == "hipcc"
    assert _props(tools["tool:compiler"])["porter:toolchain:name"] == "debian-trixie-rocm"
    assert (tools["tool:toolkit"]["name"], tools["tool:toolkit"]["version"]) == ("ROCm", "5.7")
    [torch] = [c for c in doc["components"] if c["bom-ref"] == "torch"]
    assert torch["version"] == "2.13.0+rocm6.2"
    assert _props(torch)["porter:torch:cxx11_abi"] == "false" and _props(torch)["porter:torch:hip"] == "6.2.41133"
    assert {"ref": "wheel", "dependsOn": ["torch"]} in doc["dependencies"]
    [so] = wheel["components"]
    assert so["hashes"] == [{"alg": "SHA-256", "content": "e" * 64}] and so["name"].endswith(".so")


def test_a_git_source_and_unknown_patches_are_said_as_such() -> None:
    m = _manifest(git_commit="a" * 40)
    del m["sources"]["sdist_sha256"], m["sources"]["patches"]
    data = _doc(m)
    _validate(data)
    wheel = json.loads(data)["metadata"]["component"]
    assert wheel["pedigree"]["ancestors"][0]["pedigree"]["commits"] == [{"uid": "a" * 40}]
    assert "patches" not in wheel["pedigree"] and "did not record" in wheel["pedigree"]["notes"]
    words = sbom.describe(json.loads(data))
    assert any(line.startswith("patches: unknown") for line in words)
    assert any(f"git commit {'a' * 40}" in line for line in words)


def test_the_same_manifest_gives_the_same_bytes() -> None:
    one, two = _doc(), _doc()
    assert one == two
    serial = uuid.UUID(json.loads(one)["serialNumber"].removeprefix("urn:uuid:"))
    assert serial.version == 5
    other = _manifest(origin="deepspeed-0.18.9.tar.gz")
    assert json.loads(_doc(other))["serialNumber"] != json.loads(one)["serialNumber"]


def _record(zf: zipfile.ZipFile) -> dict[str, tuple[str, str]]:
    info = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
    rows = [line.rsplit(",", 2) for line in zf.read(info).decode().splitlines()]
    return {name: (digest, size) for name, digest, size in rows}


def test_every_wheel_with_a_manifest_carries_its_sbom_in_record(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    files = {"deepspeed/__init__.py": b"", "{dist_info}/porter.json": _carried()}
    one = write_wheel(tmp_path / "one", WheelSpec("deepspeed", VERSION, CP), files)
    two = write_wheel(tmp_path / "two", WheelSpec("deepspeed", VERSION, CP), files)
    assert one.read_bytes() == two.read_bytes()
    name = f"deepspeed-{VERSION}.dist-info/sboms/porter.cdx.json"
    with zipfile.ZipFile(one) as zf:
        data = zf.read(name)
        digest, size = _record(zf)[name]
    assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert size == str(len(data))
    _validate(data)
    doc = json.loads(data)
    assert doc["metadata"]["timestamp"].startswith("2023-11-14T22:13:20")
    assert doc["metadata"]["component"]["version"] == VERSION
    assert sbom.read_sbom(one) == doc


def test_a_wheel_without_a_manifest_gets_none(tmp_path: Path) -> None:
    out = write_wheel(tmp_path, WheelSpec("plain", "1.0", "py3-none-any", purelib=True), {"plain/__init__.py": b""})
    with zipfile.ZipFile(out) as zf:
        assert not [n for n in zf.namelist() if "/sboms/" in n]
    with pytest.raises(ConfigError, match="carries no porter SBOM"):
        sbom.read_sbom(out)


def test_rewrite_never_carries_a_stale_sbom(tmp_path: Path) -> None:
    old = write_wheel(tmp_path / "old", WheelSpec("deepspeed", "0.18.9", CP),
                      {"deepspeed/__init__.py": b"", "{dist_info}/porter.json": _carried()})
    assert sbom.read_sbom(old)["metadata"]["component"]["version"] == "0.18.9"
    bare = rewrite_wheel(old, tmp_path / "bare", version="0.18.9+cpu", tag=CP)
    with zipfile.ZipFile(bare) as zf:
        names = zf.namelist()
    assert "deepspeed-0.18.9+cpu.dist-info/porter.json" in names
    # the carried manifest came along, so the SBOM is made anew for the new version, never copied
    assert sbom.read_sbom(bare)["metadata"]["component"]["version"] == "0.18.9+cpu"
    m = _manifest()
    m["version"] = "0.18.9+rocm5.7.gfx942"
    new = rewrite_wheel(old, tmp_path / "new", version="0.18.9+rocm5.7.gfx942", tag=CP,
                        add={"{dist_info}/porter.json": json.dumps(m).encode()})
    assert sbom.read_sbom(new)["metadata"]["component"]["version"] == "0.18.9+rocm5.7.gfx942"


_SET = """
[set]
description = "test"
[[patch]]
id = "wave"
why = "a warp is 64 lanes here"
files = ["k.cu"]
[[patch.edit]]
action = "replace"
anchor = "WARP = 32"
text = "WARP = 64"
[[patch]]
id = "absent"
why = "a problem this tree lacks"
files = ["k.cu"]
needed_if = {regex = "cudaDeviceScheduleYield"}
[[patch.edit]]
action = "delete"
anchor = "cudaDeviceScheduleYield"
"""


def test_a_plan_records_each_applied_patch_with_its_files(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    before = b"int WARP = 32;\n"
    (tree / "k.cu").write_bytes(before)
    pset = parse_set(_SET, project="p", name="n", where="p/n.toml", base=None)
    [record] = plan(tree, [pset]).records()
    after = b"int WARP = 64;\n"
    assert record == {"set": "p/n", "id": "wave", "sha256": pset.patches[0].digest, "why": "a warp is 64 lanes here",
                      "state": "applied", "files": [{"path": "k.cu", "before": hashlib.sha256(before).hexdigest(),
                                                     "after": hashlib.sha256(after).hexdigest()}]}
    assert pset.patches[0].digest != pset.patches[1].digest
    apply(tree, [pset])
    assert (tree / "k.cu").read_bytes() == after
    # applied earlier (the tree's journal says so): still listed, its files not known per patch
    assert plan(tree, [pset]).records() == [{"set": "p/n", "id": "wave", "sha256": pset.patches[0].digest,
                                             "why": "a warp is 64 lanes here", "state": "applied-earlier"}]


def test_porter_sbom_says_it_in_words(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path, WheelSpec("deepspeed", VERSION, CP),
                        {"{dist_info}/porter.json": _carried()})
    out = CliRunner().invoke(cli, ["sbom", str(wheel)], obj=Logger())
    assert out.exit_code == 0, out.output
    text = out.output
    assert f"source: deepspeed 0.18.9 from deepspeed==0.18.9; sdist sha256 {SDIST}" in text
    assert "patch: deepspeed/rocm-sources/hip-arch: the arch list is CUDA's" in text
    assert "toolchain: debian-trixie-rocm (rocm): compiler hipcc" in text and "toolkit: ROCm 5.7" in text
    assert "archs gfx90a,gfx942, wavefront 64, cpu_isa x86-64-v2" in text
    assert "torch: 2.13.0+rocm6.2 (rocm, HIP 6.2.41133, C++11 ABI no)" in text
    as_json = CliRunner().invoke(cli, ["sbom", "--json", str(wheel)], obj=Logger())
    assert json.loads(as_json.output) == sbom.read_sbom(wheel)


def test_deepspeed_lists_the_patches_made_to_the_wheels_own_files(tmp_path: Path) -> None:
    from porter.artifacts.wheelfile import read_wheel
    from porter.components.deepspeed.wheel import guarded
    from tests.unit.test_ds_no_compiler import BUILDER, base_wheel, porter_wheel

    base = base_wheel(tmp_path)
    records = guarded(read_wheel(base).files)[1]
    assert records and {r["set"] for r in records} == {"deepspeed/no-jit"}
    assert all(r["applied_to"] == "wheel" and r["state"] == "applied" for r in records)
    out = porter_wheel(tmp_path, base, {})
    changed = [f for r in records for f in r["files"] if f["path"] == BUILDER]
    assert changed[0]["before"] == hashlib.sha256(read_wheel(base).files[BUILDER]).hexdigest()
    assert changed[-1]["after"] == hashlib.sha256(read_wheel(out).files[BUILDER]).hexdigest()


def test_an_images_combined_sbom_keeps_each_wheel_apart() -> None:
    """porter image's SBOM: the image the subject, each installed wheel a component with its own parts under
    references prefixed by its name (two wheels with the same torch stay two), schema-valid, the same bytes for
    the same wheels in any order."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    from porter.artifacts.sbom import image_document

    a, b = ("deepspeed", "0.19.8+cpu", _manifest(), "pypi"), ("megatron-fused-kernels", "0.2.0", _manifest(), "pypi")
    doc = image_document([a, b], name="node", epoch=315532800)
    assert doc == image_document([b, a], name="node", epoch=315532800)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(doc.decode()) is None
    bom = json.loads(doc)
    assert bom["metadata"]["component"]["bom-ref"] == "image"
    refs = [c["bom-ref"] for c in bom["components"]]
    assert len(refs) == len(set(refs)) and {"deepspeed/wheel", "megatron-fused-kernels/wheel"} <= set(refs)
    image_deps = next(d for d in bom["dependencies"] if d["ref"] == "image")
    assert sorted(d for d in image_deps["dependsOn"]) == ["deepspeed/wheel", "megatron-fused-kernels/wheel"]


def test_an_images_network_plugin_is_a_generic_package_beside_its_wheels() -> None:
    from porter.artifacts.sbom import image_document

    doc = image_document([("deepspeed", "0.19.8+cpu", _manifest(), "pypi"), ("aws-ofi-nccl", "1.19.2", _manifest(),
                                                                            "generic")], name="node", epoch=315532800)
    _validate(doc)
    bom = json.loads(doc)
    wheel, plugin = (next(c for c in bom["components"] if c["bom-ref"] == f"{n}/wheel")
                     for n in ("deepspeed", "aws-ofi-nccl"))
    assert wheel["purl"].startswith("pkg:pypi/deepspeed@") and plugin["purl"] == "pkg:generic/aws-ofi-nccl@1.19.2"
    image_deps = next(d for d in bom["dependencies"] if d["ref"] == "image")
    assert sorted(image_deps["dependsOn"]) == ["aws-ofi-nccl/wheel", "deepspeed/wheel"]
