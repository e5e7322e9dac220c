"""No JIT left at start-up, end to end, as processes.

- ``port`` on each fork variation (no apex RMSNorm import, a kernel without the HCC guard, no package_info.py,
  the upstream-like training tree, the layered DeepSpeed sets): needed patches applied, the others reported as
  not needed, and the ported tree passes ``porter audit``.
- A cpu-profile port builds Megatron's dataset helpers for real with g++ into the kernels wheel; the ported tree
  imports ``megatron`` (stub accelerator saying 'cuda', no apex) up to the clear apex error, and
  ``compile_helper()`` loads the prebuilt helpers with no compiler on PATH.
- The audit finds the compile sites of the fixture tree and of the real DeepSpeed 0.19.8 sdist, and none that
  would compile once porter's wheels are installed.
- DeepSpeed 0.18.4's CPU-ops wheel verifies without a false failure: its load-time feature probe is reported as a
  probe; with deepspeed/no-jit applied it answers from the wheel's recorded answers and compiles nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.conftest import fetch_sdist

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TRAINING = FIXTURES / "training"


def porter(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def states(doc: dict[str, object]) -> dict[str, str]:
    return {p["patch"]: p["state"] for p in doc["patches"]}  # type: ignore[index, union-attr, attr-defined]


def audit_doc(tree: Path, *python: str) -> tuple[int, dict[str, object]]:
    res = porter("audit", str(tree), *(("--python", *python) if python else ("--no-python",)), "--json")
    assert res.stdout, res.stderr
    return res.returncode, json.loads(res.stdout)


def by_status(doc: dict[str, object]) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for s in doc["sites"]:  # type: ignore[attr-defined]
        out.setdefault(s["status"], []).append((s["kind"], s["file"]))
    return out


MEGATRON_FORKS = [
    (FIXTURES / "patch-forks" / "megatron-no-rmsnorm", {"apex-rmsnorm-clear-error"}),
    (FIXTURES / "patch-forks" / "megatron-no-hcc-guard", set()),
    (FIXTURES / "patch-forks" / "megatron-no-package-info", set()),
    (TRAINING / "megatron-deepspeed", set()),
]
# files the small fork stand-ins do not have (the training tree has them all)
ONLY_IN_TRAINING = {"apex-multi-tensor-clear-error", "apex-optimizers-clear-error", "apex-vision-clear-error",
                    "dataset-helpers-module", "dataset-helpers-prebuilt"}
# the older (BLOOM-era) generation's fused layer norm and the older forks' softmax: none of these trees has them
ONLY_IN_OLDER = {"layer-norm-wave-size", "softmax-short-keys"}


def test_port_each_fork_then_the_audit_passes(tmp_path: Path) -> None:
    for tree, not_needed in MEGATRON_FORKS:
        out = tmp_path / f"{tree.name}-ported"
        res = porter("port", "megatron-deepspeed", str(tree), "-t", "frontier", "--no-kernels", "--dest", str(out),
                     "--json")
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        st = states(doc)
        expected_absent = not_needed | ONLY_IN_OLDER | (set() if tree.parent == TRAINING else ONLY_IN_TRAINING)
        assert {p for p, s in st.items() if s == "not-needed"} == expected_absent, (tree.name, st)
        assert st["fused-kernels-prebuilt"] == "applied"
        assert all(s in ("applied", "already", "not-needed") for s in st.values()), st
        if tree.name == "megatron-no-hcc-guard":
            hcc = next(p for p in doc["patches"] if p["patch"] == "hip-platform-amd")
            assert {f["file"].rsplit("/", 1)[1]: f["status"] for f in hcc["files"]}["scaled_softmax_cuda.cu"] in \
                ("already", "not-needed")  # hipify's own output, or no guard at all: never a failure
        if tree.parent == TRAINING:  # the real small kernels: hipify's findings, one group with its verdict
            (group,) = doc["hipify_findings"]
            assert group["name"] == "megatron/fused_kernels/softmax_common.h" and group["verdict_id"] == "warp32"
            assert res.stderr.count("WARNING: hipify: ") == 1, res.stderr
        if tree.name == "megatron-no-package-info":
            assert doc["version"] == "" and "no megatron/core/package_info.py" in doc["notes"][0]
        text = porter("port", "megatron-deepspeed", str(tree), "-t", "frontier", "--no-kernels", "--dest", str(out))
        assert text.returncode == 0 and "patches (megatron-deepspeed/rocm):" in text.stdout, text.stderr
        rc, audit = audit_doc(out)
        if tree.parent == TRAINING:  # its DeepSpeed op is covered by a target python's DeepSpeed: see below
            assert rc == 1 and by_status(audit)["compiles"] == [("deepspeed", "pretrain_gpt.py")], audit
            assert ("make", "megatron/data/dataset_utils.py") in by_status(audit)["guarded"]
        else:
            assert rc == 0, audit
            assert "compiles" not in by_status(audit)
        assert ("torch-jit", "megatron/fused_kernels/__init__.py") in by_status(audit)["guarded"]
    # before the port the training tree compiles at three places
    rc, before = audit_doc(TRAINING / "megatron-deepspeed")
    assert rc == 1 and sorted(by_status(before)["compiles"]) == [
        ("deepspeed", "pretrain_gpt.py"), ("make", "megatron/data/dataset_utils.py"),
        ("torch-jit", "megatron/fused_kernels/__init__.py")]

    # the layered DeepSpeed sets: no-jit then explicit-arch on one builder.py, every patch needed there
    ds_out = tmp_path / "deepspeed-ported"
    res = porter("port", "deepspeed", str(TRAINING / "deepspeed"), "--dest", str(ds_out), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["sets"] == ["deepspeed/no-jit", "deepspeed/explicit-arch"]
    assert set(states(doc).values()) == {"applied"} and len(states(doc)) == 5
    again = json.loads(porter("port", "deepspeed", str(TRAINING / "deepspeed"), "--dest", str(ds_out),
                              "--json").stdout)
    assert set(states(again).values()) == {"already"}
    status = porter("patch", "status", str(ds_out))
    assert status.returncode == 0 and "CHANGED" not in status.stdout


def stub_accelerator(root: Path, device: str) -> Path:
    """A ``deepspeed.accelerator`` that reports ``device`` (on ROCm DeepSpeed's says 'cuda'), nothing else."""
    pkg = root / device / "deepspeed" / "accelerator"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    body = f"class _Accelerator:\n    def device_name(self):\n        return {device!r}\n\n\n" \
           "def get_accelerator():\n    return _Accelerator()\n"
    (pkg / "__init__.py").write_text(body)
    (pkg / "real_accelerator.py").write_text(body)
    return root / device


def test_ported_megatron_imports_to_the_clear_error_and_uses_prebuilt_helpers(
        tmp_path: Path, torch_venv: Path, cpu_ops_wheelhouse: Path) -> None:
    out, wheelhouse = tmp_path / "mds-cpu", tmp_path / "wh"
    res = porter("port", "megatron-deepspeed", str(TRAINING / "megatron-deepspeed"), "-t", "cpu", "--dest", str(out),
                 "-o", str(wheelhouse), "--python", str(torch_venv), "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [b["name"] for b in doc["built"]] == ["helpers"]  # a cpu profile builds the host-only helpers alone
    (wheel,) = wheelhouse.glob("megatron_fused_kernels-0.2.0+cpu.*.whl")
    (ds_wheel,) = cpu_ops_wheelhouse.glob("*.whl")
    subprocess.run([str(torch_venv), "-m", "pip", "install", "-q", str(wheel), str(ds_wheel)], check=True,
                   capture_output=True)

    no_tools = tmp_path / "empty-bin"
    no_tools.mkdir()
    base = {"PATH": str(no_tools), "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    cuda = stub_accelerator(tmp_path / "stubs", "cuda")
    imp = subprocess.run([str(torch_venv), "-c", "import megatron"], cwd=out, capture_output=True, text=True,
                         env={**base, "PYTHONPATH": str(cuda)}, timeout=300)
    assert imp.returncode != 0
    last = imp.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: Megatron's multi-tensor ops need apex") and "porter wheel apex" in last, \
        imp.stderr[-2000:]

    cpu = stub_accelerator(tmp_path / "stubs", "cpu")
    use = subprocess.run([str(torch_venv), "-c",
                          "from megatron.data.dataset_utils import compile_helper, sample_index\n"
                          "compile_helper()\n"
                          "import sys\n"
                          "prebuilt = sys.modules['megatron_fused_kernels.helpers']\n"
                          "print('HELPERS', prebuilt.__file__.endswith('.so'), sample_index([5, 3], 2))"],
                         cwd=out, capture_output=True, text=True, env={**base, "PYTHONPATH": str(cpu)}, timeout=300)
    assert "HELPERS True [(0, 0), (0, 2), (0, 4), (1, 1)]" in use.stdout, use.stderr
    assert not list((out / "megatron" / "data").glob("helpers*.so"))  # nothing was built by make

    verify = porter("verify", "--python", str(torch_venv), "--json")
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-2000:]
    vdoc = json.loads(verify.stdout)
    mods = {m["module"]: m for c in vdoc["components"] for m in c["modules"]}
    assert mods["megatron_fused_kernels.helpers"]["import"] == "ok"
    assert mods["megatron_fused_kernels.helpers"].get("host_only") is True

    rc, audit = audit_doc(out, str(torch_venv))
    assert rc == 0, audit
    st = by_status(audit)
    assert ("make", "megatron/data/dataset_utils.py") in st["covered"]
    assert ("deepspeed", "pretrain_gpt.py") in st["covered"]  # DeepSpeedCPUAdam: cpu_adam prebuilt
    assert ("torch-jit", "megatron/fused_kernels/__init__.py") in st["guarded"]  # GPU kernels: not built on cpu
    assert "compiles" not in st

    # the layered DeepSpeed fixture, ported, with porter's DeepSpeed wheel as its target: nothing compiles
    ds_out = tmp_path / "deepspeed-ported"
    assert porter("port", "deepspeed", str(TRAINING / "deepspeed"), "--dest", str(ds_out)).returncode == 0
    rc, ds_audit = audit_doc(ds_out, str(torch_venv))
    assert rc == 0, ds_audit
    assert ("deepspeed", "deepspeed/ops/adam/cpu_adam.py") in by_status(ds_audit)["covered"]


def unpack(sdist: Path, dest: Path) -> Path:
    with tarfile.open(sdist) as tf:
        tf.extractall(dest, filter="data")
    (tree,) = [p for p in dest.iterdir() if p.is_dir()]
    return tree


def test_audit_of_the_real_deepspeed_sdist(tmp_path: Path, deepspeed_sdist: Path, torch_venv: Path,
                                           cpu_ops_wheelhouse: Path) -> None:
    tree = unpack(deepspeed_sdist, tmp_path)
    rc, bare = audit_doc(tree)
    assert rc == 1
    compiles = by_status(bare)["compiles"]
    assert ("deepspeed", "deepspeed/ops/adam/cpu_adam.py") in compiles
    assert ("deepspeed", "deepspeed/ops/adam/fused_adam.py") in compiles
    assert any(k == "triton" for k, _ in compiles) and len(compiles) > 50
    assert ("probe", "op_builder/async_io.py") in by_status(bare)["probe"]
    (ds_wheel,) = cpu_ops_wheelhouse.glob("*.whl")
    subprocess.run([str(torch_venv), "-m", "pip", "install", "-q", str(ds_wheel)], check=True, capture_output=True)
    rc, covered = audit_doc(tree, str(torch_venv))
    ops = {s["what"].rsplit(" ", 1)[-1] for s in covered["sites"]  # type: ignore[attr-defined]
           if s["status"] == "covered" and s["kind"] == "deepspeed"}
    assert {"cpu_adam", "cpu_adagrad", "cpu_lion"} <= ops, ops
    assert rc == 1  # the GPU ops of the sdist are not in a CPU wheel: honestly still JIT


DS_0184_OPS = ("cpu_adam", "fused_adam", "deepspeed_shm_comm")


@pytest.fixture(scope="module")
def ds0184_venv(tmp_path_factory: pytest.TempPathFactory, ccache_remote: dict[str, str]) -> Path:
    """A fresh venv with CPU torch and porter's DeepSpeed 0.18.4 CPU-ops wheel (cpu_adam, fused_adam -- the cpu
    accelerator's host build -- and shm_comm, named deepspeed_shm_comm in 0.18.4's catalogue)."""
    sdist = fetch_sdist("deepspeed", "0.18.4")
    house = tmp_path_factory.mktemp("wh0184")
    res = porter("ops", "build", "--source", str(sdist), "-t", "cpu", "--ops", ",".join(DS_0184_OPS), "-o", str(house),
                 "--json", timeout=3600, env=ccache_remote)
    assert res.returncode == 0, res.stderr[-4000:]
    (wheel,) = house.glob("*.whl")
    root = tmp_path_factory.mktemp("venv0184")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    py = root / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0", str(wheel)], check=True,
                   capture_output=True)
    return py


def test_deepspeed_0184_cpu_ops_verify_without_a_false_failure(ds0184_venv: Path) -> None:
    """0.18.4 asks every op's is_compatible() at import: async_io's has_function compiles a test program. porter's
    wheel answers it from the build host's recorded answer (its copy of the builder carries deepspeed/no-jit), so
    by default nothing is compiled; asked to probe as upstream does, the call is a note, not a JIT failure."""
    res = porter("verify", "--python", str(ds0184_venv), "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    doc = json.loads(res.stdout)
    (ds,) = [c for c in doc["components"] if c["component"] == "deepspeed"]
    assert all(ds["loader"][op] is None for op in DS_0184_OPS), ds["loader"]
    assert ds["feature_probes"] == [] and doc["ok"] and not any("feature probe" in n for n in doc["notes"]), doc
    site = Path(ds["modules"][0]["path"])
    site_packages = next(p for p in site.parents if p.name == "site-packages")
    info = (site_packages / "deepspeed" / "git_version_info_installed.py").read_text()
    assert "porter_feature_probes={'io_submit:aio': " in info

    probing = porter("verify", "--python", str(ds0184_venv), "--json", env={"PORTER_FEATURE_PROBES": "compile"})
    assert probing.returncode == 0, probing.stdout[-3000:] + probing.stderr[-2000:]
    doc = json.loads(probing.stdout)
    (ds,) = [c for c in doc["components"] if c["component"] == "deepspeed"]
    assert ds["feature_probes"] and all("test.c" in c or "a.out" in c for c in ds["feature_probes"])
    text = porter("verify", "--python", str(ds0184_venv), env={"PORTER_FEATURE_PROBES": "compile"})
    assert text.returncode == 0 and "note: deepspeed: 1 load-time feature probe call(s)" in text.stdout, text.stdout
