"""What porter changes in DeepSpeed's own wheel beyond the prebuilt modules and ``installed_ops``.

The wheel's own copy of DeepSpeed's op builder gets porter's deepspeed/no-jit patch set (:data:`WHEEL_SETS`),
edited in memory here and never in the source tree: DeepSpeed answers its load-time feature probes (``has_function``)
by compiling a test program, on import (0.18) or when ``deepspeed.ops.__compatible_ops__`` is first read (0.19);
patched, an installation porter wrote answers them from ``porter_feature_probes`` (the build python's answers,
recorded beside ``installed_ops``), so a prebuilt install starts no compiler by default. The same set's opt-in
``PORTER_NO_JIT=1`` guard comes with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from porter.errors import ToolError
from porter.fs import owned_temp
from porter.patching import failure_message, load_shipped, plan as plan_patches

WHEEL_SETS: tuple[tuple[str, str], ...] = (("deepspeed", "no-jit"),)
"""Patch sets (project, name) applied to the wheel's own copy of the files they edit; a file they do not need to
change (no such probe, already patched in the source tree) is left as DeepSpeed's setup.py wrote it."""


def guarded(files: Mapping[str, bytes]) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
    """The files of a wheel (archive name -> bytes) that :data:`WHEEL_SETS` change, as they change them, and the
    patches that change them as its manifest lists them (:meth:`porter.patching.engine.Plan.records`, each with
    ``applied_to: wheel``): the sets are planned once, in memory, on a scratch copy of just those files. A needed
    edit that cannot be made (DeepSpeed moved a line the set anchors on) is an error naming the file, the anchor and
    the closest line: a wheel that would run the compiler at import is not written. Each patch decides by its own
    ``needed_if`` (no version gate)."""
    sets = [load_shipped(project, name) for project, name in WHEEL_SETS]
    names = {f for s in sets for p in s.patches for f in p.files}
    mine = {n: d for n, d in files.items() if n in names}
    if not mine:
        return {}, []
    with owned_temp(None, "porter-wheel-guard-") as tmp:
        for rel, data in mine.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        planned = plan_patches(tmp, sets)
    if planned.failed:
        refs = ", ".join(s.ref for s in sets)
        raise ToolError(f"cannot add {refs} to the wheel's copy of {', '.join(sorted(mine))}: "
                        + failure_message(planned.failed),
                        hint=f"this DeepSpeed moved a line {refs} anchors on, so its wheel would compile feature "
                             f"probes at import; 'porter patch check TREE --set {refs}' shows which (the source "
                             "tree itself is never changed by 'porter ops build')")
    return ({c.path: c.after for c in planned.changes if c.after is not None and c.path in files},
            [{**r, "applied_to": "wheel"} for r in planned.records()])

