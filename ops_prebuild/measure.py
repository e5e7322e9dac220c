"""``python -m ops_prebuild.measure OUT.json -- COMMAND...``: run one compile, record its cost.

ninja runs each compile of a ``--compile-only`` plan through this wrapper: the command's exit status
passes through unchanged; ``OUT.json`` gets its wall time and the peak resident memory of the largest
process in its tree (the compiler proper under hipcc/chroot), as the kernel accounts it to the
waiting parent (``wait4``). Those numbers are what MAX_JOBS and shard sizes are chosen from.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: python -m ops_prebuild.measure OUT.json -- COMMAND...\n")
        return 2
    out, cmd = argv[1], argv[3:]
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child becomes the command
        try:
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            sys.stderr.write(f"porter measure: cannot run {cmd[0]}: {exc.strerror}\n")
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    doc = {"seconds": round(time.monotonic() - start, 3), "peak_rss_kib": usage.ru_maxrss, "returncode": code}
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, out)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
