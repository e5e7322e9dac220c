"""porter port megatron-deepspeed, the parts that need no subprocess: tree preparation, the kernel
specs, and the wheel packaging (with stand-in .so files)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from porter.artifacts import labels
from ops_prebuild.build import OpResult
from porter.errors import ConfigError
from porter.artifacts.manifest import read_manifest
from porter.fs import sha256_file
from porter.components.megatron.port import KernelBuild, package_kernels, port_megatron, prebuilt_ops
from porter.port import PORT_RECORD
from porter.log import quiet_logger
from porter.run import RecordingRunner
from porter.toolchain.profile import Toolchain, load_toolchain
from ops_prebuild.plan import Plan
from porter.torch_facts import TorchInfo

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "patch"
OLDER = Path(__file__).resolve().parent.parent / "fixtures" / "megatron-older"


def torch_info(tmp: Path, hip: str | None = None) -> TorchInfo:
    return TorchInfo(version="2.13.0+cpu", cuda=None, hip=hip, root=str(tmp / "torch"),
                     include_dirs=(str(tmp / "torch/include"),), cuda_include_dirs=(),
                     library_dir=str(tmp / "torch/lib"), cxx11_abi=True, python_include="/usr/include/python3.11",
                     ext_suffix=".cpython-311-x86_64-linux-gnu.so", python_tag="cp311", platform_tag="linux_x86_64",
                     site_packages=str(tmp / "site"))


def planned(tree: Path, tc: Toolchain, torch: TorchInfo) -> Plan:
    """The kernels' plan as a dry run of the port makes it (on the flow: nothing runs, nothing is written)."""
    return KernelBuild("0.2.0", tree).build(tree, tc, torch, RecordingRunner(quiet_logger()), quiet_logger(), python=None,
                                            jobs=None).plan


@pytest.fixture
def mds(tmp_path: Path) -> Path:
    dest = tmp_path / "Megatron-DeepSpeed"
    shutil.copytree(FIXTURES / "megatron-deepspeed", dest)
    return dest


def test_port_copies_beside_the_tree_and_refuses_bad_outputs(mds: Path, tmp_path: Path) -> None:
    tc = load_toolchain("cuda-h100")  # (no hipify: the copy and the checks of the output alone)

    def port(tree: Path, out: Path | None = None, in_place: bool = False) -> Path:
        return port_megatron(tree, tc, out=out, in_place=in_place, kernels=False).out

    out = port(mds)
    assert out == tmp_path / "Megatron-DeepSpeed-cuda-h100"
    assert (out / PORT_RECORD).is_file() and (out / "megatron/fused_kernels/__init__.py").is_file()
    assert not (mds / ".porter").exists()
    assert port(mds, out) == out  # a re-run replaces its own earlier port
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("not ours")
    with pytest.raises(ConfigError, match="was not written by porter port"):
        port(mds, tmp_path / "other")
    with pytest.raises(ConfigError, match="inside it"):
        port(mds, mds / "sub")
    with pytest.raises(ConfigError, match="exclude each other"):
        port(mds, tmp_path / "x", in_place=True)
    with pytest.raises(ConfigError, match="not a Megatron-DeepSpeed tree"):
        port(tmp_path / "other")


def test_rocm_plan_uses_profile_archs_and_wavefront(mds: Path, tmp_path: Path) -> None:
    tc = load_toolchain("lumi-g")
    plan = planned(mds, tc, torch_info(tmp_path))
    assert sorted(plan.outputs) == ["scaled_masked_softmax_cuda", "scaled_softmax_cuda",
                                    "scaled_upper_triang_masked_softmax_cuda"]
    device = [s for s in plan.steps if s.kind == "compile" and s.inputs[0].endswith("_cuda.cu")]
    assert len(device) == 3
    for step in device:
        argv = list(step.argv)
        argv = argv[1:] if Path(argv[0]).name == "ccache" else argv  # (the compiler cache, where one is installed)
        assert argv[0] == tc.compiler
        assert [a for a in argv if a.startswith("--offload-arch=")] == [f"--offload-arch={t.spec}" for t in tc.targets]
        assert "-DROCM_WAVEFRONT_SIZE=64" in argv and "-D__HIP_PLATFORM_AMD__=1" in argv
        assert "-std=c++20" in argv and "-D__HIP_NO_HALF_CONVERSIONS__=1" in argv
    links = [s for s in plan.steps if s.kind == "link"]
    assert all(s.output.endswith("_cuda.cpython-311-x86_64-linux-gnu.so") for s in links)


def test_cuda_specs_carry_gencode_and_toolkit_include(mds: Path) -> None:
    tc = load_toolchain("cuda-h100")
    (op, *_) = prebuilt_ops(tc, mds)
    assert "-gencode=arch=compute_90,code=sm_90" in op.nvcc_args
    assert f"{tc.root}/include" in op.include_paths
    assert op.module == "scaled_upper_triang_masked_softmax_cuda"  # top-level, as Megatron imports it


def test_package_kernels_wheel_and_manifest(tmp_path: Path) -> None:
    tc = load_toolchain("frontier")
    ops = []
    for name in ("scaled_softmax_cuda", "scaled_masked_softmax_cuda"):
        so = tmp_path / f"{name}.cpython-311-x86_64-linux-gnu.so"
        so.write_bytes(b"\x7fELF stand-in " + name.encode())
        ops.append(OpResult(name, "built", 1.0, "log", str(so), sha256_file(so)))
    house = tmp_path / "wheelhouse"
    house.mkdir()
    wheel, manifest = package_kernels(ops, tc, torch_info(tmp_path), "0.2.0", house, source="/src")
    assert wheel.name == f"megatron_fused_kernels-0.2.0+{labels.make(tc)}-cp311-cp311-linux_x86_64.whl"
    m = read_manifest(manifest)
    assert m["component"] == "megatron-deepspeed" and m["wheel"]["sha256"] == sha256_file(wheel)
    assert m["target"]["wavefront"] == 64 and m["target"]["archs"] == list(tc.arch_names)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "scaled_softmax_cuda.cpython-311-x86_64-linux-gnu.so" in names
        record = zf.read(f"megatron_fused_kernels-0.2.0+{labels.make(tc)}.dist-info/RECORD").decode()
        assert "scaled_masked_softmax_cuda.cpython-311-x86_64-linux-gnu.so,sha256=" in record
        inner = json.loads(zf.read(f"megatron_fused_kernels-0.2.0+{labels.make(tc)}.dist-info/porter.json"))
        assert inner["component"] == "megatron-deepspeed"
    assert [p.name for p in house.iterdir()] == [wheel.name, manifest.name] or \
        sorted(p.name for p in house.iterdir()) == sorted([wheel.name, manifest.name])


def test_older_generation_is_recognised_and_its_layer_norm_planned(tmp_path: Path) -> None:
    """BLOOM-era trees (and site ports of them) have the masked and upper-triangular softmax, no scaled_softmax.cpp,
    and a fused layer norm that their loader JIT-builds at every start-up (issue 18: refused as 'not a tree')."""
    from porter.components.megatron import is_tree, kernels

    tree = tmp_path / "bloom"
    shutil.copytree(OLDER, tree)
    assert is_tree(tree) and "fused_mix_prec_layer_norm_cuda" in {k.module for k in kernels(tree)}
    out = port_megatron(tree, load_toolchain("cuda-h100"), kernels=False).out
    assert (out / "megatron/fused_kernels/layer_norm_cuda_kernel.cu").is_file()
    rocm = planned(tree, load_toolchain("debian-rocm7", environ={"PORTER_ROCM7_ROOT": str(tmp_path / "r7")}),
                   torch_info(tmp_path))
    assert sorted(rocm.outputs) == ["fused_mix_prec_layer_norm_cuda", "scaled_masked_softmax_cuda",
                                    "scaled_upper_triang_masked_softmax_cuda"]
    ln = next(s for s in rocm.steps if s.output.endswith("layer_norm_cuda_kernel.cu.o"))
    assert "-maxrregcount=50" not in ln.argv and len([a for a in ln.argv if a.startswith("--offload-arch=")]) == 3
    (cuda_ln,) = [o for o in prebuilt_ops(load_toolchain("cuda-h100"), tree)
                  if o.module == "fused_mix_prec_layer_norm_cuda"]
    assert "-maxrregcount=50" in cuda_ln.nvcc_args  # what its loader passes nvcc


def test_a_tree_without_the_common_softmax_kernels_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "half"
    shutil.copytree(OLDER, tree)
    (tree / "megatron/fused_kernels/scaled_masked_softmax_cuda.cu").unlink()
    with pytest.raises(ConfigError, match="masked and upper-triangular"):
        port_megatron(tree, load_toolchain("frontier"), kernels=False)


def test_ported_older_loader_imports_its_own_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loader patch, applied to the older generation, imports the prebuilt layer norm at every start-up and the
    softmax kernels only with --masked-softmax-fusion, and never compiles (a missing module is an error that names
    the porter command)."""
    import importlib.util
    import sys
    import types

    from porter.components.megatron.port import port_megatron

    pytest.importorskip("torch.utils.hipify", reason="the port hipifies with torch's hipify; torch is not installed")

    tree = tmp_path / "bloom"
    shutil.copytree(OLDER, tree)
    res = port_megatron(tree, load_toolchain("frontier"), kernels=False)
    init = res.out / "megatron/fused_kernels/__init__.py"
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch.utils")
    ext = types.ModuleType("torch.utils.cpp_extension")

    def no_jit(**kwargs: object) -> None:
        raise AssertionError(f"compiled at start-up: {kwargs.get('name')}")

    ext.load = no_jit  # type: ignore[attr-defined]
    for name, mod in (("torch", torch), ("torch.utils", utils), ("torch.utils.cpp_extension", ext)):
        monkeypatch.setitem(sys.modules, name, mod)
    utils.cpp_extension = ext  # type: ignore[attr-defined]
    torch.utils = utils  # type: ignore[attr-defined]
    monkeypatch.delenv("PORTER_ALLOW_JIT", raising=False)
    spec = importlib.util.spec_from_file_location("porter_test_loader", init)
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    args = types.SimpleNamespace(rank=0, masked_softmax_fusion=False)
    with pytest.raises(RuntimeError, match="fused_mix_prec_layer_norm_cuda") as exc:
        loader.load(args)
    assert "scaled_masked_softmax_cuda" not in str(exc.value) and "porter port megatron-deepspeed" in str(exc.value)
    monkeypatch.setitem(sys.modules, "fused_mix_prec_layer_norm_cuda", types.ModuleType("fused_mix_prec_layer_norm_cuda"))
    loader.load(args)  # the prebuilt layer norm imports: nothing else is asked for
    args.masked_softmax_fusion = True
    with pytest.raises(RuntimeError) as exc:
        loader.load(args)
    assert "scaled_upper_triang_masked_softmax_cuda" in str(exc.value) and "scaled_softmax_cuda (" not in str(exc.value)


def test_port_compile_only_with_a_failed_kernel_exits_3_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Some kernels compiled, one did not: exit 3 (partial), the ERROR names the kernel, its archs, the first error
    and the log; --json still prints the whole report on stdout."""
    import porter.components.megatron.port
    from porter.cli import main
    from porter.port import PortResult

    tree = tmp_path / "t"
    res = PortResult(tree, tmp_path / "out", "debian-rocm7", "0", compile_only=True, compiled=[
        {"name": "scaled_masked_softmax_cuda", "status": "compiled", "error": "", "log": "a.log",
         "archs": {"gfx90a": "compiled"}, "tus": [], "seconds": 1.0},
        {"name": "fused_mix_prec_layer_norm_cuda", "status": "failed", "error": "k.cu:3:1: error: boom",
         "log": "/b/ln/build.log", "archs": {"gfx90a": "failed"}, "tus": [], "seconds": 1.0}])
    monkeypatch.setattr(porter.components.megatron.port, "port_megatron", lambda *a, **k: res)
    for extra in ([], ["--json"]):
        with pytest.raises(SystemExit) as exc:
            main(["port", "megatron-deepspeed", str(tmp_path), "-t", "debian-rocm7", "--compile-only", *extra])
        out, err = capsys.readouterr()
        assert exc.value.code == 3, err
        assert "fused_mix_prec_layer_norm_cuda (gfx90a):\n    k.cu:3:1: error: boom" in err  # the archs it failed for
        assert "full log: /b/ln/build.log" in err and "Traceback" not in err
        if extra:
            assert json.loads(out)["compiled"][1]["status"] == "failed"


def test_kernel_jobs_are_sized_from_what_a_compile_only_port_measured(mds: Path, tmp_path: Path) -> None:
    """On the one build flow, the port's kernels take their MAX_JOBS from measured costs as every build does."""
    from porter.wheels import costs
    from porter.wheels.base import Machine, WheelRequest
    from porter.components.megatron.port import PER_JOB

    tc, machine, drv = load_toolchain("mi300x"), Machine(cores=64, free_bytes=25 << 30), KernelBuild("0.2.0", mds)
    info = drv.detect(mds)
    guess = drv.plan(info, WheelRequest(source=mds, toolchain=tc, output=tmp_path), machine)
    assert guess.per_job_source == "guess" and guess.per_job_bytes == PER_JOB and guess.jobs == 4
    costs.record(info.project, info.version, tc, [("scaled_softmax_cuda", 40.0, 1400 * 1024)], tmp_path)
    measured = costs.load(info.project, info.version, tc, tmp_path)
    p = drv.plan(info, WheelRequest(source=mds, toolchain=tc, output=tmp_path, measured=measured), machine)
    assert p.per_job_source == "measured" and p.per_job_bytes == 1792 << 20 and p.jobs == 13
    assert any("measured compile costs" in n for n in p.notes)
