"""Can a wheel's shared objects load on the node? Read from their ELF (pyelftools), before anything is installed.

For each ``.so`` in a wheel, against the node's userspace (this host, or a root folder: a chroot, an image's root
file system) and the target environment's torch:

- every library it needs (``DT_NEEDED``) is found: beside it in the wheel, through its RUNPATH/RPATH, in torch's
  ``lib/``, in the node's library folders (``ld.so.conf`` included) or, on this host, ``LD_LIBRARY_PATH``;
- every symbol version it needs (``GLIBC_2.38``, ``GLIBCXX_3.4.32``, ``CXXABI_1.3.15`` ...) is defined by the
  library the node has under that name;
- every symbol it takes from torch (``c10::``, ``at::``, ``torch::``) is defined by torch's libraries here: a
  wheel built against another torch, or the other ``_GLIBCXX_USE_CXX11_ABI``, fails here as it would at import.

What this cannot see: libraries a site module would add to ``LD_LIBRARY_PATH`` later (load it before
``porter install``), and anything that fails only when the GPU runs the code.
"""

from __future__ import annotations

import functools
import glob
import io
import os
import re
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection
from elftools.elf.sections import SymbolTableSection

LIB_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib64", "lib", "usr/lib",
            "usr/local/lib", "opt/rocm/lib")
"""The node's library folders, relative to its root, before those ``etc/ld.so.conf`` adds."""

TORCH_SYMBOL = re.compile(r"^_ZN?K?(3c10|2at|5torch)")
"""Mangled names in torch's namespaces (c10::, at::, torch::): what a wheel takes from torch's libraries."""


@dataclass(frozen=True)
class ElfNeeds:
    """What one shared object asks of the loader, and what it defines (read of a node's library)."""

    needed: tuple[str, ...]
    runpath: tuple[str, ...]
    versions: dict[str, tuple[str, ...]]   # soname -> symbol versions needed from it
    torch_symbols: tuple[str, ...]          # undefined, non-weak symbols in torch's namespaces
    defines: frozenset[str] = frozenset()   # symbol versions it defines
    symbols: frozenset[str] = frozenset()   # global and weak symbols it defines


def read_needs(data: bytes | BinaryIO, name: str = "<so>") -> ElfNeeds | None:
    """The loader's view of one shared object (its bytes, or an open file); None when it is not an ELF file."""
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    try:
        elf = ELFFile(stream)
        needed: list[str] = []
        runpath: list[str] = []
        versions: dict[str, tuple[str, ...]] = {}
        torch: list[str] = []
        defines: set[str] = set()
        symbols: set[str] = set()
        for sec in elf.iter_sections():
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    kind = tag.entry.d_tag  # pyelftools names each tag's value after the tag
                    if kind == "DT_NEEDED":
                        needed.append(str(getattr(tag, "needed")))
                    elif kind in ("DT_RUNPATH", "DT_RPATH"):
                        runpath += str(getattr(tag, kind[3:].lower())).split(":")
            elif isinstance(sec, GNUVerNeedSection):
                for verneed, auxes in sec.iter_versions():
                    versions[str(verneed.name)] = tuple(str(a.name) for a in auxes)
            elif isinstance(sec, GNUVerDefSection):
                for _verdef, auxes in sec.iter_versions():
                    defines.update(a.name for a in auxes)
            elif isinstance(sec, SymbolTableSection) and sec.name == ".dynsym":
                syms = [(s.name, s["st_shndx"] == "SHN_UNDEF", s["st_info"]["bind"]) for s in sec.iter_symbols()]
                torch += [n for n, undef, bind in syms if undef and bind == "STB_GLOBAL" and TORCH_SYMBOL.match(n)]
                symbols.update(n for n, undef, bind in syms if not undef and bind in ("STB_GLOBAL", "STB_WEAK"))
    except (ELFError, ValueError) as exc:
        stream.seek(0)
        if stream.read(4) == b"\x7fELF":
            raise ValueError(f"{name}: unreadable ELF file: {exc}") from None
        return None
    return ElfNeeds(tuple(needed), tuple(p for p in runpath if p), versions, tuple(sorted(torch)), frozenset(defines),
                    frozenset(symbols))


@dataclass
class Userspace:
    """The node's libraries: ``root`` ("/" for this host) and torch's ``lib/`` folder of the target environment."""

    root: Path = Path("/")
    torch_lib: Path | None = None
    extra_dirs: tuple[Path, ...] = ()
    _libs: dict[Path, ElfNeeds] = field(default_factory=dict)

    @classmethod
    def of(cls, root: str | os.PathLike[str] = "/", torch_root: str = "") -> Userspace:
        root = Path(root)
        extra: tuple[Path, ...] = ()
        if root == Path("/"):  # what a loaded site module put there counts on this host
            extra = tuple(Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p)
        return cls(root, Path(torch_root) / "lib" if torch_root else None, extra)

    def describe(self) -> str:
        return "this host" if self.root == Path("/") else str(self.root)

    @functools.cached_property
    def dirs(self) -> list[Path]:
        torch = [self.torch_lib] if self.torch_lib is not None else []
        found = [*torch, *self.extra_dirs, *(self.root / d for d in LIB_DIRS), *self._conf_dirs()]
        return [d for d in dict.fromkeys(found) if d.is_dir()]

    def _conf_dirs(self) -> Iterator[Path]:
        seen: set[Path] = set()

        def read(conf: Path) -> Iterator[Path]:
            if conf in seen or not conf.is_file():
                return
            seen.add(conf)
            for line in conf.read_text(errors="replace").splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("include "):
                    for pattern in line.split()[1:]:
                        rel = pattern.lstrip("/") if pattern.startswith("/") else f"etc/{pattern}"
                        for inc in sorted(glob.glob(str(self.root / rel))):
                            yield from read(Path(inc))
                elif line.startswith("/"):
                    yield self.root / line.lstrip("/")

        yield from read(self.root / "etc" / "ld.so.conf")

    def find(self, soname: str, also: Iterable[Path] = ()) -> Path | None:
        return next((d / soname for d in (*also, *self.dirs) if (d / soname).exists()), None)

    def defined(self, path: Path) -> ElfNeeds:
        """What a library on the node defines (read once)."""
        path = path.resolve()
        if path not in self._libs:
            with open(path, "rb") as f:
                self._libs[path] = read_needs(f, str(path)) or ElfNeeds((), (), {}, ())
        return self._libs[path]


def _max_version(names: Iterable[str], prefix: str) -> str:
    same = sorted((n for n in names if re.fullmatch(re.escape(prefix) + r"\d[\d.]*", n)),
                  key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))
    return same[-1] if same else "none"


def check_shared_object(arc: str, needs: ElfNeeds, node: Userspace, in_wheel: set[str]) -> list[str]:
    """Why ``arc`` (a path in the wheel) would not load on ``node`` ([] when it would)."""
    out: list[str] = []
    brought = {PurePosixPath(n).name for n in in_wheel}
    runpath = [node.root / p.lstrip("/") for p in needs.runpath if not p.startswith("$ORIGIN")]
    found: dict[str, Path] = {}
    for soname in needs.needed:
        if soname in brought:
            continue  # the wheel brings it
        if (lib := node.find(soname, runpath)) is None:
            out.append(f"{arc} needs {soname}, which {node.describe()} does not have "
                       f"(looked in {', '.join(str(d) for d in node.dirs[:6])}{' ...' if len(node.dirs) > 6 else ''})")
        else:
            found[soname] = lib
    for soname, wanted in sorted(needs.versions.items()):
        if (lib := found.get(soname)) is None:
            continue
        have = node.defined(lib).defines
        if missing := [v for v in wanted if v not in have]:
            prefix = re.match(r"[A-Z_]+", missing[0])
            newest = _max_version(have, prefix.group(0) if prefix else missing[0])
            out.append(f"{arc} needs {', '.join(missing)} from {soname}; {node.describe()}'s ({lib}) has up to "
                       f"{newest}")
    torch_libs = [p for p in found.values() if node.torch_lib is not None and p.parent == node.torch_lib]
    if needs.torch_symbols and torch_libs:
        defined: set[str] = set().union(*(node.defined(lib).symbols for lib in torch_libs))
        if absent := [s for s in needs.torch_symbols if s not in defined]:
            abi = " (a std::string in it: the other _GLIBCXX_USE_CXX11_ABI)" if any(
                "__cxx11" in s or "basic_string" in s for s in absent[:3]) else ""
            out.append(f"{arc} needs {len(absent)} symbol(s) torch's libraries here ({node.torch_lib}) do not "
                       f"define, e.g. {absent[0]}{abi}: built against another torch")
    return out


def check_wheel_abi(wheel: Path, node: Userspace) -> list[str]:
    """Why the wheel's shared objects would not load on ``node`` ([] when they all would)."""
    out: list[str] = []
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        sos = [n for n in names if n.endswith(".so") or ".so." in PurePosixPath(n).name]
        for arc in sos:
            try:
                needs = read_needs(zf.read(arc), arc)
            except ValueError as exc:  # damaged: it cannot load anywhere
                out.append(str(exc))
                continue
            if needs is not None:
                out += check_shared_object(arc, needs, node, set(sos))
    return out
