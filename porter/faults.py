"""Fault injection: ``PORTER_KILL_AT=POINT`` makes porter kill itself (SIGKILL, as an out-of-memory kill or a
``kill -9`` would) when it reaches ``POINT``, so a test, or a site checking its shared filesystem, can see what a
kill there leaves and that the next run starts clean from what was published.

Points: ``unpack`` (an sdist extracted into its temporary sibling, not yet published in the cache), ``wheel``
(a wheel half-written into its temporary file beside the wheelhouse) and ``port`` (a ported tree complete in its
temporary sibling, not yet published). Kills during a compile or a link come from
outside (the tests kill porter while a compiler or linker it started runs)."""

from __future__ import annotations

import os
import signal

POINTS = ("unpack", "wheel", "port")
VARIABLE = "PORTER_KILL_AT"


def reached(point: str) -> None:
    assert point in POINTS, point
    if os.environ.get(VARIABLE) == point:
        os.kill(os.getpid(), signal.SIGKILL)
