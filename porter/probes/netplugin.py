"""Entry, run where an RCCL network plugin is built or used (the toolchain's chroot, a container, a node).

argv[1]: a JSON object with
  ``headers``: include folders to read version facts from (RCCL's ``rccl/rccl.h`` and ``rccl/nccl_net.h``,
  libfabric's ``rdma/fabric.h``, HIP's ``hip/hip_version.h``); the first folder holding a header wins;
  ``libraries``: plugin libraries to dlopen (RTLD_NOW, so a missing symbol fails here as it would in RCCL),
  each one's ``ncclNetPlugin_vN`` / ``ncclCollNetPlugin_vN`` symbols are listed, with the shared objects the
  load mapped (read from /proc/self/maps before and after);
  ``rccl_runtime``: also dlopen ``librccl.so.1`` and ask ``ncclGetVersion``.
Nothing here talks to a NIC or a GPU: the plugin's functions are never called.
"""

from __future__ import annotations

import json
import sys

from porter.probes.netplugin_lib import header_facts, load_library, rccl_runtime  # porter: concatenated
from porter.probes.protocol import emit  # porter: concatenated

req = json.loads(sys.argv[1])
doc: dict[str, object] = {"headers": header_facts(list(req.get("headers") or []))}
doc["libraries"] = [load_library(str(lib)) for lib in req.get("libraries") or []]
if req.get("rccl_runtime"):
    doc["rccl_runtime"] = rccl_runtime()
emit(doc)
