"""The ELF / offload-bundle reader, on byte strings built here (the integration tier uses real .so files)."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from porter.codeobjects import BUNDLE_MAGIC, archs_in, read_code_objects
from porter.errors import ConfigError


def bundle(ids: list[str], payload: bytes = b"\x7fELFcode") -> bytes:
    header = BUNDLE_MAGIC + struct.pack("<Q", len(ids))
    entries_len = sum(24 + len(i) for i in ids)
    body, table, offset = b"", b"", len(header) + entries_len
    for ident in ids:
        data = b"" if ident.startswith("host") else payload
        table += struct.pack("<QQQ", offset, len(data), len(ident)) + ident.encode()
        body += data
        offset += len(data)
    return header + table + body


def elf_with_section(name: str, content: bytes) -> bytes:
    """A minimal 64-bit ELF: header, one named section, a section-name string table."""
    shstrtab = b"\0" + name.encode() + b"\0.shstrtab\0"
    data_off = 64
    str_off = data_off + len(content)
    sh_off = str_off + len(shstrtab)
    ehdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    ehdr += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 2)
    null = bytes(64)
    sec = struct.pack("<IIQQQQIIQQ", 1, 1, 0, 0, data_off, len(content), 0, 0, 1, 0)
    strsec = struct.pack("<IIQQQQIIQQ", 2 + len(name), 3, 0, 0, str_off, len(shstrtab), 0, 0, 1, 0)
    return ehdr + content + shstrtab + null + sec + strsec


def test_reads_targets_from_a_hip_fatbin(tmp_path: Path) -> None:
    blob = bundle(["host-x86_64-unknown-linux-gnu-", "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-",
                   "hipv4-amdgcn-amd-amdhsa--gfx908"])
    so = tmp_path / "lib.so"
    so.write_bytes(elf_with_section(".hip_fatbin", blob + bytes(100) + bundle(["hipv4-amdgcn-amd-amdhsa--gfx942"])))
    targets = [c.target for c in read_code_objects(so)]
    assert targets == ["gfx90a:xnack-", "gfx908", "gfx942"]
    assert archs_in(so) == ["gfx908", "gfx90a", "gfx942"]


def test_reads_zlib_compressed_bundles(tmp_path: Path) -> None:
    inner = bundle(["hipv4-amdgcn-amd-amdhsa--gfx942"])
    packed = zlib.compress(inner)
    ccob = b"CCOB" + struct.pack("<HHIIQ", 2, 0, 24 + len(packed), len(inner), 0) + packed
    so = tmp_path / "lib.so"
    so.write_bytes(elf_with_section(".hip_fatbin", ccob))
    assert archs_in(so) == ["gfx942"]


def test_reads_cuda_fatbin(tmp_path: Path) -> None:
    entry = struct.pack("<HHIQIIHHIII", 2, 0, 64, 8, 0, 0, 0, 8, 90, 0, 0).ljust(64, b"\0") + b"cubin..."
    fat = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entry)) + entry
    so = tmp_path / "lib.so"
    so.write_bytes(elf_with_section(".nv_fatbin", fat))
    objs = read_code_objects(so)
    assert [(c.target, c.kind) for c in objs] == [("sm_90", "sass")]


def test_cpu_only_elf_has_no_code_objects(tmp_path: Path) -> None:
    so = tmp_path / "lib.so"
    so.write_bytes(elf_with_section(".text", b"\x90" * 16))
    assert read_code_objects(so) == []


def test_not_an_elf(tmp_path: Path) -> None:
    bad = tmp_path / "x.so"
    bad.write_bytes(b"not elf at all" * 10)
    with pytest.raises(ConfigError, match="is not an ELF file"):
        read_code_objects(bad)
