"""porter matrix through a real one-node Slurm (slurm-wlm + munge, started here and stopped after).

Cells are cheap: the apex fixture built with the cpu profile and with a cpu profile for x86-64-v3,
plus a copy of it that fails to compile (the deliberately failing cell).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm

MATRIX = """\
name = "itest"
toolchains = ["cpu", "cpu-v3.toml"]

[[component]]
name = "apex"
sources = ["apex-env"]

[[component]]
name = "apex"
sources = ["apex-broken"]
toolchains = ["cpu"]

[slurm]
cpus_per_task = 1
max_parallel = 2
time = "20:00"
"""
GOOD = ("apex-apex-env-cpu", "apex-apex-env-cpu-v3")
BROKEN = "apex-apex-broken-cpu"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("matrix")
    shutil.copytree(FIXTURES / "apex-env", root / "apex-env")
    shutil.copytree(FIXTURES / "apex-env", root / "apex-broken")
    with open(root / "apex-broken" / "csrc" / "flatten_sum.cpp", "a") as f:
        f.write("\n#error deliberately broken cell\n")
    (root / "cpu-v3.toml").write_text('extends = "cpu"\ncpu_isa = "x86-64-v3"\n')
    (root / "m.toml").write_text(MATRIX)
    return root


def porter(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def slurm_cmd(cluster: SlurmCluster, *argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True,
                          env={**os.environ, **cluster.env}).stdout


def jobs_known(cluster: SlurmCluster) -> list[str]:
    return slurm_cmd(cluster, "squeue", "-h", "-t", "all", "-o", "%i").split()


def wait_for_report(directory: Path, cluster: SlurmCluster, timeout: float = 600) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while not (directory / "report.json").exists():
        if time.monotonic() > deadline:
            logs = "".join(p.read_text()[-1500:] for p in sorted((directory / "logs").glob("*.log")))
            pytest.fail(f"no report after {timeout}s; squeue:\n{slurm_cmd(cluster, 'squeue', '-t', 'all')}\n{logs}")
        time.sleep(1)
    doc: dict[str, object] = json.loads((directory / "report.json").read_text())
    return doc


def check_report(report: dict[str, object], directory: Path) -> None:
    cells = {c["id"]: c for c in report["cells"]}  # type: ignore[attr-defined]
    assert sorted(cells) == sorted((*GOOD, BROKEN))
    assert report["counts"] == {"built": 2, "failed": 1}
    assert cells[GOOD[0]]["wheel"] == "apex-1.14.0a0+cpu.x86.64.v2-cp311-cp311-linux_x86_64.whl"
    assert cells[GOOD[1]]["wheel"] == "apex-1.14.0a0+cpu.x86.64.v3-cp311-cp311-linux_x86_64.whl"
    for cid in GOOD:
        assert cells[cid]["status"] == "built" and cells[cid]["version"].startswith("1.14.0a0+cpu.x86.64.v")
        assert (directory / "wheelhouse" / cells[cid]["wheel"]).is_file()
    broken = cells[BROKEN]
    assert broken["status"] == "failed" and broken["wheel"] is None
    # the compiler's own line, as porter's one first_error reads it (path, line, column)
    assert re.fullmatch(r"\S*flatten_sum\.cpp:\d+:\d+: error: #error deliberately broken cell", broken["error"]), \
        broken["error"]
    log = Path(broken["log"])
    assert log == directory / "cells" / BROKEN / "build.log" and "deliberately broken" in log.read_text()
    # the good wheels still ship: indexed, installable with pip --index-url
    index = json.loads((directory / "wheelhouse" / "porter-wheelhouse.json").read_text())
    assert sorted(w["filename"] for w in index["wheels"]) == sorted(cells[c]["wheel"] for c in GOOD)
    assert (directory / "wheelhouse" / "simple" / "apex" / "index.html").is_file()


def test_matrix_runs_as_a_held_array_and_the_index_waits_on_afterok(slurm: SlurmCluster, project: Path,
                                                                    tmp_path: Path) -> None:
    d = tmp_path / "shared"
    res = porter("matrix", "run", str(project / "m.toml"), "--slurm", "--dir", str(d), env=slurm.env)
    assert res.returncode == 0, res.stderr[-3000:]
    sub = json.loads((d / "submission.json").read_text())
    assert "--hold" in sub["array_argv"] and "--array=0-2%2" in sub["array_argv"]
    index_job = slurm_cmd(slurm, "scontrol", "show", "job", sub["index_job"])
    assert f"Dependency=afterok:{sub['array_job']}" in index_job, index_job
    report = wait_for_report(d, slurm)
    check_report(report, d)
    results = [json.loads((d / "cells" / c / "result.json").read_text()) for c in (*GOOD, BROKEN)]
    assert {r["slurm"]["array_job_id"] for r in results} == {sub["array_job"]}  # each cell was an array task
    assert sorted(int(r["slurm"]["array_task_id"]) for r in results) == [0, 1, 2]
    assert max(r["finished"] for r in results) <= report["index_started"]  # type: ignore[operator]
    assert (d / "logs" / "cell-2.log").is_file() and (d / "logs" / "index.log").is_file()
    st = porter("matrix", "status", str(d))
    assert st.returncode == 3, st.stderr
    assert "[finished]" in st.stdout and str(d / "cells" / BROKEN / "build.log") in st.stdout
    assert "2 wheel(s) indexed" in st.stdout


def test_slurm_wait_and_local_report_the_same_cells(slurm: SlurmCluster, project: Path, tmp_path: Path) -> None:
    outs = {}
    for mode in ("--slurm", "--local"):
        d = tmp_path / mode.strip("-")
        argv = ["matrix", "run", str(project / "m.toml"), mode, "--dir", str(d), "--json"]
        res = porter(*argv, *(["--wait"] if mode == "--slurm" else []), env=slurm.env)
        assert res.returncode == 3, res.stderr[-3000:]  # partial: the broken cell failed, the others shipped
        assert "1 of 3 cell(s) did not build cleanly" in res.stderr
        doc = json.loads(res.stdout)
        check_report(doc["report"], d)
        outs[mode] = {c["id"]: (c["status"], c["wheel"]) for c in doc["report"]["cells"]}
    assert outs["--slurm"] == outs["--local"]


def test_sbatch_missing_names_local(project: Path, tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    res = porter("matrix", "run", str(project / "m.toml"), "--slurm", "--dir", str(tmp_path / "d"),
                 env={"PATH": str(empty)})
    assert res.returncode == 1, res.stderr
    assert "sbatch and scontrol not found on PATH" in res.stderr and "--local" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "d").exists()


def test_unknown_toolchain_is_refused_before_submission(slurm: SlurmCluster, project: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(MATRIX.replace('"cpu-v3.toml"', '"cpu-v9"').replace("name = \"itest\"", "name = \"bad\""))
    for name in ("apex-env", "apex-broken"):
        (tmp_path / name).symlink_to(project / name)
    before = jobs_known(slurm)
    res = porter("matrix", "run", str(bad), "--slurm", "--dir", str(tmp_path / "d"), env=slurm.env)
    assert res.returncode == 2, res.stderr
    assert "cell apex-apex-env-cpu-v9: toolchain 'cpu-v9'" in res.stderr and "nothing was submitted" in res.stderr
    assert jobs_known(slurm) == before and not (tmp_path / "d").exists()


def test_unwritable_shared_dir_is_refused(slurm: SlurmCluster, project: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    before = jobs_known(slurm)
    for d, words in ((blocker / "shared", "cannot create the matrix folder"), (Path("/sys/kernel"), "not writable")):
        res = porter("matrix", "run", str(project / "m.toml"), "--slurm", "--dir", str(d), env=slurm.env)
        assert res.returncode == 2, res.stderr
        assert words in res.stderr and str(d) in res.stderr and "--dir" in res.stderr, res.stderr
    assert jobs_known(slurm) == before
