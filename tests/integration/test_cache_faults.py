"""Issue 22, with real builds: a built file that a crash or a full disk left truncated in the cache is found out
and built again (ninja alone would take it as up to date), and the wheel is the one a clean build writes."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from porter.fs import sha256_bytes
from tests.integration.conftest import CPU_OPS, run_porter, sigkill, slow_cpu_profile, small_ops_sdist, wait_for

pytestmark = [pytest.mark.integration]


def _build(sdist: Path, wheelhouse: Path) -> tuple[dict, str]:  # type: ignore[type-arg]
    res = run_porter("ops", "build", "--source", str(sdist), "--toolchain", "cpu", "--ops", ",".join(CPU_OPS),
                     "-o", str(wheelhouse), "--json")
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout), res.stderr


def _modules(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as z:
        return {n: sha256_bytes(z.read(n)) for n in z.namelist() if n.endswith(".so")}


def test_truncated_module_and_object_are_rebuilt_not_reused(cpu_ops_wheelhouse: Path, deepspeed_sdist: Path,
                                                             tmp_path: Path) -> None:
    (clean,) = cpu_ops_wheelhouse.glob("*.whl")
    doc, _ = _build(deepspeed_sdist, tmp_path / "a")  # the same build: every op from the cache
    assert all(o["status"] == "cached" for o in doc["ops"]), doc["ops"]
    steps = doc["plan"]["steps"]
    module = Path(next(s["output"] for s in steps if s["kind"] == "link" and "cpu_adam" in s["output"]))
    obj = Path(next(s["output"] for s in steps if s["kind"] == "compile" and "cpu_lion" in s["output"]))
    for path in (module, obj):  # as a crash or a full disk leaves them: a new time, the first 1000 bytes
        path.write_bytes(path.read_bytes()[:1000])
    doc, err = _build(deepspeed_sdist, tmp_path / "b")
    assert "no longer match what porter recorded" in err and module.name in err, err[-3000:]
    status = {o["name"]: o["status"] for o in doc["ops"]}
    assert status["cpu_adam"] == "built" and status["cpu_lion"] == "built", status
    (again,) = (tmp_path / "b").glob("*.whl")
    assert _modules(again) == _modules(clean)  # what a clean build wrote, byte for byte
    assert module.stat().st_size > 100_000


@pytest.fixture
def small_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 1 MiB tmpfs: a real file system that fills (mounting needs root; without it the test is skipped and the
    unit tier's injected ENOSPC stands in)."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_is_an_error_naming_the_path(cpu_ops_wheelhouse: Path, deepspeed_sdist: Path,
                                               small_fs: Path) -> None:
    # the wheelhouse fills while the wheel is written (every op from the cache: only the wheel is new)
    wh = small_fs / "wh"
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "--toolchain", "cpu", "--ops", ",".join(CPU_OPS),
                     "-o", str(wh))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "ERROR: no space left on device while writing" in res.stderr and str(wh) in res.stderr, res.stderr[-2000:]
    assert "TIP: free space on the file system that holds" in res.stderr
    assert not list(wh.glob("*")), list(wh.glob("*"))  # nothing half-written
    # the cache fills while the sdist is unpacked
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "--toolchain", "cpu", "--ops", "cpu_adam",
                     "-o", str(small_fs.parent / "wh2"), env={"PORTER_CACHE_DIR": str(small_fs / "cache")})
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "ERROR: no space left on device while writing" in res.stderr and str(small_fs / "cache") in res.stderr, \
        res.stderr[-2000:]
    assert "setup.py" not in res.stderr.split("ERROR:")[-1]  # the TIP names the disk, not another program
    assert not [p for p in (small_fs / "cache").rglob("*") if p.is_file() and not p.name.endswith((".lock", ".owner"))]


def _left(marker: str) -> str:
    import subprocess

    return subprocess.run(["pgrep", "-a", "-f", marker], capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_a_build_killed_at_each_stage_reruns_to_the_same_wheel(deepspeed_small_sdist: Path, tmp_path: Path) -> None:
    """Issue 22: porter killed with SIGKILL while it unpacks the sdist, while a compiler runs, while the linker
    runs, and while it writes the wheel; after each kill nothing it started still runs, nothing half-written is
    published, no lock blocks the next run; the run after the last kill writes the very wheel a build that was
    never killed writes (same cache path, so the same bytes). (DeepSpeed with small op sources: what is tested is
    porter's, not DeepSpeed's.)"""
    import os
    import shutil
    import signal
    import subprocess
    import sys

    profile, marks = slow_cpu_profile(tmp_path / "bin")
    cxx = profile.parent / "slow-g++"
    cache, wheelhouse = tmp_path / "cache", tmp_path / "wh"
    argv = [sys.executable, "-m", "porter", "ops", "build", "--source", str(deepspeed_small_sdist), "-t",
            str(profile), "--ops", "cpu_adam", "--no-cache", "--json"]
    env = {**os.environ, "PORTER_CACHE_DIR": str(cache)}
    env.pop("PORTER_KILL_AT", None)

    ref = subprocess.run([*argv, "-o", str(tmp_path / "ref")], capture_output=True, text=True, env=env, timeout=1800)
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = next((tmp_path / "ref").glob("*.whl")).read_bytes()
    shutil.rmtree(cache)

    def killed_inside(point: str) -> None:  # porter kills itself there (porter.faults)
        res = subprocess.run([*argv, "-o", str(wheelhouse)], capture_output=True, text=True, timeout=1800,
                             env={**env, "PORTER_KILL_AT": point})
        assert res.returncode == -signal.SIGKILL, (point, res.returncode, res.stderr[-2000:])

    def killed_outside(step: str) -> None:  # the test kills porter while its compiler (or linker) runs
        (marks / step).write_text("600")
        proc = subprocess.Popen([*argv, "-o", str(wheelhouse)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env)
        try:
            assert wait_for(lambda: list(marks.glob(f"{step}.*")) or proc.poll() is not None, 900, 0.1) \
                and list(marks.glob(f"{step}.*")), f"no {step} started (porter exit {proc.poll()})"
        finally:
            sigkill(proc)
            (marks / step).unlink()
        assert wait_for(lambda: not _left(str(cxx)), 30), f"outlived porter after a kill during {step}: {_left(str(cxx))}"

    killed_inside("unpack")
    sources = cache / "sources"
    assert not [p for p in sources.iterdir() if p.is_dir() and not p.name.startswith(".")], "a half-unpacked source was published"
    assert [p for p in sources.iterdir() if p.name.startswith(".unpack-")]  # what the kill left, under its pid
    killed_outside("compile")
    assert not [p for p in sources.iterdir() if p.name.startswith(".unpack-")]  # the next run removed it
    killed_outside("link")
    killed_inside("wheel")
    assert not list(wheelhouse.glob("*.whl")), "a half-written wheel was published"
    assert [p for p in wheelhouse.iterdir() if p.name.startswith(".porter-")]  # what the kill left, under its pid

    res = subprocess.run([*argv, "-o", str(wheelhouse)], capture_output=True, text=True, env=env, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "waiting for" not in res.stderr  # no lock of a killed run held on
    wheels = list(wheelhouse.glob("*.whl"))
    assert len(wheels) == 1 and wheels[0].read_bytes() == reference
    assert not [p for p in wheelhouse.iterdir() if p.name.startswith(".")]  # the killed write's temp is gone


@pytest.mark.slow
def test_four_different_builds_at_once_on_one_cache(deepspeed_small_sdist: Path, tmp_path: Path) -> None:
    """Issue 22: two builds on one cache once failed 3 runs out of 3 (an unpack renamed onto another's, a
    half-unpacked tree read as a source). Builds that share some work and not the rest, at once on one fresh
    cache: two of the same request, one of another op from the same source, one of the same op from another
    release. All succeed; the same request is compiled once (the other waits for the build folder, then finds it
    built) and gives a byte-identical wheel; each source is unpacked once. (DeepSpeed with small op sources:
    what is tested is porter's, not DeepSpeed's.)"""
    import os
    import subprocess
    import sys

    from tests.conftest import fetch_sdist

    older = small_ops_sdist(fetch_sdist("deepspeed", "0.16.4"), tmp_path / "older")
    cache = tmp_path / "cache"
    env = {**os.environ, "PORTER_CACHE_DIR": str(cache)}
    requests = [(deepspeed_small_sdist, "cpu_adam"), (deepspeed_small_sdist, "cpu_lion"),
                (deepspeed_small_sdist, "cpu_adam"), (older, "cpu_adam")]
    procs = [subprocess.Popen([sys.executable, "-m", "porter", "ops", "build", "--source", str(sdist), "-t", "cpu",
                               "--ops", op, "-o", str(tmp_path / f"wh{i}"), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i, (sdist, op) in enumerate(requests)]
    outs = [p.communicate(timeout=1800) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], [err[-2000:] for _, err in outs]
    docs = [json.loads(out) for out, _ in outs]
    assert [[o["name"] for o in d["ops"]] for d in docs] == [["cpu_adam"], ["cpu_lion"], ["cpu_adam"], ["cpu_adam"]]
    wheels = [next((tmp_path / f"wh{i}").glob("*.whl")) for i in range(4)]
    assert wheels[0].read_bytes() == wheels[2].read_bytes()
    assert sorted(d["ops"][0]["status"] for d in (docs[0], docs[2])) == ["built", "cached"]
    assert "waiting for" in outs[0][1] + outs[2][1]  # the waiter said so
    assert wheels[3].name.startswith("deepspeed-0.16.4+cpu") and wheels[1].name == wheels[0].name
    assert sorted(p.name.rsplit("-", 1)[0] for p in (cache / "sources").iterdir()
                  if p.is_dir() and not p.name.startswith(".")) == ["deepspeed-0.16.4", "deepspeed-0.19.8"]


def test_an_interrupted_download_is_an_error_that_says_so_and_keeps_nothing(tmp_path: Path) -> None:
    """Issue 22: a package index whose sdist transfer breaks off every time (a real HTTP server that promises
    100 kB and sends 1,000 bytes): pip resumes and gives up; porter says the download was interrupted, quoting pip,
    with a TIP for a network fault (not 'check the version exists'), and nothing of the download is kept."""
    import http.server
    import threading

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.startswith("/simple/deepspeed"):
                body = b'<html><body><a href="/f/deepspeed-0.0.1.tar.gz">deepspeed-0.0.1.tar.gz</a></body></html>'
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path.startswith("/f/"):
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                self.wfile.write(b"\x1f\x8b" + b"x" * 998)
                self.close_connection = True
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cache = tmp_path / "cache"
        res = run_porter("ops", "build", "--source", "deepspeed==0.0.1", "-t", "cpu", "--ops", "cpu_lion",
                         "-o", str(tmp_path / "wh"), timeout=300,
                         env={"PORTER_CACHE_DIR": str(cache), "PIP_RESUME_RETRIES": "1", "PIP_RETRIES": "0",
                              "PIP_INDEX_URL": f"http://127.0.0.1:{server.server_port}/simple",
                              "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": "/dev/null"})
    finally:
        server.shutdown()
    assert res.returncode == 1, res.stderr[-2000:]
    assert "ERROR: the download of deepspeed==0.0.1 was interrupted: " in res.stderr
    assert "not enough bytes" in res.stderr and "check the version exists" not in res.stderr
    assert "Traceback" not in res.stderr
    left = sorted(p.name for p in (cache / "sdists").iterdir())
    assert left == ["deepspeed-0.0.1.lock", "deepspeed-0.0.1.lock.owner"], left  # no sdist, no temp folder
    assert not (tmp_path / "wh").exists()
