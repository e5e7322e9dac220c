"""The same matrix through Slurm and with --local, side by side in one run on this machine.

Prints one ratio (target in brackets):
  wall time of `porter matrix run --slurm --wait` / `porter matrix run --local`   [<= 1.1]
and, because the cell builds themselves vary with the machine's load, its parts: each run's wall time
minus the sum of its cells' build times (what the run adds around the builds), the load average
before each run, and the ratio the same builds would give with only the added time differing.

Same cells, same machine: Slurm is a one-node cluster started here (tests/slurm_cluster.py: slurm-wlm
+ munge, installed with apt-get when missing) and stopped at the end. Each cell task asks for every
core (cpus_per_task = cores), so the cells run one after another as with --local and the ratio is
what going through Slurm costs: submission, scheduling, one python start per job, the index job.
--fan-out asks for 1 CPU per cell instead (cells side by side, as many as there are cores).
Every run gets an empty porter cache (no object or compiler-cache reuse between runs).

Cells (--cells):
  deepspeed  DeepSpeed 0.19.8's cpu_adam from its sdist (pip download) with the cpu profile and a cpu
             profile for x86-64-v3 (two real builds of about a minute each on 2 cores; the default)
  apex       the apex test fixture with the same two profiles (about 10 s each: mostly start-up)

Usage: python benchmarks/matrix.py [--cells deepspeed|apex] [--rounds N] [--fan-out] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import SDIST_CACHE  # noqa: E402
from tests.slurm_cluster import one_node_slurm  # noqa: E402


def matrix_file(work: Path, cells: str, cores: int, fan_out: bool) -> Path:
    (work / "cpu-v3.toml").write_text('extends = "cpu"\ncpu_isa = "x86-64-v3"\n')
    if cells == "deepspeed":
        sdist_dir = SDIST_CACHE / "deepspeed-0.19.8"  # the test suite's download, when it has one
        if not list(sdist_dir.glob("*.tar.gz")):
            sdist_dir = work / "sdist"
        if not list(sdist_dir.glob("*.tar.gz")):
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            "-d", str(sdist_dir), "deepspeed==0.19.8"], check=True)
        source = str(next(sdist_dir.glob("*.tar.gz")))
        entry = f'name = "deepspeed"\nsources = ["{source}"]\nops = ["cpu_adam"]\n'
    else:
        entry = f'name = "apex"\nsources = ["{ROOT / "tests" / "fixtures" / "apex-env"}"]\n'
    slurm = (f"cpus_per_task = 1\nmax_parallel = {cores}\n" if fan_out else
             f"cpus_per_task = {cores}\nmax_parallel = {cores}\n")
    path = work / "bench.toml"
    path.write_text(f'name = "bench"\ntoolchains = ["cpu", "cpu-v3.toml"]\n\n[[component]]\n{entry}\n'
                    f"[slurm]\n{slurm}")
    return path


def timed_run(matrix: Path, mode: str, work: Path, env: dict[str, str], n: int) -> tuple[float, dict[str, object]]:
    folder = work / f"{mode}-{n}"
    shutil.rmtree(folder, ignore_errors=True)
    cache = work / f"cache-{mode}-{n}"
    shutil.rmtree(cache, ignore_errors=True)
    run_env = {**env, "PORTER_CACHE_DIR": str(cache), "CCACHE_DISABLE": "1"}
    argv = [sys.executable, "-m", "porter", "-q", "matrix", "run", str(matrix), f"--{mode}", "--dir", str(folder),
            "--json"] + (["--wait"] if mode == "slurm" else [])
    start = time.monotonic()
    proc = subprocess.run(argv, env=run_env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{mode} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report: dict[str, object] = json.loads(proc.stdout)["report"]
    return seconds, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", choices=("deepspeed", "apex"), default="deepspeed")
    ap.add_argument("--rounds", type=int, default=1, help="local+slurm pairs, the order alternating (default 1)")
    ap.add_argument("--fan-out", action="store_true", help="1 CPU per cell: Slurm runs cells side by side")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temp folder, removed)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="porter-bench-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    matrix = matrix_file(work, args.cells, cores, args.fan_out)
    times: dict[str, list[float]] = {"local": [], "slurm": []}
    around: dict[str, list[float]] = {"local": [], "slurm": []}
    with one_node_slurm(work / "slurm") as cluster:
        env = {**os.environ, **cluster.env}
        print(f"matrix: 2 cells ({args.cells}: cpu, cpu-v3), {cores} cores, cells "
              f"{'side by side (1 CPU each)' if args.fan_out else 'one after another (all cores each)'}", flush=True)
        for n in range(args.rounds):
            for mode in (("local", "slurm") if n % 2 == 0 else ("slurm", "local")):
                load = os.getloadavg()[0]
                seconds, report = timed_run(matrix, mode, work, env, n)
                cells = report["cells"]
                assert isinstance(cells, list)
                built = sum(c["status"] == "built" for c in cells)
                builds = sum(float(c["seconds"]) for c in cells)
                cell_s = " + ".join(f"{c['seconds']:.1f}" for c in cells)
                print(f"  round {n + 1} {mode:<5}  {seconds:7.1f} s   ({built}/{len(cells)} built; cell builds "
                      f"{cell_s} s; around them {seconds - builds:5.1f} s; load before {load:.1f})", flush=True)
                times[mode].append(seconds)
                around[mode].append(seconds - builds)
    local = sum(times["local"])
    ratio = sum(times["slurm"]) / local
    same_builds = (local + sum(around["slurm"]) - sum(around["local"])) / local
    print("ratio (one run, side by side):")
    print(f"  slurm --wait / local            {ratio:7.3f}   target <= 1.1  {'ok' if ratio <= 1.1 else 'MISSED'}")
    print(f"  the same, had the builds taken equal time (local wall + the difference of the time around the "
          f"builds, / local wall): {same_builds:.3f}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
