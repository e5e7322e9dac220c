"""(e) A FlashAttention CK build's wall time on 1, 4 and 16 nodes, predicted from the .ninja_log of a small
compile-only sample. A MODEL, not a measurement: every assumption is printed with the table.

    python benchmarks/fa_scaling.py BUILD/.ninja_log                     # archs from BUILD/build.ninja
    python benchmarks/fa_scaling.py a/.ninja_log b/.ninja_log@gfx90a     # several logs; archs named
    python benchmarks/fa_scaling.py LOG --archs gfx90a,gfx942 --cores 56 --node-mem 512 --nodes 1,4,16,64
    python benchmarks/fa_scaling.py LOG --assume fmha_bwd=600 --assume fmha_fwd=400   # families not sampled

A sample comes from, e.g.:

    porter wheel flash-attn --source SDIST -t debian-rocm7 --arch gfx90a --compile-only \\
        --units 'fmha_bwd_convert_dq_d128_*' --instances 4
    # its .ninja_log and build.ninja are in the build folder the JSON report's plan names

The model (porter/cluster/site/scaling.py): per-family single-arch TU time from the sample, an arch scaling
t(A) = t1 (1 + beta (A - 1)) fitted from units measured with two arch counts (else beta = 1.0: a CK
instance compiles each arch in full), the full build's TU count per family (flash-attn 2.8.3.post2's, or
--plan with a dry run's JSON), LPT scheduling over nodes x jobs slots (jobs = min(cores, node memory /
memory per job)), a start latency per job and one serial link job after the last compile.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fa_scaling_model as sc  # noqa: E402  (beside this script)
from porter.components.flash_attn import ck_family  # noqa: E402
from porter.errors import PorterError  # noqa: E402


def hms(seconds: float) -> str:
    m = int(round(seconds / 60))
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{seconds / 60:.1f}m"


def counts_from_plan(path: Path) -> dict[str, int]:
    """TUs per family from `porter wheel flash-attn --compile-only --dry-run --json` (all units selected)."""
    doc = json.loads(path.read_text())
    steps = doc["plan"]["steps"]
    return dict(collections.Counter(ck_family(s["op"]) for s in steps if s["kind"] == "compile"))


def parse_assume(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        fam, _, secs = item.partition("=")
        try:
            out[fam] = float(secs)
        except ValueError:
            raise SystemExit(f"--assume {item!r}: give FAMILY=SECONDS (single-arch seconds of one TU)") from None
    return out


def model(args: argparse.Namespace) -> sc.Model:
    samples = [s for spec in args.logs for s in sc.load_samples(spec)]
    counts = counts_from_plan(args.plan) if args.plan else dict(sc.FA_2_8_3_COUNTS)
    archs = len({a for a in args.archs.split(",") if a})
    fitted = sc.fit(samples, beta=args.beta)
    full = sc.with_assumed(fitted, counts, parse_assume(args.assume), args.assume_default)
    machine = sc.Nodes(cores=args.cores, mem_gib=args.node_mem, mem_per_job_gib=args.mem_per_job,
                       start_latency_s=args.start_latency, link_s=args.link, speed=args.speed)
    nodes = [int(n) for n in args.nodes.split(",") if n]
    return sc.Model(full, counts, archs, machine, sc.predict(full, counts, archs, nodes, machine), samples)


def report(m: sc.Model, args: argparse.Namespace) -> dict[str, Any]:
    return {"model": "prediction, not a measurement", "archs": args.archs.split(","), "beta": m.fit.beta,
            "beta_source": m.fit.beta_source, "tus": sum(m.counts.values()), "assumed_work_share": m.assumed_share(),
            "machine": {**dataclasses.asdict(m.machine), "jobs_per_node": m.machine.jobs},
            "families": {f: {"tus": m.counts.get(f, 0), "samples": c.samples, "seconds_one_arch": c.seconds_one_arch,
                             "seconds_per_tu": m.fit.tu_seconds(f, m.archs)} for f, c in m.fit.families.items()},
            "predictions": [{"nodes": p.nodes, "jobs_per_node": p.jobs_per_node, "slots": p.slots,
                             "work_s": p.work_s, "compile_s": p.compile_s, "total_s": p.total_s,
                             "slot_use": p.efficiency} for p in m.predictions]}


def show(m: sc.Model, args: argparse.Namespace) -> None:
    total_tus = sum(m.counts.values())
    logs = ", ".join("/".join(Path(s.partition("@")[0]).parts[-3:-1]) or s for s in args.logs)
    print(f"# MODEL, not a measurement: a FlashAttention CK build of {total_tus:,} TUs for {m.archs} arch(s) "
          f"({args.archs})")
    print(f"# sample: {len(m.samples)} TU measurement(s) from {len(args.logs)} ninja log(s) ({logs})")
    print(f"# arch scaling: t(A) = t1 * (1 + {m.fit.beta:.2f} * (A - 1)), {m.fit.beta_source}")
    print()
    print(f"{'family':<26} {'TUs':>5} {'sampled':>7} {'t1 (s)':>8} {f'per TU, {m.archs} arch(s)':>18} {'work':>6}")
    work = {f: m.counts[f] * m.fit.tu_seconds(f, m.archs) for f in m.counts}
    for fam in sorted(m.counts, key=lambda f: -work[f]):
        c = m.fit.families[fam]
        sampled = str(c.samples) if c.samples else "assumed"
        print(f"{fam:<26} {m.counts[fam]:>5} {sampled:>7} {c.seconds_one_arch:>8.1f} "
              f"{m.fit.tu_seconds(fam, m.archs):>18.1f} {work[fam] / sum(work.values()):>6.1%}")
    share = m.assumed_share()
    if share:
        print(f"# {share:.0%} of the work rests on families the sample did not measure (cost 'assumed': "
              + ("--assume values" if args.assume else "the largest measured family's t1")
              + "); docs/wheels.md: fmha_fwd and fmha_bwd instances ran far longer than the light families")
    print()
    print(f"{'nodes':>5} {'cores':>5} {'jobs/node':>9} {'slots':>5} {'compile (LPT)':>13} {'total':>9} "
          f"{'speed-up':>8} {'slot use':>8}")
    base = m.predictions[0].total_s if m.predictions else 1.0
    for p in m.predictions:
        print(f"{p.nodes:>5} {m.machine.cores:>5} {p.jobs_per_node:>9} {p.slots:>5} {hms(p.compile_s):>13} "
              f"{hms(p.total_s):>9} {base / p.total_s:>7.1f}x {p.efficiency:>8.0%}")
    mc = m.machine
    print()
    print("# assumptions (a model; change them with the options):")
    print(f"#  - a node runs min(cores={mc.cores}, floor({mc.mem_gib:g} GiB / {mc.mem_per_job_gib:g} GiB per job))"
          f" = {mc.jobs} compiles at once; each compile is single-threaded and never waits on I/O")
    print(f"#  - a node core takes {mc.speed:g} s per second measured in the sample (the sample ran on a shared "
          "2-core host: its seconds include contention)")
    print("#  - TUs are dealt longest first to the least loaded slot (LPT) over all nodes, and every node's "
          "shard compiles at the same time (porter's --shard deals round-robin in plan order instead)")
    print(f"#  - each shard starts {mc.start_latency_s:g} s late (job start, reading the tree, generating the "
          f"sources); one link job starts {mc.start_latency_s:g} s after the last compile and takes "
          f"{mc.link_s:g} s (not measured: no ROCm torch here to link against)")
    print("#  - no queue wait, no compiler-cache hits, no shared-filesystem contention; arch scaling and "
          "per-family means carry the sample's noise")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+", metavar="LOG[@ARCHS]",
                    help=".ninja_log of a compile-only sample; @gfx90a,gfx942 names its archs (else read from "
                         "the build.ninja beside it)")
    ap.add_argument("--archs", default="gfx90a,gfx942,gfx950", help="target archs of the full build")
    ap.add_argument("--nodes", default="1,4,16", help="node counts to predict (comma-separated)")
    ap.add_argument("--cores", type=int, default=64, help="cores per node")
    ap.add_argument("--node-mem", type=float, default=256.0, help="GiB of memory per node for compiles")
    ap.add_argument("--mem-per-job", type=float, default=2.8, help="GiB per compile job (FA CK: ~2.8)")
    ap.add_argument("--start-latency", type=float, default=60.0, help="seconds from a job's start to its first compile")
    ap.add_argument("--link", type=float, default=300.0, help="seconds of the serial link and packaging")
    ap.add_argument("--speed", type=float, default=1.0, help="node seconds per sample second")
    ap.add_argument("--beta", type=float, default=None, help="arch scaling to use instead of the fit")
    ap.add_argument("--assume", action="append", default=[], metavar="FAMILY=SECONDS",
                    help="single-arch seconds of one TU of a family (wins over the sample)")
    ap.add_argument("--assume-default", type=float, default=None,
                    help="single-arch seconds of families neither sampled nor --assume'd "
                         "(default: the largest measured family's)")
    ap.add_argument("--plan", type=Path, default=None,
                    help="TU counts from `porter wheel flash-attn --compile-only --dry-run --json` output "
                         "(default: flash-attn 2.8.3.post2's 2,782)")
    ap.add_argument("--json", action="store_true", help="print the model as JSON")
    args = ap.parse_args(argv)
    try:
        m = model(args)
    except PorterError as exc:
        print(f"ERROR: {exc.message}" + (f"\nTIP: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report(m, args), indent=2))
    else:
        show(m, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
