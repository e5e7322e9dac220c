"""porter ops build vs DeepSpeed's own AOT path, side by side in one run on this machine.

Prints ratios (targets in brackets):
  cold porter build (defaults) / DeepSpeed's own `DS_BUILD_<OP>=1 pip wheel`   [<= 0.45]
    with --repeat N: N pairs, each porter build beside a DeepSpeed build; the median and the spread
  the same with DeepSpeed's own debug info (--debug-info full) and with a shared precompiled torch
  header (--pch): what each choice costs or gives, side by side
  warm porter re-run / cold porter build                          [<= 0.05]
  fresh-process load of the prebuilt op / cold JIT load of it      [<= 0.01]

Same sdist, same ops (the three CPU ops), same machine, same python/torch. Usage:
  python benchmarks/ops_build.py [--version 0.19.8] [--repeat N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

OPS = ("cpu_adam", "cpu_adagrad", "cpu_lion")


def timed(argv: list[str], **kw: object) -> float:
    start = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    return time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default="0.19.8")
    ap.add_argument("--keep", type=Path, help="work folder to keep (default: a temp folder)")
    ap.add_argument("--repeat", type=int, default=1, help="pairs of cold builds (porter, DeepSpeed's own)")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="porter-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    sdist_dir = work / "sdist"
    if not list(sdist_dir.glob("*.tar.gz")):
        subprocess.run([py, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(sdist_dir),
                        f"deepspeed=={args.version}"], check=True)
    sdist = next(sdist_dir.glob("*.tar.gz"))
    env = {**os.environ, "PORTER_CACHE_DIR": str(work / "porter-cache")}
    porter = [py, "-m", "porter", "-q", "ops", "build", "--source", str(sdist), "-t", "cpu", "--ops", ",".join(OPS),
              "-o", str(work / "wheelhouse")]

    ds_tree = work / "ds-own"
    with tarfile.open(sdist) as tf:
        tf.extractall(ds_tree, filter="data")
    tree = next(ds_tree.iterdir())
    ds_env = {**os.environ, "DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cpu", **{f"DS_BUILD_{o.upper()}": "1" for o in OPS}}

    def own_build() -> float:
        subprocess.run(["rm", "-rf", str(tree / "build"), str(work / "ds-out")], check=True)
        return timed([py, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "ds-out"),
                      "."], cwd=tree, env=ds_env)

    print(f"DeepSpeed {args.version}, ops {', '.join(OPS)}, {os.cpu_count()} cores", flush=True)
    pairs: list[tuple[float, float]] = []
    for i in range(args.repeat):
        subprocess.run(["rm", "-rf", env["PORTER_CACHE_DIR"], str(work / "wheelhouse")], check=True)
        cold = timed(porter, env=env)
        own = own_build()
        pairs.append((cold, own))
        print(f"  pair {i + 1}: porter cold build {cold:8.1f} s, DeepSpeed's own pip wheel {own:8.1f} s: "
              f"{cold / own:.3f}", flush=True)
    warm = timed(porter, env=env)
    print(f"  porter warm re-run:            {warm:8.1f} s", flush=True)
    variants: dict[str, float] = {}
    for name, extra in (("--debug-info full", ["--debug-info", "full"]), ("--pch", ["--pch"])):
        tag = name.replace("--", "").replace(" ", "-")
        env_v = {**os.environ, "PORTER_CACHE_DIR": str(work / f"porter-cache-{tag}")}
        subprocess.run(["rm", "-rf", env_v["PORTER_CACHE_DIR"], str(work / f"wheelhouse-{tag}")], check=True)
        variants[name] = timed([*porter[:-1], str(work / f"wheelhouse-{tag}"), *extra], env=env_v)
        print(f"  porter cold build, {name + ':':<25} {variants[name]:8.1f} s", flush=True)

    ratios = sorted(c / o for c, o in pairs)
    cold, own = statistics.median(c for c, _ in pairs), statistics.median(o for _, o in pairs)

    venv = work / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([py, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
    wheel = next((work / "wheelhouse").glob("deepspeed-*.whl"))
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps",
                    str(wheel)], check=True)
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)], check=True)
    probe = ("import json, sys, time, torch\nfrom deepspeed.ops.op_builder import CPUAdamBuilder\n"
             "b = CPUAdamBuilder(); t = time.perf_counter()\n"
             "m = b.jit_load(verbose=False) if sys.argv[1] == 'jit' else b.load()\n"
             "print(json.dumps({'seconds': time.perf_counter() - t, 'file': m.__file__}))\n")
    ext = work / "torch-extensions"
    run_env = {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(ext)}
    subprocess.run(["rm", "-rf", str(ext)], check=True)
    loads = {}
    for mode in ("prebuilt", "jit"):
        out = subprocess.run([str(venv / "bin/python"), "-c", probe, mode], check=True, capture_output=True, text=True,
                             env=run_env).stdout
        loads[mode] = json.loads(out.strip().splitlines()[-1])
        print(f"  load of cpu_adam ({mode:<8}):    {loads[mode]['seconds']:8.3f} s  ({loads[mode]['file']})", flush=True)

    print("ratios (one run, side by side):")
    print(f"  cold porter / DeepSpeed's own over {len(pairs)} pair(s): median {statistics.median(ratios):.3f}, "
          f"spread {ratios[0]:.3f} .. {ratios[-1]:.3f}")
    rows = [("cold porter / DeepSpeed's own", statistics.median(ratios), 0.45),
            *((f"cold {name} / DeepSpeed's own", t / own, 0.45) for name, t in variants.items()),
            ("warm re-run / cold", warm / cold, 0.05),
            ("prebuilt load / cold JIT load", loads["prebuilt"]["seconds"] / loads["jit"]["seconds"], 0.01)]
    for name, ratio, target in rows:
        print(f"  {name:<32} {ratio:7.3f}   target <= {target}  {'ok' if ratio <= target else 'MISSED'}")


if __name__ == "__main__":
    main()
