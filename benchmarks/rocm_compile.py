"""Compile every ROCm-compatible DeepSpeed op for gfx90a, gfx942 and gfx950 with each ROCm line here,
and write docs/rocm-compile.md from porter's own --json reports.

    python benchmarks/rocm_compile.py                 # compile (long: all ops, two ROCm lines) + write
    python benchmarks/rocm_compile.py --from-json DIR # rewrite the page from saved reports

Each ROCm line is one `porter ops build --all-compatible --compile-only --json` run (one ninja graph,
every arch of the profile in one compile per translation unit, so a per-arch verdict comes from the code
objects in each object file). Arches a compiler rejects outright are reported from `porter toolchain
check`, which fails in seconds naming the arch and the compiler version.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHS = ("gfx90a", "gfx942", "gfx950")
LINES = (("debian-trixie-rocm", "ROCm 5.7.1"), ("debian-rocm7", "ROCm 7.2.4"))


def porter(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter", *args], capture_output=True, text=True, cwd=ROOT)


def run(source: str, jobs: int, out: Path, only: str | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for profile, _ in LINES:
        if only and profile != only:
            continue
        start = time.monotonic()
        check = porter("toolchain", "check", profile, "--arch", ",".join(ARCHS), "--json")
        (out / f"{profile}.check.json").write_text(check.stdout or json.dumps({"error": check.stderr[-2000:]}))
        res = porter("ops", "build", "--source", source, "-t", profile, "--all-compatible", "--compile-only",
                     "--json", "-j", str(jobs))
        (out / f"{profile}.json").write_text(res.stdout or json.dumps({"error": res.stderr[-4000:]}))
        print(f"{profile}: exit {res.returncode} in {time.monotonic() - start:.0f} s", file=sys.stderr)


def verdict(op: dict[str, object], arch: str, rejected: dict[str, str]) -> str:
    if arch in rejected:
        return f"rejected: {rejected[arch]}"
    archs = op.get("archs") or {}
    tus = op.get("tus") or []
    if op.get("status") != "failed" and not any("code_objects" in t for t in tus):  # type: ignore[union-attr]
        return "host-only"
    if isinstance(archs, dict) and archs.get(arch) == "compiled":
        return "compiled"
    if arch not in archs:  # type: ignore[operator]
        return "not in this run"
    err = str(op.get("error") or "?").replace("|", "\\|")
    return "failed: " + err.split("/")[-1][:140]  # the header or source file and the message, not the build path


def cause(error: str) -> str:
    """Whose doing a failure is, from the compiler's first error (a heuristic, stated as one)."""
    e = error.lower()
    if not e:
        return ""
    if "torch-hip-view" in e:
        return "porter (the HIP view of torch's headers)" if "file not found" not in e else \
            "this ROCm line (a library header torch's headers need is not packaged)"
    if "cutlass" in e or "cub/" in e or "cuda_" in e or "cublas" in e or "cusparse" in e:
        return "upstream (NVIDIA-only code)"
    if "amd_hip_bf16.h" in e and "static assertion" in e:
        return "upstream + host compiler: a .cpp compiled by g++ includes HIP's bf16 header, which needs clang"
    if "file not found" in e:
        return "this ROCm line (a header is not packaged)"
    if "undeclared identifier" in e or "no member named" in e or "unknown type name" in e:
        return "hipify or upstream (an API with no HIP mapping)"
    return "see the op's log"


def write_page(out: Path, dest: Path) -> None:
    lines = ["# DeepSpeed ops compiled for AMD GPUs with porter", "",
             "Written by `benchmarks/rocm_compile.py` from `porter ops build --all-compatible --compile-only "
             "--json` reports (DeepSpeed 0.19.8 sdist, torch 2.13.0+cpu seen through porter's HIP header view). "
             "**Compiled, not linked**: no ROCm build of torch exists here to link against. "
             f"Machine: {os.cpu_count()} cores, {platform.machine()}.", ""]
    for profile, title in LINES:
        path = out / f"{profile}.json"
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        check = json.loads((out / f"{profile}.check.json").read_text()) if (out / f"{profile}.check.json").is_file() \
            else {}
        rejected = {a["arch"]: a["message"].splitlines()[0].split(";")[0][:80] for a in check.get("archs", [])
                    if not a.get("ok") and a.get("arch") in ARCHS}
        lines += [f"## {title} (`-t {profile}`)", ""]
        if "compiled" not in doc:
            lines += [f"The run failed before compiling: `{str(doc.get('error', ''))[-300:]}`", ""]
            continue
        ran = doc.get("plan", {}).get("build_dir", "")
        lines += [f"Compile-only run: {doc.get('seconds', 0):.0f} s with {doc.get('jobs')} jobs; build dir `{ran}`.",
                  "", "| op | " + " | ".join(ARCHS) + " | seconds | peak MiB | whose doing |",
                  "|---|" + "---|" * (len(ARCHS) + 3)]
        for op in doc["compiled"]:
            peak = max((t.get("peak_rss_mib", 0) for t in op["tus"]), default=0)
            cells = [verdict(op, a, rejected) for a in ARCHS]
            lines.append(f"| {op['name']} | " + " | ".join(cells) + f" | {op['seconds']:.0f} | {peak:.0f} | "
                         f"{cause(str(op.get('error') or ''))} |")
        lines.append("")
    lines += ["## Whose doing is a failure", "",
              "The last column is read from the compiler's first error by `cause()` in the script (a "
              "heuristic): an error inside porter's HIP view of torch's headers is porter's (the view is a "
              "stand-in for a ROCm torch), a missing header of a ROCm library is the ROCm line's packaging, "
              "CUDA-only code (CUTLASS, cuBLAS, CUB) is upstream's, an identifier hipify did not map is "
              "hipify's or upstream's. The full log of each op is in its build folder.", ""]
    dest.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="deepspeed==0.19.8")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "rocm-compile")
    ap.add_argument("--from-json", type=Path, default=None, help="only rewrite the page from saved reports")
    ap.add_argument("--page", type=Path, default=ROOT / "docs" / "rocm-compile.md")
    ap.add_argument("--only", default=None, help="compile with this one profile (the other's saved report stays)")
    args = ap.parse_args()
    if args.from_json is None:
        run(args.source, args.jobs, args.out, args.only)
    write_page(args.from_json or args.out, args.page)
    print(f"wrote {args.page}", file=sys.stderr)


if __name__ == "__main__":
    main()
