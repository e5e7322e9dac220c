"""Entry, run by the *target* interpreter: tags, install paths, torch (read from torch/version.py
without importing torch) and the distributions porter cares about with their shared objects.

argv[1]: JSON list of canonical distribution names to report on.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import importlib.util
import json
import os
import re
import sys
import sysconfig

from porter.probes.protocol import emit  # porter: concatenated


want = set(json.loads(sys.argv[1]))
out: dict[str, object] = {"executable": sys.executable, "version": list(sys.version_info[:3]),
       "implementation": sys.implementation.name, "prefix": sys.prefix,
       "paths": {k: sysconfig.get_path(k) for k in ("purelib", "platlib", "data", "scripts")}}
out["tags"] = []
with contextlib.suppress(Exception):
    try:
        from packaging import tags as _tags
    except ImportError:
        from pip._vendor.packaging import tags as _tags  # type: ignore[no-redef]
    out["tags"] = [str(t) for t in _tags.sys_tags()]
try:
    import pip
    out["pip"] = pip.__version__
except Exception:
    out["pip"] = None
torch: object = None
spec = importlib.util.find_spec("torch")
if spec is not None and spec.submodule_search_locations:
    vf = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
    ns: dict[str, object] = {}
    try:
        with open(vf) as fh:
            exec(compile(fh.read(), vf, "exec"), ns)
        torch = {"version": ns.get("__version__"), "hip": ns.get("hip"), "cuda": ns.get("cuda"),
                 "path": os.path.dirname(vf)}
    except Exception as exc:
        torch = {"version": None, "error": repr(exc), "path": os.path.dirname(vf)}
out["torch"] = torch
dists: dict[str, object] = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if not name:
        continue
    canon = re.sub(r"[-_.]+", "-", name).lower()
    if canon not in want or canon in dists:
        continue
    files = [[str(rel), str(d.locate_file(rel))] for rel in d.files or []
             if str(rel).endswith(".so") or ".so." in os.path.basename(str(rel))]
    try:
        carried = d.read_text("porter.json")
    except Exception:
        carried = None
    dists[canon] = {"name": name, "version": d.version, "location": str(d.locate_file("")),
                    "shared_objects": files, "carried_manifest": carried}
out["dists"] = dists
emit(out)
