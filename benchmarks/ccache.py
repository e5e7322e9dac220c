"""The compiler cache, measured side by side in one run: DeepSpeed's CPU ops built cold, then

(b) rebuilt with an empty build folder and the cache warm (every compile a hit; links and packaging
    still run), and
(a) built in a second, fresh cache that first built the previous release (``--previous``): the sources
    that did not change between the releases hit.

    python benchmarks/ccache.py [--source deepspeed==0.19.8] [--previous deepspeed==0.19.7]
                                [--ops cpu_adam,cpu_adagrad,cpu_lion]

Prints the wall times, hits and misses, and the ratios (goals: (a) <= 0.20, (b) <= 0.10). Every porter
cache folder (PORTER_CACHE_DIR) is fresh, so nothing from earlier runs helps a cold build.
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
    ap.add_argument("--previous", default="deepspeed==0.19.7", help="the release built before (a); '' skips (a)")
    ap.add_argument("--ops", default="cpu_adam,cpu_adagrad,cpu_lion")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="porter-bench-ccache-") as tmp:
        env = {**os.environ, "PORTER_CACHE_DIR": str(Path(tmp) / "cache")}
        other = {**os.environ, "PORTER_CACHE_DIR": str(Path(tmp) / "cache-after-previous")}
        # the sdists and DeepSpeed's pure-Python base wheels are made once, before timing
        for e in (env, other):
            build(["ops", "build", "--source", args.source, "-t", "cpu", "--ops", args.ops, "--dry-run"], e)
        common = ["ops", "build", "--source", args.source, "-t", "cpu", "--ops", args.ops]
        cold_s, cold = build([*common, "-o", str(Path(tmp) / "a")], env)
        shutil.rmtree(Path(str(cold["plan"]["build_dir"])))  # type: ignore[index]
        warm_s, warm = build([*common, "-o", str(Path(tmp) / "b")], env)
        if args.previous:  # the previous release builds those of the ops it has
            listed = subprocess.run([sys.executable, "-m", "porter", "-q", "ops", "list", "--source", args.previous,
                                     "-t", "cpu", "--json"], capture_output=True, text=True, env=other, check=True)
            known = {o["name"] for o in json.loads(listed.stdout)["ops"]}
            prev_ops = ",".join(o for o in args.ops.split(",") if o in known)
            prev_s, prev = build(["ops", "build", "--source", args.previous, "-t", "cpu", "--ops", prev_ops,
                                  "-o", str(Path(tmp) / "c")], other)
            next_s, nxt = build([*common, "-o", str(Path(tmp) / "d")], other)
    print(f"cold build:                      {cold_s:7.1f} s  cache {cold['cache']}")
    print(f"(b) empty build folder, warm:    {warm_s:7.1f} s  cache {warm['cache']}")
    if args.previous:
        print(f"    {args.previous} ({prev_ops}) cold, fresh cache: {prev_s:7.1f} s  cache {prev['cache']}")
        print(f"(a) {args.source} after it:    {next_s:7.1f} s  cache {nxt['cache']}")
    print(f"(b) warm / cold = {warm_s / cold_s:.3f}   (goal <= 0.10)")
    if args.previous:
        print(f"(a) after {args.previous} / cold = {next_s / cold_s:.3f}   (goal <= 0.20)")


if __name__ == "__main__":
    main()
