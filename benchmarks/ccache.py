"""The compiler cache, measured side by side in one run: DeepSpeed's CPU ops built cold, then rebuilt with
an empty build folder and the cache warm (every compile a hit; links and packaging still run).

    python benchmarks/ccache.py [--source deepspeed==0.19.8] [--ops cpu_adam,cpu_adagrad,cpu_lion]

Prints both wall times and warm/cold (the issue's goal: <= 0.10). Uses a fresh porter cache folder
(PORTER_CACHE_DIR) so nothing from earlier runs helps the cold build.
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


def build(args: list[str], env: dict[str, str]) -> tuple[float, dict[str, object]]:
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "porter", "-q", *args, "--json"], capture_output=True, text=True,
                         env=env)
    seconds = time.monotonic() - start
    if res.returncode != 0:
        sys.exit(f"porter failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return seconds, json.loads(res.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="deepspeed==0.19.8")
    ap.add_argument("--ops", default="cpu_adam,cpu_adagrad,cpu_lion")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="porter-bench-ccache-") as tmp:
        env = {**os.environ, "PORTER_CACHE_DIR": str(Path(tmp) / "cache")}
        # the sdist and DeepSpeed's pure-Python base wheel are made once, before timing
        build(["ops", "build", "--source", args.source, "-t", "cpu", "--ops", args.ops, "--dry-run"], env)
        common = ["ops", "build", "--source", args.source, "-t", "cpu", "--ops", args.ops]
        cold_s, cold = build([*common, "-o", str(Path(tmp) / "a")], env)
        shutil.rmtree(Path(str(cold["plan"]["build_dir"])))  # type: ignore[index]
        warm_s, warm = build([*common, "-o", str(Path(tmp) / "b")], env)
    print(f"cold build:                      {cold_s:7.1f} s  cache {cold['cache']}")
    print(f"empty build folder, warm cache:  {warm_s:7.1f} s  cache {warm['cache']}")
    print(f"warm / cold = {warm_s / cold_s:.3f}   (goal <= 0.10)")


if __name__ == "__main__":
    main()
