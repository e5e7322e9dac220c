"""porter's emulated HIP target without a compiler: its profiles, labels, plan, link step and check bookkeeping."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from ops_prebuild.catalogue import Catalogue, OpSpec
from ops_prebuild.plan import make_plan
from ops_prebuild.source import Source
from porter import emulate
from porter.artifacts import labels
from porter.emulate import checks, shared
from porter.emulate.run import CheckRun, emulated_wheels, unpack
from porter.errors import ConfigError
from porter.toolchain.profile import load_toolchain
from porter.torch_facts import need_for
from tests.unit.test_ops_plan import FUSED_ADAM, TORCH


@pytest.mark.parametrize("wave", [64, 32])
def test_the_presets_are_one_wave_size_each_and_label_their_wheels(wave: int) -> None:
    tc = load_toolchain(f"emulate-wave{wave}", environ={})
    assert (tc.kind, tc.wavefront, tc.hip, tc.gpu, tc.arch_names) == ("emulated", wave, True, True, (f"wave{wave}",))
    assert labels.make(tc) == f"emu.wave{wave}"
    parsed = labels.parse(f"emu.wave{wave}")
    assert parsed is not None and (parsed.kind, parsed.archs) == ("emulated", (f"wave{wave}",))
    assert need_for("emulated") is None  # its modules link against torch's CPU libraries: any torch builds them


def test_an_emulated_profile_takes_one_emulated_arch() -> None:
    with pytest.raises(ConfigError, match="one wavefront size"):
        load_toolchain("emulate-wave64", environ={}, overrides={"archs": ["wave64", "wave64"]})
    with pytest.raises(ConfigError, match="not emulated archs"):
        load_toolchain("emulate-wave64", environ={}, overrides={"archs": ["gfx90a"]})
    with pytest.raises(ConfigError, match="not rocm archs"):
        load_toolchain("debian-rocm7", environ={}, overrides={"archs": ["wave64"]})
    assert labels.parse("emu.wave48") is None


def test_device_flags_keep_what_the_host_compiler_takes() -> None:
    flags = ["-O3", "-mllvm", "-amdgpu-early-inline-all=true", "--offload-arch=gfx90a", "-fgpu-rdc", "-fno-gpu-rdc",
             "-DX=1", "-U__HIP_NO_HALF_OPERATORS__", "-munsafe-fp-atomics", "-std=c++17", "--gpu-max-threads-per-block=1024"]
    assert emulate.device_flags(flags) == ["-O3", "-DX=1", "-U__HIP_NO_HALF_OPERATORS__", "-std=c++17"]
    assert emulate.compile_flags(64) == ["-DPORTER_EMU_WAVE=64", f"-I{emulate.INCLUDE_DIR}", "-include",
                                         "porter_emu/prelude.h"]
    assert len(emulate.revision()) == 16 and emulate.revision() == emulate.revision()


FUSED_LION = OpSpec(name="fused_lion", builder="FusedLionBuilder", build_var="DS_BUILD_FUSED_LION",
                    module="deepspeed.ops.lion.fused_lion_op",
                    sources=("csrc/lion/fused_lion_frontend.cpp", "csrc/lion/multi_tensor_lion.cu"),
                    include_paths=("csrc/includes", "csrc/lion"), device=True, compatible=True,
                    cxx_args=FUSED_ADAM.cxx_args, nvcc_args=FUSED_ADAM.nvcc_args)


def _plan(tmp_path: Path, wave: int = 64) -> list[tuple[str, list[str]]]:
    from dataclasses import replace

    from porter.components.op_builder import bf16

    tc = load_toolchain(f"emulate-wave{wave}", environ={})
    ops = [replace(o, bf16=bf16(o.device, tc)) for o in (FUSED_ADAM, FUSED_LION)]  # as DeepSpeed's catalogue says
    cat = Catalogue(Source("deepspeed", "0.19.8", tmp_path, "test"), TORCH, "cuda", tuple(ops))
    plan = make_plan(cat, tc, ops, tmp_path / "build", stage=False)
    return [(s.kind, list(s.argv)) for s in plan.steps]


def test_the_plan_compiles_with_g_plus_plus_the_headers_and_links_against_cpu_torch(tmp_path: Path) -> None:
    steps = _plan(tmp_path)
    compiles = [argv for kind, argv in steps if kind == "compile" and argv[0] == "g++"]
    device = next(a for a in compiles if a[a.index("-c") + 1].endswith(".cu"))
    host = next(a for a in compiles if a[a.index("-c") + 1].endswith(".cpp"))
    for argv in (device, host):
        assert "-DPORTER_EMU_WAVE=64" in argv and "-DROCM_WAVEFRONT_SIZE=64" in argv and "-DUSE_ROCM=1" in argv
        assert f"-I{emulate.INCLUDE_DIR}" in argv and not any(a.startswith("--offload") for a in argv)
    assert device[:3] == ["g++", "-x", "c++"] and "-DBF16_AVAILABLE" in device
    assert device.index("-O1") > device.index("-O3") and "-fno-strict-aliasing" in device  # the last -O wins
    # porter's prelude is precompiled once per flag set (the two ops' host units, their device units): the units
    # take the header standing in for it
    pch = [argv for kind, argv in steps if kind == "pch"]
    assert len(pch) == 2 and all(("-c", "-x", "c++-header") in list(zip(a, a[1:], a[2:])) for a in pch)
    assert all(("-include", emulate.PRELUDE) not in list(zip(a, a[1:])) for a in (device, host))
    shared_step = next(argv for kind, argv in steps if "porter.emulate.shared" in argv)
    assert shared_step[shared_step.index("--rev") + 1] == emulate.revision()
    link = next(argv for kind, argv in steps if kind == "link")
    assert link[0] == "g++" and "-ltorch_cpu" in link and not any("hip" in a for a in link)
    assert any(a.endswith("porter-dynamic-shared.o") for a in link)


def test_the_wave_size_is_the_profiles(tmp_path: Path) -> None:
    argv = next(a for k, a in _plan(tmp_path, 32) if k == "compile" and a[0] == "g++")
    assert "-DPORTER_EMU_WAVE=32" in argv and "-DROCM_WAVEFRONT_SIZE=32" in argv


def test_the_link_step_defines_each_extern_shared_array_and_the_initialisers_called() -> None:
    text = shared.unit(["ln_shared", "_ZN12_GLOBAL__N_17s_floatE"],
                       {"_ZTH9ln_shared", "__tls_init", "_ZTHN12_GLOBAL__N_17s_floatE", "unrelated"})
    assert f'__thread unsigned char porter_dynamic_shared_0[{shared.CAPACITY}] __asm__("ln_shared");' in text
    assert '__asm__("_ZN12_GLOBAL__N_17s_floatE")' in text
    for init in ("__tls_init", "_ZTH9ln_shared", "_ZTHN12_GLOBAL__N_17s_floatE"):
        assert f'__asm__("{init}")' in text
    assert "unrelated" not in text
    assert shared.init_function("buf") == "_ZTH3buf"
    runtime = (emulate.INCLUDE_DIR / "porter_emu" / "runtime.h").read_text()
    assert f"kDynamicShared = {shared.CAPACITY // 1024} * 1024" in runtime  # the launch checks what is defined


def test_a_wheelhouse_is_grouped_by_the_wave_its_manifests_name(tmp_path: Path) -> None:
    for name, target in (("a-1+emu.wave64-py3-none-any.whl", {"kind": "emulated", "wavefront": 64}),
                         ("b-1+emu.wave32-py3-none-any.whl", {"kind": "emulated", "wavefront": 32}),
                         ("c-1+rocm7.2.gfx90a-py3-none-any.whl", {"kind": "rocm", "wavefront": 64})):
        (tmp_path / name).write_bytes(b"")
        (tmp_path / f"{name}.porter.json").write_text(json.dumps(
            {"schema": "porter.manifest/1", "component": "x", "version": "1", "wheel": {"name": name}, "target": target,
             "extensions": []}))
    (tmp_path / "d-1-py3-none-any.whl").write_bytes(b"")  # no manifest: not porter's
    groups = emulated_wheels(tmp_path)
    assert {w: [p.name for p in ps] for w, ps in groups.items()} == {
        64: ["a-1+emu.wave64-py3-none-any.whl"], 32: ["b-1+emu.wave32-py3-none-any.whl"]}
    with pytest.raises(ConfigError, match="wheelhouse not found"):
        emulated_wheels(tmp_path / "nope")


def test_unpacking_refuses_a_member_outside_the_folder(tmp_path: Path) -> None:
    whl = tmp_path / "x.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("ok/mod.py", "")
        zf.writestr("../escape.py", "")
    with pytest.raises(ConfigError, match="outside the folder"):
        unpack(whl, tmp_path / "site")
    assert not (tmp_path / "escape.py").exists()
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="cannot be read as a wheel"):
        unpack(tmp_path / "bad.whl", tmp_path / "site2")


def test_the_summary_is_each_familys_worst_check_per_wave() -> None:
    row = {"kernel": "megatron.layer_norm", "check": "", "wave": 64, "tolerance": 1e-3, "ok": True}
    run = CheckRun(rows=[{**row, "check": "fp32", "max_abs_err": 1e-5},
                         {**row, "check": "bf16", "max_abs_err": 5e-4},
                         {**row, "check": "fp16", "max_abs_err": None, "ok": False, "error": "not modelled"},
                         {**row, "wave": 32, "check": "fp32", "max_abs_err": 2e-4}])
    summary = run.summary()
    assert [(s["wave"], s["check"], s["checks"], s["ok"]) for s in summary] == [(32, "fp32", 1, True),
                                                                                (64, "fp16", 3, False)]
    assert not run.ok and not CheckRun().ok


def test_every_family_has_a_runner_and_a_module() -> None:
    assert set(checks.RUNNERS) == set(checks.FAMILIES)
    c = checks.Checks.__dict__
    assert all(name in c for name in set(checks.RUNNERS.values()))


def test_a_check_that_raises_fails_with_the_kernels_words_and_no_value() -> None:
    pytest.importorskip("torch")
    runs = checks.Checks("cpu", 64)

    def boom() -> float:
        raise RuntimeError("porter emulated HIP target: __shfl at k.hip:3 reached by lanes 0-15 ... not modelled\n"
                           "Invoked with: tensor([...])")
    runs.run("megatron.layer_norm", "fwd", 1e-3, boom)
    runs.run("megatron.layer_norm", "bwd", 1e-3, lambda: float("nan"))
    runs.run("megatron.layer_norm", "ok", 1e-3, lambda: 1e-4)
    failed, nan, ok = runs.rows
    assert failed["ok"] is False and failed["max_abs_err"] is None and "not modelled" in failed["error"]
    assert "Invoked with" not in failed["error"]
    assert nan["ok"] is False and ok["ok"] is True and ok["wave"] == 64
