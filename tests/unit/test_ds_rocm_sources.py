"""The sets a project's manifest names for a toolchain kind (DeepSpeed: rocm-sources) and porter's patched copy of
a source: the source stays as it was, the copy is published once and reused, a set that cannot apply is a
warning and the source as it is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ops_prebuild.source import Source, build_sets, patched_source
from porter.errors import ConfigError
from porter.patching import load_project, load_shipped, plan
from porter.patching.model import parse_set
from tests.conftest import FIXTURES

PATCHES = {"bf16-float-broadcast", "bf16-integer-conversions", "bf16-raw-max-init", "bf16-to-integer", "dc-symm-mem-header", "fp-quantizer-template-shadow", "fp6-linear-bindings-nvidia-only",
           "fp6-linear-nvidia-only", "hipblas-v2-datatype"}


def _tree(tmp_path: Path) -> Source:
    tree = tmp_path / "ds"
    shutil.copytree(FIXTURES / "ds-rocm-units", tree)
    return Source("deepspeed", "0.1.0", tree, str(tree))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_deepspeed_names_rocm_sources_for_rocm_and_emulated_builds_only() -> None:
    """The emulated HIP target builds what a ROCm build builds, so the same sources."""
    assert load_project("deepspeed").build == {"rocm": ("rocm-sources",), "emulated": ("rocm-sources",)}
    assert [s.ref for s in build_sets("deepspeed", "rocm")] == ["deepspeed/rocm-sources"]
    assert [s.ref for s in build_sets("deepspeed", "emulated")] == ["deepspeed/rocm-sources"]
    assert build_sets("deepspeed", "cpu") == [] and build_sets("deepspeed", "cuda") == []
    assert build_sets("no-such-project", "rocm") == []


def test_every_patch_of_rocm_sources_is_needed_in_the_fixture_and_converges(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    sets = [load_shipped("deepspeed", "rocm-sources")]
    first = plan(src.tree, sets)
    assert not first.failed
    assert {r.patch for s in first.sets for r in s.results if r.status == "would-apply"} == PATCHES
    for change in first.changes:  # write the plan, then plan again: nothing left to do
        (src.tree / change.path).write_bytes(change.after or b"")
    again = plan(src.tree, sets)
    assert not again.failed and not [c for c in again.changes if c.after != c.before]
    text = (src.tree / "csrc/fp_quantizer/fp_quantize_impl.cu").read_text()
    assert text.count("int q_exponent_bits_arg = 4>") == 2 and "q_mantisa_bits + q_exponent_bits_arg + 1" in text
    blas = (src.tree / "deepspeed/inference/v2/kernels/core_ops/blas_kernels/blas_utils.h").read_text()
    assert "HIPBLAS_R_32F;" not in blas.split("#elif defined(__HIP_PLATFORM_AMD__)")[0].split("typedef hipDataType")[1]


def test_patched_copy_leaves_the_source_alone_and_is_reused(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    before = _files(src.tree)
    cache = tmp_path / "cache"
    sets = build_sets("deepspeed", "rocm")
    done = patched_source(src, sets, cache)
    assert not done.warning and done.source.tree != src.tree and done.source.tree.parent == cache / "sources"
    assert done.applied == ("deepspeed/rocm-sources: " + ", ".join(sorted(PATCHES)),)
    assert _files(src.tree) == before
    copy = done.source.tree
    assert "porter_blas_datatype_t" in (copy / "deepspeed/inference/v2/kernels/core_ops/blas_kernels/blas_utils.h").read_text()
    # an unchanged file is the source's own (linked), a patched one is a file of its own
    assert (copy / "csrc/bf16_scale/bf16_scale.cpp").stat().st_ino == (src.tree / "csrc/bf16_scale/bf16_scale.cpp").stat().st_ino
    assert (copy / "op_builder/fp_quantizer.py").samefile(src.tree / "op_builder/fp_quantizer.py")
    assert not (copy / "csrc/includes/conversion_utils.h").samefile(src.tree / "csrc/includes/conversion_utils.h")
    stamp = (copy / ".porter-patched").stat().st_mtime_ns
    assert patched_source(src, sets, cache).source.tree == copy and (copy / ".porter-patched").stat().st_mtime_ns == stamp
    # a dry run names the copy and writes nothing
    dry = patched_source(src, sets, tmp_path / "other-cache", write=False)
    assert dry.applied == done.applied and not (tmp_path / "other-cache").exists()


def test_a_set_that_cannot_apply_is_a_warning_and_the_source_as_it_is(tmp_path: Path) -> None:
    src = _tree(tmp_path)
    drifted = parse_set("""
[set]
description = "anchors on a line this tree does not have"
[[patch]]
id = "drifted"
why = "test"
files = ["csrc/includes/conversion_utils.h"]
needed_if = '__ll2bfloat16_rn'
[[patch.edit]]
action = "replace"
anchor = "a line that is not there"
text = "x"
""", project="deepspeed", name="drifted", where="test", base=None)
    done = patched_source(src, [drifted], tmp_path / "cache")
    assert done.source == src and not done.applied
    assert "cannot be applied" in done.warning and "a line that is not there" in done.warning
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_no_set_no_copy(tmp_path: Path, kind: str) -> None:
    src = _tree(tmp_path)
    assert patched_source(src, build_sets("deepspeed", kind), tmp_path / "cache").source == src


def test_outputs_whose_content_changed_since_recorded_are_discarded(tmp_path: Path) -> None:
    from ops_prebuild.build import OUTPUTS_RECORD, check_outputs, record_outputs

    build = tmp_path / "build"
    (build / "op").mkdir(parents=True)
    so, obj, other = build / "op" / "op.so", build / "op" / "a.o", build / "op" / "b.o"
    for p in (so, obj, other):
        p.write_bytes(p.name.encode() * 1000)
    outputs = [str(so), str(obj), str(other), str(build / "op" / "never-built.o")]
    record_outputs(build, outputs)
    assert set(json.loads((build / OUTPUTS_RECORD).read_text())) == {"op/op.so", "op/a.o", "op/b.o"}
    assert check_outputs(build, outputs) == []  # all as recorded: kept
    so.write_bytes(so.read_bytes()[:1000])  # truncated
    obj.write_bytes(b"x" * obj.stat().st_size)  # same size, other bytes
    assert check_outputs(build, outputs) == ["op/a.o", "op/op.so"]
    assert not so.exists() and not obj.exists() and other.exists()
    assert set(json.loads((build / OUTPUTS_RECORD).read_text())) == {"op/b.o"}
    (build / OUTPUTS_RECORD).write_text("{garbled")
    assert check_outputs(build, outputs) == [f"{OUTPUTS_RECORD} (unreadable)", "op/b.o"]
    assert not other.exists() and not (build / OUTPUTS_RECORD).exists()
    assert check_outputs(build, outputs) == []  # no record: nothing to vouch for, nothing to discard


def test_one_resolver_for_every_project_a_folder_an_sdist_and_a_requirement(tmp_path: Path) -> None:
    """DeepSpeed's builds and the setup.py-driven wheels (APEX, FlashAttention) read their source through
    ops_prebuild.source.fetch_tree: a folder as it is (its git commit read from .git), an sdist unpacked once
    into the cache, NAME==VERSION matched by the project's name however it is spelt."""
    import tarfile

    from ops_prebuild.source import _requirement, fetch_tree
    from porter.run import Runner

    tree = tmp_path / "flash-attention"
    (tree / ".git" / "refs" / "heads").mkdir(parents=True)
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tree / ".git" / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    (tree / "setup.py").write_text("# setup\n")
    got, provenance = fetch_tree(str(tree), cache=tmp_path / "cache", runner=Runner(), hint="h")
    assert got == tree.resolve() and provenance == {"git_commit": "a" * 40}
    sdist = tmp_path / "flash_attn-2.8.3.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(tree / "setup.py", arcname="flash_attn-2.8.3/setup.py")
    first, prov = fetch_tree(str(sdist), cache=tmp_path / "cache", runner=Runner(), hint="h")
    assert first.parent == tmp_path / "cache" / "sources" and (first / "setup.py").read_text() == "# setup\n"
    assert prov["sdist"] == sdist.name and len(prov["sdist_sha256"]) == 64
    assert fetch_tree(str(sdist), cache=tmp_path / "cache", runner=Runner(), hint="h")[0] == first  # reused
    assert _requirement("flash-attn", "flash_attn==2.8.3") == ("flash_attn", "2.8.3")
    assert _requirement("flash-attn", "Flash.Attn==2.8.3.post2") == ("Flash.Attn", "2.8.3.post2")
    assert _requirement("deepspeed", "flash-attn==2.8.3") is None and _requirement(None, "apex==1.8.0")
    with pytest.raises(ConfigError, match="source not found") as err:
        fetch_tree(str(tmp_path / "nope"), cache=tmp_path / "cache", runner=Runner(), hint="the hint")
    assert err.value.hint == "the hint"


def test_an_unpacked_source_that_lost_a_file_is_unpacked_again_with_a_note(tmp_path: Path) -> None:
    """Issue 22: a cache entry whose files no longer match its record (a file deleted or truncated since, by a
    crash, a full disk, a clean-up) is not reused as it is: it is unpacked again, and the build says so."""
    import io
    import tarfile

    from ops_prebuild.source import fetch_tree
    from porter.log import Logger
    from porter.run import Runner

    sdist = tmp_path / "deepspeed-0.1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for name, data in (("setup.py", b"# setup\n"), ("csrc/a.cpp", b"int a;\n" * 100)):
            info = tarfile.TarInfo(f"deepspeed-0.1.0/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    said = io.StringIO()
    runner = Runner(Logger(stream=said, color=False))
    tree, _ = fetch_tree(str(sdist), cache=tmp_path / "cache", runner=runner, hint="h")
    (tree / "csrc" / "a.cpp").unlink()
    again, _ = fetch_tree(str(sdist), cache=tmp_path / "cache", runner=runner, hint="h")
    assert again == tree and (tree / "csrc" / "a.cpp").read_bytes() == b"int a;\n" * 100
    assert "lost or changed 1 file(s)" in said.getvalue() and "csrc/a.cpp" in said.getvalue()
    (tree / "setup.py").write_bytes(b"#")  # truncated
    fetch_tree(str(sdist), cache=tmp_path / "cache", runner=runner, hint="h")
    assert (tree / "setup.py").read_bytes() == b"# setup\n"
    (tree / ".porter-unpacked").write_text("{garbled")
    fetch_tree(str(sdist), cache=tmp_path / "cache", runner=runner, hint="h")
    assert "unreadable record" in said.getvalue() and (tree / "csrc" / "a.cpp").is_file()
    quiet = io.StringIO()
    fetch_tree(str(sdist), cache=tmp_path / "cache", runner=Runner(Logger(stream=quiet, color=False)), hint="h")
    assert quiet.getvalue() == ""  # whole again: reused without a word
