"""``porter port``'s patch step on fork stand-ins, with no subprocess (a cuda profile does not hipify;
--no-kernels builds nothing): per-patch summary, --set / --skip, the note for a tree without a version
file, atomic output; and the dataset helpers as one more host-only op of the kernels wheel."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from ops_prebuild.build import OpResult
from porter.cli.port import summary_lines
from porter.errors import ConfigError
from porter.fs import sha256_file
from porter.patching import read_journal
from porter.patching.engine import PatchFailed
from porter.components.megatron import PATCH_PROJECT
from porter.components.megatron.port import HELPERS_OP, package_kernels, port_megatron, prebuilt_ops
from porter.port import patch_sets
from porter.toolchain.profile import load_toolchain
from tests.unit.test_port import torch_info

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TRAINING = FIXTURES / "training" / "megatron-deepspeed"


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def copy(tmp_path: Path, src: Path, name: str = "tree") -> Path:
    dest = tmp_path / name
    shutil.copytree(src, dest)
    return dest


def states(res: object) -> dict[str, str]:
    return {p.patch: p.state for p in res.patches}  # type: ignore[attr-defined]


@pytest.mark.parametrize("fork, not_needed", [
    ("megatron-no-rmsnorm", {"apex-rmsnorm-clear-error"}),
    ("megatron-no-package-info", set()),
])
def test_port_fork_applies_what_it_needs_and_says_the_rest_is_not_needed(tmp_path: Path, fork: str,
                                                                         not_needed: set[str]) -> None:
    tree = copy(tmp_path, FIXTURES / "patch-forks" / fork)
    original = snapshot(tree)
    res = port_megatron(tree, load_toolchain("cuda-h100"), out=tmp_path / "out", kernels=False)
    st = states(res)
    assert st["fused-kernels-prebuilt"] == "applied" and st["apex-layer-norm-clear-error"] == "applied"
    # the fork stand-ins have no optimizer / data / vision files, nor the older generation's layer norm or the older forks' softmax: those
    # patches are not needed there
    absent = {"apex-multi-tensor-clear-error", "apex-optimizers-clear-error", "apex-vision-clear-error",
              "dataset-helpers-module", "dataset-helpers-prebuilt", "layer-norm-wave-size", "softmax-short-keys"}
    assert {p for p, s in st.items() if s == "not-needed"} == not_needed | absent
    assert snapshot(tree) == original and (tmp_path / "out" / ".porter/port.json").is_file()
    lines = "\n".join(summary_lines(res.patches))
    assert "patches (megatron-deepspeed/rocm):" in lines
    assert "  applied      fused-kernels-prebuilt" in lines
    if fork == "megatron-no-package-info":
        assert res.version == ""
        (note,) = res.notes
        assert note.startswith("the tree has no megatron/core/package_info.py, so its Megatron version is unknown")
        assert "fused_kernels" not in note
    else:
        assert res.notes == [] and "  not needed   apex-rmsnorm-clear-error" in lines


def test_port_fork_without_hcc_guard_reports_per_file(tmp_path: Path) -> None:
    tree = copy(tmp_path, FIXTURES / "patch-forks" / "megatron-no-hcc-guard")
    res = port_megatron(tree, load_toolchain("cuda-h100"), out=tmp_path / "out", kernels=False)
    (hcc,) = [p for p in res.patches if p.patch == "hip-platform-amd"]
    assert hcc.state == "applied"
    assert dict((f, s) for f, s, _ in hcc.files)["megatron/fused_kernels/scaled_softmax_cuda.cu"] == "not-needed"
    line = next(l for l in summary_lines(res.patches) if "hip-platform-amd" in l)
    assert "scaled_softmax_cuda.cu: not needed" in line and "scaled_masked_softmax_cuda.cu: applied" in line


def test_port_skip_leaves_a_patch_out_and_the_journal_knows(tmp_path: Path) -> None:
    tree = copy(tmp_path, TRAINING)
    out = tmp_path / "out"
    res = port_megatron(tree, load_toolchain("cuda-h100"), out=out, kernels=False,
                        skip=["apex-vision-clear-error"])
    assert states(res)["apex-vision-clear-error"] == "skipped"
    assert "import apex\n" in (out / "megatron/model/vision/vit_backbone.py").read_text()
    entry = read_journal(out)["sets"][0]
    assert "apex-vision-clear-error" not in entry["patches"] + entry["not_needed"]
    assert any("(--skip)" in l for l in summary_lines(res.patches))
    # a later port without --skip applies the left-out patch on top (the journal holds another digest)
    again = port_megatron(tree, load_toolchain("cuda-h100"), out=out, kernels=False)
    assert states(again)["apex-vision-clear-error"] == "applied"
    assert "porter: apex is required by the vision models" in (out / "megatron/model/vision/vit_backbone.py").read_text()


def test_set_and_skip_are_checked() -> None:
    with pytest.raises(ConfigError, match="--skip nope: no such patch in megatron-deepspeed/rocm"):
        patch_sets([], ["nope"], project=PATCH_PROJECT)
    some = patch_sets(["megatron-deepspeed/rocm"], ["hip-platform-amd"], project=PATCH_PROJECT)
    assert some.skipped == {"megatron-deepspeed/rocm": ["hip-platform-amd"]}
    whole = patch_sets(project=PATCH_PROJECT).sets
    assert some.sets[0].digest != whole[0].digest and len(some.sets[0].patches) == len(whole[0].patches) - 1


def test_failed_patch_stops_the_port_and_leaves_out_alone(tmp_path: Path) -> None:
    tree = copy(tmp_path, TRAINING)
    init = tree / "megatron/model/__init__.py"  # the problem is there, the anchored line is not
    init.write_text(init.read_text().replace("    from apex.normalization import MixedFusedRMSNorm as RMSNorm",
                                             "    if True:\n        from apex.normalization import MixedFusedRMSNorm"
                                             " as RMSNorm"))
    out = tmp_path / "out"
    with pytest.raises(PatchFailed) as err:
        port_megatron(tree, load_toolchain("cuda-h100"), out=out, kernels=False)
    msg = err.value.message
    assert f"the port stops before writing anything ({out} is as it was)" in msg
    assert "  FAILED       megatron-deepspeed/rocm: apex-rmsnorm-clear-error" in msg
    assert "  would apply  megatron-deepspeed/rocm: fused-kernels-prebuilt" in msg
    assert "--skip PATCH" in (err.value.hint or "")
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_helpers_are_a_host_only_op_for_every_profile(tmp_path: Path) -> None:
    tree = copy(tmp_path, TRAINING)
    assert [o.name for o in prebuilt_ops(load_toolchain("cpu"), tree)] == [HELPERS_OP]
    rocm = prebuilt_ops(load_toolchain("frontier"), tree)
    assert [o.name for o in rocm][-1] == HELPERS_OP and len(rocm) == 4
    op = rocm[-1]
    assert not op.device and op.module == "megatron_fused_kernels.helpers" and op.leaf == "helpers"
    assert op.sources == ("megatron/data/helpers.cpp",) and "-Wl,--as-needed" in op.extra_ldflags
    assert [o.name for o in prebuilt_ops(load_toolchain("cpu"), FIXTURES / "patch" / "megatron-deepspeed")] == []


def test_cpu_profile_without_helpers_is_refused(tmp_path: Path) -> None:
    tree = copy(tmp_path, FIXTURES / "patch" / "megatron-deepspeed")
    with pytest.raises(ConfigError, match="GPU code"):
        port_megatron(tree, load_toolchain("cpu"), wheelhouse=tmp_path / "wh")


def test_package_puts_helpers_in_a_package_and_marks_them_host_only(tmp_path: Path) -> None:
    tc = load_toolchain("frontier")
    tree = copy(tmp_path, TRAINING)
    specs = {o.name: o for o in prebuilt_ops(tc, tree)}
    ops = []
    for name in ("scaled_softmax_cuda", HELPERS_OP):
        leaf = specs[name].leaf
        so = tmp_path / f"{leaf}.cpython-311-x86_64-linux-gnu.so"
        so.write_bytes(b"\x7fELF stand-in " + name.encode())
        ops.append(OpResult(name, "built", 1.0, "log", str(so), sha256_file(so)))
    house = tmp_path / "wh"
    wheel, manifest = package_kernels(ops, tc, torch_info(tmp_path), "0.2.0", house, source=str(tree), specs=specs)
    entries = {e["op"]: e for e in json.loads(manifest.read_text())["extensions"]}
    assert entries[HELPERS_OP]["path"] == "megatron_fused_kernels/helpers.cpython-311-x86_64-linux-gnu.so"
    assert entries[HELPERS_OP]["host_only"] is True and entries[HELPERS_OP]["archs"] == []
    assert entries["scaled_softmax_cuda"]["path"] == "scaled_softmax_cuda.cpython-311-x86_64-linux-gnu.so"
    assert "host_only" not in entries["scaled_softmax_cuda"]
    with zipfile.ZipFile(wheel) as zf:
        assert "megatron_fused_kernels/__init__.py" in zf.namelist()


def test_in_place_and_dest_are_named_as_the_command_names_them(tmp_path: Path) -> None:
    """port's -o is the wheelhouse; the ported tree's folder is --dest, and the messages say so."""
    from porter.port import PORT_RECORD, destination

    tree = tmp_path / "tree"
    tree.mkdir()
    with pytest.raises(ConfigError, match="--in-place and --dest exclude each other"):
        destination(tree.resolve(), tmp_path / "elsewhere", True, "x")
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigError) as exc:
        destination(tree.resolve(), tmp_path / "taken", False, "x")
    assert "--dest" in (exc.value.hint or "") and "-o" not in (exc.value.hint or "")
    (tmp_path / "taken" / PORT_RECORD).parent.mkdir(parents=True)
    (tmp_path / "taken" / PORT_RECORD).write_text("{}")
    assert destination(tree.resolve(), tmp_path / "taken", False, "x") == (tmp_path / "taken").resolve()
