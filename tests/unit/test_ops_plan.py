"""ops_prebuild without subprocesses: catalogue selection, flags, the pinned ROCm/CUDA plans, packaging."""
from __future__ import annotations

import re
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from ops_prebuild.build import _failure_blocks
from ops_prebuild.catalogue import Catalogue, OpSpec, needing_unbuildable
from ops_prebuild.plan import host_args, make_plan
from porter.components.op_builder import profile_simd, simd_define
from ops_prebuild.source import Source
from porter.errors import ConfigError
from porter.run import Runner
from porter.resources import default_jobs
from porter.toolchain.profile import load_toolchain
from porter.torch_facts import TorchInfo, need_for, refusal

TORCH = TorchInfo(version="2.13.0+cpu", cuda=None, hip=None, root="/t/torch", include_dirs=("/t/torch/include",),
                  cuda_include_dirs=(), library_dir="/t/torch/lib", cxx11_abi=True, python_include="/py/include",
                  ext_suffix=".cpython-311-x86_64-linux-gnu.so", python_tag="cp311", platform_tag="linux_x86_64",
                  site_packages="/t/site")
CPU_ADAM = OpSpec(name="cpu_adam", builder="CPUAdamBuilder", build_var="DS_BUILD_CPU_ADAM",
                  module="deepspeed.ops.adam.cpu_adam_op", sources=("csrc/adam/cpu_adam.cpp",),
                  include_paths=("csrc/includes",), device=False, compatible=True,
                  cxx_args=("-O3", "-march=native", "-fopenmp", "-D__AVX512__"))
FUSED_ADAM = OpSpec(name="fused_adam", builder="FusedAdamBuilder", build_var="DS_BUILD_FUSED_ADAM",
                    module="deepspeed.ops.adam.fused_adam_op",
                    sources=("csrc/adam/fused_adam_frontend.cpp", "csrc/adam/multi_tensor_adam.cu"),
                    include_paths=("csrc/includes", "csrc/adam"), device=True, compatible=True,
                    cxx_args=("-O3", "-std=c++17"), nvcc_args=("-O3", "-DVERSION_GE_1_5"))
EVO = OpSpec(name="evoformer_attn", builder="EvoformerAttnBuilder", build_var="", module="deepspeed.ops.x",
             sources=("a.cu",), include_paths=(), device=True, compatible=False, reason="needs CUTLASS")


def catalogue(torch: TorchInfo = TORCH) -> Catalogue:
    return Catalogue(Source("deepspeed", "0.19.8", Path("/src/ds"), "test"), torch, "cuda",
                     (CPU_ADAM, FUSED_ADAM, EVO))


def test_host_guesses_replaced_by_the_profile_isa() -> None:
    """The engine replaces -march; the op_builder family's catalogue replaces its SIMD define."""
    cpu, frontier = load_toolchain("cpu", environ={}), load_toolchain("frontier", environ={})
    assert host_args(profile_simd(CPU_ADAM.cxx_args, cpu.cpu_isa), cpu) == \
        ["-O3", "-fopenmp", "-D__SCALAR__", "-march=x86-64-v2"]
    assert host_args(profile_simd(CPU_ADAM.cxx_args, frontier.cpu_isa), frontier)[-2:] == \
        ["-D__AVX256__", "-march=znver3"]
    native = load_toolchain("cpu", environ={}, overrides={"cpu_isa": "native"})
    assert host_args(profile_simd(CPU_ADAM.cxx_args, "native"), native) == list(CPU_ADAM.cxx_args)


def test_unknown_isa_for_simd_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no SIMD level known"):
        simd_define("pentium4")


def test_select_unknown_incompatible_and_all_compatible() -> None:
    cat = catalogue()
    with pytest.raises(ConfigError, match="did you mean cpu_adam"):
        cat.select(["cpu_adm"], False)
    with pytest.raises(ConfigError, match="needs CUTLASS"):
        cat.select(["evoformer_attn"], False)
    assert [o.name for o in cat.select(None, True)] == ["cpu_adam", "fused_adam"]
    with pytest.raises(ConfigError, match="no ops selected"):
        cat.select(None, False)


def test_an_op_brings_the_ops_its_load_loads_first() -> None:
    """DeepSpeed 0.19.8: async_io's load() loads pin_memory (whose .so holds the pinned-tensor manager) first; a
    wheel with async_io and without pin_memory compiles pin_memory on the node."""
    from dataclasses import replace

    pin = replace(CPU_ADAM, name="pin_memory", builder="PinMemoryBuilder", module="deepspeed.ops.pin_memory_op")
    aio = replace(CPU_ADAM, name="async_io", builder="AsyncIOBuilder", module="deepspeed.ops.aio.async_io_op",
                  loads=("pin_memory",))
    gds = replace(aio, name="gds", builder="GDSBuilder", module="deepspeed.ops.gds.gds_op", loads=("async_io",))
    cat = Catalogue(Source("deepspeed", "0.19.8", Path("/src/ds"), "test"), TORCH, "cuda", (CPU_ADAM, aio, pin, gds))
    assert [o.name for o in cat.select(["cpu_adam", "async_io"], False)] == ["cpu_adam", "async_io", "pin_memory"]
    assert [o.name for o in cat.select(["gds"], False)] == ["gds", "async_io", "pin_memory"]  # and what those load
    assert [o.name for o in cat.select(["pin_memory", "async_io"], False)] == ["pin_memory", "async_io"]
    assert [o.name for o in cat.select(None, True)] == ["cpu_adam", "async_io", "pin_memory", "gds"]
    # an op that loads one the toolchain cannot build is not compatible either (through another op too)
    ops = needing_unbuildable((gds, aio, replace(pin, compatible=False, reason="pin_memory says no"), CPU_ADAM))
    assert [(o.name, o.compatible) for o in ops] == [("gds", False), ("async_io", False), ("pin_memory", False),
                                                     ("cpu_adam", True)]
    assert ops[1].reason == "it loads pin_memory at run time, which this toolchain cannot build (pin_memory says no)"
    assert ops[0].reason.startswith("it loads async_io at run time")
    unbuildable = Catalogue(cat.source, TORCH, "cuda", ops)
    with pytest.raises(ConfigError, match="async_io cannot be built .*: it loads pin_memory"):
        unbuildable.select(["async_io"], False)
    assert [o.name for o in unbuildable.select(None, True)] == ["cpu_adam"]


def test_rocm_plan_is_pinned(tmp_path: Path) -> None:
    tc = load_toolchain("frontier", environ={})
    hip = {"fused_adam": {"csrc/adam/fused_adam_frontend.cpp": str(tmp_path / "hip/csrc/adam/fused_adam_frontend.cpp"),
                          "csrc/adam/multi_tensor_adam.cu": str(tmp_path / "hip/csrc/adam/multi_tensor_adam.hip")}}
    plan = make_plan(catalogue(), tc, [FUSED_ADAM], tmp_path, sources=hip)
    host, dev, link = plan.steps
    # the binding of a GPU op includes HIP headers: the ROCm toolchain's clang++ (ROCm 7's hip_bf16.h is clang-only)
    assert host.argv[0] == tc.hip_cxx == "/opt/rocm-7.1.1/llvm/bin/amdclang++"
    assert "-march=znver3" in host.argv and "-D__HIP_PLATFORM_AMD__=1" in host.argv
    assert dev.argv[0] == "hipcc"
    for flag in ("--offload-arch=gfx90a", "-D__HIP_PLATFORM_AMD__=1", "-DROCM_WAVEFRONT_SIZE=64", "-fno-gpu-rdc",
                 "-DTORCH_EXTENSION_NAME=fused_adam_op", f"-I{tmp_path}/hip/csrc/includes",
                 f"{tc.root}/include", "-DVERSION_GE_1_5"):
        assert flag in dev.argv, flag
    assert dev.argv[dev.argv.index("-c") + 1].endswith("multi_tensor_adam.hip")
    assert not any(a.startswith("-march=native") for s in plan.steps for a in s.argv)
    assert link.argv[0] == "hipcc" and "-lamdhip64" in link.argv and "-ltorch_hip" in link.argv
    assert link.output.endswith("fused_adam/fused_adam_op.cpython-311-x86_64-linux-gnu.so")


def test_rocm_plan_through_a_chroot_names_only_paths_the_chroot_sees(tmp_path: Path) -> None:
    root = tmp_path / "trixie"
    tc = load_toolchain("debian-trixie-rocm", environ={"PORTER_TRIXIE_ROOT": str(root)})
    assert tc.executor.work_root is not None
    build = tc.executor.work_root / "ops" / "x"
    plan = make_plan(catalogue(), tc, [FUSED_ADAM], build, stage=False)  # a dry run: nothing staged
    assert not root.exists()
    host, dev, link = plan.steps
    assert dev.argv[:3] == ("chroot", str(root), "hipcc")
    assert "--offload-arch=gfx90a" in dev.argv and "--offload-arch=gfx942" in dev.argv
    for step in plan.steps:
        assert step.argv[:2] == ("chroot", str(root))
        for arg in step.argv[2:]:
            path = arg[2:] if arg.startswith(("-I", "-L")) else arg
            assert str(tmp_path) not in path and not path.startswith(("/t/", "/py/", "/src/")), (step.kind, arg)
    # torch's headers (outside the root) are named where a real run stages them
    assert "-isystem" in dev.argv
    staged = dev.argv[dev.argv.index("-isystem") + 1]
    w = tc.executor.inside(tc.executor.work_root)
    assert staged.startswith(f"{w}/staged/") and staged.endswith("-include")
    assert dev.argv[dev.argv.index("-c") + 1] == f"{w}/staged/" + \
        tc.executor.staged_path("/src/ds/csrc/adam/multi_tensor_adam.cu").name
    assert link.argv[link.argv.index("-o") + 1] == f"{w}/ops/x/fused_adam/" \
        "fused_adam_op.cpython-311-x86_64-linux-gnu.so"


def test_cuda_plan_uses_nvcc_with_host_isa(tmp_path: Path) -> None:
    op = OpSpec(**{**FUSED_ADAM.__dict__, "nvcc_args": ("-O3", "-gencode=arch=compute_90,code=sm_90")})
    plan = make_plan(catalogue(), load_toolchain("cuda-h100", environ={}), [op], tmp_path)
    dev = plan.steps[1]
    assert dev.argv[0] == "nvcc" and "-gencode=arch=compute_90,code=sm_90" in dev.argv
    assert "-march=x86-64-v2" in dev.argv and "--expt-relaxed-constexpr" in dev.argv
    assert "-lcudart" in plan.steps[2].argv


def test_one_ninja_graph_for_all_ops(tmp_path: Path) -> None:
    plan = make_plan(catalogue(), load_toolchain("cpu", environ={}), [CPU_ADAM], tmp_path)
    text = plan.ninja()
    assert text.count("\nbuild ") == 2 and "rule compile" in text and "deps = gcc" in text
    assert "default " + str(tmp_path / "cpu_adam" / "cpu_adam_op.cpython-311-x86_64-linux-gnu.so").replace(":", "$:") in text


def test_torch_of_the_wrong_kind_is_one_rule() -> None:
    why = refusal(need_for("rocm"), TORCH, "py", what="x")
    assert why is not None and why.exit_code == 2 and "ROCm build of torch" in why.message and "py" in why.message
    why = refusal(need_for("cuda"), TORCH, "py", what="x")
    assert why is not None and "cuda build of torch" in why.message and "make cuda-venv" in (why.hint or "")
    assert refusal(need_for("cpu"), TORCH, "py", what="x") is None
    rocm_torch = TorchInfo(version="2.9.1+rocm6.4", hip="6.4.43482")
    assert refusal("rocm", rocm_torch, "py", what="x") is None


def test_jobs_fit_memory() -> None:
    gib = 1 << 30
    assert default_jobs(3 * gib, cores=16, free_bytes=10 * gib) == 3
    assert default_jobs(gib, cores=2, free_bytes=64 * gib) == 2
    assert default_jobs(gib, cores=2, free_bytes=64 * gib, spare=1) == 3  # the engine's: no core idles at the end
    assert default_jobs(gib, cores=2, free_bytes=int(2.5 * gib), spare=1) == 1  # memory still bounds it
    assert default_jobs(8 * gib, cores=8, free_bytes=2 * gib) == 1


def test_failure_blocks_split_per_edge() -> None:
    out = ("[1/3] COMPILE a\nFAILED: /b/x/a.o\ng++ ...\nerror: boom\n[2/3] COMPILE b\n"
           "FAILED: /b/y/b.o\nerror: bang\nninja: build stopped\n")
    assert _failure_blocks(out) == ["FAILED: /b/x/a.o\ng++ ...\nerror: boom", "FAILED: /b/y/b.o\nerror: bang"]


def test_the_one_flow_adds_deepspeeds_ops_marked_prebuilt_and_relabels_under_the_torch_tag(tmp_path: Path) -> None:
    from ops_prebuild.build import OpResult
    from ops_prebuild.catalogue import Catalogue
    from porter.components.deepspeed.build import DRIVER
    from porter.wheels.engine import prebuilt_files
    from porter.wheels.verify import relabel

    base = tmp_path / "deepspeed-0.19.8-py3-none-any.whl"
    with WheelFile(base, "w") as wf:
        wf.writestr("deepspeed/__init__.py", b"")
        wf.writestr("deepspeed/git_version_info_installed.py",
                    b"version='0.19.8'\ninstalled_ops={'cpu_adam': False}\naccelerator_name='cpu'\n")
        wf.writestr("deepspeed-0.19.8.dist-info/METADATA", b"Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")
        wf.writestr("deepspeed-0.19.8.dist-info/WHEEL", b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    so = tmp_path / "x.so"
    so.write_bytes(b"\x7fELF fake")
    torch = replace(TORCH, ext_suffix=".cpython-311-x86_64-linux-gnu.so", python_tag="cp311", platform_tag="linux_x86_64")
    cat = Catalogue(Source("deepspeed", "0.19.8", tmp_path), torch, "cpu",
                    (OpSpec("cpu_adam", "deepspeed.ops.adam.cpu_adam_op"), OpSpec("fused_adam", "deepspeed.ops.adam")),
                    (("io_submit:aio", False),))
    add, patches = prebuilt_files(base, cat, [OpResult("cpu_adam", "built", so=str(so))], DRIVER)
    assert patches == []  # (no op builder in this wheel to guard)
    tc = load_toolchain("cpu", environ={})
    out, _ = relabel(base, "cpu.x86.64.v2", tmp_path / "out", dict(component="deepspeed", tc=tc, torch=torch,
                     python_tag="cp311", sources={}, extensions=[]), add=add, tag=torch.wheel_tag)
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        assert out.name == "deepspeed-0.19.8+cpu.x86.64.v2-cp311-cp311-linux_x86_64.whl"
        info = "deepspeed-0.19.8+cpu.x86.64.v2.dist-info"
        assert f"{info}/RECORD" in names and f"{info}/porter.json" in names
        assert "deepspeed/ops/adam/cpu_adam_op.cpython-311-x86_64-linux-gnu.so" in names
        assert b"Version: 0.19.8+cpu.x86.64.v2" in z.read(f"{info}/METADATA")
        wheel_meta = z.read(f"{info}/WHEEL").decode()
        assert "Root-Is-Purelib: false" in wheel_meta and "Tag: cp311-cp311-linux_x86_64" in wheel_meta
        assert "py3-none-any" not in wheel_meta
        info_py = z.read("deepspeed/git_version_info_installed.py").decode()
        assert "installed_ops={'cpu_adam': True, 'fused_adam': False}" in info_py
        # the build python's answer to async_io's has_function probe, read by deepspeed/no-jit on the node
        assert "porter_feature_probes={'io_submit:aio': False}" in info_py


def test_builder_flags_come_after_torchs_so_their_undefines_win(tmp_path: Path) -> None:
    op = OpSpec(**{**FUSED_ADAM.__dict__, "nvcc_args": ("-U__CUDA_NO_HALF_OPERATORS__",)})
    dev = make_plan(catalogue(), load_toolchain("cuda-h100", environ={}), [op], tmp_path).steps[1].argv
    assert dev.index("-D__CUDA_NO_HALF_OPERATORS__") < dev.index("-U__CUDA_NO_HALF_OPERATORS__")
    assert "-std=c++20" in dev  # torch 2.13 headers need C++20 when the builder names no standard
    op = OpSpec(**{**FUSED_ADAM.__dict__, "nvcc_args": ("-U__HIP_NO_HALF_OPERATORS__",)})
    dev = make_plan(catalogue(), load_toolchain("frontier", environ={}), [op], tmp_path).steps[1].argv
    assert dev.index("-D__HIP_NO_HALF_OPERATORS__=1") < dev.index("-U__HIP_NO_HALF_OPERATORS__")



def test_compile_only_plan_has_no_link_and_records_each_compile(tmp_path: Path) -> None:
    tc = load_toolchain("frontier", environ={})
    view = tmp_path / "view"
    plan = make_plan(catalogue(), tc, [FUSED_ADAM, CPU_ADAM], tmp_path, compile_only=True, extra_includes=(view,),
                     stage=False)
    assert plan.compile_only and all(s.kind == "compile" for s in plan.steps) and not plan.outputs
    assert plan.objects["fused_adam"] == [s.output for s in plan.steps if s.op == "fused_adam"]
    for step in plan.steps:
        assert step.wrapper[1:3] == ("-m", "ops_prebuild.measure") and step.wrapper[-1] == "--"
        assert step.wrapper[-2] == f"{step.output}.cost.json"
        assert step.argv[0] == ("g++" if step.op == "cpu_adam" else "hipcc" if ".cu" in step.output else tc.hip_cxx)
    text = plan.ninja()
    assert "ops_prebuild.measure" in text and "rule link" in text and " link " not in text.split("default")[0]
    assert text.rstrip().splitlines()[-1].startswith("default ") and ".o" in text.rstrip().splitlines()[-1]
    dev = next(s for s in plan.steps if s.op == "fused_adam" and s.argv[0] == "hipcc").argv
    assert dev[dev.index("-isystem") + 1] == str(view)  # the HIP view comes before torch's own headers
    host = next(s for s in plan.steps if s.op == "cpu_adam").argv
    assert str(view) not in host  # host-only ops never see it


def test_bf16_on_rocm_follows_the_profile_archs(tmp_path: Path) -> None:
    """The op_builder family's rule (porter.components.op_builder.bf16) decides; the engine passes what it says."""
    from dataclasses import replace

    from porter.components.op_builder import bf16

    def flags(tc_name: str, archs: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        tc = load_toolchain(tc_name, environ={}, overrides={"archs": archs})
        ops = [replace(o, bf16=bf16(o.device, tc)) for o in (FUSED_ADAM, CPU_ADAM)]
        return tuple(s.argv for s in make_plan(catalogue(), tc, ops, tmp_path).steps if s.kind == "compile")

    frontend, kernel, cpu = flags("frontier", ("gfx90a", "gfx942"))
    assert "-DBF16_AVAILABLE" in kernel and "-DBF16_AVAILABLE" in frontend  # DeepSpeed never passes it on ROCm
    assert "-DBF16_AVAILABLE" not in cpu
    frontend, kernel, _ = flags("frontier", ("gfx908",))  # MI100: no bf16 in hardware
    assert "-DBF16_AVAILABLE" not in kernel and "-DBF16_AVAILABLE" not in frontend
    cuda = load_toolchain("cuda-h100", environ={})
    assert bf16(True, cuda, own=True) and not bf16(True, cuda)  # CUDA: the builder's own verdict


def test_compile_only_is_for_gpu_profiles(tmp_path: Path) -> None:
    from porter.components.deepspeed.build import DRIVER
    from porter.wheels import WheelRequest
    from porter.wheels.compile import compile_only

    cpu = load_toolchain("cpu", environ={})
    with pytest.raises(ConfigError, match="--compile-only compiles GPU code") as exc:
        compile_only(DRIVER, "deepspeed==0.19.8", WheelRequest(source=tmp_path, toolchain=cpu, output=tmp_path,
                                                               ops=("cpu_adam",)), runner=Runner())
    assert exc.value.exit_code == 2 and "debian-rocm7" in (exc.value.hint or "")


def test_torch_hip_view_is_only_for_a_torch_without_hip(tmp_path: Path) -> None:
    from porter import torch_hip_view as view
    from porter.run import Runner

    assert view.needed(TORCH) and not view.needed(TorchInfo("2.9.1+rocm6.4", hip="6.4"))
    with pytest.raises(ConfigError, match="ROCm build"):
        view.make_view(TorchInfo("2.9.1+rocm6.4", hip="6.4"), tmp_path, python="py", runner=Runner())
    named = view.view_dir(TORCH, tmp_path)
    assert named.parent == tmp_path / "torch-hip-view" and not named.exists()  # a dry run only names it
    bare = TorchInfo("2.13.0+cpu", root=str(tmp_path / "t"), include_dirs=(str(tmp_path / "t" / "include"),))
    (tmp_path / "t" / "include" / "ATen").mkdir(parents=True)
    with pytest.raises(ConfigError, match="no ATen/cuda and c10/cuda headers"):
        view.make_view(bare, tmp_path, python="py", runner=Runner())


def test_shards_split_the_compiles_and_links_read_a_response_file(tmp_path: Path) -> None:
    many = OpSpec(**{**CPU_ADAM.__dict__, "sources": tuple(f"csrc/gen/instance_{i:04d}_with_a_long_name.cpp"
                                                           for i in range(1200))})
    plan = make_plan(catalogue(), load_toolchain("cpu", environ={}), [many], tmp_path)
    compiles = [s for s in plan.steps if s.kind == "compile"]
    shards = [plan.shard(i, 3) for i in range(3)]
    assert sorted(s.output for part in shards for s in part) == sorted(s.output for s in compiles)
    assert {len(part) for part in shards} == {400} and plan.shard(1, 3)[0] is compiles[1]
    with pytest.raises(ConfigError, match="does not exist"):
        plan.shard(3, 3)
    (link,) = plan.links()
    assert link.rsp == tuple(s.output for s in compiles)  # 1200 long paths: far over the limit
    assert f"@{link.output}.rsp" in link.argv and not any(a.endswith(".o") for a in link.argv)
    text = plan.ninja(plan.links(), builddir=".ninja-link")
    assert "builddir = .ninja-link" in text and "rspfile = $out.rsp" in text and "build " in text
    assert "rule compile" in text and text.count("\nbuild ") == 1  # only the link edge
    part = plan.ninja(shards[0], builddir=".ninja-shard-0-of-3")
    assert part.count("\nbuild ") == 400 and part.rstrip().splitlines()[-1].count(".o") == 400
    small = make_plan(catalogue(), load_toolchain("cpu", environ={}), [CPU_ADAM], tmp_path)
    assert not small.links()[0].rsp and "rspfile_content = $rsp" in small.ninja()


def test_a_cached_plan_keys_paths_relative_to_the_build_folder(tmp_path: Path) -> None:
    """What lets the next release hit: the sources copied beside the build folder (the one build flow's layout),
    base_dir above both, and (in a chroot, whose cwd is its root) the compiler started in the build folder."""
    from ops_prebuild.catalogue import source_tops
    from porter.ccache import CompilerCache

    root = tmp_path / "trixie"
    tc = load_toolchain("debian-trixie-rocm", environ={"PORTER_TRIXIE_ROOT": str(root)})
    assert tc.executor.work_root is not None
    keyed = tc.executor.work_root / "wheels" / "deepspeed-0.19.8-x"
    cache = CompilerCache("/usr/bin/ccache", tc.executor.work_root / "ccache", "0123456789abcdef")
    cat = Catalogue(Source("deepspeed", "0.19.8", keyed / "src", "test"), TORCH, "cuda", (CPU_ADAM, FUSED_ADAM, EVO))
    plan = make_plan(cat, tc, [CPU_ADAM, FUSED_ADAM], keyed / "build", stage=False, cache=cache)
    w = tc.executor.inside(tc.executor.work_root)
    assert plan.env["CCACHE_BASEDIR"] == f"{w}/wheels"
    adam = plan.steps[0]
    assert adam.argv[:6] == ("chroot", str(root), "env", "-C", f"{w}/wheels/deepspeed-0.19.8-x/build", "/usr/bin/ccache")
    assert adam.argv[adam.argv.index("-c") + 1] == f"{w}/wheels/deepspeed-0.19.8-x/src/csrc/adam/cpu_adam.cpp"
    assert f"-I{w}/wheels/deepspeed-0.19.8-x/src/csrc/includes" in adam.argv
    assert all("env" not in s.argv for s in plan.links())  # links are not cached
    host = make_plan(catalogue(), load_toolchain("cpu", environ={}), [CPU_ADAM], tmp_path / "b", cache=cache)
    assert host.steps[0].argv[0] == "/usr/bin/ccache" and host.env["CCACHE_BASEDIR"] == str(tmp_path.parent)
    assert "CCACHE_SLOPPINESS" not in host.env
    # --pch: without ccache's PCH sloppiness every step was "could not use precompiled header", none cached
    shared = make_plan(catalogue(), load_toolchain("cpu", environ={}), [CPU_ADAM, CPU_LION], tmp_path / "c",
                       cache=cache, pch=True)
    assert shared.env["CCACHE_SLOPPINESS"] == "pch_defines,time_macros"
    assert [s.argv[0] for s in shared.steps if s.kind in ("pch", "compile")] == ["/usr/bin/ccache"] * 4
    assert source_tops([CPU_ADAM, FUSED_ADAM, EVO]) == ["a.cu", "csrc"]


CPU_LION = OpSpec(name="cpu_lion", builder="CPULionBuilder", build_var="DS_BUILD_CPU_LION",
                  module="deepspeed.ops.lion.cpu_lion_op", sources=("csrc/lion/cpu_lion.cpp", "csrc/lion/cpu_lion_impl.cpp"),
                  include_paths=("csrc/includes",), device=False, compatible=True,
                  cxx_args=("-O3", "-march=native", "-fopenmp", "-D__AVX512__"))


def test_units_that_differ_only_in_the_op_name_share_one_precompiled_torch_header(tmp_path: Path) -> None:
    from ops_prebuild.plan import PCH_HEADER

    tc = load_toolchain("cpu", environ={})
    plan = make_plan(catalogue(), tc, [CPU_ADAM, CPU_LION], tmp_path, pch=True)
    (pch,) = [s for s in plan.steps if s.kind == "pch"]
    header = str(next(iter(plan.files)))
    assert header.endswith(PCH_HEADER) and "#include <torch/extension.h>" in plan.files[header]
    assert pch.output == header + ".gch" and pch.wrapper[-3:] == ("ops_prebuild.publish", pch.output, "--")
    assert "-x" in pch.argv and not any(a.startswith("-DTORCH_EXTENSION_NAME") for a in pch.argv)
    units = [s for s in plan.steps if s.kind == "compile"]
    assert len(units) == 3
    for unit in units:  # each unit reads the header first and still names its op
        assert unit.argv[unit.argv.index("-include") + 1] == header and pch.output in unit.inputs
        assert any(a.startswith("-DTORCH_EXTENSION_NAME=") for a in unit.argv)
    assert "desc = PCH shared: torch_ext.h.gch" in plan.ninja()
    # every shard makes the header its units read; the link step knows nothing of it
    for i in range(2):
        part = plan.shard(i, 2)
        assert part[0] is pch and all(s.kind == "compile" for s in part[1:])
    assert all(pch.output not in s.inputs for s in plan.links())
    # no sharing for one unit, for device units, or for per-unit costs
    alone = make_plan(catalogue(), tc, [CPU_ADAM], tmp_path, pch=True)
    assert not [s for s in alone.steps if s.kind == "pch"] and not alone.files
    costs = make_plan(catalogue(), load_toolchain("frontier", environ={}), [CPU_ADAM, CPU_LION, FUSED_ADAM],
                      tmp_path, pch=True, compile_only=True)
    assert not [s for s in costs.steps if s.kind == "pch"]
    rocm = make_plan(catalogue(), load_toolchain("frontier", environ={}), [CPU_ADAM, FUSED_ADAM], tmp_path, pch=True)
    dev = next(s for s in rocm.steps if s.argv[0] == "hipcc")
    assert "-include" not in dev.argv


def test_the_publish_wrapper_renames_only_a_whole_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ops_prebuild import publish

    seen: list[list[str]] = []

    def compiler(text: str, code: int):  # type: ignore[no-untyped-def]
        def call(cmd: list[str]) -> int:
            seen.append(list(cmd))
            Path(cmd[cmd.index("-o") + 1]).write_text(text)
            if "-MF" in cmd:
                Path(cmd[cmd.index("-MF") + 1]).write_text(f"{text}.d")
            return code
        return call

    out = tmp_path / "h.gch"
    monkeypatch.setattr(publish.subprocess, "call", compiler("x", 0))
    assert publish.main(["publish", str(out), "--", "g++", "-o", str(out)]) == 0 and out.read_text() == "x"
    assert seen[-1][-1].endswith(".tmp.gch")  # ccache still sees a precompiled header
    monkeypatch.setattr(publish.subprocess, "call", compiler("half", 1))
    assert publish.main(["publish", str(out), "--", "g++", "-o", str(out)]) == 1
    assert out.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["h.gch"]
    assert publish.main(["publish", str(out), "g++"]) == 2  # usage
    # an object and its dependency file, as a shard's compile names them
    obj = tmp_path / "a.cpp.o"
    monkeypatch.setattr(publish.subprocess, "call", compiler("obj", 0))
    assert publish.main(["publish", str(obj), "--", "g++", "-MMD", "-MF", f"{obj}.d", "-c", "a.cpp", "-o",
                         str(obj)]) == 0
    assert obj.read_text() == "obj" and Path(f"{obj}.d").read_text() == "obj.d"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.cpp.o", "a.cpp.o.d", "h.gch"]
    # inside a chroot the compiler sees other paths: the same private names there
    monkeypatch.setattr(publish.subprocess, "call", lambda cmd: seen.append(list(cmd)) or 1)
    assert publish.main(["publish", str(obj), "--", "nvcc", "--dependency-output", "/in/a.cu.o.d", "-c", "a.cu",
                         "-o", "/in/a.cu.o"]) == 1
    argv = seen[-1]
    assert re.fullmatch(r"/in/a\.cu\.\d+@.+\.tmp\.o", argv[argv.index("-o") + 1])
    assert argv[argv.index("--dependency-output") + 1].startswith("/in/a.cu.o.d.")
    assert obj.read_text() == "obj"  # a failed compile publishes nothing


def test_a_shards_ninja_file_publishes_each_object_whole(tmp_path: Path) -> None:
    plan = make_plan(catalogue(), load_toolchain("cpu", environ={}), [CPU_ADAM, CPU_LION], tmp_path)
    part = plan.shard(0, 2)
    text = plan.ninja(part, builddir=".ninja-shard-0-of-2", publish=True)
    cmds = [ln for ln in text.splitlines() if ln.startswith("  cmd = ")]
    assert cmds and all("-m ops_prebuild.publish " in c for c in cmds)
    assert all(f"ops_prebuild.publish {s.output} -- " in text for s in part if s.kind == "compile")
    assert "ops_prebuild.publish" not in plan.ninja()  # one build alone holds its folder: no wrapper


def test_debug_info_levels_replace_the_builders_g(tmp_path: Path) -> None:
    tc = load_toolchain("frontier", environ={})
    adam = OpSpec(**{**CPU_ADAM.__dict__, "cxx_args": ("-O3", "-g", "-fopenmp")})
    fused = OpSpec(**{**FUSED_ADAM.__dict__, "cxx_args": ("-O3", "-g"), "nvcc_args": ("-O3", "-g")})
    full = make_plan(catalogue(), tc, [adam, fused], tmp_path)
    lines = make_plan(catalogue(), tc, [adam, fused], tmp_path, debug="lines")
    for a, b in zip(full.steps, lines.steps):
        if a.kind == "compile":
            assert "-g" in a.argv and "-g" not in b.argv and "-g1" in b.argv
            assert [x for x in a.argv if x != "-g"] == [x for x in b.argv if x != "-g1"]
    none = make_plan(catalogue(), tc, [adam], tmp_path, debug="none")
    assert "-g0" in none.steps[0].argv
    cuda = make_plan(catalogue(TorchInfo(**{**TORCH.__dict__, "cuda": "13.0"})), load_toolchain("cuda-h100", environ={}),
                     [fused], tmp_path, debug="lines")
    dev = next(s for s in cuda.steps if s.kind == "compile" and "-c" in s.argv and s.argv[s.argv.index("-c") + 1].endswith(".cu"))
    assert "-g" in dev.argv  # nvcc's own -g is left alone
    with pytest.raises(ConfigError, match="debug info 'some'"):
        make_plan(catalogue(), tc, [adam], tmp_path, debug="some")


def test_chroot_plan_stages_torch_include_folders_as_one_tree(tmp_path: Path) -> None:
    """Every -isystem into torch's headers is a path inside one staged copy of torch's include/ (issue 18:
    two copies made clang see <torch/extension.h>'s headers twice)."""
    inc = tmp_path / "torch" / "include"
    api = inc / "torch" / "csrc" / "api" / "include"
    api.mkdir(parents=True)
    torch = TorchInfo(**{**TORCH.__dict__, "include_dirs": (str(inc), str(api))})
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    tc = load_toolchain("debian-rocm7", environ={"PORTER_ROCM7_ROOT": str(root)})
    plan = make_plan(catalogue(torch), tc, [FUSED_ADAM], tmp_path / "b", stage=False)
    argv = next(s.argv for s in plan.steps if s.output.endswith(".cu.o"))
    system = [argv[i + 1] for i, a in enumerate(argv) if a == "-isystem"]
    python_inc = tc.executor.visible(TORCH.python_include, stage=False)
    torch_inc = [d for d in system if d.endswith(("-include", "/csrc/api/include")) and d != python_inc]
    staged = [d for d in torch_inc if not d.startswith(torch_inc[0])]
    assert torch_inc[1] == torch_inc[0] + "/torch/csrc/api/include" and not staged, system


def test_first_error_names_the_unit_that_included_the_failing_header() -> None:
    from ops_prebuild.build import OpResult, failures, first_error

    log = ("FAILED: [code=1] /b/op/x.cpp.o\nchroot /r g++ -c /b/hip/csrc/op/x_hip.cpp -o /b/op/x.cpp.o\n"
           "In file included from /usr/include/hip/hip_bf16.h:29,\n"
           "                 from /b/hip/csrc/includes/conv_hip.h:7,\n"
           "                 from /b/hip/csrc/op/x_hip.cpp:4:\n"
           "/usr/include/hip/amd_detail/amd_hip_bf16.h:350:43: error: static assertion failed\n")
    err = first_error(log)
    assert err == ("/usr/include/hip/amd_detail/amd_hip_bf16.h:350:43: error: static assertion failed "
                   "(included from /b/hip/csrc/op/x_hip.cpp:4)")
    assert first_error("x.cu:3:1: error: expected ';'\n") == "x.cu:3:1: error: expected ';'"
    text = failures([OpResult("op", "failed", 1.0, "/b/op/build.log", error=err)], "deepspeed 0.18.8 (sdist)",
                    load_toolchain("debian-rocm7", environ={}))
    assert text.startswith("in deepspeed 0.18.8 (sdist) with debian-rocm7:")
    assert "op (gfx90a, gfx942, gfx950):\n    /usr/include/hip" in text and "full log: /b/op/build.log" in text
    assert first_error(f"ERROR: no op compiled {text}") == err  # the compiler's line, read back from porter's own


def test_ops_the_tree_declares_incompatible_are_listed_with_its_reason(tmp_path: Path) -> None:
    from ops_prebuild.build import BuildResult

    cat = catalogue()
    plan = make_plan(cat, load_toolchain("cpu", environ={}), cat.select(None, True)[:1], tmp_path)
    doc = BuildResult(plan, cat).to_dict()
    assert doc["excluded"] == [{"name": "evoformer_attn", "reason": "needs CUTLASS"}]


def test_the_wheel_tag_of_extension_modules_comes_from_packaging() -> None:
    from packaging.tags import parse_tag

    tag = TorchInfo("2.13.0+cpu", python_tag="cp311", platform_tag="manylinux_2_28_x86_64").wheel_tag
    assert tag == "cp311-cp311-manylinux_2_28_x86_64"
    (parsed,) = parse_tag(tag)
    assert (parsed.interpreter, parsed.abi, parsed.platform) == ("cp311", "cp311", "manylinux_2_28_x86_64")
