"""Run in the build python: what a torch extension build needs to know about that python's torch.

Standalone on purpose (the build python need not have porter): used as a script by
``ops_prebuild.catalogue.probe_torch`` and imported by ``_probe.py``.
"""

from __future__ import annotations  # the build python may be older than porter's

import json
import os
import sys
import sysconfig
from typing import Any

MARKER = "@@porter-torch@@"


def torch_info() -> dict[str, Any]:
    import torch
    import torch.utils.cpp_extension as cpp

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


if __name__ == "__main__":
    doc: dict[str, Any]
    try:
        doc = torch_info()
    except ImportError as exc:
        doc = {"error": str(exc)}
    sys.stdout.write("\n" + MARKER + json.dumps(doc) + "\n")
