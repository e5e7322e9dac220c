"""apex and flash-attn drivers: detection, regimes, env/args from the profile, bad input (no subprocess)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from porter.artifacts import labels
from porter.errors import ConfigError
from porter.toolchain.profile import load_toolchain
from porter.components import get_driver, wheel_drivers
from porter.wheels import Machine, WheelRequest
from porter.components.apex import read_flag_extensions
from porter.wheels.base import GiB
from porter.wheels.engine import detect
from porter.components.flash_attn import allowed_archs
from tests.conftest import FIXTURES

DRIVERS = wheel_drivers()

APEX_ENV = FIXTURES / "apex-env"
APEX_FLAGS = FIXTURES / "apex-flags"
FA = FIXTURES / "flash-attn-mini"
BIG = Machine(cores=64, free_bytes=512 * GiB)


def request(source: Path, tc: str = "mi300x", **kw: object) -> WheelRequest:
    archs = kw.pop("archs", ())
    return WheelRequest(source=source, toolchain=load_toolchain(tc, overrides={"archs": archs}),
                        output=Path("/nonexistent"), **kw)  # type: ignore[arg-type]


def plan(name: str, source: Path, tc: str = "mi300x", machine: Machine = BIG, **kw: object):  # type: ignore[no-untyped-def]
    d = get_driver(name)
    info = detect(d, source, DRIVERS)
    return d.plan(info, request(source, tc, **kw), machine)


# -- apex ---------------------------------------------------------------------------------------

def test_apex_env_regime_and_op_catalogue_are_read_from_the_tree() -> None:
    info = get_driver("apex").detect(APEX_ENV)
    assert info is not None and info.regime == "env" and info.version == "1.14.0a0"
    ops = {op.name: (op.group, op.build_var, op.module) for op in info.ops}
    assert ops == {"apex_C": ("cpp", "APEX_BUILD_APEX_C", "apex.apex_C"),
                   "fused_demo_cuda": ("cuda", "APEX_BUILD_FUSED_DEMO", "apex.fused_demo_cuda")}


def test_apex_flags_regime_reads_extensions_under_the_flags() -> None:
    info = get_driver("apex").detect(APEX_FLAGS)
    assert info is not None and info.regime == "flags" and info.version == "1.7.0"
    ops = {op.name: (op.group, op.required) for op in info.ops}
    # xentropy_cuda is created inside a further condition: optional
    assert ops == {"apex_C": ("cpp", True), "amp_C": ("cuda", True), "xentropy_cuda": ("cuda", False)}


def test_apex_env_regime_all_ops_on_rocm_sets_every_op_switch_and_arch() -> None:
    p = plan("apex", APEX_ENV, "mi300x")
    assert p.env["APEX_BUILD_APEX_C"] == "1" and p.env["APEX_BUILD_FUSED_DEMO"] == "1"
    assert p.env["APEX_BUILD_CPP_OPS"] is None and p.env["APEX_BUILD_CUDA_OPS"] is None
    assert p.env["PYTORCH_ROCM_ARCH"] == "gfx942"
    assert p.pip_args == () and p.needs_torch == "rocm" and p.label == labels.make(load_toolchain("mi300x"))
    assert set(p.expect.modules) == {"apex.apex_C", "apex.fused_demo_cuda"}
    assert p.expect.archs == ("gfx942",) and p.expect.prebuilt


def test_apex_single_op_sets_its_own_switch_and_unsets_the_rest() -> None:
    p = plan("apex", APEX_ENV, "frontier", ops=("fused_demo_cuda",))
    assert p.env["APEX_BUILD_FUSED_DEMO"] == "1"
    assert p.env["APEX_BUILD_APEX_C"] is None and p.env["APEX_BUILD_CPP_OPS"] is None
    assert p.env["APEX_BUILD_CUDA_OPS"] is None
    assert p.expect.modules == ("apex.fused_demo_cuda",) and p.env["PYTORCH_ROCM_ARCH"] == "gfx90a"


def test_apex_cpu_profile_builds_cpp_ops_only_and_needs_no_rocm_torch() -> None:
    p = plan("apex", APEX_ENV, "cpu")
    assert p.env["APEX_BUILD_APEX_C"] == "1" and p.env["APEX_BUILD_FUSED_DEMO"] is None
    assert p.env["PYTORCH_ROCM_ARCH"] is None and p.needs_torch is None and p.expect.archs == ()
    with pytest.raises(ConfigError, match="need a rocm toolchain"):
        plan("apex", APEX_ENV, "cpu", ops=("cuda",))
    with pytest.raises(ConfigError, match="device .HIP. op"):
        plan("apex", APEX_ENV, "cpu", ops=("fused_demo_cuda",))


def test_apex_flags_regime_passes_build_options() -> None:
    p = plan("apex", APEX_FLAGS, "mi300x")
    assert p.pip_args == ("--config-settings=--build-option=--cpp_ext", "--config-settings=--build-option=--cuda_ext")
    assert set(p.expect.modules) == {"apex_C", "amp_C"} and p.expect.optional == ("xentropy_cuda",)
    cpu = plan("apex", APEX_FLAGS, "cpu")
    assert cpu.pip_args == ("--config-settings=--build-option=--cpp_ext",)
    with pytest.raises(ConfigError, match="groups only"):
        plan("apex", APEX_FLAGS, "mi300x", ops=("amp_C_typo",))


def test_apex_forced_wrong_regime_carries_the_empty_wheel_explanation() -> None:
    p = plan("apex", APEX_ENV, "cpu", regime="flags")
    assert p.pip_args == ("--config-settings=--build-option=--cpp_ext",)
    assert "silently drops --cpp_ext" in p.expect.empty_hint and p.expect.prebuilt


def test_apex_unknown_op_names_close_matches() -> None:
    with pytest.raises(ConfigError, match="did you mean fused_demo_cuda"):
        plan("apex", APEX_ENV, ops=("fused_demo_cud",))


def test_read_flag_extensions_positional_and_keyword_names() -> None:
    text = ('import sys\nif "--cpp_ext" in sys.argv:\n    e.append(CppExtension("apex_C", []))\n'
            'if "--distributed_adam" in sys.argv or "--cuda_ext" in sys.argv:\n'
            '    e.append(CUDAExtension(name="distributed_adam_cuda", sources=[]))\n')
    names = {(o.name, o.group) for o in read_flag_extensions(text, "setup.py")[0]}
    assert names == {("apex_C", "cpp"), ("distributed_adam_cuda", "cuda")}


# -- flash-attn ---------------------------------------------------------------------------------

def test_flash_attn_ck_plan_sets_every_knob_from_the_profile() -> None:
    p = plan("flash-attn", FA, "mi300x", machine=Machine(cores=16, free_bytes=40 * GiB))
    env = p.env
    assert env["BUILD_TARGET"] == "rocm" and env["GPU_ARCHS"] == "gfx942" and env["PYTORCH_ROCM_ARCH"] == "gfx942"
    assert env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] is None and env["FLASH_ATTENTION_SKIP_CUDA_BUILD"] is None
    assert env["MAX_JOBS"] == str(p.jobs) and p.jobs * p.per_job_bytes <= 40 * GiB
    assert "native" not in env["GPU_ARCHS"]
    assert p.needs_torch == "rocm" and p.expect.modules == ("flash_attn_2_cuda",) and p.expect.archs == ("gfx942",)


def test_flash_attn_triton_plan_needs_no_rocm_torch_and_no_extension() -> None:
    p = plan("flash-attn", FA, "frontier", backend="triton")
    assert p.env["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "TRUE" and p.env["FLASH_ATTENTION_SKIP_CK_BUILD"] == "TRUE"
    assert p.needs_torch is None and not p.expect.prebuilt
    assert p.expect.packages == ("flash_attn/flash_attn_triton_amd",) and p.label == labels.make(load_toolchain("frontier"))


def test_flash_attn_unsupported_arch_is_refused_with_the_tree_list() -> None:
    with pytest.raises(ConfigError) as exc:
        plan("flash-attn", FA, "debian-rocm")  # gfx90a + gfx908
    assert "does not support gfx908" in exc.value.message and "gfx90a, gfx942, gfx950" in exc.value.message
    assert exc.value.exit_code == 2


def test_flash_attn_missing_submodule_names_the_fix(tmp_path: Path) -> None:
    tree = tmp_path / "fa"
    shutil.copytree(FA, tree)
    ck = tree / "csrc" / "composable_kernel"
    shutil.rmtree(ck)
    ck.mkdir()  # what a clone without --recursive leaves
    with pytest.raises(ConfigError) as exc:
        plan("flash-attn", tree, "mi300x")
    assert "composable_kernel" in exc.value.message and "is empty" in exc.value.message
    assert "git submodule update --init csrc/composable_kernel" in (exc.value.hint or "")
    # the Triton backend does not need the submodule
    assert plan("flash-attn", tree, "mi300x", backend="triton").backend == "triton"


def test_flash_attn_needs_a_rocm_profile() -> None:
    with pytest.raises(ConfigError, match="for ROCm only"):
        plan("flash-attn", FA, "cpu")


def test_allowed_archs_from_setup_text_or_version() -> None:
    assert allowed_archs('allowed_archs = ["native", "gfx90a", "gfx940"]\n', "9.9") == ("gfx90a", "gfx940")
    assert allowed_archs("nothing here", "2.8.3") == ("gfx90a", "gfx942", "gfx950")
    assert allowed_archs("nothing here", "2.6.3") == ("gfx90a", "gfx940", "gfx941", "gfx942")


def test_flash_attn_without_triton_switch_refuses_triton(tmp_path: Path) -> None:
    tree = tmp_path / "fa"
    shutil.copytree(FA, tree)
    setup = tree / "setup.py"
    setup.write_text(setup.read_text().replace("FLASH_ATTENTION_TRITON_AMD_ENABLE", "SOME_OTHER_SWITCH"))
    with pytest.raises(ConfigError, match="no Triton backend"):
        plan("flash-attn", tree, "mi300x", backend="triton")


# -- neither -----------------------------------------------------------------------------------

def test_source_that_is_neither_project(tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup(name='x')\n")
    for name in DRIVERS:
        with pytest.raises(ConfigError) as exc:
            detect(get_driver(name), tmp_path, DRIVERS)
        assert f"is not a {get_driver(name).title} source tree (nor " in exc.value.message, exc.value.message
        assert all(d.title in exc.value.message for d in DRIVERS.values())  # the project asked for, and the others


def test_the_other_project_is_named() -> None:
    with pytest.raises(ConfigError) as exc:
        detect(get_driver("apex"), FA, DRIVERS)
    assert "FlashAttention tree, not ROCm apex" in exc.value.message
    assert "porter wheel flash-attn" in (exc.value.hint or "")


def test_unknown_driver() -> None:
    with pytest.raises(ConfigError, match="did you mean apex"):
        get_driver("apx")
