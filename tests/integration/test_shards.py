"""A build split into shards (what a Slurm job array runs) gives what one local build gives: the same
objects and the same wheel, byte for byte."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import run_porter


def _digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_two_shards_then_link_equal_one_local_build(deepspeed_sdist: Path, tmp_path: Path,
                                                    ccache_remote: dict[str, str]) -> None:
    env = {"PORTER_CACHE_DIR": str(tmp_path / "cache"), **ccache_remote}
    base = ("ops", "build", "--source", str(deepspeed_sdist), "-t", "cpu", "--ops", "cpu_lion",
            "--json", "-j", "2")
    objects: list[str] = []
    for i in range(2):
        res = run_porter(*base, "--shard", f"{i}/2", "-o", str(tmp_path / "unused"), env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        doc = json.loads(res.stdout)
        assert doc["shard"]["index"] == i and len(doc["shard"]["objects"]) == 1 and doc["wheel"] is None
        objects += doc["shard"]["objects"]
    assert not (tmp_path / "unused").exists()  # shards package nothing
    sharded = {o: _digest(o) for o in objects}
    stamps = {o: Path(o).stat().st_mtime_ns for o in objects}
    linked = run_porter(*base, "--link-only", "-o", str(tmp_path / "a"), env=env)
    assert linked.returncode == 0, linked.stderr[-3000:]
    build_dir = Path(json.loads(linked.stdout)["plan"]["build_dir"])
    # link-only links what the shards compiled: no object is compiled again
    assert {o: Path(o).stat().st_mtime_ns for o in objects} == stamps
    assert "build.link.ninja" in linked.stderr
    shutil.rmtree(build_dir)  # the same build, in one run
    local = run_porter(*base, "-o", str(tmp_path / "b"), env=env)
    assert local.returncode == 0, local.stderr[-3000:]
    assert {o: _digest(o) for o in objects} == sharded
    (wa,), (wb,) = (tmp_path / "a").glob("*.whl"), (tmp_path / "b").glob("*.whl")
    assert wa.name == wb.name and _digest(wa) == _digest(wb)


def test_shards_over_an_earlier_build_record_their_objects_for_the_link(deepspeed_small_sdist: Path,
                                                                       tmp_path: Path) -> None:
    """Session 7's CI failure: a whole build had recorded its objects; shards then compiled them again (their
    ninja state is their own) to other bytes (ROCm objects carry temp names), recorded nothing, and the link job
    took its own objects for damaged ones, discarded them and failed. Each shard now checks its own objects against
    the record and adds what it compiled; the link links them. (What the record says is what is tested, not what
    the compiler does: DeepSpeed with small op sources.)"""
    env = {"PORTER_CACHE_DIR": str(tmp_path / "cache")}
    base = ("ops", "build", "--source", str(deepspeed_small_sdist), "-t", "cpu", "--ops", "cpu_lion", "--json")
    whole = run_porter(*base, "-o", str(tmp_path / "a"), env=env)
    assert whole.returncode == 0, whole.stderr[-3000:]
    build_dir = Path(json.loads(whole.stdout)["plan"]["build_dir"])
    record = build_dir / "porter-outputs.json"
    rec = json.loads(record.read_text())
    objects = sorted(k for k in rec if k.endswith(".o"))
    assert len(objects) == 2
    for k in objects:  # the earlier build's objects had other bytes than the ones there now
        rec[k]["sha256"] = "0" * 64
    record.write_text(json.dumps(rec))
    for i in range(2):
        res = run_porter(*base, "--shard", f"{i}/2", env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        assert res.stderr.count("no longer match") == 1 and "discarded and built again" in res.stderr
        mine = json.loads(res.stdout)["shard"]["objects"]
        assert len(mine) == 1 and Path(mine[0]).is_file()
        named = res.stderr.split("built again: ", 1)[1].split()[0]
        assert Path(mine[0]) == build_dir / named  # its own object, never the other shard's
    rec = json.loads(record.read_text())
    assert all(rec[k]["sha256"] == _digest(build_dir / k) for k in objects)
    linked = run_porter(*base, "--link-only", "-o", str(tmp_path / "b"), env=env)
    assert linked.returncode == 0, linked.stderr[-3000:]
    assert "no longer match" not in linked.stderr and len(list((tmp_path / "b").glob("*.whl"))) == 1


def test_link_only_names_a_missing_shard(deepspeed_small_sdist: Path, tmp_path: Path) -> None:
    env = {"PORTER_CACHE_DIR": str(tmp_path / "cache")}
    res = run_porter("ops", "build", "--source", str(deepspeed_small_sdist), "-t", "cpu", "--ops", "cpu_lion",
                     "--no-cache", "--link-only", "-o", str(tmp_path / "wh"), env=env)
    assert res.returncode == 1 and "object(s) are missing" in res.stderr and "--shard" in res.stderr
    bad = run_porter("ops", "build", "--source", str(deepspeed_small_sdist), "-t", "cpu", "--ops", "cpu_lion",
                     "--shard", "2/2", env=env)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_the_same_shard_of_two_arrays_at_once_compiles_once(deepspeed_small_sdist: Path, tmp_path: Path) -> None:
    """Issue 22: two arrays of one build on one shared build folder (a resubmission while the first still runs,
    two users' jobs): shard 0 of each starts at once. They do not mix one ninja state: one compiles, the other
    waits for it (and says so) and then finds its objects built. (Small op sources; each compile waits 10 s, so
    that the second array surely arrives while the first compiles.)"""
    import os
    import subprocess
    import sys

    from tests.integration.conftest import slow_cpu_profile

    profile, marks = slow_cpu_profile(tmp_path / "bin")
    (marks / "compile").write_text("10")
    env = {**os.environ, "PORTER_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "porter", "ops", "build", "--source", str(deepspeed_small_sdist), "-t", str(profile),
            "--ops", "cpu_lion", "--no-cache", "--json", "--shard", "0/2"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=1200) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    docs = [json.loads(out) for out, _ in outs]
    assert sorted(d["ops"][0]["status"] for d in docs) == ["cached", "compiled"]
    assert docs[0]["shard"]["objects"] == docs[1]["shard"]["objects"]
    assert any("waiting for" in err and "shard-0-of-2" in err for _, err in outs)


@pytest.mark.slow
def test_a_shard_killed_mid_compile_resumes_where_it_stopped(deepspeed_small_sdist: Path, tmp_path: Path) -> None:
    """Issue 22: a shard task killed (a time limit, preemption) and run again (Slurm's requeue runs the same
    script): the object it had finished is kept, only the rest is compiled, and the link after it succeeds. (Small
    op sources; each compile of the killed run waits 5 s, the window the kill lands in.)"""
    import os
    import subprocess
    import sys

    from tests.integration.conftest import sigkill, slow_cpu_profile, wait_for

    profile, marks = slow_cpu_profile(tmp_path / "bin")
    (marks / "compile").write_text("5")
    env = {**os.environ, "PORTER_CACHE_DIR": str(tmp_path / "cache")}
    base = [sys.executable, "-m", "porter", "ops", "build", "--source", str(deepspeed_small_sdist), "-t", str(profile),
            "--ops", "cpu_lion", "--no-cache", "--json", "-j", "1"]
    proc = subprocess.Popen([*base, "--shard", "0/1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        def finished() -> list[Path]:  # ninja logs an object once its compile has ended (an .o appears earlier)
            logs = list((tmp_path / "cache").glob("wheels/*/build/.ninja-shard-0-of-1/.ninja_log"))
            lines = logs[0].read_text().splitlines()[1:] if logs else []
            paths = [ln.split("\t")[3] for ln in lines if len(ln.split("\t")) > 3]
            return [logs[0].parent.parent / p for p in paths if p.endswith(".o")]

        first = wait_for(finished, 600, 0.1)
        assert len(first) == 1, f"expected one finished object before the kill, found {first}"
    finally:
        sigkill(proc)
        (marks / "compile").unlink()
    kept = first[0].stat().st_mtime_ns
    again = subprocess.run([*base, "--shard", "0/1"], capture_output=True, text=True, env=env, timeout=1200)
    assert again.returncode == 0, again.stderr[-3000:]
    doc = json.loads(again.stdout)
    assert len(doc["shard"]["objects"]) == 2 and first[0].stat().st_mtime_ns == kept  # kept, not compiled again
    assert "waiting for" not in again.stderr  # the killed shard's lock went with it
    linked = subprocess.run([*base, "--link-only", "-o", str(tmp_path / "wh")], capture_output=True, text=True,
                            env=env, timeout=1200)
    assert linked.returncode == 0, linked.stderr[-3000:]
    assert len(list((tmp_path / "wh").glob("*.whl"))) == 1


HALF_WRITING_CXX = """#!{python}
# g++, but a compile writes its object in two halves: the first, then a mark (naming the path it writes), then,
# once the test says go, the rest: a large object landing on a slow shared file system, seen from another node
import os, subprocess, sys, time
args = sys.argv[1:]
if "-c" not in args:
    os.execvp("g++", ["g++", *args])
at = args.index("-o") + 1
out = args[at]
args[at] = out + ".whole"
code = subprocess.call(["g++", *args])
if code:
    sys.exit(code)
with open(out + ".whole", "rb") as f:
    data = f.read()
os.unlink(out + ".whole")
marks = os.environ["MARKS"]
with open(out, "wb") as f:
    f.write(data[: len(data) // 2])
    f.flush()
    with open(os.path.join(marks, f"half.{{os.getpid()}}"), "w") as m:
        m.write(out)
    while not os.path.exists(os.path.join(marks, "go")):
        time.sleep(0.05)
    f.write(data[len(data) // 2:])
"""


@pytest.mark.slow
def test_two_arrays_with_other_shard_counts_never_show_a_half_written_object(deepspeed_small_sdist: Path,
                                                                              tmp_path: Path) -> None:
    """Issue 22: two arrays of one build with other shard counts (0/2 and 0/3) on one build folder compile the
    same object at once. Each compile writes a private file and renames it whole into place: while both are
    halfway, the object's own path holds nothing half-written; one array is killed there (its private file goes
    nowhere) and the other's object, with the other shard of its array, links into the wheel."""
    import os
    import subprocess
    import sys

    from elftools.elf.elffile import ELFFile

    from tests.integration.conftest import cpu_profile, sigkill, wait_for

    (tmp_path / "bin").mkdir()
    profile = cpu_profile(tmp_path / "bin", "half-g++", HALF_WRITING_CXX.format(python=sys.executable))
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PORTER_CACHE_DIR": str(tmp_path / "cache"), "MARKS": str(marks)}
    base = [sys.executable, "-m", "porter", "ops", "build", "--source", str(deepspeed_small_sdist), "-t", str(profile),
            "--ops", "cpu_lion", "--no-cache", "--json", "-j", "1"]
    a = subprocess.Popen([*base, "--shard", "0/2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env)
    b = subprocess.Popen([*base, "--shard", "0/3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    try:
        halves = wait_for(lambda: sorted(marks.glob("half.*")) if len(list(marks.glob("half.*"))) == 2
                          or a.poll() is not None or b.poll() is not None else [], 900, 0.1)
        assert len(halves) == 2, f"expected both arrays halfway through one object (exits {a.poll()}, {b.poll()})"
        written = sorted(p.read_text() for p in halves)
        finals = {re.sub(r"\.\d+@[^/]+\.tmp\.o$", ".o", w) for w in written}
        assert len(finals) == 1 and all(w.endswith(".tmp.o") for w in written), written  # one object, two private
        (obj,) = finals
        assert not Path(obj).exists(), "a half-written object lies where the link reads it"
    finally:
        sigkill(a)  # array A is killed halfway (a time limit, preemption)
        (marks / "go").touch()
    out, err = b.communicate(timeout=900)
    assert b.returncode == 0, err[-3000:]
    assert json.loads(out)["shard"]["objects"] == [obj]
    killed = [w for w in written if Path(w).exists()]
    assert len(killed) == 1, written  # the killed compile's private file; the other was renamed into place
    rest = subprocess.run([*base, "--shard", "1/3"], capture_output=True, text=True, env=env, timeout=900)
    assert rest.returncode == 0, rest.stderr[-3000:]
    # the killed compile's private object and dependency file, removed by the next build on this host
    assert re.search(r"removed [12] half-written output\(s\) of killed compiles", rest.stderr), rest.stderr[-2000:]
    assert not Path(killed[0]).exists() and not list(Path(obj).parent.glob("*.tmp*"))
    linked = subprocess.run([*base, "--link-only", "-o", str(tmp_path / "wh")], capture_output=True, text=True,
                            env=env, timeout=900)
    assert linked.returncode == 0, linked.stderr[-3000:]
    assert "no longer match" not in linked.stderr and len(list((tmp_path / "wh").glob("*.whl"))) == 1
    with open(obj, "rb") as f:
        assert ELFFile(f).num_sections() > 0  # whole: its section headers, at the end of the file, are there
