"""verify's static checks on ELF files built here, and its import check's verdicts (fake runner)."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from porter.probe import script_text
from porter.probes.protocol import MARKER
from porter.install.env import Node, TargetEnv
from porter.install.records import write_record
from porter.install.verify import collect, import_check, verify
from porter.artifacts.manifest import read_manifest, manifest_path
from porter.fs import sha256_file
from porter.run import Result
from tests.fixtures.install.fakes import FakeRunner, ROCM_TORCH, env_json
from tests.fixtures.install.wheels import SOABI_SUFFIX, deepspeed_wheel
from tests.unit.test_codeobjects import bundle, elf_with_section

CPU_SO = elf_with_section(".text", b"\x90" * 16)
GFX90A = Node(("gfx90a",), "--arch")
ROCM_BUILT = {"version": "2.13.0+rocm5.7", "kind": "rocm", "hip": "5.7.31921", "cuda": None}


def hip_so(*archs: str) -> bytes:
    return elf_with_section(".hip_fatbin", bundle(["host-x86_64-unknown-linux-gnu-"]
                                                  + [f"hipv4-amdgcn-amd-amdhsa--{a}" for a in archs]))


def installed(tmp_path: Path, sos: Mapping[str, bytes], archs: Mapping[str, Sequence[str]] | None, *,
              kind: str = "rocm", ops: Mapping[str, bool] | None = None, torch: Mapping[str, Any] = ROCM_TORCH,
              record: bool = True) -> TargetEnv:
    """Lay the wheel's files out as pip would, register the dist, write porter's record."""
    label = "rocm5.7.gfx908.gfx90a" if kind == "rocm" else "cpu.x86.64.v2"
    whl = deepspeed_wheel(tmp_path / "wh", sos, label=label, kind=kind, archs=archs,
                          rocm_version="5.7" if kind == "rocm" else None,
                          torch=ROCM_BUILT if kind == "rocm" else None, ops=ops)
    site = tmp_path / "venv" / "site-packages"
    import zipfile
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(site)
    rels = [f"deepspeed/ops/adam/{op}_op{SOABI_SUFFIX}" for op in sos]
    state = env_json(tmp_path / "venv", torch=torch, dists={"deepspeed": {
        "name": "deepspeed", "version": f"0.19.8+{label}", "location": str(site),
        "shared_objects": [[r, str(site / r)] for r in rels], "carried_manifest": None}})
    env = TargetEnv.from_json(state)
    if record:
        write_record(env, "deepspeed", read_manifest(manifest_path(whl)), sha256_file(whl), str(whl))
    return env


def problems(env: TargetEnv, node: Node) -> list[str]:
    return [str(p) for c in collect(env, node) for p in c.problems]


def test_multi_arch_so_passes_and_single_arch_fails_naming_file_and_both_lists(tmp_path: Path) -> None:
    env = installed(tmp_path, {"fused_adam": hip_so("gfx90a", "gfx908"), "fused_lamb": hip_so("gfx908")},
                    {"fused_adam": ["gfx90a", "gfx908"], "fused_lamb": ["gfx908"]})
    [comp] = collect(env, GFX90A)
    assert [m["archs"] for m in comp.modules] == [["gfx908", "gfx90a"], ["gfx908"]]
    [p] = comp.problems
    assert p.file.endswith(f"deepspeed/ops/adam/fused_lamb_op{SOABI_SUFFIX}")
    assert (p.expected, p.found) == ("code for gfx90a", "code for gfx908")
    assert problems(env, Node(("gfx908",), "--arch")) == []


def test_no_node_arch_is_a_problem_for_gpu_builds(tmp_path: Path) -> None:
    env = installed(tmp_path, {"fused_adam": hip_so("gfx90a")}, {"fused_adam": ["gfx90a"]})
    found = problems(env, Node((), "none"))
    assert any("no GPU visible" in p for p in found) and any("GPU arch" in p for p in found)


def test_wavefront_torch_and_rocm_mismatches(tmp_path: Path) -> None:
    env = installed(tmp_path, {"fused_adam": hip_so("gfx90a", "gfx1030")}, {"fused_adam": ["gfx90a", "gfx1030"]},
                    torch={**ROCM_TORCH, "version": "2.14.1+rocm6.2", "hip": "6.2.41133"})
    found = problems(env, Node(("gfx1030",), "--arch"))
    assert any("wavefront" in p and "wave64" in p and "wave32" in p for p in found)
    assert any("torch" in p and "2.13.0 (rocm)" in p and "2.14.1 (rocm)" in p for p in found)
    assert any("ROCm" in p and "5.7" in p and "6.2.41133" in p for p in found)


def test_file_changed_or_missing_after_install(tmp_path: Path) -> None:
    env = installed(tmp_path, {"fused_adam": hip_so("gfx90a"), "fused_lamb": hip_so("gfx90a")},
                    {"fused_adam": ["gfx90a"], "fused_lamb": ["gfx90a"]})
    site = Path(env.dists["deepspeed"].location)
    (site / f"deepspeed/ops/adam/fused_adam_op{SOABI_SUFFIX}").write_bytes(hip_so("gfx90a") + b"\0")
    (site / f"deepspeed/ops/adam/fused_lamb_op{SOABI_SUFFIX}").unlink()
    found = problems(env, GFX90A)
    assert any("fused_adam_op" in p and "sha256" in p for p in found)
    assert any("fused_lamb_op" in p and "found missing" in p for p in found)


def test_manifest_archs_that_the_file_does_not_hold(tmp_path: Path) -> None:
    env = installed(tmp_path, {"fused_adam": hip_so("gfx90a")}, {"fused_adam": ["gfx90a", "gfx942"]})
    assert any("archs in file vs manifest: expected gfx90a,gfx942, found gfx90a" in p
               for p in problems(env, GFX90A))


def test_installed_ops_must_mark_what_ships(tmp_path: Path) -> None:
    env = installed(tmp_path, {"cpu_adam": CPU_SO}, None, kind="cpu",
                    ops={"cpu_adam": False, "cpu_lion": True}, torch={"version": "2.13.0+cpu"})
    found = problems(env, Node((), "none"))
    assert any("installed_ops['cpu_adam']" in p and "JIT-compile cpu_adam" in p for p in found)
    assert any("installed_ops['cpu_lion']" in p and "no such module shipped" in p for p in found)


def test_record_without_dist_and_dist_without_record(tmp_path: Path) -> None:
    env = installed(tmp_path / "a", {"cpu_adam": CPU_SO}, None, kind="cpu", torch={"version": "2.13.0+cpu"})
    gone = TargetEnv.from_json({**env_json(tmp_path / "a" / "venv"), "dists": {}})
    assert any("not installed" in p for p in problems(gone, Node((), "none")))
    bare = installed(tmp_path / "b", {"cpu_adam": CPU_SO}, None, kind="cpu",
                     torch={"version": "2.13.0+cpu"}, record=False)
    assert any("porter manifest" in p and "installed some other way" in p for p in problems(bare, Node((), "none")))


class ImportRunner(FakeRunner):
    """Plays the target python under verify: may 'call a compiler' and 'JIT into' the extensions dir."""

    def __init__(self, result: dict[str, Any], jit: bool = False) -> None:
        super().__init__({})
        self.result, self.jit = result, jit

    def run(self, argv: Sequence[str | os.PathLike[str]], **kw: Any) -> Result:
        env = kw["env"]
        assert argv[1] == "-" and kw["input"] == script_text("imports")
        trap_bin = env["PATH"].split(os.pathsep)[0]
        assert {"g++", "hipcc", "nvcc", "ninja", "c++"} <= set(os.listdir(trap_bin))
        assert os.listdir(env["TORCH_EXTENSIONS_DIR"]) == [] and env["CXX"].startswith(trap_bin)
        if self.jit:
            with open(Path(trap_bin).parent / "compiler-calls.log", "a") as f:
                f.write("ninja --version\n")
            Path(env["TORCH_EXTENSIONS_DIR"], "cpu_adam").mkdir()
        self.calls.append(([str(a) for a in argv], dict(env)))
        return Result([str(a) for a in argv], 0, "import noise\n" + MARKER + json.dumps(self.result), 0.1)


def test_import_check_verdicts(tmp_path: Path) -> None:
    env = installed(tmp_path, {"cpu_adam": CPU_SO}, None, kind="cpu", torch={"version": "2.13.0+cpu"})
    mod = "deepspeed.ops.adam.cpu_adam_op"
    ok = ImportRunner({"modules": {mod: None}, "loader": {"*": "skipped: no loader"}})
    rep = verify(env, Node((), "none"), ok)
    assert rep.ok, rep.problems
    assert ok.calls[0][1]["DS_ACCELERATOR"] == "cpu" and json.loads(ok.calls[0][0][3]) == ["cpu_adam"]
    jit = ImportRunner({"modules": {mod: None}, "loader": {"cpu_adam": None}}, jit=True)
    found = [str(p) for p in verify(env, Node((), "none"), jit).problems]
    assert any("compiler calls: expected 0, found 1: ninja --version" in p for p in found)
    assert any("TORCH_EXTENSIONS_DIR: expected empty (no JIT build), found cpu_adam" in p for p in found)
    broken = ImportRunner({"modules": {mod: "ImportError: undefined symbol: _ZN3c10"}, "loader": {}})
    reps = collect(env, Node((), "none"))
    import_check(env, reps, broken)
    [p] = reps[0].problems
    assert p.check == f"import {mod}" and "undefined symbol" in p.found and p.file.endswith(".so")


def test_manifest_carried_in_dist_info_is_used_without_a_record(tmp_path: Path) -> None:
    env = installed(tmp_path, {"fused_lamb": hip_so("gfx908")}, {"fused_lamb": ["gfx908"]}, record=False)
    whl = next((tmp_path / "wh").glob("*.whl"))
    carried = {k: v for k, v in read_manifest(manifest_path(whl)).items() if k != "wheel"}
    dist = env.dists["deepspeed"]
    state = env_json(tmp_path / "venv", torch=ROCM_TORCH, dists={"deepspeed": {
        "name": dist.name, "version": dist.version, "location": dist.location,
        "shared_objects": [list(s) for s in dist.shared_objects], "carried_manifest": json.dumps(carried)}})
    [comp] = collect(TargetEnv.from_json(state), GFX90A)
    assert comp.record is None and comp.kind == "rocm"
    assert [(p.check, p.expected, p.found) for p in comp.problems] == [
        ("GPU arch", "a match", "node has gfx90a, wheel has code for gfx908"),
        ("GPU code objects", "code for gfx90a", "code for gfx908")]


class ProbeRunner(ImportRunner):
    """The target python whose DeepSpeed asks has_function at load time: cc on a lone test.c (the 0.18.4 case)."""

    def run(self, argv: Sequence[str | os.PathLike[str]], **kw: Any) -> Result:
        trap_bin = kw["env"]["PATH"].split(os.pathsep)[0]
        assert "PORTER_NO_JIT" not in kw["env"]  # what a node does by default
        with open(Path(trap_bin).parent / "compiler-calls.log", "a") as f:
            f.write("cc -Wsign-compare -DNDEBUG -g -fwrapv -O2 -Wall -fPIC -c /tmp/tmpk2j3/test.c -o /tmp/tmpk2j3/test.o\n")
        return super().run(argv, **kw)


def test_feature_probe_is_a_note_not_a_jit_failure(tmp_path: Path) -> None:
    env = installed(tmp_path, {"cpu_adam": CPU_SO}, None, kind="cpu", torch={"version": "2.13.0+cpu"})
    mod = "deepspeed.ops.adam.cpu_adam_op"
    rep = verify(env, Node((), "none"), ProbeRunner({"modules": {mod: None}, "loader": {"cpu_adam": None}}))
    assert rep.ok, rep.problems
    (note,) = rep.notes
    assert "1 load-time feature probe call(s), not a JIT build" in note and "test.c" in note
    assert "deepspeed/no-jit" in note
    assert rep.to_json()["components"][0]["feature_probes"][0].startswith("cc ")


@pytest.mark.parametrize("line, kind", [
    ("cc -fPIC -c /tmp/tmpa/test.c -o /tmp/tmpa/test.o", "probe"),
    ("cc /tmp/tmpa/test.o -laio -o /tmp/tmpa/a.out", "probe"),
    ("ninja -v", "build"),
    ("c++ -MMD -DTORCH_EXTENSION_NAME=cpu_adam -c cpu_adam.cpp -o cpu_adam.o", "build"),
    ("hipcc --offload-arch=gfx90a -c /x/test.c -o kernel.cu", "build"),
    ("g++ --version", "build"),
])
def test_classify_trapped_calls(line: str, kind: str) -> None:
    from porter.install.verify import classify_call

    assert classify_call(line) == kind
