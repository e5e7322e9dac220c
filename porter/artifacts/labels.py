"""PEP 440 local version labels that name a build target, in normal form.

``rocm5.7.gfx90a.gfx942``, ``cu130.sm90``, ``cpu.x86.64.v2``, ``emu.wave64`` (porter's emulated HIP target): segments are lower-case alphanumerics
joined by dots, so ``packaging.version.Version(v)`` prints exactly what is in the wheel's file name
and METADATA (``+cpu.x86_64_v2`` would come back as ``cpu.x86.64.v2``). The CPU ISA is a -march
value whose hyphens become dots; :func:`parse` joins them back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from porter.errors import ConfigError

if TYPE_CHECKING:  # only for the type: no import cycle between the toolchain and this module
    from porter.toolchain.profile import Toolchain

_HEAD = re.compile(r"^(rocm|cu|cpu|emu)(\d*)$")
_ARCH = re.compile(r"^(gfx[0-9a-z]+|sm\d+[a-z]?)$")


@dataclass(frozen=True)
class Label:
    kind: str                     # rocm | cuda | cpu | emulated
    toolkit: str                  # "5.7" (rocm), "130" (cuda, as written), "" (cpu)
    archs: tuple[str, ...]        # gfx90a, sm_90
    cpu_isa: str = ""             # cpu labels only: x86-64-v2

    def text(self) -> str:
        if self.kind == "cpu":
            return normalize("cpu." + self.cpu_isa)
        head = {"emulated": "emu", "rocm": "rocm" + self.toolkit}.get(self.kind, "cu" + self.toolkit)
        return normalize(".".join([head, *(a.replace("sm_", "sm") for a in self.archs)]))


def normalize(label: str) -> str:
    """The normal form of a local label (what packaging prints)."""
    try:
        local = Version(f"0+{label}").local
    except ValueError as exc:  # InvalidVersion, or a numeric segment past Python's int-from-string limit
        why = "" if isinstance(exc, InvalidVersion) else " (a numeric segment is too long)"
        raise ConfigError(f"{label!r} is not a valid PEP 440 local version label{why}",
                          hint="lower-case letters and digits in segments joined by '.', e.g. rocm6.2.gfx90a") from None
    assert local is not None
    return local


def make(tc: Toolchain) -> str:
    """The label of a profile's builds."""
    if tc.kind == "cpu":
        return Label("cpu", "", (), tc.cpu_isa.lower()).text()
    toolkit = tc.toolkit_version.replace(".", "") if tc.kind == "cuda" else tc.toolkit_version
    return Label(tc.kind, toolkit, tc.arch_names).text()


def parse(local: str) -> Label | None:
    """A porter label back into its parts; None for a label porter does not write."""
    segs = normalize(local).split(".")
    if not (m := _HEAD.match(segs[0])):
        return None
    head, digits = m.groups()
    rest = segs[1:]
    if head == "cpu":
        return None if digits or not rest else Label("cpu", "", (), "-".join(rest))
    if head == "emu":
        return Label("emulated", "", tuple(rest)) if not digits and rest and all(
            re.fullmatch(r"wave(32|64)", a) for a in rest) else None
    version = [digits] if digits else []
    while rest and rest[0].isdigit():
        version.append(rest.pop(0))
    if not version or not rest or not all(_ARCH.match(a) for a in rest):
        return None
    archs = tuple(("sm_" + a[2:]) if a.startswith("sm") else a for a in rest)
    return Label("rocm", ".".join(version), archs) if head == "rocm" else Label("cuda", "".join(version), archs)


def with_label(version: str, label: str) -> str:
    """``0.19.8`` (or ``0.19.8+abc``) -> ``0.19.8+<label>``, in normal form."""
    try:
        public = Version(version).public
    except ValueError:  # InvalidVersion, or a release number past Python's int-from-string limit
        raise ConfigError(f"{version!r} is not a PEP 440 version", hint="e.g. 0.19.8 or 2.5.1.post1") from None
    return str(Version(f"{public}+{label}"))
