"""A build split into shards (what a Slurm job array runs) gives what one local build gives: the same
objects and the same wheel, byte for byte."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests.integration.conftest import run_porter


def _digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_two_shards_then_link_equal_one_local_build(deepspeed_sdist: Path, tmp_path: Path) -> None:
    env = {"PORTER_CACHE_DIR": str(tmp_path / "cache")}
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


def test_link_only_names_a_missing_shard(deepspeed_sdist: Path, tmp_path: Path) -> None:
    env = {"PORTER_CACHE_DIR": str(tmp_path / "cache")}
    res = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "cpu", "--ops", "cpu_lion", "--no-cache",
                     "--link-only", "-o", str(tmp_path / "wh"), env=env)
    assert res.returncode == 1 and "object(s) are missing" in res.stderr and "--shard" in res.stderr
    bad = run_porter("ops", "build", "--source", str(deepspeed_sdist), "-t", "cpu", "--ops", "cpu_lion",
                     "--shard", "2/2", env=env)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
