"""porter hipify vs plain torch.utils.hipify on DeepSpeed's csrc/ (one run, same machine).

    python benchmarks/hipify.py [--sdist deepspeed-0.19.8.tar.gz | --csrc DIR]

Prints, measured in this one run:
  * output: every file porter writes equals torch's output for it with porter's extra map applied
    (files torch leaves unchanged: torch adds its breadcrumb line, porter copies them byte-identical);
  * time ratio porter / torch for a first run (target <= 1.0);
  * unchanged re-run ratio: porter's second run on the same tree / its first run (target <= 0.2).
Exit status 1 when an output differs or a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VERSION = "0.19.8"


def fetch_sdist(dest: Path) -> Path:
    found = sorted(dest.glob("deepspeed-*.tar.gz"))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "--no-build-isolation", "-d", str(dest), f"deepspeed=={VERSION}"], check=True)
    return sorted(dest.glob("deepspeed-*.tar.gz"))[0]


def unpack_csrc(sdist: Path, into: Path) -> Path:
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if "/csrc/" in m.name or m.name.endswith("/csrc")]
        tf.extractall(into, members=members, filter="data")
    return next(into.glob("*/csrc"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, help=f"a deepspeed-{VERSION} sdist (default: download it once)")
    ap.add_argument("--csrc", type=Path, help="an unpacked csrc/ directory instead of the sdist")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "porter-tests" / "sdists" / f"deepspeed-{VERSION}")
    args = ap.parse_args()

    # Both sides use the same, already imported torch.utils.hipify (its tables compile at import).
    import torch.utils.hipify.hipify_python as hp

    from porter.hipify import hipify_tree
    from porter.hipify.maps import builtin_map
    from porter.hipify.torch_engine import SOURCE_EXTENSIONS, torch_hipify, torch_hipify_version

    assert torch_hipify() is hp
    with tempfile.TemporaryDirectory(prefix="porter-bench-hipify-") as tmp_s:
        tmp = Path(tmp_s)
        if args.csrc:
            src = tmp / "csrc"
            shutil.copytree(args.csrc, src, symlinks=True)
        else:
            src = unpack_csrc(args.sdist or fetch_sdist(args.cache), tmp / "unpacked")
        files = sorted(p for p in src.rglob("*") if p.is_file())
        print(f"tree: DeepSpeed {VERSION} csrc/: {len(files)} files, "
              f"{sum(p.stat().st_size for p in files) / 1e6:.1f} MB; torch.utils.hipify {torch_hipify_version()}")

        torch_out, porter_out = tmp / "torch-out", tmp / "porter-out"
        hp.HIPIFY_FINAL_RESULT.clear()
        sink = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            hp.hipify(project_directory=str(src), output_directory=str(torch_out), is_pytorch_extension=False,
                      show_progress=False)
        t_torch = time.perf_counter() - t0

        t0 = time.perf_counter()
        first = hipify_tree(src, porter_out)
        t_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        second = hipify_tree(src, porter_out)
        t_second = time.perf_counter() - t0

        extras = builtin_map().compiled
        crumb = hp.HIPIFY_C_BREADCRUMB
        identical = by_extras = mismatched = 0
        for p in files:
            rel = p.relative_to(src).as_posix()
            mine = (porter_out / rel).read_bytes()
            if not rel.endswith(SOURCE_EXTENSIONS):
                theirs_b = (torch_out / rel).read_bytes()
                ok = mine == theirs_b
                identical += ok
                mismatched += not ok
                if not ok:
                    print(f"  DIFF (copied file) {rel}")
                continue
            theirs = (torch_out / hp.get_hip_file_path(rel, False)).read_text(encoding="utf-8")
            theirs = theirs.removeprefix(crumb)
            mine_t = mine.decode("utf-8").removeprefix(crumb)
            if mine_t == theirs:
                identical += 1
            elif mine_t == extras.apply(theirs):
                by_extras += 1
            else:
                mismatched += 1
                print(f"  DIFF {rel}")
        extra_names = set(extras.identifiers) | set(extras.calls)
        extra_counts = {k: v for k, v in first.replacements.items() if k in extra_names}

        print(f"output: {identical} files identical to torch's, {by_extras} differ only by porter's extra "
              f"mappings {extra_counts}, {mismatched} differ otherwise")
        r_time = t_first / t_torch
        r_rerun = t_second / t_first
        print(f"time: torch.utils.hipify {t_torch:.3f} s, porter first run {t_first:.3f} s "
              f"-> ratio {r_time:.2f} (target <= 1.0)")
        print(f"unchanged re-run: {t_second:.3f} s ({second.cached} of {len(second.files)} files from the cache) "
              f"-> ratio {r_rerun:.3f} of the first run (target <= 0.2)")
        print(f"porter found: {len(first.unsupported)} unsupported-API uses, {len(first.warp32)} warp-size-32 flags")
        ok = mismatched == 0 and r_time <= 1.0 and r_rerun <= 0.2
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
