"""Every warp-size-32 finding of a 64-lane build gets a state: fixed, safe (with its checks), refused, or allowed by
the override (porter/hipify/wave64.py); code no ROCm build compiles is no finding (porter/hipify/scan.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from porter.artifacts import sbom
from porter.emulate import checks
from porter.errors import CheckFailed, ConfigError
from porter.hipify import wave64
from porter.hipify.maps import combined_map
from porter.hipify.scan import Finding, not_on_hip, scan
from porter.patching.model import project_names


def finding(path: str, line: int, rule: str = "lane-arithmetic", text: str = "int lane = threadIdx.x & 0x1f;") -> Finding:
    return Finding("warp32", path, line, 1, rule, "what is assumed", text)


def dead_text(src: str) -> list[str]:
    return [src[a:b].strip() for a, b in not_on_hip(src)]


def test_branches_no_rocm_build_compiles_are_known_and_others_are_not() -> None:
    src = "\n".join([
        "#ifdef __HIP_PLATFORM_AMD__", "hip_a", "#else", "cuda_a", "#endif",
        "#if defined(BF16_AVAILABLE) && !defined(__HIP_PLATFORM_AMD__)", "cuda_b", "#endif",
        "#ifndef USE_ROCM", "cuda_c", "#elif X", "never_d", "#else", "never_e", "#endif",
        "#if __CUDA_ARCH__ >= 800", "unknown_f", "#else", "unknown_g", "#endif",
        "#if defined(A) || defined(USE_ROCM)", "hip_h", "#else", "cuda_i", "#endif",
        "#if X && Y || USE_ROCM", "unknown_j", "#else", "unknown_k", "#endif",
        "#if !defined(__HIP_PLATFORM_AMD__)", "#if X", "cuda_l", "#endif", "cuda_m", "#endif", "hip_n"])
    dead = " ".join(dead_text(src))
    for word in ("cuda_a", "cuda_b", "cuda_c", "cuda_i", "cuda_l", "cuda_m"):
        assert word in dead, word
    for word in ("hip_a", "hip_h", "hip_n", "unknown_f", "unknown_g", "unknown_j", "unknown_k"):
        assert word not in dead, word
    # #elif and #else after a branch known false: the #elif's own condition decides; after it, not known
    assert "never_d" not in dead and "never_e" not in dead


def test_a_32_lane_constant_in_the_cuda_branch_is_no_finding_and_the_same_outside_is() -> None:
    cmap = combined_map([]).compiled
    body = "constexpr int warp_size = 32;\n__global__ void k() { int lane = threadIdx.x & 0x1f; __shfl_xor(1, 1); }\n"
    guarded = f"#ifdef __HIP_PLATFORM_AMD__\nconstexpr int warp_size = 64;\n#else\n{body}#endif\n"
    plain = scan(body, "k.cu", cmap).warp32
    assert plain and scan(guarded, "k.cu", cmap).warp32 == []
    assert scan(f"#if __CUDA_ARCH__ >= 700\n{body}#endif\n", "k.cu", cmap).warp32  # not known: still a finding


def test_the_include_graph_follows_quoted_and_angled_includes_inside_the_tree(tmp_path: Path) -> None:
    (tmp_path / "csrc" / "includes").mkdir(parents=True)
    (tmp_path / "csrc" / "op").mkdir()
    (tmp_path / "csrc" / "op" / "k.cu").write_text('#include "local.h"\n#include <shared.h>\n#include <vector>\n')
    (tmp_path / "csrc" / "op" / "local.h").write_text('#include "../includes/deep.h"\n')
    (tmp_path / "csrc" / "includes" / "shared.h").write_text("// no includes\n")
    (tmp_path / "csrc" / "includes" / "deep.h").write_text('#include "../../../outside.h"\n')
    (tmp_path.parent / "outside.h").write_text("")
    (tmp_path / "csrc" / "includes" / "unused.h").write_text("")
    got = wave64.files_of(tmp_path, ["csrc/op/k.cu"], ["csrc/includes"])
    assert got == {"csrc/op/k.cu", "csrc/op/local.h", "csrc/includes/shared.h", "csrc/includes/deep.h"}


LEDGER = """
[[safe]]
file = "csrc/includes/shim.h"
rule = "reduction-from-16"
text = "i = 16"
ops = ["adam"]
checks = ["deepspeed.fused_adam"]
why = "no kernel calls it"
"""


def test_each_finding_gets_its_state_per_op_that_compiles_it() -> None:
    ledger = wave64.parse_ledger(LEDGER, "wave64.toml")
    shim = finding("csrc/includes/shim.h", 115, "reduction-from-16", "for (int i = 16; i >= lanes; i >>= 1)")
    soft = finding("csrc/softmax.cu", 56)
    gone = finding("csrc/softmax.cu", 80, "block-x-32", "dim3 threads(32,4,1);")
    files = {"adam": {"csrc/includes/shim.h"}, "lamb": {"csrc/includes/shim.h"},
             "softmax": {"csrc/softmax.cu", "csrc/includes/shim.h"}, "cpu_adam": set()}
    got = wave64.assess([shim, soft], files, ledger, fixed={gone: "proj/rocm:a-patch"})
    states = {(s.op, s.finding.line): (s.state, s.by) for s in got.states}
    assert states == {("adam", 115): ("safe", "deepspeed.fused_adam"), ("lamb", 115): ("refused", ""),
                      ("softmax", 115): ("refused", ""), ("softmax", 56): ("refused", ""),
                      ("softmax", 80): ("fixed", "proj/rocm:a-patch")}
    err = got.error("DeepSpeed 0.19.8 for mi300x")
    assert isinstance(err, CheckFailed) and err.exit_code == 1
    assert "csrc/softmax.cu:56: lane-arithmetic (int lane = threadIdx.x & 0x1f;) in op softmax" in err.message
    assert "3 warp-size-32 assumption(s) in 2 op(s)" in err.message and "--allow-wave32 lamb,softmax" in err.hint
    allowed = wave64.assess([shim, soft], files, ledger, allow=["softmax"])
    assert [(s.op, s.state) for s in allowed.of("allowed")] == [("softmax", "allowed"), ("softmax", "allowed")]
    assert [s.op for s in allowed.of("refused")] == ["lamb"]
    everything = wave64.assess([shim, soft], files, ledger, allow=["all"])
    assert everything.error("x") is None and everything.to_dict()["counts"] == {"safe": 1, "allowed": 3}
    assert everything.to_dict()["allowed"] == ["all"]


def test_the_override_must_name_ops_of_the_build() -> None:
    with pytest.raises(ConfigError, match="does not build: trnsformer"):
        wave64.assess([], {"transformer": set()}, (), allow=["trnsformer"])


@pytest.mark.parametrize("entry, message", [
    ('file = "a.h"\nrule = "r"\nops = ["x"]\nwhy = "w"', "checks"),
    ('file = "a.h"\nrule = "r"\nops = ["x"]\nchecks = []\nwhy = "w"', "non-empty array"),
    ('file = "a.h"\nrule = "r"\nops = ["x"]\nchecks = ["c"]\nwhy = "w"\nproof = "p"', "proof"),
    ('file = ""\nrule = "r"\nops = ["x"]\nchecks = ["c"]\nwhy = "w"', "file must be a non-empty string"),
])
def test_a_ledger_entry_without_its_proof_is_refused(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        wave64.parse_ledger(f"[[safe]]\n{entry}\n", "patches/x/wave64.toml")


def test_every_shipped_ledger_names_checks_that_exist() -> None:
    """A safe state is only as good as its proof: each check a ledger names is one porter emulate check runs."""
    seen = 0
    for project in project_names():
        for proof in wave64.load_ledger(project):
            seen += 1
            assert set(proof.checks) <= set(checks.FAMILIES), (project, proof)
    assert seen >= 1


def test_the_sbom_records_the_states_and_the_override() -> None:
    w = wave64.assess([finding("k.cu", 7)], {"k": {"k.cu"}}, (), allow=["k"]).to_dict()
    manifest = {"component": "megatron-deepspeed", "version": "0+emu.wave64", "wave64": w,
                "target": {"kind": "emulated", "label": "emu.wave64", "wavefront": 64}, "sources": {"patches": []}}
    doc = json.loads(sbom.document(manifest, name="megatron_fused_kernels", version="0+emu.wave64", epoch=0))
    lines = sbom.describe(doc)
    assert "wave 64: 1 allowed warp-size-32 finding(s); built by override (--allow-wave32 k)" in lines
    assert "  allowed: op k: k.cu:7: lane-arithmetic (by --allow-wave32)" in lines


def test_the_emulated_targets_deepspeed_python_side_is_built_for_the_cpu_accelerator(tmp_path: Path) -> None:
    """With the CPU torch the emulated modules run on, DeepSpeed's setup.py for "cuda" looks for a CUDA toolkit
    (0.18.9: 'CUDA_HOME does not exist'): the emulated build asks for its CPU Python side; a ROCm build for its own."""
    from porter.components.deepspeed.build import DRIVER
    from porter.toolchain.profile import load_toolchain
    from porter.wheels.base import Machine, SourceInfo, WheelRequest

    info = SourceInfo("deepspeed", "0.18.9", tmp_path)
    asked = [DRIVER.plan(info, WheelRequest(source=tmp_path, toolchain=load_toolchain(name), output=tmp_path),
                         Machine(2, 1 << 30)).env["DS_ACCELERATOR"] for name in ("emulate-wave64", "debian-rocm7")]
    assert asked == ["cpu", "cuda"]


def test_verify_notes_a_wheel_built_with_unproven_wave32_code() -> None:
    from porter.install.verify import ComponentReport

    rep = ComponentReport("megatron-deepspeed", "megatron-fused-kernels", "0+emu.wave64", None)
    assert rep.notes == []
    rep.wave64_allowed = [f"fused_mix_prec_layer_norm_cuda: k.cu:{n} lane-arithmetic" for n in (80, 109, 258, 271)]
    (note,) = rep.notes
    assert note.startswith("megatron-deepspeed: built for 64-lane wavefronts with 4 warp-size-32 finding(s) nothing "
                           "proves safe (--allow-wave32): fused_mix_prec_layer_norm_cuda: k.cu:80 lane-arithmetic")
    assert note.endswith(" ... (porter sbom WHEEL lists each)")


def test_a_finding_is_fixed_only_where_the_patched_file_lost_its_line(tmp_path: Path) -> None:
    """Counted per line text: a patch that rewrites one of two equal lines fixes one finding; a line hipify rewrote
    (the scanner's text is not in the source) is never taken as fixed; a file no patch changes keeps all."""
    loop = "for(int i = 16; i >= lanes; i >>= 1) {"
    (tmp_path / "shim.h").write_text(f"{loop}\n{loop}\nint lane = threadIdx.x & 0x1f;\n")
    (tmp_path / "other.cu").write_text(f"{loop}\n")
    found = [finding("shim.h", 1, "reduction-from-16", loop), finding("shim.h", 2, "reduction-from-16", loop),
             finding("shim.h", 3, "lane-arithmetic", "int lane = __lane_id() & 0x1f;"),  # as hipify wrote it
             finding("other.cu", 1, "reduction-from-16", loop)]
    patched = {"shim.h": f"for(int i = warpSize / 2; i >= lanes; i >>= 1) {{\n{loop}\n"}
    got = wave64.lost_lines(found, tmp_path, patched.get, "apex/rocm")
    assert got == {found[1]: "apex/rocm"} or got == {found[0]: "apex/rocm"}, got
    assert len(got) == 1
    assert wave64.lost_lines(found, tmp_path, lambda rel: None, "x") == {}


def test_sources_porter_cannot_scan_are_refused_unless_all_is_allowed(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Without torch next to porter its hipify cannot run: nothing is known, so nothing is proven. The build stops
    naming why, unless --allow-wave32 all, which the plan notes; a build with no device sources needs no scan."""
    from porter.errors import ToolError
    from porter.log import quiet_logger

    def no_torch(tree: Path) -> list[Finding]:
        raise ToolError("torch.utils.hipify cannot be imported: No module named 'torch'")

    monkeypatch.setattr(wave64, "scan_tree", no_torch)
    ops = {"k": (("k.cu",), ())}
    lanes = wave64.gate("x", tmp_path, lambda rel: None, "", ops, (), quiet_logger())
    stop = lanes.error("x 1.0 for mi300x")
    assert stop is not None and "cannot check the sources" in stop.message and "No module named" in stop.message
    assert "--allow-wave32 all" in (stop.hint or "")
    allowed = wave64.gate("x", tmp_path, lambda rel: None, "", ops, ("all",), quiet_logger())
    assert allowed.error("x") is None and allowed.to_dict()["unscanned"].startswith("torch.utils.hipify")
    assert allowed.allowed_notes() == ["built without the wave-64 check (--allow-wave32 all): torch.utils.hipify "
                                       "cannot be imported: No module named 'torch'"]
    assert wave64.gate("x", tmp_path, lambda rel: None, "", {}, (), quiet_logger()).error("x") is None
