"""``python -m ops_prebuild.pch GCH -- COMPILE...``: make a precompiled header without a half-written file.

The compile names ``GCH`` (as its compiler sees it, after ``-o``); it writes a private temporary instead,
which is renamed over ``GCH`` (the host path) when the compile succeeded. Shards on several nodes may make
the same header at once on a shared folder: each rename is atomic, and every compile that reads it sees a
whole file.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[2] != "--" or "-o" not in argv[3:-1]:
        sys.stderr.write("usage: python -m ops_prebuild.pch GCH -- COMPILE... -o GCH_AS_SEEN ...\n")
        return 2
    host, cmd = argv[1], argv[3:]
    at = cmd.index("-o") + 1
    suffix = f".{os.getpid()}.tmp.gch"  # still a .gch: ccache caches it as a precompiled header
    cmd[at] += suffix
    tmp = host + suffix
    try:
        code = subprocess.call(cmd)
        if code == 0:
            os.replace(tmp, host)
        return code if code >= 0 else 128 - code
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
