"""porter install / verify / report / wheelhouse index as processes, on wheels built here with g++.

Each test wheel holds a real CPython extension module compiled by g++, laid out like porter's ops
engine lays out a DeepSpeed wheel, and is installed by the target venv's pip.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from porter.artifacts.manifest import manifest_path
from tests.fixtures.install.wheels import compile_ext, deepspeed_wheel, make_manifest, make_venv, make_wheel

DS = "deepspeed-0.19.8+cpu.x86.64.v2-cp311-cp311-linux_x86_64.whl"


def porter(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True, timeout=600,
                          env=env)


@pytest.fixture(scope="module")
def cpu_so(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("so")
    return compile_ext(d / "cpu_adam_op.so", "cpu_adam_op").read_bytes()


@pytest.fixture
def wheelhouse(tmp_path: Path, cpu_so: bytes) -> Path:
    wh = tmp_path / "wheelhouse"
    deepspeed_wheel(wh, {"cpu_adam": cpu_so})
    return wh


def record_intact(py: Path, dist: str) -> list[str]:
    """Files listed in the installed dist's RECORD that are missing or differ (empty = whole)."""
    out = subprocess.run([str(py), "-c", f"import importlib.metadata as m; d = m.distribution({dist!r}); "
                          "print(d._path)"], capture_output=True, text=True, check=True).stdout.strip()
    info = Path(out)
    bad = []
    with (info / "RECORD").open() as f:
        for path, digest, _size in csv.reader(f):
            full = (info.parent / path).resolve()
            if not digest:
                continue
            algo, _, want = digest.partition("=")
            if not full.is_file():
                bad.append(f"missing {path}")
                continue
            got = base64.urlsafe_b64encode(hashlib.new(algo, full.read_bytes()).digest()).rstrip(b"=").decode()
            if got != want:
                bad.append(f"changed {path}")
    return bad


def test_cpu_op_wheel_installs_offline_and_verifies(tmp_path: Path, wheelhouse: Path) -> None:
    py = make_venv(tmp_path / "venv")
    res = porter("install", str(wheelhouse), "--python", str(py))
    assert res.returncode == 0, res.stderr
    assert f"installed deepspeed 0.19.8+cpu.x86.64.v2 ({DS})" in res.stdout
    assert "--no-index" in res.stderr and "--find-links" in res.stderr
    step = subprocess.run([str(py), "-c", "from deepspeed.ops.adam import cpu_adam_op as m; print(m.step(1.0, 0.5, 0.1))"],
                          capture_output=True, text=True)
    assert step.stdout.strip() == "0.95", step.stderr
    res = porter("verify", "--python", str(py), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    [comp] = doc["components"]
    assert comp["component"] == "deepspeed" and comp["mode"] == "prebuilt" and comp["installed_ops"] == {"cpu_adam": True}
    assert comp["modules"][0]["import"] == "ok" and comp["record"].endswith("share/porter/installed/deepspeed.json")
    rep = porter("report", "--python", str(py), "--json")
    assert rep.returncode == 0 and json.loads(rep.stdout)["components"][0]["version"] == "0.19.8+cpu.x86.64.v2"
    again = porter("install", str(wheelhouse), "--python", str(py))
    assert again.returncode == 0 and "unchanged deepspeed" in again.stdout


def test_two_installs_at_once_take_turns_and_leave_a_whole_install(tmp_path: Path, wheelhouse: Path) -> None:
    py = make_venv(tmp_path / "venv")
    argv = [sys.executable, "-m", "porter", "install", str(wheelhouse), "--python", str(py), "--reinstall", "--json"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    docs = [json.loads(o) for o, _ in outs]
    assert all(d["installed"][0]["wheel"] == DS for d in docs)
    (a0, a1), (b0, b1) = sorted((d["lock"]["acquired_at"], d["lock"]["released_at"]) for d in docs)
    assert a1 <= b0, f"the two installs held the lock at the same time: {a0}-{a1} and {b0}-{b1}"
    assert max(d["lock"]["waited_s"] for d in docs) > 0  # one of them did wait for the other
    assert record_intact(py, "deepspeed") == []
    assert porter("verify", "--python", str(py)).returncode == 0


@pytest.fixture(scope="module")
def shared_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_venv(tmp_path_factory.mktemp("bad") / "venv")


def _not_installed(py: Path) -> bool:
    return subprocess.run([str(py), "-c", "import deepspeed"], capture_output=True).returncode != 0


def test_tampered_wheel_is_refused(tmp_path: Path, wheelhouse: Path, shared_venv: Path) -> None:
    with (wheelhouse / DS).open("ab") as f:
        f.write(b"\0")
    res = porter("install", str(wheelhouse), "--python", str(shared_venv))
    assert res.returncode == 2 and "sha256 does not match its manifest" in res.stderr and DS in res.stderr
    assert _not_installed(shared_venv)


def test_wheel_escaping_the_target_is_refused(tmp_path: Path, cpu_so: bytes, shared_venv: Path) -> None:
    wh = tmp_path / "wh"
    whl = make_wheel(wh, "deepspeed", "0.19.8+cpu.x86.64.v2",
                     {"deepspeed/__init__.py": b"", "deepspeed/../../../escaped.pth": b"import os\n"})
    make_manifest(whl, component="deepspeed", version="0.19.8+cpu.x86.64.v2")
    res = porter("install", str(wh), "--python", str(shared_venv))
    assert res.returncode == 2 and "entries escape the install target: deepspeed/../../../escaped.pth" in res.stderr
    assert _not_installed(shared_venv)
    assert not list(shared_venv.parent.parent.rglob("escaped.pth"))


def test_no_match_lists_what_the_wheelhouse_has(tmp_path: Path, cpu_so: bytes, shared_venv: Path) -> None:
    wh = tmp_path / "wh"
    deepspeed_wheel(wh, {"cpu_adam": cpu_so}, torch={"version": "2.12.0+cpu", "kind": "cpu"})
    other = make_wheel(wh, "flash-attn", "2.8.3+rocm5.7.gfx90a", {"flash_attn/__init__.py": b""},
                       tag="cp310-cp310-linux_x86_64")
    make_manifest(other, component="flash-attn", version="2.8.3+rocm5.7.gfx90a", kind="rocm", archs=["gfx90a"])
    res = porter("install", str(wh), "--python", str(shared_venv))
    assert res.returncode == 4, res.stderr
    assert "no wheel in" in res.stderr and DS in res.stderr and "torch: built for 2.12.0 (cpu), found 2.13.0 (cpu)" in res.stderr
    assert other.name in res.stderr and "cp310" in res.stderr
    assert _not_installed(shared_venv)


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_manifest_missing_or_corrupt(damage: str, wheelhouse: Path, shared_venv: Path) -> None:
    m = manifest_path(wheelhouse / DS)
    if damage == "missing":
        m.unlink()
    else:
        m.write_text(m.read_text()[:40])
    res = porter("install", str(wheelhouse), "--python", str(shared_venv))
    assert res.returncode == 2 and f"manifest {damage}" in res.stderr and DS in res.stderr
    assert _not_installed(shared_venv)


def test_wheelhouse_index_serves_pip(tmp_path: Path, wheelhouse: Path, shared_venv: Path) -> None:
    dep = make_wheel(wheelhouse, "hjson", "3.1.0", {"hjson/__init__.py": b"V = 1\n"}, tag="py3-none-any")
    res = porter("wheelhouse", "index", str(wheelhouse))
    assert res.returncode == 0, res.stderr
    combined = json.loads((wheelhouse / "porter-wheelhouse.json").read_text())
    assert {w["filename"] for w in combined["wheels"]} == {DS, dep.name}
    dest = tmp_path / "dl"
    url = (wheelhouse / "simple").as_uri() + "/"
    got = subprocess.run([str(shared_venv), "-m", "pip", "download", "--no-deps", "--index-url", url, "-d", str(dest),
                          "deepspeed==0.19.8+cpu.x86.64.v2", "hjson"], capture_output=True, text=True)
    assert got.returncode == 0, got.stdout + got.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted([DS, dep.name])


def _runtime_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist without extras, torch left out (the venv has it)."""
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    reqs = [Requirement(ln.split(":", 1)[1].strip()) for ln in lines if ln.startswith("Requires-Dist:")]
    return [str(r) for r in reqs if r.name != "torch" and (r.marker is None or r.marker.evaluate({"extra": ""}))]


@pytest.mark.slow
def test_real_deepspeed_cpu_op_wheel_from_the_ops_engine(tmp_path: Path, cpu_ops_wheelhouse: Path) -> None:
    """The session's porter ops build (the real DeepSpeed 0.19.8 sdist, its three CPU ops, g++) -> a wheelhouse ->
    fresh venv with torch 2.13.0 -> porter install (offline; the dependencies downloaded into the wheelhouse first)
    -> porter verify, which loads each op through DeepSpeed's own op loader with compilers trapped."""
    import shutil

    from tests.conftest import require
    from tests.integration.conftest import CPU_OPS

    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    for built in cpu_ops_wheelhouse.glob("deepspeed-*"):
        shutil.copy2(built, wh / built.name)
    [whl] = wh.glob("deepspeed-*.whl")
    assert whl.name == DS
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    got = subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], capture_output=True, text=True)
    require("torch==2.13.0 for a fresh venv", got.returncode == 0, got.stderr[-500:])
    got = subprocess.run([str(py), "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(wh),
                          *_runtime_requirements(whl)], capture_output=True, text=True)
    require("DeepSpeed's dependency wheels", got.returncode == 0, got.stderr[-500:])
    res = porter("install", str(wh), "--python", str(py), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert [w["wheel"] for w in json.loads(res.stdout)["installed"]] == [DS]
    res = porter("verify", "--python", str(py), "--json")
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    [comp] = json.loads(res.stdout)["components"]
    assert all(comp["installed_ops"][op] is True for op in CPU_OPS), comp["installed_ops"]
    assert comp["loader"] == {op: None for op in CPU_OPS}, comp["loader"]
    assert [m["import"] for m in comp["modules"]] == ["ok"] * len(CPU_OPS)


def test_install_killed_while_pip_runs_leaves_no_pip_and_the_rerun_is_whole(tmp_path: Path, wheelhouse: Path) -> None:
    """Issue 22: porter killed (SIGKILL) while the target's pip installs: pip stops with it (nothing porter
    started runs on), the install lock goes with porter, porter's install record was never written, and the next
    install leaves a whole install that verifies. The killed install's staging folder (named by its pid) is
    removed by the next install, in the same temp folder."""
    from tests.integration.conftest import sigkill, wait_for

    py = make_venv(tmp_path / "venv")
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen([sys.executable, "-m", "porter", "install", str(wheelhouse), "--python", str(py)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def pip_running() -> str:
        return subprocess.run(["pgrep", "-a", "-f", f"{py} -m pip install"], capture_output=True,
                              text=True).stdout.strip()

    try:
        assert wait_for(lambda: pip_running() or proc.poll() is not None, 120, 0.02) and pip_running(), \
            f"pip never ran (porter exit {proc.poll()})"
    finally:
        sigkill(proc)
    assert wait_for(lambda: not pip_running(), 20), "pip outlived porter"
    assert not list((py.parent.parent / "share" / "porter" / "installed").glob("*.json"))  # no record, no claim
    left = [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith(f"porter-install-{proc.pid}@")]
    assert left, "the killed install left no staging folder: the rerun below proves nothing"
    res = porter("install", str(wheelhouse), "--python", str(py), "--json", env=env)
    assert res.returncode == 0, res.stderr
    assert not [p for p in (tmp_path / "tmp").iterdir() if p.name.startswith("porter-install-")], \
        "a staging folder outlived its install"
    assert "waiting for" not in res.stderr
    assert record_intact(py, "deepspeed") == []
    assert porter("verify", "--python", str(py)).returncode == 0
