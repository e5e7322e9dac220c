"""Builds at once on one cache, measured side by side in one run: one cold ``ops build`` alone in a fresh cache,
then N identical cold builds started together on another fresh cache.

    python benchmarks/concurrent_builds.py [--source deepspeed==0.19.8] [--ops cpu_adam] [-n 4]

Prints each wall time, the ratio N-at-once / alone (goal <= 1.3: the work is shared, not repeated) and the
compiler calls each way (ninja's log of every command it ran, over every build folder of the cache; goal: the
same count). The compiler cache is off in both runs, so a second compile would show as a second call.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def compiler_calls(cache: Path) -> int:
    calls = 0
    for log in cache.glob("wheels/*/build/.ninja_log"):
        calls += sum(1 for line in log.read_text().splitlines() if line and not line.startswith("#")
                     and line.split("\t")[3].endswith(".o"))
    return calls


def run(n: int, source: str, ops: str, root: Path) -> tuple[float, int]:
    cache = root / "cache"
    env = {**os.environ, "PORTER_CACHE_DIR": str(cache)}
    argv = [sys.executable, "-m", "porter", "-q", "ops", "build", "--source", source, "-t", "cpu", "--ops", ops,
            "--no-cache"]
    start = time.monotonic()
    procs = [subprocess.Popen([*argv, "-o", str(root / f"wh{i}")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, env=env) for i in range(n)]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            sys.exit(f"porter failed ({p.returncode}):\n{err[-3000:]}")
    return time.monotonic() - start, compiler_calls(cache)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="deepspeed==0.19.8")
    ap.add_argument("--ops", default="cpu_adam")
    ap.add_argument("-n", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="porter-bench-") as tmp:
        # the sdist is downloaded once into a shared folder first, so neither run times the network
        warm = Path(tmp) / "sdist"
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d",
                        str(warm), args.source], check=True)
        source = str(next(warm.glob("*.tar.gz")))
        alone, calls1 = run(1, source, args.ops, Path(tmp) / "alone")
        many, calls_n = run(args.n, source, args.ops, Path(tmp) / "many")
    print(f"1 build alone:            {alone:7.1f} s   {calls1} compiler call(s)")
    print(f"{args.n} identical at once:     {many:7.1f} s   {calls_n} compiler call(s)")
    print(f"ratio {args.n}-at-once / alone: {many / alone:.3f} (goal <= 1.3); compiler calls {calls_n} vs {calls1} "
          f"(goal: equal)")


if __name__ == "__main__":
    main()
