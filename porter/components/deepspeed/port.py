"""``porter port deepspeed``: a DeepSpeed tree with porter's ``deepspeed`` patch sets (no-jit, then explicit-arch),
published as OUT by one rename; its ops are then built ahead of time from OUT (``porter ops build --source OUT``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from porter.components.deepspeed.build import is_tree
from porter.errors import ConfigError
from porter.log import Logger, quiet_logger
from porter.run import Runner
from porter.port import PortResult, destination, patch_sets, staged


def port_deepspeed(tree: str | os.PathLike[str], *, out: str | os.PathLike[str] | None = None,
                   in_place: bool = False, sets: Sequence[str] = (), skip: Sequence[str] = (),
                   target_version: str | None = None, log: Logger | None = None,
                   runner: Runner | None = None) -> PortResult:
    """A DeepSpeed tree, ported: every ``deepspeed`` set (no-jit, then explicit-arch on the same file: layered),
    each patch where its problem is present; OUT (default TREE-ported) appears by one rename. Its ops are then
    built ahead of time from OUT with ``porter ops build --source OUT``. A recording ``runner`` is a dry run: the
    patches are checked against TREE, nothing is written."""
    log = log or quiet_logger()
    src = Path(tree)
    if not src.is_dir() or not is_tree(src.resolve()):
        raise ConfigError(f"{src} is not a DeepSpeed tree (no op_builder/builder.py beside deepspeed/)",
                          hint="pass the top folder of a DeepSpeed checkout or unpacked sdist")
    src = src.resolve()
    dest = destination(src, Path(out) if out is not None else None, in_place, "ported")
    patches = patch_sets(sets, skip, project="deepspeed", target_version=target_version)
    result = PortResult(src, dest, "", "", kernels=False)
    patches.take(src, result)  # checked against TREE before anything is written: a dry run ends here
    if runner is not None and runner.dry:
        return result
    with staged(src, dest, in_place, log) as work:
        patches.take(work, result, log)
    return result
