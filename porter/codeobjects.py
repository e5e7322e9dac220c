"""Read which GPU code objects a shared object carries, straight from its ELF sections.

No ROCm or CUDA tool is needed (compute nodes may have none):
- AMD: the ``.hip_fatbin`` section holds clang offload bundles (``__CLANG_OFFLOAD_BUNDLE__``, or
  compressed ``CCOB`` bundles from newer ROCm); each entry's id names the target,
  e.g. ``hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-``.
- NVIDIA: the ``.nv_fatbin`` section holds fat binaries (magic ``0xBA55ED50``); each entry records
  its kind (PTX or SASS/cubin) and ``sm_XX``.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass

from porter.errors import ConfigError

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
COMPRESSED_MAGIC = b"CCOB"
NV_FATBIN_MAGIC = 0xBA55ED50
_MAGIC = re.compile(re.escape(BUNDLE_MAGIC) + b"|" + COMPRESSED_MAGIC)
_AMD_ID = re.compile(r"amdgcn-amd-amdhsa-[^-]*-(gfx[0-9a-f]+(?::[a-z]+[+-])*)")


@dataclass(frozen=True)
class CodeObject:
    vendor: str     # amd | nvidia
    target: str     # gfx90a:xnack- | sm_90
    kind: str       # hsaco | sass | ptx
    size: int

    @property
    def arch(self) -> str:
        return self.target.split(":")[0]


def _amd_bundles(blob: bytes) -> list[CodeObject]:
    found: list[CodeObject] = []
    pos = 0
    while pos < len(blob):
        magic = _MAGIC.search(blob, pos)
        if magic is None:
            break
        start = magic.start()
        if magic.group() == COMPRESSED_MAGIC:
            inner, consumed = _decompress(blob, start)
            found += _amd_bundles(inner)
            pos = start + consumed
            continue
        count, = struct.unpack_from("<Q", blob, start + len(BUNDLE_MAGIC))
        cursor = start + len(BUNDLE_MAGIC) + 8
        end = cursor
        for _ in range(count):
            off, size, id_len = struct.unpack_from("<QQQ", blob, cursor)
            ident = blob[cursor + 24:cursor + 24 + id_len].decode(errors="replace")
            cursor += 24 + id_len
            end = max(end, start + off + size)
            m = _AMD_ID.search(ident)
            if m:
                found.append(CodeObject("amd", m.group(1), "hsaco", size))
        pos = max(end, cursor)
    return found


def _decompress(blob: bytes, start: int) -> tuple[bytes, int]:
    version, method = struct.unpack_from("<HH", blob, start + 4)
    total = None if version == 1 else struct.unpack_from("<I", blob, start + 8)[0]  # v1 has no total size
    header = 24
    payload = blob[start + header:start + total] if total else blob[start + header:]
    if method == 0:  # zlib
        d = zlib.decompressobj()
        inner = d.decompress(payload)
        return inner, total or header + len(payload) - len(d.unused_data)
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigError("compressed (zstd) offload bundle found; reading it needs the 'zstandard' module",
                          hint="pip install zstandard, or build without --offload-compress") from None
    return zstandard.ZstdDecompressor().decompressobj().decompress(payload), total or len(blob) - start


def _nv_fatbins(blob: bytes) -> list[CodeObject]:
    found: list[CodeObject] = []
    pos = 0
    while pos + 16 <= len(blob):
        magic, _ver, hsize, fat_size = struct.unpack_from("<IHHQ", blob, pos)
        if magic != NV_FATBIN_MAGIC:
            pos += 8  # fat binaries are 8-byte aligned inside the section
            continue
        cursor, end = pos + hsize, pos + hsize + fat_size
        while cursor + 32 <= end:
            kind, _u, ehsize, size = struct.unpack_from("<HHIQ", blob, cursor)
            arch, = struct.unpack_from("<I", blob, cursor + 28)
            if ehsize == 0:
                break
            found.append(CodeObject("nvidia", f"sm_{arch}", {1: "ptx", 2: "sass"}.get(kind, str(kind)), size))
            cursor += ehsize + size
        pos = end
    return found


def read_code_objects(path: str | os.PathLike[str]) -> list[CodeObject]:
    """All GPU code objects embedded in an ELF shared object or object (empty for CPU-only code), or held by an
    offload bundle file (what clang writes for ``--offload-device-only``)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    readers = {".hip_fatbin": _amd_bundles, ".nv_fatbin": _nv_fatbins}
    with open(path, "rb") as f:
        if f.read(len(BUNDLE_MAGIC)).startswith((BUNDLE_MAGIC, COMPRESSED_MAGIC)):
            f.seek(0)
            return _amd_bundles(f.read())
        f.seek(0)
        try:
            sections = [sec for sec in ELFFile(f).iter_sections() if sec.name in readers]
            return [o for sec in sections for o in readers[sec.name](sec.data())]
        except ELFError as exc:
            raise ConfigError(f"{path} is not an ELF file pyelftools can read ({exc})") from None


def archs_in(path: str | os.PathLike[str]) -> list[str]:
    """Sorted distinct device archs (``gfx90a``, ``sm_90``) with real code (PTX counted separately)."""
    return sorted({c.arch for c in read_code_objects(path) if c.kind != "ptx"})


def registers_device_code(path: str | os.PathLike[str]) -> bool:
    """Whether a HIP unit's host object registers device code (its module constructor calls
    ``__hipRegisterFatBinary``): false for a unit with no kernel and no device variable in it."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(path, "rb") as f:
        return any(sym.name == "__hipRegisterFatBinary" for sec in ELFFile(f).iter_sections()
                   if isinstance(sec, SymbolTableSection) for sym in sec.iter_symbols())
