"""What a torch extension build needs to know about this python's torch (importable part)."""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any


def torch_info() -> dict[str, Any]:
    """Version, kind, include and library dirs, ABI and tags; ``{"error": ...}`` without torch."""
    try:
        import torch
        import torch.utils.cpp_extension as cpp
    except Exception as exc:  # ImportError, or a torch that fails to import
        return {"error": f"{type(exc).__name__}: {exc}"}
    root = os.path.dirname(torch.__file__)
    return {
        "version": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
        "root": root, "include_dirs": cpp.include_paths(),
        "cuda_include_dirs": cpp.include_paths("cuda") if torch.version.cuda else [],
        "library_dir": os.path.join(root, "lib"),
        "cxx11_abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)),
        "python_include": sysconfig.get_paths()["include"], "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "python_tag": "cp%d%d" % sys.version_info[:2],
        "platform_tag": sysconfig.get_platform().replace("-", "_").replace(".", "_"),
        "site_packages": sysconfig.get_paths()["purelib"],
    }
