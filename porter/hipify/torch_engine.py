"""torch's own hipify (``torch.utils.hipify``), applied to one file's text.

torch's ``hipify_python.hipify()`` copies a whole tree, keeps module-level state
(``HIPIFY_FINAL_RESULT``), prints to stdout and writes ``<dir>/hip/<name>`` files. porter needs the
*transformation* only, so this module runs torch's own pieces on a string, in the order torch's
``preprocessor`` runs them in its non-extension mode (``is_pytorch_extension=False``):

1. the identifier map (``RE_PYTORCH_PREPROCESSOR`` over ``PYTORCH_MAP``, built from
   ``CUDA_TO_HIP_MAPPINGS``), 2. ``CAFFE2_PATH_MAPPINGS``, 3. ``#include`` rewrites for
``ATen/cuda``-style headers (``get_hip_file_path``), 4. ``CMakeLists.txt`` rewrites, 5. kernel
launches (``processKernelLaunches``), 6. ``replace_math_functions`` for ``.cu``/``.cuh``,
7. ``hip_header_magic``.

Parity with torch's own output is tested (tests/unit/test_hipify_torch_parity.py) and measured on
DeepSpeed's ``csrc/`` (benchmarks/hipify.py). The hipify package imports only the standard library,
so it is loaded from torch's installed files without running ``import torch`` (seconds saved on
every CLI call); if that ever fails, the ordinary import is used.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
from collections import Counter
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from porter.errors import ToolError

# torch's hipify() defaults (hipify_python.hipify: extensions=...). A unit test checks they agree.
SOURCE_EXTENSIONS: tuple[str, ...] = (".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".in", ".hpp")
# Files that get torch's breadcrumb line when written (hipify_python.preprocessor).
BREADCRUMB_EXTENSIONS: tuple[str, ...] = (".cu", ".cuh", ".c", ".cc", ".cpp", ".h", ".hpp")
# Include prefixes torch rewrites through get_hip_file_path in non-extension mode (facts from
# hipify_python.preprocessor's header rewrite).
_HIP_PATH_INCLUDE_PREFIXES = ("ATen/cuda", "ATen/native/cuda", "ATen/native/nested/cuda",
                              "ATen/native/quantized/cuda", "ATen/native/sparse/cuda",
                              "ATen/native/transformers/cuda", "THC/")

_ALIAS = "porter._torch_hipify"


def _load_standalone() -> ModuleType:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torch is not installed")
    pkg_dir = Path(next(iter(spec.submodule_search_locations))) / "utils" / "hipify"
    pkg_spec = importlib.util.spec_from_file_location(_ALIAS, pkg_dir / "__init__.py",
                                                      submodule_search_locations=[str(pkg_dir)])
    if pkg_spec is None or pkg_spec.loader is None:
        raise ImportError(f"no torch.utils.hipify package at {pkg_dir}")
    pkg = importlib.util.module_from_spec(pkg_spec)
    sys.modules[_ALIAS] = pkg
    try:
        pkg_spec.loader.exec_module(pkg)
        mod_spec = importlib.util.spec_from_file_location(f"{_ALIAS}.hipify_python", pkg_dir / "hipify_python.py")
        assert mod_spec is not None and mod_spec.loader is not None
        mod = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = mod
        mod_spec.loader.exec_module(mod)
    except BaseException:
        for name in [n for n in sys.modules if n == _ALIAS or n.startswith(_ALIAS + ".")]:
            del sys.modules[name]
        raise
    return mod


@lru_cache(maxsize=1)
def torch_hipify() -> ModuleType:
    """torch's ``hipify_python`` module (already imported, standalone-loaded, or imported)."""
    loaded = sys.modules.get("torch.utils.hipify.hipify_python")
    if loaded is not None:
        return loaded
    with contextlib.suppress(Exception):  # fall back to the ordinary import below
        return _load_standalone()
    try:
        import torch.utils.hipify.hipify_python as hp
    except ImportError as exc:
        raise ToolError(f"torch.utils.hipify cannot be imported: {exc}",
                        hint="porter hipify uses torch's own hipify; install torch (the CPU wheel is enough) "
                             "in the environment that runs porter") from None
    return hp


def torch_hipify_version() -> str:
    version_module = torch_hipify().__name__.rsplit(".", 1)[0] + ".version"
    try:
        pkg = importlib.import_module(version_module)
    except ImportError:
        return "unknown"
    return str(getattr(pkg, "__version__", "unknown"))


@lru_cache(maxsize=1)
def _caffe2_steps() -> tuple[tuple[str, re.Pattern[str] | None, str], ...]:
    """(CUDA path, the pattern to substitute -- None: a plain replace --, HIP path) per CAFFE2_PATH_MAPPINGS entry."""
    return tuple((cuda_path, re.compile(r"(?<!/hip/)" + re.escape(cuda_path))
                  if "/hip/" in hip_path and "/hip/" not in cuda_path else None, hip_path)
                 for cuda_path, hip_path in torch_hipify().CAFFE2_PATH_MAPPINGS.items())


def breadcrumb() -> str:
    return str(torch_hipify().HIPIFY_C_BREADCRUMB)


def transform_text(text: str, rel_path: str, counts: Counter[str] | None = None) -> str:
    """torch's hipify of one file's text (non-extension mode), without the breadcrumb line.

    ``rel_path`` (POSIX, relative) decides the per-file rules (``.cu``/``.cuh`` math functions,
    ``CMakeLists.txt``). Replacements are counted into ``counts`` by CUDA identifier.
    """
    hp = torch_hipify()
    pmap: dict[str, Any] = hp.PYTORCH_MAP
    counts = Counter() if counts is None else counts

    def repl(m: re.Match[str]) -> str:
        counts[m.group(0)] += 1
        return str(pmap[m.group(0)])

    out = hp.RE_PYTORCH_PREPROCESSOR.sub(repl, text)
    for literal, pattern, hip_path in _caffe2_steps():
        if literal in out:  # a cheap test first: these patterns start with a look-behind (slow)
            out = pattern.sub(hip_path, out) if pattern is not None else out.replace(literal, hip_path)

    for rx, templ in ((hp.RE_QUOTE_HEADER, '#include "{0}"'), (hp.RE_ANGLE_HEADER, "#include <{0}>"),
                      (hp.RE_THC_GENERIC_FILE, '#define THC_GENERIC_FILE "{0}"')):
        def header(m: re.Match[str], templ: str = templ) -> str:
            f = m.group(1)
            if not (f.startswith(_HIP_PATH_INCLUDE_PREFIXES) or (f.startswith("THC") and not f.startswith("THCP"))):
                return m.group(0)
            new = str(templ.format(hp.get_hip_file_path(f, False)))
            if new != m.group(0):
                counts[f"#include {f}"] += 1
            return new

        out = rx.sub(header, out)

    if rel_path.endswith("CMakeLists.txt"):
        out = out.replace("CUDA", "HIP").replace("THC", "THH")
        out = hp.RE_CU_SUFFIX.sub(".hip", out)

    if "<<<" in out:
        stats: dict[str, list[Any]] = {"unsupported_calls": [], "kernel_launches": []}
        out = hp.processKernelLaunches(out, stats)
        if stats["kernel_launches"]:
            counts["<<<...>>> kernel launch"] += len(stats["kernel_launches"])
    else:
        # processKernelLaunches finds no launch without "<<<"; only its first rewrite applies.
        out = hp.RE_KERNEL_LAUNCH.sub(lambda m: f"{m.group(1)}{m.group(2)}::", out)

    if rel_path.endswith((".cu", ".cuh")) and "PowKernel" not in rel_path:
        out = hp.replace_math_functions(out)

    magic = hp.hip_header_magic(out)
    if magic != out:
        counts['#include "hip/hip_runtime.h" (added)'] += 1
    return str(magic)
