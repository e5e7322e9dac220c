"""``python -m ops_prebuild.measure OUT.json -- COMMAND...``: run one compile, record its cost.

ninja runs each compile of a ``--compile-only`` plan through this wrapper: the command's exit status
passes through unchanged; ``OUT.json`` gets its wall time and the peak resident memory of the largest
process in its tree (the compiler proper under hipcc/chroot), as the kernel accounts it to the
waiting parent (``wait4``). Those numbers are what MAX_JOBS and shard sizes are chosen from.

``OUT.json`` is the object's own path plus ``.cost.json``, so the wrapper knows what the command must
write: a command that exits 0 without writing it fails here (exit 1). Debian's hipcc does exactly that
when the shell it runs clang through is killed by a signal, and ninja would otherwise log the unit
as built.
"""

from __future__ import annotations

import json
import os
import sys
import time

SUFFIX = ".cost.json"


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: python -m ops_prebuild.measure OUT.json -- COMMAND...\n")
        return 2
    out, cmd = argv[1], argv[3:]
    obj = out[: -len(SUFFIX)] if out.endswith(SUFFIX) else None
    if obj is not None and os.path.lexists(obj):
        os.unlink(obj)  # an old object must not pass for the new one
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
    if code == 0 and obj is not None and not os.path.exists(obj):
        sys.stderr.write(f"porter measure: {cmd[0]} exited 0 but wrote no {obj} (was it killed by a signal?)\n")
        code = 1
    doc = {"seconds": round(time.monotonic() - start, 3), "peak_rss_kib": usage.ru_maxrss, "returncode": code}
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, out)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
