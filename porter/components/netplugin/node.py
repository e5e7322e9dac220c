"""The RCCL network plugin (aws-ofi-nccl built ``--with-rocm``, or the older aws-ofi-rccl) as a node sees it:
whether a library loads in this process and what it exports.

RCCL dlopens the file ``NCCL_NET_PLUGIN`` names (or ``librccl-net.so`` / ``libnccl-net.so`` on the library
path) and looks up ``ncclNetPlugin_vN`` for the newest API version N it knows, and ``ncclCollNetPlugin_vN``
where the plugin offers collectives in the network. The loading itself is the ``netplugin`` probe's
(:mod:`porter.probes.netplugin_lib`), which ``porter net-plugin build/verify`` run in a target environment;
the preflight runs it here, in its own process, on the node.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porter.errors import ToolError

@dataclass(frozen=True)
class LibraryInfo:
    path: str
    net_versions: tuple[int, ...]
    collnet_versions: tuple[int, ...]
    hip_runtime: bool | None = None
    """Loading it mapped the HIP runtime: built with ROCm (None: the runtime was loaded before, not known)."""


def inspect_library(path: Path) -> LibraryInfo:
    """dlopen ``path`` (its dependencies must resolve here) and list the plugin symbols it exports."""
    from porter.probes.netplugin_lib import load_library

    if not path.is_file():
        raise ToolError(f"network plugin {path} does not exist",
                        hint="load the site's plugin module, or set the plugin's path in the site profile")
    doc = load_library(os.fspath(path))
    if not doc["loads"]:
        raise ToolError(f"network plugin {path} does not load: {doc['error']}",
                        hint="its dependencies (libfabric, the HIP runtime) must resolve on the node: "
                             "check LD_LIBRARY_PATH and 'ldd'")
    return LibraryInfo(os.fspath(path), tuple(doc["net_api"]), tuple(doc["collnet_api"]),  # type: ignore[arg-type]
                       links_hip(doc))


def links_hip(lib: dict[str, Any]) -> bool | None:
    """Whether loading the library (a ``netplugin`` probe's record of it) mapped the HIP runtime (None: not known)."""
    value = lib.get("hip_runtime")
    return None if value is None else bool(value)


def manifest_near(path: Path) -> dict[str, Any] | None:
    """The porter manifest of an installed plugin: ``<lib>.porter.json`` beside it, or ``porter.json`` one
    level up (a package porter wrote, unpacked: ``TOP/lib/<lib>`` and ``TOP/porter.json``)."""
    for cand in (path.with_name(path.name + ".porter.json"), path.parent.parent / "porter.json"):
        if cand.is_file():
            try:
                doc = json.loads(cand.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(doc, dict) and isinstance(doc.get("target", {}).get("net_plugin"), dict):
                return doc
    return None
