"""The CUDA twin: porter's ahead-of-time builds of real DeepSpeed ops and Megatron fused kernels, built for an
NVIDIA GPU, installed the way a node installs them, then run on the GPU and compared with torch's own math.

porter's ROCm builds cannot run here (no AMD GPU anywhere these tests run), but the same upstream sources go through
the same porter pipeline for a CUDA profile. What this script shows, for each op and kernel, reaches "run":

1. ``porter ops build`` (DeepSpeed sdist) and ``porter port megatron-deepspeed`` (each tree) for the profile;
2. ``porter install`` of the wheelhouse, offline, into the python that holds the GPU's torch, then ``porter verify``;
3. in a fresh process whose compilers, ninja and CUDA_HOME are traps that log any call: the checks of
   ``porter.emulate.checks`` (the same ones porter's emulated wave-32 and wave-64 targets run) on DeepSpeed's fused
   optimizer ops and Megatron's kernel modules, on the GPU against a float32 torch reference (forward and backward),
   and DeepSpeed's FusedAdam and the masked softmax timed side by side with the torch code they replace (ratios,
   one run).

It needs a GPU, nvcc and a CUDA torch; no network (dependency wheels come from --deps). It writes
``cuda-twin.json`` to --out and prints one line per check. Exit 0 when every check held, 1 otherwise.

    python benchmarks/cuda_twin.py --sdist deepspeed-0.19.8.tar.gz --megatron TREE [--megatron TREE] \
        --deps WHEELS_DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TRAPPED = ("nvcc", "gcc", "g++", "cc", "c++", "clang", "clang++", "hipcc", "ninja", "make")


def porter(*args: str, cwd: Path, timeout: int = 1800) -> tuple[int, dict, str]:
    """Run the installed porter with --json, from cwd (not from a checkout, whose porter/ would shadow it);
    (exit code, its JSON or {}, the end of its stderr)."""
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "porter", *args, "--json"], capture_output=True, text=True,
                         timeout=timeout, cwd=cwd)
    print(f"  porter {' '.join(args[:2])}: exit {res.returncode} in {time.monotonic() - t:.0f} s", flush=True)
    try:
        doc = json.loads(res.stdout) if res.stdout.strip() else {}
    except json.JSONDecodeError:
        doc = {}
    return res.returncode, doc, res.stderr[-3000:]


def toolchain(name: str, work: Path) -> str:
    """The preset, or where its CUDA root is not this machine's, the same profile at the root of the nvcc on PATH."""
    preset = Path(__file__).resolve().parents[1] / "porter" / "toolchain" / "presets" / f"{name}.toml"
    nvcc = shutil.which("nvcc")
    if not preset.is_file() or not nvcc or 'root = "/usr/local/cuda"' not in preset.read_text() \
            or Path("/usr/local/cuda/bin/nvcc").exists():
        return name
    root = Path(nvcc).resolve().parents[1]
    mine = work / f"{name}-here.toml"
    mine.write_text(preset.read_text().replace('root = "/usr/local/cuda"', f'root = "{root}"'))
    print(f"  nvcc is at {nvcc}: building with {mine} (root {root})", flush=True)
    return str(mine)


def trap_dir(root: Path) -> Path:
    """A folder of scripts named like compilers that log each call and fail."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "bin").mkdir(exist_ok=True)
    log = root / "calls.log"
    for name in TRAPPED:
        script = root / "bin" / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit 1\n')
        script.chmod(0o755)
    return root


# ---------------------------------------------------------------------------------------------------------
# run on the GPU, in a process of its own (python cuda_twin.py --check WHAT)


def _timed(fn, reps: int = 50) -> float:  # noqa: ANN001
    """Median milliseconds of fn on the GPU (CUDA events, after warm-up)."""
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def check_deepspeed() -> list[dict]:
    """The shared checks (porter.emulate.checks, the same the emulated target runs) of DeepSpeed's fused optimizer
    ops, on the GPU; then one optimizer step timed side by side with torch's."""
    import torch
    from deepspeed.ops.adam import FusedAdam

    from porter.emulate import checks

    out = checks.run_checks("cuda", 32, only=["deepspeed.fused_adam", "deepspeed.fused_lamb", "deepspeed.fused_lion"])
    # side by side: one optimizer step over 64 tensors of 1M floats
    big = [torch.nn.Parameter(torch.randn(1 << 20, device="cuda")) for _ in range(64)]
    for p in big:
        p.grad = torch.randn_like(p)
    t_ds = _timed(FusedAdam(big, lr=1e-3).step)
    t_each = _timed(torch.optim.AdamW(big, lr=1e-3, foreach=True).step)
    t_fused = _timed(torch.optim.AdamW(big, lr=1e-3, fused=True).step)
    out.append({"timing": "AdamW step, 64 x 1M fp32", "deepspeed_ms": t_ds, "torch_foreach_ms": t_each,
                "torch_fused_ms": t_fused})
    return out


def check_megatron(label: str) -> list[dict]:
    """The shared checks of Megatron's fused kernels (softmax of both generations, the BLOOM-era layer norm) on the
    GPU, each named with the tree; then the masked softmax forward timed side by side with torch's."""
    import torch

    from porter.emulate import checks

    out = [{**r, "check": f"{label} {r['kernel']} {r['check']}"}
           for r in checks.run_checks("cuda", 32, only=[f for f in checks.FAMILIES if f.startswith("megatron.")])]
    mod = checks.load("scaled_masked_softmax_cuda")
    if mod is not None:
        b, heads, sq, sk, scale = 2, 8, 2048, 2048, 0.125
        x = torch.randn(b, heads, sq, sk, device="cuda", dtype=torch.float16)
        mask = torch.rand(b, 1, sq, sk, device="cuda") < 0.3
        ref = lambda: torch.softmax((x.float() * scale).masked_fill(mask, -10000.0), -1).to(x.dtype)  # noqa: E731
        out.append({"timing": f"{label} masked softmax fwd fp16 {b}x{heads}x{sq}x{sk}",
                    "kernel_ms": _timed(lambda: mod.forward(x, mask, scale)), "torch_ms": _timed(ref)})
    if not out:
        out.append({"check": f"{label}: no Megatron kernel module imports", "ok": False})
    return out


def run_checks(what: str, label: str, result: Path) -> None:
    import torch

    print(f"  torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    rows = check_deepspeed() if what == "deepspeed" else check_megatron(label)
    result.write_text(json.dumps(rows, indent=1))


# ---------------------------------------------------------------------------------------------------------


def checks_in_a_trapped_process(what: str, label: str, work: Path) -> list[dict]:
    """Run one group of checks in a fresh python whose compilers are traps; a compiler call fails the group."""
    traps = trap_dir(work / f"traps-{what}-{label}")
    ext = work / f"torch-ext-{what}-{label}"
    ext.mkdir(parents=True, exist_ok=True)
    result = work / f"checks-{what}-{label}.json"
    env = dict(os.environ, PATH=f"{traps / 'bin'}:{os.environ['PATH']}", CUDA_HOME=str(traps),
               TORCH_EXTENSIONS_DIR=str(ext), DS_BUILD_OPS="0", PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    env.pop("PORTER_ALLOW_JIT", None)
    res = subprocess.run([sys.executable, __file__, "--check", what, "--label", label, "--result", str(result)],
                         env=env, capture_output=True, text=True, timeout=900, cwd=work)
    print(res.stdout, end="")
    rows = json.loads(result.read_text()) if res.returncode == 0 and result.exists() else \
        [{"check": f"{what} {label} checks", "ok": False, "error": res.stderr[-2000:]}]
    calls = (traps / "calls.log").read_text().splitlines() if (traps / "calls.log").exists() else []
    built = [p for p in ext.rglob("*") if p.is_file()]
    rows.append({"check": f"{what} {label}: no compiler call, nothing JIT-built while the checks ran",
                 "compiler_calls": calls[:20], "jit_files": [str(p) for p in built[:20]],
                 "ok": not calls and not built})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, help="a DeepSpeed sdist")
    ap.add_argument("--megatron", type=Path, action="append", default=[], help="a Megatron-DeepSpeed tree")
    ap.add_argument("--deps", type=Path, help="a folder of dependency wheels for the wheelhouse (offline)")
    ap.add_argument("-t", "--toolchain", default="cuda-h100")
    ap.add_argument("--out", type=Path, default=Path("cuda-twin"))
    ap.add_argument("--check", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.check:
        run_checks(args.check, args.label, args.result)
        return 0
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    args.sdist = args.sdist.resolve() if args.sdist else None
    args.megatron = [t.resolve() for t in args.megatron]
    args.deps = args.deps.resolve() if args.deps else None
    py = sys.executable
    tc = toolchain(args.toolchain, work)
    rows: list[dict] = []
    steps: list[dict] = []

    def step(name: str, *cmd: str, timeout: int = 1800) -> bool:
        code, _, err = porter(*cmd, cwd=work, timeout=timeout)
        steps.append({"step": name, "exit": code, "stderr_tail": "" if code == 0 else err})
        return code == 0

    # the builds side by side (each its own ninja graph; the GPU machine has the cores), then install, verify and
    # the checks one project at a time (two Megatron trees ship the same distribution)
    builds: dict[str, tuple[str, ...]] = {}
    if args.sdist:
        builds["deepspeed"] = ("ops", "build", "--source", str(args.sdist), "-t", tc, "--ops",
                               "fused_adam,fused_lamb,fused_lion",
                               "--python", py, "-o", str(work / "wheelhouse-deepspeed"))
    for tree in args.megatron:
        builds[tree.name] = ("port", "megatron-deepspeed", str(tree), "-t", tc, "--python", py,
                             "-o", str(work / f"wheelhouse-{tree.name}"), "--dest", str(work / f"ported-{tree.name}"))
    for name in builds:
        shutil.rmtree(work / f"wheelhouse-{name}", ignore_errors=True)
        shutil.rmtree(work / f"ported-{name}", ignore_errors=True)
    with ThreadPoolExecutor(len(builds) or 1) as pool:
        done = dict(zip(builds, pool.map(lambda cmd: step(f"build: porter {cmd[0]} {cmd[1]}", *cmd), builds.values())))
    for name, built in done.items():
        wh = work / f"wheelhouse-{name}"
        if not built:
            continue
        for whl in (args.deps.glob("*.whl") if args.deps else []):
            shutil.copy(whl, wh)
        if step(f"install {name}", "install", str(wh), "--python", py, "--reinstall") and \
                step(f"verify {name}", "verify", "--python", py):
            what = "deepspeed" if name == "deepspeed" else "megatron"
            rows += checks_in_a_trapped_process(what, name, work)
    ok = all(s["exit"] == 0 for s in steps) and all(r.get("ok", True) for r in rows) and bool(rows)
    (work / "cuda-twin.json").write_text(json.dumps({"ok": ok, "steps": steps, "checks": rows}, indent=1))
    for s in steps:
        print(f"{'ok  ' if s['exit'] == 0 else 'FAIL'} step {s['step']}" + (f": {s['stderr_tail'][-800:]}"
                                                                             if s["exit"] else ""))
    for r in rows:
        if "timing" in r:
            base = r.get("torch_ms") or r.get("torch_foreach_ms")
            mine = r.get("kernel_ms") or r.get("deepspeed_ms")
            extra = f", torch fused {r['torch_fused_ms']:.3f} ms" if "torch_fused_ms" in r else ""
            print(f"time {r['timing']}: {mine:.3f} ms vs torch {base:.3f} ms (x{base / mine:.2f}){extra}")
        else:
            err = f" max abs err {r['max_abs_err']:.2e}" if r.get("max_abs_err") is not None else \
                f" max rel err {r['max_rel_err']:.2e}" if "max_rel_err" in r else ""
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['check']}{err}" + (f" {(r.get('error') or '')[-800:]}"
                                                                          if not r["ok"] else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
