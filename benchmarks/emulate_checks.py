"""What porter's emulated checks cost: seconds per kernel family and wave size on this machine, measured in one run.

    python benchmarks/emulate_checks.py WHEELHOUSE [WHEELHOUSE ...]

Each WHEELHOUSE holds wheels built for the emulated target (porter port / porter ops build -t emulate-wave64 or
emulate-wave32). For each family, prints the seconds its checks took inside the kernels' process (the kernels on the
emulator plus torch's float32 reference), the wall time of the family's process (with torch's import), and how many
checks ran. No target: nothing is asserted, the numbers are the result.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    from porter.emulate import checks
    from porter.emulate.run import emulated_wheels

    print(f"{'wave':>4}  {'family':<44} {'checks':>6} {'in checks':>10} {'process':>9}")
    for wheelhouse in map(Path, argv):
        for wave in sorted(emulated_wheels(wheelhouse)):
            for family in checks.FAMILIES:
                start = time.monotonic()
                res = subprocess.run([sys.executable, "-m", "porter", "emulate", "check", str(wheelhouse), "--only",
                                      family, "--json"], capture_output=True, text=True)
                wall = time.monotonic() - start
                if res.returncode == 4 or not res.stdout.strip():
                    continue
                rows = [r for r in json.loads(res.stdout) if r["wave"] == wave]
                if not rows:
                    continue
                inside = sum(float(r.get("seconds") or 0) for r in rows)
                print(f"{wave:>4}  {family:<44} {len(rows):>6} {inside:>9.1f}s {wall:>8.1f}s"
                      + ("" if all(r["ok"] for r in rows) else "  (failed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
