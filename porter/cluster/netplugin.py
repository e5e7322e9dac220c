"""The RCCL network plugin (aws-ofi-nccl built ``--with-rocm``, or the older aws-ofi-rccl): what a built
library exports and whether it loads.

RCCL dlopens the file ``NCCL_NET_PLUGIN`` names (or ``librccl-net.so`` / ``libnccl-net.so`` on the library
path) and looks up ``ncclNetPlugin_vN`` for the newest API version N it knows, and ``ncclCollNetPlugin_vN``
where the plugin offers collectives in the network.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from porter.errors import ToolError

API_VERSIONS = range(1, 16)


@dataclass(frozen=True)
class LibraryInfo:
    path: str
    net_versions: tuple[int, ...]
    collnet_versions: tuple[int, ...]


def inspect_library(path: Path) -> LibraryInfo:
    """dlopen ``path`` (its dependencies must resolve here) and list the plugin symbols it exports."""
    if not path.is_file():
        raise ToolError(f"network plugin {path} does not exist",
                        hint="load the site's plugin module, or set the plugin's path in the site profile")
    try:
        lib = ctypes.CDLL(os.fspath(path), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError as exc:
        raise ToolError(f"network plugin {path} does not load: {exc}",
                        hint="its dependencies (libfabric, the HIP runtime) must resolve on the node: "
                             "check LD_LIBRARY_PATH and 'ldd'") from None

    def has(name: str) -> bool:
        try:
            getattr(lib, name)
        except AttributeError:
            return False
        return True

    return LibraryInfo(os.fspath(path), tuple(v for v in API_VERSIONS if has(f"ncclNetPlugin_v{v}")),
                       tuple(v for v in API_VERSIONS if has(f"ncclCollNetPlugin_v{v}")))
