"""The op_builder family's rules (DeepSpeed's op builders, which ROCm apex took): its record of what is prebuilt
(``git_version_info_installed.py``'s ``installed_ops``: the loader imports an op marked True as its module and
JIT-compiles the rest), and the SIMD define its host ops are compiled with."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

from porter.errors import ConfigError
from porter.toolchain.archs import BF16_AMD
from porter.toolchain.profile import Toolchain

SIMD_DEFINES = frozenset({"-D__AVX512__", "-D__AVX256__", "-D__SCALAR__", "-D__SVE__", "-D__NEON__"})
"""What a builder's ``simd_width()`` guesses from the build host (lscpu, py-cpuinfo)."""


def bf16(device: bool, tc: Toolchain, own: bool = False) -> bool:
    """Whether an op's device code is built with ``-DBF16_AVAILABLE``: the builder's ``own`` verdict on CUDA
    (compute capability 8+); on ROCm, where DeepSpeed never passes it (its issue #4717), when every arch of the
    profile has bf16 in hardware; on porter's emulated target (its hip_bf16.h, as CDNA2 and later have), always."""
    if tc.kind == "rocm":
        return device and all(t.name in BF16_AMD for t in tc.targets)
    return device if tc.kind == "emulated" else own


def simd_define(isa: str) -> str:
    """The SIMD define for a -march value (``isa.toml`` beside this module)."""
    table = tomllib.loads(Path(__file__).with_name("isa.toml").read_text())["simd"]
    if isa not in table:
        raise ConfigError(f"no SIMD level known for cpu_isa {isa!r}",
                          hint=f"use one of {', '.join(sorted(table))}, or add it to porter/components/isa.toml")
    return f"-D{table[isa]}"


def profile_simd(args: tuple[str, ...], isa: str) -> tuple[str, ...]:
    """A builder's host flags with its build-host SIMD guess replaced by the profile ISA's define (``native``: as
    they are). A wheel built on an AVX-512 login node must not crash with SIGILL on a Zen 3 compute node."""
    return args if isa == "native" else (*(a for a in args if a not in SIMD_DEFINES), simd_define(isa))


def read_installed_ops(text: str) -> dict[str, bool] | None:
    """``installed_ops`` from the text of git_version_info_installed.py (None when unreadable)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "installed_ops"
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            if isinstance(value, dict):
                return {str(k): bool(v) for k, v in value.items()}
    return None


def set_installed_ops(text: str, installed: Mapping[str, bool], name: str = "installed_ops") -> str:
    """The text of an op_builder family's ``git_version_info_installed.py`` (DeepSpeed's, and ROCm apex's, which
    took the loader from it) with ``installed_ops`` set: the loader imports an op marked True as its prebuilt
    module and JIT-compiles the rest. Another ``name`` sets another record of that file the same way (DeepSpeed's
    ``porter_feature_probes``)."""
    line = f"{name}=" + repr(dict(sorted(installed.items())))
    text, found = re.subn(rf"(?m)^{name}\s*=.*$", line.replace("\\", "\\\\"), text, count=1)
    return text if found else text.rstrip("\n") + "\n" + line + "\n"
