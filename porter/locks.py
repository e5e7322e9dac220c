"""One writer at a time for a cache entry, and a waiter that says for whom it waits.

porter's locks are ``filelock.FileLock``: on Linux an ``flock(2)`` on ``<entry>.lock``. The kernel drops such a
lock when its holder dies (exit, crash, ``kill -9``), so a lock is never left behind by a dead process: the next
waiter takes it at once. On NFS (v4, or v3 with the lock manager running) ``flock`` is emulated with POSIX byte
range locks and works across clients; Lustre grants it only when the clients mount with ``-o flock`` (with
``localflock`` a lock holds on one node only). Where locks do not work across nodes, give each node a cache of its
own (``PORTER_CACHE_DIR`` on node-local disk) or share one build through ``--shards`` (one set-up, then disjoint
parts).

Beside each lock, ``<entry>.lock.owner`` names the holder (pid, host, since when, what for): a process that
finds the entry locked prints it while it waits, so a user knows whether to wait or to look for a stuck job.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout

POLL_S = 0.2
REPORT_EVERY_S = 30.0


@contextmanager
def hold(entry: Path, what: str, *, say: Callable[[str], None] | None = None) -> Iterator[FileLock]:
    """Hold ``<entry>.lock`` for the block, waiting as long as another process holds it (saying so, and who, at
    once and then every 30 s). The lock object is yielded so that a caller may release it early."""
    lock_path = Path(str(entry) + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    start = last = time.monotonic()
    timeout = 0.0  # then POLL_S, once another holds it
    while True:
        try:
            lock.acquire(timeout=timeout)
            break
        except Timeout:
            now = time.monotonic()
            if say is not None and (not timeout or now - last >= REPORT_EVERY_S):
                who = ""  # who holds it, in words, from its owner record
                with suppress(OSError, ValueError, KeyError, TypeError):
                    rec = json.loads(Path(str(lock_path) + ".owner").read_text())
                    since = time.strftime("%H:%M:%S", time.localtime(float(rec["since"])))
                    who = f"pid {rec['pid']} on {rec['host']} since {since} ({rec['what']})"
                say((f"still waiting for {entry.name} after {now - start:.0f} s" if timeout else
                     f"waiting for {entry.name}: another porter is writing it") + (f" ({who})" if who else ""))
                last = now
            timeout = POLL_S
    try:
        with suppress(OSError):  # the record is for people; the lock itself is what excludes
            Path(str(lock_path) + ".owner").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                                   "since": time.time(), "what": what}))
        yield lock
    finally:
        if lock.is_locked:
            lock.release(force=True)
