"""``python -m ops_prebuild.publish OUT -- COMPILE...``: a compile's output appears whole or not at all.

The compile names ``OUT`` (as its compiler sees it, after ``-o``) and its dependency file (after ``-MF`` or
nvcc's ``--dependency-output``); it writes private temporaries instead (``OUT.<pid>@<host>.tmp.<ext>``, so
ccache still sees an object or a precompiled header), which are renamed over ``OUT`` and ``OUT.d`` (host paths) when
the compile succeeded. Several processes may make the same file at once on a shared folder: the shards of one
build all make the precompiled headers they read, and two job arrays with other shard counts on one build
folder compile some of the same objects. Each rename is atomic, so every reader (a compile that includes the
header, a link, porter's output record) sees a whole file, and a compiler killed mid-write leaves only its
temporary, which the next run does not read and removes (:func:`porter.fs.remove_stale_outputs`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

_DEPFILE_FLAGS = ("-MF", "--dependency-output")


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[2] != "--" or "-o" not in argv[3:-1]:
        sys.stderr.write("usage: python -m ops_prebuild.publish OUT -- COMPILE... -o OUT_AS_SEEN ...\n")
        return 2
    host, cmd = argv[1], argv[3:]
    stem, ext = os.path.splitext(host)
    tag = f".{os.getpid()}@{socket.gethostname()}.tmp"
    renames = {f"{stem}{tag}{ext}": host}  # still a .o / .gch: ccache caches it as one
    at = cmd.index("-o") + 1
    cmd[at] = os.path.splitext(cmd[at])[0] + tag + ext
    for flag in _DEPFILE_FLAGS:
        if flag in cmd[:-1]:
            i = cmd.index(flag) + 1
            cmd[i] += tag
            renames[host + ".d" + tag] = host + ".d"
    try:
        code = subprocess.call(cmd)
        if code == 0:
            for tmp, final in renames.items():
                if os.path.exists(tmp) or final == host:
                    os.replace(tmp, final)
        return code if code >= 0 else 128 - code
    finally:
        for tmp in renames:
            if os.path.exists(tmp):
                os.unlink(tmp)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
