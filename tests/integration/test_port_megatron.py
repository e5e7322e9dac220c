"""``porter port megatron-deepspeed`` as a process on a fixture tree: a real copy, real hipify (torch's
hipify + porter's map), the real patch set. With the frontier profile and CPU torch it cannot link a ROCm
extension here: a real run is refused before any work, a dry run prints the plan and that refusal, and
--no-kernels ports the tree without building the kernels."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "patch"


def digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_port_rocm_profile_ports_tree_and_prints_plan(tmp_path: Path, porter_cli: list[str]) -> None:
    tree = tmp_path / "Megatron-DeepSpeed"
    shutil.copytree(FIXTURES / "megatron-deepspeed", tree)
    original = digest(tree)
    out = tmp_path / "ported"
    argv = [*porter_cli, "port", "megatron-deepspeed", str(tree), "--toolchain", "frontier", "--dest", str(out),
            "-o", str(tmp_path / "wh")]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and "needs the ROCm build of torch" in refused.stderr, refused.stderr
    assert not out.exists() and not (tmp_path / "wh").exists()  # refused before any work
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ported")]
    argv.append("--no-kernels")
    first = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert digest(tree) == original  # the user's tree is untouched

    kernels = out / "megatron" / "fused_kernels"
    cu = (kernels / "scaled_softmax_cuda.cu").read_text()
    assert "__HIP_PLATFORM_HCC__" not in cu and "#ifndef __HIP_PLATFORM_AMD__" in cu
    assert "hip/hip_fp16.h" in cu  # hipified
    init = (kernels / "__init__.py").read_text()
    assert "def _porter_load_prebuilt(args):" in init and "porter port megatron-deepspeed" in init
    assert "hipified megatron/fused_kernels/scaled_softmax_cuda.cu" in first.stdout
    assert "patched megatron/fused_kernels/__init__.py" in first.stdout
    assert "build plan" not in first.stdout
    assert not (tmp_path / "wh").exists() or not any((tmp_path / "wh").iterdir())

    ported = digest(out)
    again = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["patched"] == [] and doc["hipified"] == []
    assert not doc["kernels"] and doc["wheel"] is None
    assert digest(out) == ported  # a re-run changes nothing

    dry = subprocess.run([*porter_cli, "port", "megatron-deepspeed", str(tree), "--toolchain", "frontier",
                          "--dry-run", "--json"], capture_output=True, text=True, timeout=600)
    assert dry.returncode == 0, dry.stderr
    doc = json.loads(dry.stdout)
    assert "megatron/fused_kernels/__init__.py" in doc["patched"]
    assert "needs the ROCm build of torch" in doc["refusal"]
    steps = doc["plan"]["steps"]
    device = [s["argv"] for s in steps if s["kind"] == "compile" and s["argv"][-3].endswith("_cuda.cu")]
    assert len(device) == 3
    assert all("--offload-arch=gfx90a" in a and "-DROCM_WAVEFRONT_SIZE=64" in a for a in device)
    text = subprocess.run([*porter_cli, "port", "megatron-deepspeed", str(tree), "--toolchain", "frontier",
                           "--dry-run"], capture_output=True, text=True, timeout=600)
    assert text.returncode == 0 and "# plan: " in text.stdout
    assert "# a real run here would be refused: building Megatron's fused kernels" in text.stdout
    assert digest(tree) == original
    assert not (tmp_path / "Megatron-DeepSpeed-frontier").exists()


def test_port_refuses_cpu_profile_and_non_megatron_tree(tmp_path: Path, porter_cli: list[str]) -> None:
    tree = tmp_path / "t"
    shutil.copytree(FIXTURES / "megatron-deepspeed", tree)
    cpu = subprocess.run([*porter_cli, "port", "megatron-deepspeed", str(tree), "--toolchain", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert cpu.returncode == 2 and "GPU code" in cpu.stderr
    other = subprocess.run([*porter_cli, "port", "megatron-deepspeed", str(FIXTURES / "deepspeed"),
                            "--toolchain", "frontier"], capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "not a Megatron-DeepSpeed tree" in other.stderr


def test_port_killed_before_it_publishes_leaves_no_tree_and_the_rerun_ports(tmp_path: Path,
                                                                           porter_cli: list[str]) -> None:
    """Issue 22: a port killed (SIGKILL) with its copy complete but not yet renamed into place: no ported tree
    appears (half a port is never taken for a port), and the next run ports and removes the killed one's copy."""
    import os
    import signal

    tree = tmp_path / "Megatron-DeepSpeed"
    shutil.copytree(FIXTURES / "megatron-deepspeed", tree)
    out = tmp_path / "ported"
    argv = [*porter_cli, "port", "megatron-deepspeed", str(tree), "--toolchain", "frontier", "--dest", str(out),
            "--no-kernels"]
    killed = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PORTER_KILL_AT": "port"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not out.exists()
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".ported.")]  # the killed run's copy, under its pid
    env = {k: v for k, v in os.environ.items() if k != "PORTER_KILL_AT"}
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (out / "megatron" / "fused_kernels" / "scaled_softmax_cuda.cu").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ported.")]
