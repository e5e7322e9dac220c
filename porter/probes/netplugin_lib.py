"""A part of the ``netplugin`` probe, also imported by porter itself (the preflight loads a plugin in its
own process on a node): read version facts from headers, dlopen a network plugin and list its plugin
symbols and the shared objects the load mapped, ask a loaded RCCL its version. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
from collections.abc import Iterable

API_MAX = 15


def _defines(path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"\s*#\s*define\s+(\w+)[ \t]+(.+?)\s*(?://.*|/\*.*)?$", line)
            if m and m.group(1) not in out:
                out[m.group(1)] = m.group(2).strip()
    return out


def _find(dirs: list[str], rel: str) -> str:
    return next((os.path.join(d, rel) for d in dirs if os.path.isfile(os.path.join(d, rel))), "")


def _int(d: dict[str, str], key: str) -> int | None:
    v = d.get(key, "").strip("()")
    return int(v) if v.isdigit() else None


def header_facts(dirs: list[str]) -> dict[str, object]:
    facts: dict[str, object] = {}
    p = _find(dirs, "rccl/rccl.h")
    if p:
        d = _defines(p)
        nums = [_int(d, k) for k in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH")]
        rccl: dict[str, object] = {"header": p, "major": nums[0], "version_code": _int(d, "NCCL_VERSION_CODE"),
                                   "version": ".".join(str(n) for n in nums) if None not in nums else None}
        facts["rccl"] = rccl
        net = _find(dirs, "rccl/nccl_net.h")
        if net:
            text = open(net, errors="replace").read()
            known = sorted({int(v) for v in re.findall(r'#\s*include\s+"net/net_v(\d+)\.h"', text)}
                           | {int(v) for v in re.findall(r"\bncclNet_v(\d+)_t\b", text)})
            newest = re.search(r"#\s*define\s+NCCL_NET_PLUGIN_SYMBOL\s+ncclNetPlugin_v(\d+)", text)
            rccl["net_api"] = known
            rccl["net_api_newest"] = int(newest.group(1)) if newest else (max(known) if known else None)
    for key, rel, names in (
            ("libfabric", "rdma/fabric.h", ("FI_MAJOR_VERSION", "FI_MINOR_VERSION", "FI_REVISION_VERSION")),
            ("hip", "hip/hip_version.h", ("HIP_VERSION_MAJOR", "HIP_VERSION_MINOR", "HIP_VERSION_PATCH")),
            ("rocm", "rocm-core/rocm_version.h", ("ROCM_VERSION_MAJOR", "ROCM_VERSION_MINOR", "ROCM_VERSION_PATCH"))):
        p = _find(dirs, rel)
        if p:
            d = _defines(p)
            nums = [_int(d, k) for k in names]
            facts[key] = {"header": p, "version": ".".join(str(n) for n in nums if n is not None) or None}
    return facts


def _mapped() -> set[str]:
    out: set[str] = set()
    with contextlib.suppress(OSError), open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/") and ".so" in parts[5]:
                out.add(parts[5].strip())
    return out


def load_library(path: str) -> dict[str, object]:
    res: dict[str, object] = {"path": path, "exists": os.path.isfile(path), "loads": False, "error": None,
                              "net_api": [], "collnet_api": [], "names": {}, "mapped": [],
                              "hip_runtime": None}
    if not res["exists"]:
        res["error"] = "no such file"
        return res
    before = _mapped()
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        res["error"] = str(exc)
        return res
    res["loads"] = True
    mapped = sorted(_mapped() - before - {os.path.realpath(path)})
    res["mapped"] = mapped

    def hip(paths: Iterable[str]) -> bool:
        return any(os.path.basename(m).startswith("libamdhip64.so") for m in paths)

    # whether the plugin pulled in the HIP runtime (None: it was loaded before, so this load cannot tell)
    res["hip_runtime"] = None if hip(before) else hip(mapped)
    names: dict[str, str] = {}
    for kind, key in (("ncclNetPlugin_v", "net_api"), ("ncclCollNetPlugin_v", "collnet_api")):
        found = []
        for v in range(1, API_MAX + 1):
            sym = f"{kind}{v}"
            try:
                ptr = ctypes.c_char_p.in_dll(lib, sym)  # every plugin table starts with its name
            except ValueError:
                continue
            found.append(v)
            try:
                names[sym] = (ptr.value or b"").decode(errors="replace")[:80]
            except Exception:
                names[sym] = ""
        res[key] = found
    res["names"] = names
    return res


def rccl_runtime() -> dict[str, object]:
    try:
        lib = ctypes.CDLL("librccl.so.1", mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return {"loads": False, "error": str(exc)}
    code = ctypes.c_int(0)
    rc = lib.ncclGetVersion(ctypes.byref(code))
    v = code.value
    base = 10000 if v >= 10000 else 1000  # its layout changed at 2.9 (2.18.3: 21803; 2.8.4: 2804)
    version = f"{v // base}.{v % base // 100}.{v % 100}"
    return {"loads": True, "error": None if rc == 0 else f"ncclGetVersion returned {rc}", "version_code": v,
            "version": version, "major": int(version.split(".")[0])}
