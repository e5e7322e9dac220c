"""ROCm for real: DeepSpeed ops and Megatron-style kernels compiled for gfx90a, gfx942 and gfx950 with
ROCm 7.2 (the sid/experimental chroot), compile-only: a CPU torch's headers seen through porter's HIP
view, every object checked for its code objects. Nothing is linked (no ROCm torch exists here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porter.codeobjects import archs_in
from tests.conftest import FIXTURES
from tests.integration.conftest import run_porter

pytestmark = [pytest.mark.integration, pytest.mark.rocm7, pytest.mark.slow]
ARCHS = ["gfx90a", "gfx942", "gfx950"]


def test_deepspeed_op_compiles_for_three_archs(rocm7: Path, deepspeed_sdist: Path) -> None:
    """One op of the real sdist (fused_adam: a host binding and a kernel unit), each arch's code object found in
    the object. The gauntlet compiles every op of four releases (docs/real-trees.md)."""
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "debian-rocm7", "--ops",
                     "fused_adam", "--compile-only", "--json", env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    assert doc["compile_only"] and not doc["linked"] and "compiled, not linked" in doc["note"]
    assert doc["hip_view"] and doc["wheel"] is None and doc["plan"]["outputs"] == {}
    assert doc["cache"] is None and "ccache" not in " ".join(doc["plan"]["steps"][0]["argv"])  # real costs only
    assert [r["name"] for r in doc["compiled"]] == ["fused_adam"]
    for rec in doc["compiled"]:
        assert rec["archs"] == {a: "compiled" for a in ARCHS}, rec
        device = [t for t in rec["tus"] if "code_objects" in t]
        assert device, rec["tus"]
        for tu in rec["tus"]:
            assert tu["seconds"] > 0 and tu["peak_rss_mib"] > 50 and tu["returncode"] == 0
        for tu in device:  # compiled in parts: the host part, then one device part (an offload bundle) per arch
            assert tu["code_objects"] == ARCHS and sorted(tu["objects"]) == ARCHS
            assert all(archs_in(path) == [arch] for arch, path in tu["objects"].items()), tu
    steps = doc["plan"]["steps"]
    assert all(s["kind"] == "compile" and s["argv"][:2] == ["chroot", str(rocm7)] for s in steps)
    kernel = next(s["argv"] for s in steps if s.get("arch") == "gfx950")
    assert "-DBF16_AVAILABLE" in kernel and "-DROCM_WAVEFRONT_SIZE=64" in kernel and "--offload-device-only" in kernel
    assert [a for a in kernel if a.startswith("--offload-arch=")] == ["--offload-arch=gfx950"]


def test_an_arch_a_kernel_has_no_variant_for_fails_alone(rocm7: Path, tmp_path: Path) -> None:
    """A compile-only kernel unit of several archs is compiled as its host part and one device part per arch. A unit
    with no gfx950 variant fails gfx950 alone: the op's other arch compiles, and so does its other unit, each part's
    bundle holding its arch. The rerun compiles only the part that failed (a stopped run keeps the archs it did)."""
    tree = tmp_path / "ds"
    shutil.copytree(FIXTURES / "ds-rocm-units", tree)
    argv = ("ops", "build", "--source", str(tree), "-t", "debian-rocm7", "--ops", "arch_guard", "--arch",
            "gfx90a,gfx950", "--compile-only", "--json")
    env = {"PORTER_ROCM7_ROOT": str(rocm7)}
    res = run_porter(*argv, env=env)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "arch_guard (gfx950):\n    " in res.stderr and "no gfx950 variant" in res.stderr, res.stderr[-3000:]
    (rec,) = json.loads(res.stdout)["compiled"]
    assert rec["status"] == "failed" and rec["archs"] == {"gfx90a": "compiled", "gfx950": "failed"}, rec
    tus = {Path(t["source"]).stem: t for t in rec["tus"]}
    assert sorted(tus) == ["guarded", "plain"], tus
    assert tus["plain"]["code_objects"] == ["gfx90a", "gfx950"] and tus["guarded"]["code_objects"] == ["gfx90a"]
    assert all(archs_in(path) == [arch] for arch, path in tus["plain"]["objects"].items())
    assert not Path(tus["guarded"]["objects"]["gfx950"]).exists()
    done = {p: Path(p).stat().st_mtime_ns for t in tus.values() for p in t["objects"].values() if Path(p).exists()}
    again = run_porter(*argv, env=env)
    assert again.returncode == 1 and json.loads(again.stdout)["compiled"][0]["archs"] == rec["archs"]
    assert {p: Path(p).stat().st_mtime_ns for p in done} == done  # the parts that compiled were not compiled again


def test_bf16_binding_and_kernel_free_unit_compile(rocm7: Path, tmp_path: Path) -> None:
    """Issue 18, seen on real DeepSpeed sdists: a GPU op's host binding that includes the bf16 header (ROCm 7.2's
    hip_bf16.h is clang-only) is compiled by the profile's hip_cxx, and an op whose units hold no kernel is
    host-only, not failed. One arch: which compiler takes the binding is the same for every arch (the three-arch
    verdicts are the DeepSpeed test's above)."""
    tree = tmp_path / "ds"
    shutil.copytree(FIXTURES / "ds-rocm-units", tree)
    res = run_porter("ops", "build", "--source", str(tree), "-t", "debian-rocm7", "--ops", "bf16_scale,host_buffer",
                     "--arch", "gfx942", "--compile-only", "--json", env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    recs = {r["name"]: r for r in doc["compiled"]}
    assert recs["bf16_scale"]["archs"] == {"gfx942": "compiled"}, recs["bf16_scale"]
    assert recs["host_buffer"]["archs"] == {"gfx942": "host-only"}, recs["host_buffer"]
    assert any(t.get("host_only") for t in recs["host_buffer"]["tus"])
    binding = next(s["argv"] for s in doc["plan"]["steps"] if s["output"].endswith("bf16_scale.cpp.o"))
    assert binding[2] == "clang++-22" and "-DBF16_AVAILABLE" in binding, binding
    # the same unit through GCC fails on ROCm 7.2's bf16 header: the ERROR names the op, its archs and the unit
    res = run_porter("ops", "build", "--source", str(tree), "-t", "debian-rocm7", "--ops", "bf16_scale", "--arch",
                     "gfx942", "--compile-only", env={"PORTER_ROCM7_ROOT": str(rocm7), "PORTER_HIP_CXX": "g++"})
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "bf16_scale (gfx942):\n    " in res.stderr and "bf16_scale_hip.cpp:" in res.stderr, res.stderr


def test_deepspeed_rocm7_source_problems_compile_through_porters_rocm_sources_set(rocm7: Path, tmp_path: Path) -> None:
    """Issue 18, seen on DeepSpeed 0.17.6-0.19.8 sdists: hipBLAS 1 data types (removed in ROCm 7), a template
    parameter redeclared as a local (clang rejects it), PTX-only FP6 linear kernels, integer -> bf16 intrinsics
    ROCm lacks, and two ops' include dirs holding a header of one name (hipify resolved it in the other op's dir).
    porter builds from its patched copy of the source (the tree untouched) and hipifies each op on its own."""
    tree = tmp_path / "ds"
    shutil.copytree(FIXTURES / "ds-rocm-units", tree)
    before = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    res = run_porter("ops", "build", "--source", str(tree), "-t", "debian-rocm7", "--ops", "fp_quantizer,inference_core_ops",
                     "--arch", "gfx942", "--compile-only", "--json", env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    recs = {r["name"]: r for r in doc["compiled"]}
    assert recs["fp_quantizer"]["archs"] == {"gfx942": "compiled"}, recs["fp_quantizer"]
    # the FP6 units are left out on ROCm: what remains is the binding unit (host code)
    assert recs["inference_core_ops"]["archs"] == {"gfx942": "host-only"}, recs["inference_core_ops"]
    assert not [s for s in doc["plan"]["steps"] if "cuda_linear" in s["output"]]
    assert doc["source_patches"] == ["deepspeed/rocm-sources: bf16-float-broadcast, bf16-integer-conversions, bf16-raw-max-init, bf16-to-integer, "
                                     "dc-symm-mem-header, fp-quantizer-template-shadow, "
                                     "fp6-linear-bindings-nvidia-only, fp6-linear-nvidia-only, hipblas-v2-datatype"]
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == before  # the source is never changed


def test_older_megatron_generation_ports_and_its_layer_norm_compiles(rocm7: Path, tmp_path: Path) -> None:
    """Issue 18: the BLOOM-era generation (fused layer norm + masked softmax, no scaled_softmax.cpp) was refused as
    'not a Megatron-DeepSpeed tree'. Now every kernel of it compiles, and the ported loader imports the prebuilt
    layer norm instead of building it at start-up. One arch here (the three-arch build is the newer generation's
    test above, and the gauntlet's rows of real trees of this generation)."""
    tree = tmp_path / "bloom"
    shutil.copytree(FIXTURES / "megatron-older", tree)
    res = run_porter("port", "megatron-deepspeed", str(tree), "-t", "debian-rocm7", "--arch", "gfx942",
                     "--compile-only", "--json", env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    recs = {r["name"]: r for r in doc["compiled"]}
    assert sorted(recs) == ["fused_mix_prec_layer_norm_cuda", "scaled_masked_softmax_cuda",
                            "scaled_upper_triang_masked_softmax_cuda"]
    for rec in recs.values():
        assert rec["archs"] == {"gfx942": "compiled"}, rec
    loader = (tmp_path / "bloom-debian-rocm7" / "megatron/fused_kernels/__init__.py").read_text()
    assert "_porter_load_prebuilt" in loader and '"fused_mix_prec_layer_norm_cuda", ""' in loader


def test_an_arch_the_compiler_rejects_stops_in_seconds(trixie: Path, deepspeed_sdist: Path) -> None:
    start = time.monotonic()
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "debian-trixie-rocm", "--arch",
                     "gfx90a,gfx950", "--ops", "fused_adam", "--compile-only", env={"PORTER_TRIXIE_ROOT": str(trixie)})
    assert res.returncode == 1 and time.monotonic() - start < 60
    assert "cannot compile for gfx950" in res.stderr and "hipcc 5.7." in res.stderr and "debian-rocm7" in res.stderr


def test_a_missing_chroot_names_its_make_target(tmp_path: Path, deepspeed_sdist: Path) -> None:
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "debian-rocm7", "--ops", "fused_adam",
                     "--compile-only", env={"PORTER_ROCM7_ROOT": str(tmp_path / "no-chroot")})
    assert res.returncode == 1 and "does not exist" in res.stderr and "make chroot-rocm7" in res.stderr


def test_cpu_ops_of_a_gpu_build_are_buildable_though_the_build_torch_is_cpu(rocm7: Path) -> None:
    """Issue 18, seen on DeepSpeed 0.16.9-0.18.9 compile-only rows: cpu_adam, cpu_adagrad, cpu_lion and dc were
    listed as excluded ("its builder raised when porter asked it"): on a GPU build their flags name ROCm's lib
    folder through torch's ROCM_HOME, which the CPU torch here leaves None. The probe gives it the toolchain's."""
    res = run_porter("ops", "list", "--source", str(FIXTURES / "ds-rocm-units"), "-t", "debian-rocm7", "--json",
                     env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr[-3000:]
    ops = {o["name"]: o for o in json.loads(res.stdout)["ops"]}
    assert ops["host_adam"]["compatible"] and not ops["host_adam"]["reason"], ops["host_adam"]


def test_an_openmp_cpu_op_of_a_gpu_build_compiles_with_the_gcc_torch_uses(rocm7: Path, tmp_path: Path) -> None:
    """Issue 18, seen on DeepSpeed 0.17.6 and 0.18.9: cpu_adam, cpu_adagrad and cpu_lion (-fopenmp, torch's
    extension header) went through the profile's clang, which finds no omp.h (torch's OpenMP is GCC's libgomp,
    LLVM's is not in the chroot). OpenMP host units of a GPU op are compiled by the profile's cxx."""
    tree = tmp_path / "ds"
    shutil.copytree(FIXTURES / "ds-rocm-units", tree)
    res = run_porter("ops", "build", "--source", str(tree), "-t", "debian-rocm7", "--ops", "host_adam",
                     "--arch", "gfx942", "--compile-only", "--json", env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    (rec,) = doc["compiled"]
    assert rec["name"] == "host_adam" and rec["archs"] == {"gfx942": "host-only"}, rec
    (step,) = doc["plan"]["steps"]
    assert step["argv"][2] == "g++" and "-fopenmp" in step["argv"], step["argv"]


def test_an_include_folder_of_the_toolchain_is_not_staged_from_the_host(rocm7: Path, tmp_path: Path) -> None:
    """Issue 18, seen on DeepSpeed 0.17.6 and 0.18.9 (dc): the builder adds ROCM_HOME/include, /usr/include for a
    ROCm under /usr. porter staged the host's /usr/include into the chroot, and its stdio.h shadowed the chroot's
    C library ("use of undeclared identifier 'L_tmpnam'"). The toolchain's own folders are its to search."""
    tree = tmp_path / "ds"
    shutil.copytree(FIXTURES / "ds-rocm-units", tree)
    res = run_porter("ops", "build", "--source", str(tree), "-t", "debian-rocm7", "--ops", "host_compile",
                     "--arch", "gfx942", "--compile-only", "--json", env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    (rec,) = doc["compiled"]
    assert rec["archs"] == {"gfx942": "host-only"}, rec
    (step,) = doc["plan"]["steps"]
    dirs = [a for a in step["argv"] if a.startswith("-I")] + [b for a, b in zip(step["argv"], step["argv"][1:])
                                                            if a == "-isystem"]
    assert dirs and not [d for d in dirs if (rocm7 / d.lstrip("/") / "stdio.h").exists()], dirs  # no C library
    # DeepSpeed 0.16's dc includes c10d/SymmetricMemory.hpp where torch 2.13 no longer has it: patched
    assert "dc-symm-mem-header" in doc["source_patches"][0], doc["source_patches"]


def test_flash_attn_frontend_compiles_with_the_header_beside_its_sources(rocm7: Path, tmp_path: Path) -> None:
    """Issue 18, seen on flash-attn 2.6.3-cktile and 2.8.3.post2: the extension's own sources include
    "flash_common.hpp", the header beside them (torch's CUDA headers inside, hipified with them). The work copy held
    only the sources porter renames to .cu, so every frontend unit failed with "'flash_common.hpp' file not found".
    One arch: the frontend holds no device code, and the CK instances' archs are the gauntlet's rows."""
    tree = tmp_path / "flash-attention"
    shutil.copytree(FIXTURES / "flash-attn-ck-frontend", tree)
    res = run_porter("wheel", "flash-attn", "--source", str(tree), "-t", "debian-rocm7", "--arch", "gfx942",
                     "--compile-only", "--drop-flag=-amdgpu-early-inline-all", "-o", str(tmp_path / "w"), "--json",
                     env={"PORTER_ROCM7_ROOT": str(rocm7)})
    assert res.returncode == 0, res.stderr[-4000:]
    doc = json.loads(res.stdout)
    recs = {r["name"]: r for r in doc["compiled"]}
    assert recs["flash_attn_2_cuda"]["status"] == "compiled", recs["flash_attn_2_cuda"]
    assert recs["flash_attn_2_cuda"]["archs"] == {"gfx942": "host-only"}  # dispatch only; kernels are instances'
    assert len(recs["flash_attn_2_cuda"]["tus"]) == 4  # flash_api, mha_fwd and the generated API dispatchers
    for instance in ("fmha_fwd_d64_fp16_batch_b64x64_fixture", "fmha_bwd_d64_fp16_batch_b64x64_fixture"):
        assert recs[instance]["archs"] == {"gfx942": "compiled"}, recs[instance]
    assert "upstream's flags left out (--drop-flag): -mllvm -amdgpu-early-inline-all=true" in " ".join(doc["notes"])
    assert doc["costs"] is None and doc["measured"] is None  # not upstream's compile: nothing sizes a real build
    argv = next(s["argv"] for s in doc["plan"]["steps"] if s["op"].startswith("fmha_bwd_d64"))
    assert "-amdgpu-function-calls=false" in argv and "-amdgpu-early-inline-all=true" not in argv


def test_two_trees_ported_at_once_into_same_named_folders_keep_their_own_kernels(rocm7: Path, tmp_path: Path) -> None:
    """#40 (faults): two ports of *different* Megatron-DeepSpeed trees at once through the ROCm 7.2 chroot, into
    destinations with the same folder name (every CI job's ``--dest ported``). Their kernels were staged under the
    cache by that name alone, with no lock: one removed the other's sources mid-compile, or compiled them into the
    other's build. Now the staging is named by what it holds and made under a lock: both ports succeed, and each
    one's objects carry its own tree's marker, never the other's. Each tree leaves out its scaled_softmax kernel
    and its upper-triangular kernel is a small one without torch's headers (the two kernels every generation has
    are what makes it a Megatron tree, so both stay): one kernel's compile of torch's headers per tree, the same race.

    Issue 18, on the same compiles: every real kernel failed with 'redefinition of OrderedDict' (torch's include
    folders staged as two copies). The fixture's kernels include <torch/extension.h> as the real ones do (a ROCm
    compile-only kernel costs about two minutes of CPU here: one is enough for a defect every kernel had). One
    arch, gfx942: the defect is the same for every arch, each arch costs a device parse of torch's headers per
    kernel, the three-arch verdicts are the DeepSpeed test's above, and the real trees' three-arch rows are the
    gauntlet's (docs/real-trees.md)."""
    procs = {}
    for side in ("a", "b"):
        tree = tmp_path / side / "Megatron-DeepSpeed"
        shutil.copytree(FIXTURES / "megatron-kernels", tree)
        for name in ("scaled_softmax.cpp", "scaled_softmax_cuda.cu"):
            (tree / "megatron/fused_kernels" / name).unlink()
        kernels = tree / "megatron/fused_kernels"
        (kernels / "scaled_upper_triang_masked_softmax.cpp").write_text("int porter_small_binding() { return 1; }\n")
        (kernels / "scaled_upper_triang_masked_softmax_cuda.cu").write_text(
            "__global__ void porter_small_kernel(float* x) { x[threadIdx.x] *= 2.0f; }\n")
        cpp = kernels / "scaled_masked_softmax.cpp"
        cpp.write_text(cpp.read_text() + f'\n__attribute__((used)) static const char porter_tree[] = "porter-tree-{side}";\n')
        procs[side] = subprocess.Popen(
            [sys.executable, "-m", "porter", "port", "megatron-deepspeed", str(tree), "-t", "debian-rocm7", "--arch",
             "gfx942", "--compile-only", "--json", "--dest", str(tmp_path / side / "ported")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PORTER_ROCM7_ROOT": str(rocm7)})
    docs = {}
    for side, proc in procs.items():
        out, err = proc.communicate(timeout=1800)
        assert proc.returncode == 0, err[-4000:]
        docs[side] = json.loads(out)
        rec = next(r for r in docs[side]["compiled"] if r["name"] == "scaled_masked_softmax_cuda")
        assert rec["archs"] == {"gfx942": "compiled"}, rec
        host = next(tu["object"] for tu in rec["tus"] if tu["source"].endswith("scaled_masked_softmax.cpp"))
        data = Path(host).read_bytes()
        other = "b" if side == "a" else "a"
        assert f"porter-tree-{side}".encode() in data and f"porter-tree-{other}".encode() not in data, host
    doc = docs["a"]
    assert doc["compile_only"] and not doc["linked"] and doc["wheel"] is None
    assert sorted(r["name"] for r in doc["compiled"]) == ["scaled_masked_softmax_cuda",
                                                          "scaled_upper_triang_masked_softmax_cuda"]
    for rec in doc["compiled"]:
        assert rec["archs"] == {"gfx942": "compiled"}, rec
        assert [tu["code_objects"] for tu in rec["tus"] if "code_objects" in tu] == [["gfx942"]], rec
    cu = (tmp_path / "a" / "ported" / "megatron/fused_kernels/scaled_masked_softmax_cuda.cu").read_text()
    assert "ATen/hip/HIPContext.h" in cu and "__HIP_PLATFORM_HCC__" not in cu
