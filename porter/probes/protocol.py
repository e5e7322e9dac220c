"""The probe protocol: one JSON document after a marker line, on the real stdout."""

from __future__ import annotations

import json
import sys
from typing import Any

MARKER = "@@porter-probe@@"

if sys.path and sys.path[0] in ("", "-"):
    del sys.path[0]  # the caller's working folder must not shadow the probed python's modules


def emit(doc: Any) -> None:
    """Print ``doc`` after the marker on the real stdout (the probed code may redirect sys.stdout)."""
    real = sys.__stdout__
    if real is None:  # no stdout at all: nowhere to send the document
        raise RuntimeError("the probe has no stdout to print its result to")
    real.write("\n" + MARKER + json.dumps(doc) + "\n")
    real.flush()
