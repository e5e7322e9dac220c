"""Engine pieces without subprocesses: torch check, dry run, verification, labelling, MAX_JOBS."""

from __future__ import annotations

import json
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from porter.errors import CheckFailed, ConfigError
from porter.resources import default_jobs
from porter.run import Result, Runner
from porter.toolchain.profile import load_toolchain
from porter.components import get_driver, wheel_drivers
from porter.wheels import Machine, WheelRequest, build_wheel
from porter.wheels.base import GiB, Expectation, choose_jobs
from porter.probe import script_text
from porter.probes.protocol import MARKER
from porter.artifacts.wheelfile import module_name
from porter.wheels.verify import relabel, verify_wheel
from tests.conftest import FIXTURES

DRIVERS = wheel_drivers()
from tests.unit.test_codeobjects import bundle, elf_with_section


@dataclass
class FakeRunner(Runner):
    """Answers the torch probe with a canned torch; fails the test if anything else would run."""

    torch: Mapping[str, Any] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def run(self, argv: Sequence[Any], **kw: Any) -> Result:  # type: ignore[override]
        args = [str(a) for a in argv]
        self.calls.append(args)
        if args[-1] == "-" and kw.get("input") == script_text("torch"):
            return Result(args, 0, "noise\n" + MARKER + json.dumps(dict(self.torch)) + "\n", 0.0)
        if self.dry:  # a dry run records what would change something
            return Result(args, 0, "", 0.0)
        raise AssertionError(f"unexpected command in a unit test: {args}")


CPU_TORCH = {"version": "2.13.0+cpu", "hip": None, "cuda": None}
ROCM_TORCH = {"version": "2.5.1+rocm6.2", "hip": "6.2.41133", "cuda": None}


HOUSE = tempfile.TemporaryDirectory(prefix="porter-test-house-")
"""The requests' wheelhouse (they are refused or dry runs: nothing is written); removed when the tests end."""


def req(source: Path, tc: str, **kw: Any) -> WheelRequest:
    """(The wave-64 step allowed: see test_wheels_compile.request.)"""
    kw.setdefault("allow_wave32", ("all",))
    return WheelRequest(source=source, toolchain=load_toolchain(tc), output=Path(HOUSE.name) / "house", **kw)


# -- torch of the wrong kind -------------------------------------------------------------------

def test_rocm_build_refuses_a_cpu_torch_before_building() -> None:
    runner = FakeRunner(torch=CPU_TORCH)
    src = FIXTURES / "flash-attn-mini"
    with pytest.raises(ConfigError) as exc:
        build_wheel(get_driver("flash-attn"), str(src), req(src, "mi300x"), runner=runner, others=DRIVERS,
                    machine=Machine(4, 64 * GiB))
    assert "needs the ROCm build of torch" in exc.value.message and "2.13.0+cpu" in exc.value.message
    assert exc.value.exit_code == 2
    assert len(runner.calls) == 1  # only the probe ran; no pip


def test_cuda_torch_is_named_too() -> None:
    runner = FakeRunner(torch={"version": "2.14.1+cu130", "hip": None, "cuda": "13.0"})
    src = FIXTURES / "apex-env"
    with pytest.raises(ConfigError, match=r"2.14.1\+cu130 \(cuda, CUDA 13.0\)"):
        build_wheel(get_driver("apex"), str(src), req(src, "frontier"), runner=runner, others=DRIVERS)


def test_dry_run_with_rocm_torch_records_the_full_command_and_env() -> None:
    runner = FakeRunner(dry=True, torch=ROCM_TORCH)
    src = FIXTURES / "apex-env"
    res = build_wheel(get_driver("apex"), str(src), req(src, "mi300x", ops=("apex_C",)), runner=runner,
                      others=DRIVERS, machine=Machine(8, 9 * GiB))
    assert res.dry_run and res.refusal is None and res.wheel is None
    assert res.argv[1:7] == ["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--disable-pip-version-check"]
    # apex's op_builder regime: the ops compile and link on porter's engine, setup.py writes the Python side only
    assert res.plan.env["APEX_BUILD_APEX_C"] is None and not any(k.startswith("APEX_BUILD") for k in res.env)
    assert res.env["PYTORCH_ROCM_ARCH"] == "gfx942"
    assert res.plan.jobs == 4  # (9 GiB - 1 GiB reserve) / 2 GiB per hipcc job
    text = res.describe()
    assert "1 op(s) compiled and linked by porter's AOT engine" in text
    assert "APEX_BUILD_APEX_C=" not in text and "pip wheel --no-deps --no-build-isolation" in text
    assert "code objects for gfx942" in text


def test_dry_run_reports_the_torch_refusal_with_the_plan() -> None:
    src = FIXTURES / "flash-attn-mini"
    res = build_wheel(get_driver("flash-attn"), str(src), req(src, "mi300x"), runner=FakeRunner(dry=True, torch=CPU_TORCH),
                      others=DRIVERS)
    assert res.refusal is not None and "needs the ROCm build of torch" in res.describe()


def test_torch_import_error_is_a_clear_config_error() -> None:
    src = FIXTURES / "apex-env"
    with pytest.raises(ConfigError, match="cannot import torch: ModuleNotFoundError"):
        build_wheel(get_driver("apex"), str(src), req(src, "cpu"),
                    runner=FakeRunner(torch={"error": "ModuleNotFoundError: No module named 'torch'"}), others=DRIVERS)


# -- MAX_JOBS ----------------------------------------------------------------------------------

@pytest.mark.parametrize("per_job", [1 * GiB, 2 * GiB, 6 * GiB, 9 * GiB])
@pytest.mark.parametrize("free", [0.5 * GiB, 3 * GiB, 7 * GiB, 24 * GiB, 100 * GiB, 1000 * GiB])
@pytest.mark.parametrize("cores", [1, 2, 16, 128])
def test_max_jobs_peak_stays_within_free_memory(per_job: int, free: float, cores: int) -> None:
    reserve = 1 * GiB
    jobs = choose_jobs(per_job, Machine(cores=cores, free_bytes=int(free)))
    assert 1 <= jobs <= cores
    if jobs > 1:  # one job is the floor even when it does not fit; more only when they all fit
        assert jobs * per_job <= free - reserve
    assert jobs == default_jobs(per_job, cores=cores, free_bytes=int(free), reserve_bytes=reserve)
    # and it is the largest such number (memory- or core-bound)
    assert jobs == cores or (jobs + 1) * per_job > free - reserve


def test_flash_attn_ck_jobs_on_a_login_node() -> None:
    d = get_driver("flash-attn")
    info = d.detect(FIXTURES / "flash-attn-mini")
    assert info is not None
    p = d.plan(info, req(info.tree, "mi300x"), Machine(cores=64, free_bytes=50 * GiB))
    assert p.jobs == 8 and p.jobs * p.per_job_bytes <= 50 * GiB  # 64 cores, but memory allows 8 CK units
    p = d.plan(info, req(info.tree, "mi300x", jobs=3), Machine(cores=64, free_bytes=50 * GiB))
    assert p.env["MAX_JOBS"] == "3"


# -- verification -------------------------------------------------------------------------------

def make_wheel(path: Path, files: dict[str, bytes], version: str = "1.0") -> Path:
    from wheel.wheelfile import WheelFile

    name = path.name.split("-")[0]
    dist = f"{name}-{version}.dist-info"
    files = {**files,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n"}
    with WheelFile(path, "w") as wf:
        for n, data in files.items():
            wf.writestr(n, data)
    return path


def test_module_names_from_wheel_paths() -> None:
    assert module_name("apex/amp_C.cpython-311-x86_64-linux-gnu.so") == "apex.amp_C"
    assert module_name("flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so") == "flash_attn_2_cuda"
    assert module_name("pkg/_ext.abi3.so") == "pkg._ext"


def test_empty_wheel_is_refused_when_prebuilt_was_asked(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path / "apex-1.0-cp311-cp311-linux_x86_64.whl", {"apex/__init__.py": b""})
    with pytest.raises(CheckFailed) as exc:
        verify_wheel(whl, Expectation(modules=("apex.apex_C",), prebuilt=True, empty_hint="drop --regime"))
    assert "holds no prebuilt extension" in exc.value.message and exc.value.hint == "drop --regime"
    assert verify_wheel(whl, Expectation()) == []  # nothing asked, nothing refused


def test_missing_module_and_missing_arch_are_named(tmp_path: Path) -> None:
    gfx90a_only = elf_with_section(".hip_fatbin", bundle(["hipv4-amdgcn-amd-amdhsa--gfx90a"]))
    whl = make_wheel(tmp_path / "flash_attn-1.0-cp311-cp311-linux_x86_64.whl",
                     {"other_ext.cpython-311-x86_64-linux-gnu.so": gfx90a_only})
    with pytest.raises(CheckFailed) as exc:
        verify_wheel(whl, Expectation(modules=("flash_attn_2_cuda",), prebuilt=True, archs=("gfx90a", "gfx942")))
    msg = exc.value.message
    assert "lacks the extension modules flash_attn_2_cuda" in msg
    assert "no code objects for gfx942 (it holds: gfx90a)" in msg


def test_host_only_so_is_refused_for_a_gpu_target_and_accepted_for_cpu(tmp_path: Path) -> None:
    host_only = elf_with_section(".text", b"\x90" * 16)
    whl = make_wheel(tmp_path / "apex-1.0-cp311-cp311-linux_x86_64.whl",
                     {"apex/apex_C.cpython-311-x86_64-linux-gnu.so": host_only})
    with pytest.raises(CheckFailed, match="no code objects for gfx90a .it holds: none"):
        verify_wheel(whl, Expectation(modules=("apex.apex_C",), prebuilt=True, archs=("gfx90a",)))
    entries = verify_wheel(whl, Expectation(modules=("apex.apex_C",), prebuilt=True))
    assert entries[0]["module"] == "apex.apex_C" and len(entries[0]["sha256"]) == 64


def test_good_gpu_wheel_lists_archs(tmp_path: Path) -> None:
    both = elf_with_section(".hip_fatbin", bundle(["hipv4-amdgcn-amd-amdhsa--gfx90a",
                                                   "hipv4-amdgcn-amd-amdhsa--gfx942:xnack-"]))
    whl = make_wheel(tmp_path / "flash_attn-1.0-cp311-cp311-linux_x86_64.whl",
                     {"flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so": both})
    (entry,) = verify_wheel(whl, Expectation(modules=("flash_attn_2_cuda",), prebuilt=True, archs=("gfx90a", "gfx942")))
    assert entry["archs"] == ["gfx90a", "gfx942"]


def test_missing_package_dir(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path / "flash_attn-1.0-cp311-cp311-linux_x86_64.whl", {"flash_attn/__init__.py": b""})
    with pytest.raises(CheckFailed, match="lacks the package directory flash_attn/flash_attn_triton_amd/"):
        verify_wheel(whl, Expectation(packages=("flash_attn/flash_attn_triton_amd",)))


# -- labelling ---------------------------------------------------------------------------------

def test_relabel_sets_the_local_version_in_name_metadata_and_manifest(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path / "apex-1.14.0a0-cp311-cp311-linux_x86_64.whl",
                     {"apex/__init__.py": b"x = 1\n"}, version="1.14.0a0")
    (tmp_path / "house").mkdir()
    manifest: Any = {"component": "apex", "version": "", "tc": load_toolchain("cpu"), "torch": None,
                     "python_tag": "cp311", "sources": {}, "extensions": []}
    out, mpath = relabel(whl, "rocm6.2.gfx942", tmp_path / "house", manifest, extra={"wave64": {"counts": {}}})
    assert out.name == "apex-1.14.0a0+rocm6.2.gfx942-cp311-cp311-linux_x86_64.whl"
    assert json.loads(mpath.read_text())["wheel"]["filename"] == out.name
    with zipfile.ZipFile(out) as zf:
        meta = zf.read("apex-1.14.0a0+rocm6.2.gfx942.dist-info/METADATA").decode()
        assert "Version: 1.14.0a0+rocm6.2.gfx942" in meta
        assert zf.read("apex/__init__.py") == b"x = 1\n"
        carried = json.loads(zf.read("apex-1.14.0a0+rocm6.2.gfx942.dist-info/porter.json"))
        assert carried["version"] == "1.14.0a0+rocm6.2.gfx942" and "wheel" not in carried
        assert carried["wave64"] == {"counts": {}} and carried["schema"].startswith("porter")
    # a second label replaces the first, in normal form
    (tmp_path / "house2").mkdir()
    again, _ = relabel(out, "cpu.x86.64.v2", tmp_path / "house2", dict(manifest))
    assert again.name.startswith("apex-1.14.0a0+cpu.x86.64.v2-")
    assert not list((tmp_path / "house").glob(".porter-*"))


def test_publish_leaves_nothing_when_the_artifact_cannot_be_written(tmp_path: Path) -> None:
    """The one output step: a writer that fails leaves neither the artifact, nor its manifest, nor a temp folder."""
    from porter.artifacts.manifest import publish

    def broken(folder: Path, data: bytes) -> Path:
        (folder / "x.whl").write_bytes(data[:10])
        raise OSError("disk full")

    fields: Any = {"component": "x", "version": "1", "tc": load_toolchain("cpu"), "torch": None, "python_tag": "py3",
                   "sources": {}, "extensions": []}
    with pytest.raises(OSError, match="disk full"):
        publish(tmp_path / "house", broken, **fields)
    assert list((tmp_path / "house").iterdir()) == []
    dest, mpath, manifest = publish(tmp_path / "house", lambda folder, data: _put(folder / "x.whl", data), **fields)
    assert sorted(p.name for p in (tmp_path / "house").iterdir()) == ["x.whl", "x.whl.porter.json"]
    assert json.loads(dest.read_bytes())["component"] == "x" and manifest["wheel"]["filename"] == "x.whl"
    assert json.loads(mpath.read_text())["wheel"]["sha256"] == manifest["wheel"]["sha256"]


def _put(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_triton_wheel_with_a_chroot_profile_runs_the_host_build_python_on_the_host(tmp_path: Path) -> None:
    """Seen on ROCm/flash-attention main_perf (issue 18's gauntlet): with no --python, the Triton wheel's pip ran
    porter's own host python inside the chroot (exit 127). setup.py runs where the build python does."""
    import sys

    src = FIXTURES / "flash-attn-mini"
    root = tmp_path / "r7"
    (root / "proc" / "self").mkdir(parents=True)
    request = WheelRequest(source=src, toolchain=load_toolchain("debian-rocm7", environ={"PORTER_ROCM7_ROOT": str(root)}),
                           output=tmp_path / "house", backend="triton")
    res = build_wheel(get_driver("flash-attn"), str(src), request, runner=FakeRunner(dry=True, torch=CPU_TORCH), others=DRIVERS)
    assert res.argv[:4] == [sys.executable, "-m", "pip", "wheel"] and "chroot" not in res.argv, res.argv
    assert res.refusal is None
