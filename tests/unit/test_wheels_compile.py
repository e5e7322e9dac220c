"""wheel apex|flash-attn --compile-only without subprocesses: reading trees, selecting units, planning,
measured costs feeding MAX_JOBS, and the APEX/FA verification truths (issue 12 item 7)."""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from porter.cli import cli as cli_main
from porter.components import get_driver, wheel_drivers
from porter.components import static
from porter.components.apex import builder_specs, read_flag_extensions, reads_hip_at_import
from porter.components.flash_attn import FRONTEND, ck_cover, ck_families, ck_family, ck_stratum, read_ck_build
from porter.errors import ConfigError
from porter.probe import script_text
from porter.probes.protocol import MARKER
from porter.run import Result, Runner
from porter.toolchain.profile import load_toolchain
from porter.wheels import Machine, WheelRequest, build_wheel
from porter.wheels import costs
from porter.wheels.base import GiB, drop_flags
from porter.wheels.compile import compile_only
from porter.wheels.engine import detect
from tests.conftest import FIXTURES

DRIVERS = wheel_drivers()
APEX_ROCM = FIXTURES / "apex-rocm"
APEX_ENV = FIXTURES / "apex-env"
FA = FIXTURES / "flash-attn-mini"
BIG = Machine(cores=64, free_bytes=512 * GiB)
MiB = 1 << 20

CPU_TORCH = {"version": "2.13.0+cpu", "hip": None, "cuda": None, "root": "/t/torch", "include_dirs": ["/t/include"],
             "library_dir": "/t/lib", "python_include": "/py/include", "ext_suffix": ".cpython-311-x86_64-linux-gnu.so",
             "python_tag": "cp311", "platform_tag": "linux_x86_64", "cxx11_abi": True}
# the instances a real CK generator writes, by direction (names shaped like 2.8.3's)
GENERATED = {
    "fwd": ["fmha_fwd_api", "fmha_fwd_d128_bf16_batch_b128x128_qr", "fmha_fwd_d64_fp16_group_b128x64_qr"],
    "fwd_splitkv": ["fmha_fwd_splitkv_api", "fmha_fwd_splitkv_d128_bf16_batch_b64", "fmha_fwd_splitkv_combine_d128_bf16_b32"],
    "fwd_appendkv": ["fmha_fwd_appendkv_api", "fmha_fwd_appendkv_d128_bf16_b64"],
    "bwd": ["fmha_bwd_api", "fmha_bwd_convert_dq_d128_bf16_b64_a", "fmha_bwd_convert_dq_d128_bf16_b64_b",
            "fmha_bwd_d128_bf16_batch_b16x128", "fmha_bwd_dot_do_o_d128_bf16_b64"],
}


@dataclass
class FakeRunner(Runner):
    """Answers the torch and hipify probes and runs a stand-in CK generator; anything else fails the test."""

    torch: Mapping[str, Any] = field(default_factory=lambda: CPU_TORCH)
    calls: list[list[str]] = field(default_factory=list)

    def run(self, argv: Sequence[Any], **kw: Any) -> Result:
        args = [str(a) for a in argv]
        self.calls.append(args)
        if args[-1] == "-" and kw.get("input") == script_text("torch"):
            return Result(args, 0, MARKER + json.dumps(dict(self.torch)) + "\n", 0.0)
        if "-" in args and kw.get("input") == script_text("hipify_ext"):
            files = [f for _incs, group in json.loads(args[-1]) for f in group]
            return Result(args, 0, MARKER + json.dumps({f: f[:-3] + ".hip" for f in files}) + "\n", 0.0)
        if any(a.endswith("generate.py") for a in args):
            out = Path(args[args.index("--output_dir") + 1])
            for stem in GENERATED[args[args.index("-d") + 1]]:
                (out / f"{stem}.cpp").write_text(f"// {stem}\n")
            return Result(args, 0, "", 0.0)
        if self.dry:  # a dry run records what would change something
            return Result(args, 0, "", 0.0)
        raise AssertionError(f"unexpected command in a unit test: {args}")


def request(source: Path, tc: str = "debian-rocm7", **kw: Any) -> WheelRequest:
    """A request whose wave-64 step never stops the plan (its states are tested in test_wave64_states and the
    integration tier; without torch next to porter it cannot scan, which would refuse every 64-lane plan here)."""
    archs = kw.pop("archs", ())
    kw.setdefault("allow_wave32", ("all",))
    return WheelRequest(source=source, toolchain=load_toolchain(tc, overrides={"archs": archs}),
                        output=Path("/nonexistent"), **kw)


def plan(name: str, source: Path, tc: str = "mi300x", **kw: Any):  # type: ignore[no-untyped-def]
    d = get_driver(name)
    return d.plan(detect(d, source, DRIVERS), request(source, tc, **kw), BIG)


# -- the static reader ---------------------------------------------------------------------------

def _scope(text: str, **names: Any) -> static.Scope:
    scope = static.Scope(names=dict(names), truth=lambda n, s: None, source=text)
    static.run(ast.parse(text).body, scope)
    return scope


def test_static_lists_paths_fstrings_and_env_defaults() -> None:
    text = ("import os\nthis_dir = os.path.dirname(__file__)\n"
            "a = ['-O3'] + macros\n"
            "inc = [os.path.join(this_dir, 'csrc'), Path(this_dir) / 'csrc' / 'x']\n"
            "f = [f\"-DLEVEL={os.environ.get('LEVEL', 3)}\", *extra]\n")
    scope = static.Scope(names={"this_dir": static.ROOT, "macros": ["-DM"], "extra": ["-X"]},
                         fixed=frozenset({"this_dir"}), source=text)
    static.run(ast.parse(text).body, scope)
    assert scope.names["a"] == ["-O3", "-DM"]
    assert scope.names["inc"] == ["csrc", "csrc/x"]
    assert scope.names["f"] == ["-DLEVEL=3", "-X"]  # porter takes the script's default, never its own env


def test_static_unknown_items_are_dropped_and_recorded() -> None:
    scope = _scope("a = ['-O3', some_call()]\nb = ['-x'] + unknown\nc = unknown\nc += ['-late']\n")
    assert scope.names["a"] == ["-O3"] and scope.names["b"] == ["-x"] and scope.names["c"] == ["-late"]
    assert any("some_call()" in s for s in scope.skipped) and any("unknown" in s for s in scope.skipped)


def test_static_guards_and_known_comparisons() -> None:
    text = ("x = []\nif cuda_home is None:\n    raise RuntimeError('no nvcc')\nelse:\n    x += ['guarded']\n"
            "if MAJOR >= 6:\n    x += ['new']\nelse:\n    x += ['old']\n"
            "if mystery:\n    x += ['maybe']\n")
    scope = _scope(text, MAJOR=7)
    assert scope.names["x"] == ["guarded", "new"]
    assert any("mystery" in s for s in scope.skipped)


# -- apex: what the tree compiles ------------------------------------------------------------------

def test_apex_builder_methods_are_read_on_the_rocm_branch() -> None:
    specs = builder_specs(APEX_ROCM / "op_builder", "7.2")
    amp = specs["amp_C"]
    assert amp.sources == ("csrc/amp_C_frontend.cpp", "csrc/multi_tensor_scale_kernel.cu",
                           "csrc/multi_tensor_l2norm_kernel.cu")
    assert amp.include_paths == ("csrc",) and amp.nvcc_args == ("-O3",) and amp.version_macros
    assert "--use_fast_math" not in amp.nvcc_args  # the CUDA-only branch is not taken on ROCm
    assert specs["apex_C"].sources == ("csrc/flatten_unflatten.cpp",)
    # class attributes, as the env fixture declares them
    assert builder_specs(APEX_ENV / "op_builder")["apex_C"].sources == ("csrc/flatten_sum.cpp",)



def test_apex_flags_that_depend_on_the_build_torchs_headers_are_answered_from_them(tmp_path: Path) -> None:
    """upstream's aten_atomic_args / backward_pass_guard_args look at the build torch's headers: porter reads the
    calls, and answers them from the include folders of the torch it builds against. aten_atomic_args looks for
    ATen/Atomic.cuh, which torch 2 keeps as ATen/cuda/Atomic.cuh (ROCm apex master's fused_index_mul_2d then
    included THC's header, gone since torch 1.11, and compiled nowhere): porter answers yes for either."""
    from porter.components.apex import _resolve_markers, torch_header_flags

    spec = builder_specs(APEX_ROCM / "op_builder", "7.2")["fused_scale_cuda"]
    assert not spec.skipped, spec.skipped  # read, not left out
    old, new = tmp_path / "old" / "include", tmp_path / "new" / "include"
    (old / "ATen").mkdir(parents=True)
    (old / "ATen" / "Atomic.cuh").write_text("")
    (old / "ATen" / "Context.h").write_text("struct TORCH_API BackwardPassGuard {\n")
    (new / "ATen" / "cuda").mkdir(parents=True)
    (new / "ATen" / "cuda" / "Atomic.cuh").write_text("")  # where torch 2 keeps it: upstream's check said no
    (new / "ATen" / "Context.h").write_text("struct TORCH_API ROCmBackwardPassGuard {\n")
    assert _resolve_markers(spec.nvcc_args, [old]) == (
        "-O3", "-DATEN_ATOMIC_HEADER", "-DBACKWARD_PASS_GUARD", "-DBACKWARD_PASS_GUARD_CLASS=BackwardPassGuard")
    assert _resolve_markers(spec.nvcc_args, [new]) == (
        "-O3", "-DATEN_ATOMIC_HEADER", "-DBACKWARD_PASS_GUARD", "-DBACKWARD_PASS_GUARD_CLASS=ROCmBackwardPassGuard")
    assert _resolve_markers(spec.nvcc_args, [tmp_path]) == ("-O3",)  # neither header: upstream's THC branch
    assert torch_header_flags("generator_args", [old, new]) == []
    assert torch_header_flags("backward_pass_guard_args", [tmp_path]) == []

OLD_SETUP = '''
import os, sys
import torch
from torch.utils.cpp_extension import CUDA_HOME, CUDAExtension, CppExtension
this_dir = os.path.dirname(os.path.abspath(__file__))
IS_ROCM_PYTORCH = torch.version.hip is not None
ext_modules = []
version_dependent_macros = ["-DVERSION_GE_1_1"]
if "--cpp_ext" in sys.argv:
    sys.argv.remove("--cpp_ext")
    ext_modules.append(CppExtension("apex_C", ["csrc/flatten_unflatten.cpp"]))
if "--cuda_ext" in sys.argv:
    sys.argv.remove("--cuda_ext")
    if CUDA_HOME is None and not IS_ROCM_PYTORCH:
        raise RuntimeError("--cuda_ext was requested, but nvcc was not found")
    else:
        hipcc_args = ['-O3'] + version_dependent_macros
        ext_modules.append(CUDAExtension(name='amp_C', sources=['csrc/amp_C_frontend.cpp', 'csrc/scale.cu'],
                                         include_dirs=[os.path.join(this_dir, 'csrc')],
                                         extra_compile_args={'cxx': ['-O3'], 'nvcc': ['-lineinfo'] if not IS_ROCM_PYTORCH else hipcc_args}))
        ext_modules.append(CUDAExtension(name='syncbn', sources=['csrc/syncbn.cpp', 'csrc/welford.cu']))
        ext_modules.append(CUDAExtension(name='fused_layer_norm_cuda', sources=['csrc/ln.cpp', 'csrc/ln.cu']))
        ext_modules.append(CUDAExtension(name='mlp_cuda', sources=['csrc/mlp.cpp', 'csrc/mlp_cuda.cu']))
        if not IS_ROCM_PYTORCH:
            ext_modules.append(CUDAExtension(name='xentropy_cuda', sources=['csrc/xentropy.cu']))
        if torch.backends.cudnn.is_available():
            ext_modules.append(CUDAExtension(name='fused_conv_bias_relu', sources=['csrc/conv.cu']))
'''


def test_old_flags_tree_guarded_extensions_are_required_and_cuda_only_ones_left_out() -> None:
    read, specs = read_flag_extensions(OLD_SETUP, "setup.py")
    ops = {o.name: (o.group, o.required) for o in read}
    # behind "if CUDA_HOME is None and not IS_ROCM: raise ... else:" is no condition on ROCm
    for name in ("amp_C", "syncbn", "fused_layer_norm_cuda", "mlp_cuda"):
        assert ops[name] == ("cuda", True), name
    assert "xentropy_cuda" not in ops  # only on the CUDA branch
    assert ops["fused_conv_bias_relu"] == ("cuda", False)  # a condition porter cannot decide
    assert ops["apex_C"] == ("cpp", True)
    spec = specs["amp_C"]
    assert spec.sources == ("csrc/amp_C_frontend.cpp", "csrc/scale.cu") and spec.include_paths == ("csrc",)
    assert spec.nvcc_args == ("-O3",) and spec.version_macros  # the hipcc branch of the IfExp


def _old_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "apex-old"
    (tree / "apex").mkdir(parents=True)
    (tree / "apex" / "__init__.py").write_text("")
    (tree / "version.txt").write_text("1.1.0\n")
    (tree / "setup.py").write_text(OLD_SETUP)
    return tree


def test_flags_regime_requires_amp_C_and_the_guarded_ops(tmp_path: Path) -> None:
    p = plan("apex", _old_tree(tmp_path), "mi300x")
    assert {"amp_C", "syncbn", "fused_layer_norm_cuda", "mlp_cuda"} <= set(p.expect.modules)
    assert p.expect.optional == ("fused_conv_bias_relu",) and p.expect.host_only == ("apex_C",)


def test_env_regime_device_ops_bring_amp_C() -> None:
    p = plan("apex", APEX_ROCM, "frontier", ops=("fused_scale_cuda",))
    assert set(p.expect.modules) == {"apex.amp_C", "apex.fused_scale_cuda"}
    assert p.env["APEX_BUILD_AMP_C"] == "1" and p.env["APEX_BUILD_APEX_C"] is None
    assert any("amp_C added" in n for n in p.notes)
    # host-only ops alone need no amp_C, and carry no code objects
    cpp = plan("apex", APEX_ROCM, "frontier", ops=("cpp",))
    assert cpp.expect.modules == ("apex.apex_C",) and cpp.expect.host_only == ("apex.apex_C",)


def test_cpu_plan_of_a_tree_that_reads_torch_hip_at_import_needs_a_rocm_torch() -> None:
    assert reads_hip_at_import(APEX_ROCM / "setup.py") == 17
    assert reads_hip_at_import(APEX_ENV / "setup.py") is None
    p = plan("apex", APEX_ROCM, "cpu")
    assert p.needs_torch == "rocm" and "torch.version.hip at import (setup.py line 17)" in p.needs_torch_why
    assert plan("apex", APEX_ENV, "cpu").needs_torch is None


def test_cpu_dry_run_says_the_real_build_must_fail_and_the_real_run_refuses() -> None:
    drv = get_driver("apex")
    req = WheelRequest(source=APEX_ROCM, toolchain=load_toolchain("cpu"), output=Path("/nonexistent/house"))
    res = build_wheel(drv, str(APEX_ROCM), req, runner=FakeRunner(dry=True), others=DRIVERS, machine=BIG)
    text = res.describe()
    assert text.splitlines()[-1].startswith("# a real run here would be refused: apex 1.16.0a0")
    assert "torch.version.hip at import" in text and "2.13.0+cpu" in text
    runner = FakeRunner()
    with pytest.raises(ConfigError) as exc:
        build_wheel(drv, str(APEX_ROCM), req, runner=runner, others=DRIVERS, machine=BIG)
    assert exc.value.exit_code == 2 and len(runner.calls) == 1  # the probe only: no pip, no setup.py


# -- flash-attn -------------------------------------------------------------------------------------

def test_triton_backend_is_not_refused_for_archs_only_ck_restricts() -> None:
    p = plan("flash-attn", FA, "debian-rocm", backend="triton")  # gfx90a + gfx908
    assert p.backend == "triton" and p.env["GPU_ARCHS"] == "gfx90a;gfx908"
    assert any("gfx908: outside the CK backend's GPU_ARCHS list" in n for n in p.notes)
    with pytest.raises(ConfigError, match="does not support gfx908"):
        plan("flash-attn", FA, "debian-rocm", backend="ck")


CK_SETUP = '''
import os, subprocess, sys
from pathlib import Path
from packaging.version import Version
this_dir = os.path.dirname(os.path.abspath(__file__))
BUILD_TARGET = os.environ.get("BUILD_TARGET", "auto")
SKIP_CUDA_BUILD = os.getenv("FLASH_ATTENTION_SKIP_CUDA_BUILD", "FALSE") == "TRUE"
IS_ROCM = BUILD_TARGET == "rocm"
SKIP_CK_BUILD = False
ext_modules = []
if not SKIP_CUDA_BUILD and not IS_ROCM:
    cc_flag = ["-gencode", "arch=compute_80,code=sm_80"]
elif not SKIP_CUDA_BUILD and IS_ROCM:
    if not SKIP_CK_BUILD:
        ck_dir = "csrc/composable_kernel"
        optdim = os.getenv("OPT_DIM", "64,128")
        subprocess.run([sys.executable, f"{ck_dir}/example/ck_tile/01_fmha/generate.py", "-d", "fwd", "--output_dir", "build", "--receipt", "2", "--optdim", optdim], check=True)
        subprocess.run([sys.executable, f"{ck_dir}/example/ck_tile/01_fmha/generate.py", "-d", "bwd", "--output_dir", "build", "--receipt", "2", "--optdim", optdim], check=True)
        archs = os.getenv("GPU_ARCHS", "native").split(";")
        if archs != ['native']:
            cc_flag = [f"--offload-arch={arch}" for arch in archs]
        else:
            cc_flag = ["--offload-arch=native"]
        sources = ["csrc/flash_attn_ck/flash_api.cpp", "csrc/flash_attn_ck/mha_fwd.cpp"] + glob.glob("build/fmha_*wd*.cpp")
        cc_flag += ["-O3", "-std=c++17", "-DCK_USE_XDL"]
        cc_flag += [f"-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT={os.environ.get('CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT', 3)}"]
        hip_version = get_hip_version()
        if hip_version > Version('6.1.40090'):
            cc_flag += ["-mllvm", "-enable-post-misched=0"]
        if hip_version > Version('6.2.41133') and hip_version < Version('6.3.00000'):
            cc_flag += ["-mllvm", "-amdgpu-coerce-illegal-types=1"]
        extra_compile_args = {"cxx": ["-O3", "-std=c++17"], "nvcc": cc_flag}
        include_dirs = [Path(this_dir) / "csrc" / "composable_kernel" / "include"]
'''


def test_read_ck_build_takes_the_rocm_branch_for_the_profiles_hip() -> None:
    ck = read_ck_build(CK_SETUP, "setup.py", "7.2")
    assert ck.directions == ("fwd", "bwd") and ck.receipt == "2" and ck.optdim == "64,128"
    assert ck.flags == ("-O3", "-std=c++17", "-DCK_USE_XDL", "-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT=3",
                        "-mllvm", "-enable-post-misched=0")
    assert ck.include_dirs == ("csrc/composable_kernel/include",) and ck.cxx == ("-O3", "-std=c++17")
    assert ck.sources == ("csrc/flash_attn_ck/flash_api.cpp", "csrc/flash_attn_ck/mha_fwd.cpp") and not ck.skipped
    old = read_ck_build(CK_SETUP, "setup.py", "6.2.41134")
    assert "-amdgpu-coerce-illegal-types=1" in old.flags
    # 2.6's setup.py runs the generator through os.system with an f-string (sys.executable unknown to porter), and
    # passes no --optdim: its generator has none ("unrecognized arguments: --optdim" when porter added 2.8.3's)
    runs = [ln for ln in CK_SETUP.splitlines() if "generate.py" in ln]
    v26 = CK_SETUP.replace(runs[0], '        os.system(f"{sys.executable} {ck_dir}/example/ck_tile/01_fmha/generate.py '
                                    '-d fwd --output_dir build --receipt 2")')
    v26 = v26.replace(runs[1], '        os.system(f"{sys.executable} {ck_dir}/example/ck_tile/01_fmha/generate.py '
                               '-d fwd_appendkv --output_dir build --receipt 2")')
    ck26 = read_ck_build(v26, "setup.py", "7.2")
    assert ck26.directions == ("fwd", "fwd_appendkv") and ck26.receipt == "2" and ck26.optdim == "" and not ck26.skipped
    # a tree porter cannot read keeps 2.8.3's, and says so
    bare = read_ck_build("x = 1\n", "setup.py", "7.2")
    assert bare.directions == ("fwd", "fwd_appendkv", "fwd_splitkv", "bwd") and bare.skipped


def test_ck_unit_families() -> None:
    assert ck_family("fmha_fwd_splitkv_combine_d128_bf16_b32") == "fmha_fwd_splitkv_combine"
    assert ck_family("fmha_bwd_dot_do_o_d128_bf16_b64") == "fmha_bwd_dot_do_o"
    assert ck_family("fmha_bwd_d128_bf16_batch_b16x128") == "fmha_bwd"
    assert ck_family(f"{FRONTEND}/flash_api.cpp") == FRONTEND and ck_family("fmha_fwd_api") == FRONTEND
    assert ck_families(("fwd", "bwd")) == ("fmha_fwd", "fmha_bwd", "fmha_bwd_convert_dq", "fmha_bwd_dot_do_o",
                                           FRONTEND)


def _fa_compile(tmp_path: Path, **kw: Any) -> tuple[Any, FakeRunner]:
    runner = FakeRunner(dry=True)
    res = compile_only(get_driver("flash-attn"), str(FA), request(FA, **kw), runner=runner, others=DRIVERS, machine=Machine(2, 24 * GiB), costs_root=tmp_path)
    return res, runner


def test_fa_compile_only_plans_each_instance_and_the_frontend(tmp_path: Path) -> None:
    res, runner = _fa_compile(tmp_path, archs=("gfx942",))
    names = list(res.plan.objects)
    instances = [n for n in names if n != FRONTEND]
    assert len(instances) == 9 and FRONTEND in names  # 13 generated - 4 API dispatchers
    assert res.selected_units == res.total_units == 9 + 4  # the fixture's setup.py names no frontend source
    gens = [c for c in runner.calls if any(a.endswith("generate.py") for a in c)]
    assert [c[c.index("-d") + 1] for c in gens] == ["fwd", "fwd_appendkv", "fwd_splitkv", "bwd"]
    assert all("-B" in c for c in gens)  # no bytecode written next to the tree's generator
    step = next(s for s in res.plan.steps if s.op == "fmha_fwd_d128_bf16_batch_b128x128_qr")
    assert step.argv[:2] == ("chroot", "/var/lib/porter/sid-rocm7") and "--offload-arch=gfx942" in step.argv
    assert step.argv[step.argv.index("-c") + 1].endswith("/src/gen/fmha_fwd_d128_bf16_batch_b128x128_qr.cu")
    assert any(a.endswith("/src/csrc/composable_kernel/include") for a in step.argv)
    assert res.to_dict()["compile_only"] and not res.to_dict()["linked"]
    assert res.wheel_plan.per_job_source == "guess" and res.jobs == 2  # no costs measured yet
    assert any("not read from setup.py" in n for n in res.notes)


def test_fa_units_instances_and_sample_select(tmp_path: Path) -> None:
    res, _ = _fa_compile(tmp_path, units=("fmha_bwd_convert_dq*",), instances=1)
    assert list(res.plan.objects) == ["fmha_bwd_convert_dq_d128_bf16_b64_a"]
    res, _ = _fa_compile(tmp_path, units=(f"fmha_fwd_d*,{FRONTEND}",))
    assert list(res.plan.objects) == ["fmha_fwd_d128_bf16_batch_b128x128_qr", "fmha_fwd_d64_fp16_group_b128x64_qr",
                                      FRONTEND]
    res, _ = _fa_compile(tmp_path, sample=1)
    strata = [ck_stratum(n) for n in res.plan.objects]
    assert sorted(strata) == sorted(set(strata))  # one of each family x head dim x dtype, + the frontend
    assert set(ck_family(n) for n in res.plan.objects) == set(ck_families(("fwd", "fwd_splitkv", "fwd_appendkv",
                                                                             "bwd")))
    assert {"fmha_fwd_d128_bf16", "fmha_fwd_d64_fp16"} <= set(strata), strata
    assert ck_stratum("fmha_bwd_d256_fp16_batch_b16x64") == "fmha_bwd_d256_fp16" and ck_stratum(FRONTEND) == FRONTEND
    stratified = [n for n in res.plan.objects if n != FRONTEND]
    # a covering sample: every family, head dim and dtype at least once, in fewer units than one per stratum
    res, _ = _fa_compile(tmp_path, sample="cover")
    cover = [n for n in res.plan.objects if n != FRONTEND]
    assert FRONTEND in res.plan.objects and set(cover) <= set(stratified) and len(cover) < len(stratified)
    fams = set(ck_families(("fwd", "fwd_splitkv", "fwd_appendkv", "bwd"))) - {FRONTEND}
    assert {ck_family(n) for n in cover} == fams
    assert {ck_stratum(n).split("_")[-2] for n in cover} == {ck_stratum(n).split("_")[-2] for n in stratified}
    assert {ck_stratum(n).split("_")[-1] for n in cover} == {"bf16", "fp16"}
    res, _ = _fa_compile(tmp_path, sample="pairs")
    pairs = [n for n in res.plan.objects if n != FRONTEND]
    assert len(cover) <= len(pairs) <= len(stratified)
    for fam in fams:  # each family at every head dim and dtype it is generated in
        want = {tuple(ck_stratum(n).split("_")[-2:]) for n in stratified if ck_family(n) == fam}
        got = {tuple(ck_stratum(n).split("_")[-2:]) for n in pairs if ck_family(n) == fam}
        assert {d for d, _ in got} == {d for d, _ in want} and {t for _, t in got} == {t for _, t in want}
    with pytest.raises(ConfigError, match="no CK instance of flash-attn 2.8.0.post2 matches nothing_like_this"):
        _fa_compile(tmp_path, units=("nothing_like_this",))


def test_covering_samples_are_small_and_complete() -> None:
    units = [f"fmha_{fam}_d{d}_{t}_{v}" for fam in ("fwd", "bwd", "fwd_splitkv", "fwd_appendkv", "bwd_dot_do_o",
                                                    "bwd_convert_dq", "fwd_splitkv_combine")
             for d in (32, 64, 128, 256) for t in ("fp16", "bf16") for v in ("batch_a", "group_b")]
    cover = ck_cover(units, "cover")
    assert len(cover) == 7 and len({ck_family(u) for u in cover}) == 7
    assert {ck_stratum(u).split("_")[-2] for u in cover} == {"d32", "d64", "d128", "d256"}
    assert cover == [u for u in units if u in cover]  # in the generator's order
    # each family by its cheapest unit: the d256 bucket from a cheap family, never the hour-long d256 bwd unit
    assert "fmha_bwd_d32_fp16_batch_a" in cover and not any(u.startswith("fmha_bwd_d256") for u in cover)
    assert ck_cover(["fmha_bwd_d32_fp16_mask_dropout_x", "fmha_bwd_d32_fp16_x"], "cover") == ["fmha_bwd_d32_fp16_x"]
    pairs = ck_cover(units, "pairs")
    assert len(pairs) == 28 and all(sum(ck_family(u) == ck_family(p) for p in pairs) == 4 for u in pairs)
    assert ck_cover(units[:1], "pairs") == units[:1] and ck_cover([], "cover") == []
    assert ck_cover(["fmha_fwd_api", "fmha_fwd_d64_fp16_x"], "cover") == ["fmha_fwd_api", "fmha_fwd_d64_fp16_x"]
    with pytest.raises(ConfigError, match="unknown sample mode"):
        ck_cover(units, "all")


def test_compile_only_refuses_cpu_profiles_and_the_triton_backend(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="compiles GPU code for every arch of a rocm or cuda profile"):
        compile_only(get_driver("apex"), str(APEX_ROCM), request(APEX_ROCM, "cpu"), runner=FakeRunner(dry=True),
                     others=DRIVERS, costs_root=tmp_path)
    with pytest.raises(ConfigError, match="Triton backend compiles nothing ahead of time"):
        _fa_compile(tmp_path, backend="triton")


def test_apex_compile_only_hipifies_device_ops_and_plans_host_ops_with_gxx(tmp_path: Path) -> None:
    res = compile_only(get_driver("apex"), str(APEX_ROCM), request(APEX_ROCM, archs=("gfx90a", "gfx942")),
                       runner=FakeRunner(dry=True), others=DRIVERS, machine=BIG, costs_root=tmp_path)
    assert sorted(res.plan.objects) == ["amp_C", "apex_C", "fused_scale_cuda", "nccl_alloc"]
    by_src = {Path(s.inputs[0]).name: s.argv for s in res.plan.steps if not s.arch}
    kernel = by_src["multi_tensor_scale_kernel.hip"]  # hipified copy, compiled by hipcc for both archs: its host part
    assert "hipcc" in kernel and "--offload-arch=gfx90a" in kernel and "--offload-arch=gfx942" in kernel
    assert "--offload-host-only" in kernel
    # ... and one device part per arch, each its own object (a verdict per arch; a stopped run keeps the archs done)
    parts = {s.arch: s for s in res.plan.steps if Path(s.inputs[0]).name == "multi_tensor_scale_kernel.hip" and s.arch}
    assert sorted(parts) == ["gfx90a", "gfx942"]
    for arch, step in parts.items():
        offload = [a for a in step.argv if a.startswith("--offload")]
        assert offload == [f"--offload-arch={arch}", "--offload-device-only"], step.argv
        assert step.output.endswith(f"multi_tensor_scale_kernel.cu.{arch}.o"), step.output
        assert step.argv[step.argv.index("-MF") + 1].endswith(f".{arch}.o.d") and step.argv[-1].endswith(f".{arch}.o")
    assert {s.output for s in parts.values()} <= set(res.plan.objects["amp_C"])
    assert {"-DVERSION_GE_1_1", "-DVERSION_GE_1_3", "-DVERSION_GE_1_5", "-O3"} <= set(kernel)
    assert any("torch-hip-view" in a for a in kernel)  # the CPU torch's headers through the HIP view
    host = by_src["flatten_unflatten.cpp"]
    assert "g++" in host and not any(a.startswith("--offload-arch") for a in host)
    # a device op's file under contrib/csrc/: hipified, torch seen through the view (the integration tier compiles
    # it for real: host-only)
    alloc = next(argv for name, argv in by_src.items() if name.startswith("allocator"))
    assert any("torch-hip-view" in a for a in alloc)
    assert res.hip_view and res.selected_units == 7


def test_an_op_porter_cannot_read_is_reported_and_the_others_still_planned(tmp_path: Path) -> None:
    tree = tmp_path / "apex"
    shutil.copytree(APEX_ROCM, tree)
    builder = tree / "op_builder" / "fused_scale.py"
    builder.write_text(builder.read_text().replace('return ["csrc/fused_scale.cpp", "csrc/fused_scale_kernel.cu"]',
                                                   'return sorted(glob.glob("csrc/fused_scale*"))'))
    res = compile_only(get_driver("apex"), str(tree), request(tree), runner=FakeRunner(dry=True), others=DRIVERS, machine=BIG, costs_root=tmp_path)
    assert sorted(res.plan.objects) == ["amp_C", "apex_C", "nccl_alloc"]
    assert any(n.startswith("fused_scale_cuda: not planned: porter cannot read the sources") for n in res.notes)


# -- measured costs -> MAX_JOBS ------------------------------------------------------------------------

def test_costs_are_merged_per_unit_and_summarised(tmp_path: Path) -> None:
    tc = load_toolchain("debian-rocm7")
    assert costs.load("flash-attn", "2.8.3", tc, tmp_path) is None
    rows = [("u1", 10.0, 500 * 1024), ("u2", 30.0, 900 * 1024)]
    path = costs.record("flash-attn", "2.8.3", tc, rows, tmp_path)
    assert path == tmp_path / "costs" / "flash-attn-2.8.3-rocm7.2.json"
    costs.record("flash-attn", "2.8.3", tc, [("u1", 12.0, 1000 * 1024), ("skipped", 1.0, 0)], tmp_path)
    m = costs.load("flash-attn", "2.8.3", tc, tmp_path)
    assert m is not None and m.exact and m.units == 2 and m.peak_rss_bytes == 1000 * MiB and m.max_seconds == 30.0
    assert m.per_job_bytes() == 1280 * MiB  # 1000 MiB + 25 %, rounded up to 256 MiB
    # nothing for this version and ROCm line: the nearest measured, marked not exact
    other = costs.load("flash-attn", "2.8.3", load_toolchain("frontier"), tmp_path)
    assert other is not None and not other.exact and (other.version, other.line) == ("2.8.3", "rocm7.2")
    costs.record("flash-attn", "2.7.4", tc, [("u9", 5.0, 100 * 1024)], tmp_path)
    near = costs.load("flash-attn", "2.8.4", tc, tmp_path)  # same ROCm line first, then the newest
    assert near is not None and near.version == "2.7.4" and not near.exact
    assert costs.load("apex", "1.0", tc, tmp_path) is None and costs.load("flash-attn", "2.8.3", load_toolchain("cpu"),
                                                                           tmp_path) is None


def test_apex_plan_sizes_max_jobs_from_measured_costs(tmp_path: Path) -> None:
    tc = load_toolchain("mi300x")
    costs.record("apex", "1.16.0a0", tc, [("amp_C/x.hip", 60.0, 1400 * 1024)], tmp_path)
    measured = costs.load("apex", "1.16.0a0", tc, tmp_path)
    d = get_driver("apex")
    req = WheelRequest(source=APEX_ROCM, toolchain=tc, output=Path("/x"), measured=measured)
    p = d.plan(detect(d, APEX_ROCM, DRIVERS), req, Machine(cores=64, free_bytes=21 * GiB))
    assert p.per_job_source == "measured" and p.per_job_bytes == 1792 * MiB
    assert p.jobs == 11  # (21 - 1) GiB / 1.75 GiB, where the 2 GiB guess gave 10
    assert any("measured compile costs" in n for n in p.notes)


def test_fa_plan_uses_measured_families_and_keeps_the_guess_for_the_rest(tmp_path: Path) -> None:
    tc = load_toolchain("mi300x")
    d = get_driver("flash-attn")
    info = detect(d, FA, DRIVERS)
    machine = Machine(cores=64, free_bytes=25 * GiB)

    def plan_with(rows: list[tuple[str, float, int]]):  # type: ignore[no-untyped-def]
        costs.record("flash-attn", info.version, tc, rows, tmp_path)
        req = WheelRequest(source=FA, toolchain=tc, output=Path("/x"),
                           measured=costs.load("flash-attn", info.version, tc, tmp_path))
        return d.plan(info, req, machine)

    p = plan_with([("fmha_bwd_convert_dq_d128_bf16_b64_a", 30.0, 440 * 1024)])
    assert p.per_job_source == "partly measured" and p.per_job_bytes == 6 * GiB and p.jobs == 4
    assert any("fmha_fwd" in n and "not yet" in n for n in p.notes)
    every = [(f"{fam}_d128_x", 60.0, 2000 * 1024) for fam in ck_families(read_ck_build("", "", "7.2").directions)
             if fam != FRONTEND] + [(f"{FRONTEND}/flash_api.cpp", 90.0, 3000 * 1024)]
    p = plan_with(every)
    assert p.per_job_source == "measured" and p.per_job_bytes == 3840 * MiB  # 3000 MiB + 25 %
    assert p.jobs == 6 and p.env["MAX_JOBS"] == "6"  # the 6 GiB guess gave 4


def test_engine_reads_the_measured_costs_of_porters_cache(_no_measured_costs: Path) -> None:
    tc = load_toolchain("mi300x")
    costs.record("apex", "1.14.0a0", tc, [("apex_C", 20.0, 3000 * 1024)], _no_measured_costs)
    req = WheelRequest(source=APEX_ENV, toolchain=tc, output=Path("/nonexistent/house"), ops=("apex_C",))
    res = build_wheel(get_driver("apex"), str(APEX_ENV), req, runner=FakeRunner(dry=True, torch={**CPU_TORCH, "hip": "7.2.1"}),
                      others=DRIVERS, machine=Machine(8, 17 * GiB))
    assert res.plan.per_job_source == "measured" and res.env["MAX_JOBS"] == "4"  # 16 GiB / 3.75 GiB
    assert "GiB per job (measured)" in res.describe()


# -- CLI ------------------------------------------------------------------------------------------------

def test_drop_flags_takes_the_mllvm_before_a_flag_and_refuses_one_that_matches_nothing() -> None:
    flags = ("-O3", "-mllvm", "-amdgpu-early-inline-all=true", "-mllvm", "-amdgpu-function-calls=false", "-DX=1")
    kept, gone = drop_flags(flags, ("-amdgpu-early-inline-all", "-DX"), what="t")
    assert kept == ("-O3", "-mllvm", "-amdgpu-function-calls=false")
    assert gone == ("-mllvm", "-amdgpu-early-inline-all=true", "-DX=1")
    assert drop_flags(flags, (), what="t") == (flags, ())
    with pytest.raises(ConfigError, match=r"-amdgpu-early-inline: not among t's flags \(-O3 -mllvm"):
        drop_flags(flags, ("-amdgpu-early-inline",), what="t")  # a prefix that is not the whole name is a typo


def test_fa_compile_only_drops_the_early_inline_on_request_and_says_so(tmp_path: Path) -> None:
    tree = FIXTURES / "flash-attn-ck-frontend"  # the HIP-gated -mllvm flags of 2.6.3 to 2.8.3's setup.py
    bwd = "fmha_bwd_d128_bf16_batch_b16x128"

    def argv(res: Any) -> tuple[str, ...]:
        return next(s.argv for s in res.plan.steps if s.op == bwd)

    runner = FakeRunner(dry=True)
    res = compile_only(get_driver("flash-attn"), str(tree), request(tree, archs=("gfx942",)), runner=runner,
                       others=DRIVERS, machine=Machine(2, 24 * GiB), costs_root=tmp_path / "c")
    assert "-amdgpu-early-inline-all=true" in argv(res) and argv(res).count("-mllvm") == 3
    assert any("-amdgpu-early-inline-all=true (upstream's" in n and "--drop-flag" in n for n in res.notes)
    res = compile_only(get_driver("flash-attn"), str(tree),
                       request(tree, archs=("gfx942",), drop_flags=("-amdgpu-early-inline-all",)), runner=FakeRunner(dry=True),
                       others=DRIVERS, machine=Machine(2, 24 * GiB), costs_root=tmp_path / "c")
    assert "-amdgpu-early-inline-all=true" not in argv(res) and argv(res).count("-mllvm") == 2
    assert "-amdgpu-function-calls=false" in argv(res)
    assert any(n.startswith("upstream's flags left out (--drop-flag): -mllvm -amdgpu-early-inline-all=true")
               for n in res.notes)
    assert not any("(upstream's, for HIP" in n for n in res.notes)
    with pytest.raises(ConfigError, match="--drop-flag -amdgpu-early-inline: not among flash-attn"):
        compile_only(get_driver("flash-attn"), str(tree),
                     request(tree, archs=("gfx942",), drop_flags=("-amdgpu-early-inline",)), runner=FakeRunner(dry=True),
                     others=DRIVERS, machine=Machine(2, 24 * GiB), costs_root=tmp_path / "c")


def test_cli_selection_options_need_compile_only() -> None:
    r = CliRunner().invoke(cli_main, ["wheel", "flash-attn", "--source", str(FA), "-t", "mi300x", "--instances", "2",
                                      "--dry-run"])
    assert r.exit_code == 2 and "add --compile-only" in r.output
    r = CliRunner().invoke(cli_main, ["wheel", "apex", "--source", str(APEX_ENV), "-t", "debian-rocm7",
                                      "--compile-only", "--patch-set", "x", "--dry-run"])
    assert r.exit_code == 2 and "--patch-set applies to a wheel build" in r.output
    r = CliRunner().invoke(cli_main, ["wheel", "flash-attn", "--source", str(FA), "-t", "debian-rocm7",
                                      "--drop-flag=-amdgpu-early-inline-all", "--dry-run"])
    assert r.exit_code == 2 and "the linked build runs upstream's setup.py with its own flags" in r.output


def test_source_copy_keeps_time_stamps_of_unchanged_files(tmp_path: Path) -> None:
    from porter.wheels.compile import KernelContext
    from porter.executor import HOST
    from porter.log import quiet_logger

    src = tmp_path / "src"
    shutil.copytree(APEX_ROCM, src)
    ctx = KernelContext(source=src, tree=tmp_path / "work", plan_tree=tmp_path / "work",
                        toolchain=load_toolchain("debian-rocm7"), python="python", py_ex=HOST, runner=FakeRunner(),
                        log=quiet_logger())
    dest = ctx.copy("csrc") / "fused_scale.cpp"
    before = dest.stat().st_mtime_ns
    ctx.copy("csrc")
    assert dest.stat().st_mtime_ns == before
    written = ctx.put("gen/a.cu", b"x")
    stamp = written.stat().st_mtime_ns
    ctx.put("gen/a.cu", b"x")
    assert written.stat().st_mtime_ns == stamp


def test_work_copy_keeps_a_symlinked_folder_and_copies_its_target(tmp_path: Path) -> None:
    """ROCm/apex master: contrib/csrc is a link to ../apex/contrib/csrc. The work copy lost it (os.walk does not
    enter linked folders), so hipify crashed on a missing input (issue 18). Now the link stays a link, its target is
    copied, and a link out of the tree is copied as a folder."""
    from porter.log import quiet_logger
    from porter.wheels.compile import KernelContext

    src = tmp_path / "apex"
    (src / "apex" / "contrib" / "csrc" / "conv").mkdir(parents=True)
    (src / "apex" / "contrib" / "csrc" / "conv" / "conv_rocm.cpp").write_text("// conv\n")
    (src / "contrib").mkdir()
    (src / "contrib" / "csrc").symlink_to("../apex/contrib/csrc")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.h").write_text("// x\n")
    (src / "contrib" / "ext").symlink_to(outside)
    work = tmp_path / "work"
    tc = load_toolchain("cpu", environ={})
    ctx = KernelContext(source=src, tree=work, plan_tree=work, toolchain=tc, python="python", py_ex=tc.executor,
                        runner=FakeRunner(), log=quiet_logger())
    ctx.copy("contrib")
    assert (work / "contrib" / "csrc").is_symlink() and (work / "contrib/csrc/conv/conv_rocm.cpp").read_text() == "// conv\n"
    assert (work / "contrib/csrc/conv/conv_rocm.cpp").resolve() == (work / "apex/contrib/csrc/conv/conv_rocm.cpp").resolve()
    assert not (work / "contrib" / "ext").is_symlink() and (work / "contrib" / "ext" / "x.h").is_file()
    ctx.copy("contrib")  # again: nothing to do, nothing broken
    assert (work / "contrib" / "csrc").is_symlink()


def test_fa_compile_only_patches_a_ck_from_before_rocm7_on_a_copy(tmp_path: Path) -> None:
    """The tree's composable_kernel returns HIP's warpSize (run-time since ROCm 7): its rocm build set ck-rocm7 is
    planned for the compile (a real run compiles a patched copy), and the note says so; a tree whose CK has no
    such header gets no set."""
    import shutil

    tree = tmp_path / "fa"
    shutil.copytree(FA, tree)
    arch = "csrc/composable_kernel/include/ck_tile/core/arch/arch.hpp"
    (tree / arch).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / "flash-attn-ck-pre-rocm7" / arch, tree / arch)
    res = compile_only(get_driver("flash-attn"), str(tree), request(tree, archs=("gfx942",)), runner=FakeRunner(dry=True),
                       others=DRIVERS, machine=Machine(2, 24 * GiB), costs_root=tmp_path / "costs")
    assert "a real run builds from porter's patched copy of the source: flash-attn/ck-rocm7: ck-constexpr-warp-size" \
        in res.notes
    assert "return warpSize;" in (tree / arch).read_text()  # the tree itself is never changed
    plain, _ = _fa_compile(tmp_path / "plain", archs=("gfx942",))
    assert not [n for n in plain.notes if "patched copy" in n]


def test_a_patch_set_asked_for_that_does_not_apply_stops_the_wheel_build_before_any_work(tmp_path: Path) -> None:
    """``--patch-set`` goes into porter's patched copy with the sets of the profile's kind (build_copy): where the set
    the user asked for does not apply, a dry run already stops (exit 2), naming the set; the kind's own sets only
    warn, as in every build."""
    from click.testing import CliRunner

    from porter.cli import cli

    diff = tmp_path / "stale.diff"
    diff.write_text("--- a/apex/__init__.py\n+++ b/apex/__init__.py\n@@ -1 +1 @@\n-not a line of this tree\n"
                    "+PATCHED_BY_PORTER = True\n")
    r = CliRunner().invoke(cli, ["wheel", "apex", "--source", str(FIXTURES / "apex-flags"), "-t", "cpu", "--dry-run",
                                 "--no-torch-check", "--patch-set", str(diff), "-o", str(tmp_path / "wh")])
    assert isinstance(r.exception, ConfigError) and r.exception.exit_code == 2, r.output
    assert "local/stale cannot be applied" in r.exception.message and "porter patch check" in (r.exception.hint or "")
    r = CliRunner().invoke(cli, ["wheel", "apex", "--source", str(FIXTURES / "apex-flags"), "-t", "cpu", "--dry-run",
                                 "--no-torch-check", "--patch-set", str(FIXTURES / "apex-patches" / "mark-patched.diff"),
                                 "-o", str(tmp_path / "wh")])
    assert r.exit_code == 0 and "building from a patched copy of the source" in r.output, r.output
