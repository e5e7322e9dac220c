"""Dynamic shared memory for an emulated module: a link-time step of the emulated HIP target.

On the emulated target ``__shared__`` is ``thread_local`` (every GPU thread of a block is a fiber on one CPU
thread, so a thread-local is exactly one copy per block in turn), which keeps both spellings of HIP's shared memory
valid C++: ``__shared__ float s[32];`` in a kernel is a block-scope thread-local (static), and ``extern __shared__
float buf[];`` declares an array defined nowhere: the launch's dynamic shared memory. This step reads the module's
objects, finds those arrays (thread-local symbols the objects use but neither they nor torch's libraries define)
and writes one C++ unit that defines each of them with room for the most dynamic shared memory a launch may ask
(:data:`CAPACITY`, checked at launch), then compiles it with the unit's compiler.

    python -m porter.emulate.shared [--rev R] --lib DIR --out DEFS.o -- CXX [FLAGS...] -- OBJ...
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

CAPACITY = 160 * 1024
"""Bytes of dynamic shared memory each such array has: the LDS of an MI355X (gfx950); a launch that asks more is an
error. Keep equal to porter_emu::kDynamicShared in runtime.h."""
TORCH_LIBS = ("libc10.so", "libtorch_cpu.so", "libtorch_python.so", "libtorch.so")


def thread_locals(path: Path, *, section: str) -> tuple[set[str], set[str]]:
    """(used but not defined, defined) thread-local symbols of an ELF file's ``section``."""
    used: set[str] = set()
    defined: set[str] = set()
    with path.open("rb") as f:
        table = ELFFile(f).get_section_by_name(section)
        for sym in table.iter_symbols() if isinstance(table, SymbolTableSection) else ():
            if sym["st_info"]["type"] != "STT_TLS" or not sym.name:
                continue
            (used if sym["st_shndx"] == "SHN_UNDEF" else defined).add(sym.name)
    return used, defined


def undefined(path: Path) -> set[str]:
    with path.open("rb") as f:
        table = ELFFile(f).get_section_by_name(".symtab")
        symbols = table.iter_symbols() if isinstance(table, SymbolTableSection) else ()
        return {s.name for s in symbols if s["st_shndx"] == "SHN_UNDEF"}


def extern_shared(objects: list[Path], libs: list[Path]) -> list[str]:
    used: set[str] = set()
    defined: set[str] = set()
    for obj in objects:
        u, d = thread_locals(obj, section=".symtab")
        used |= u
        defined |= d
    for lib in libs:
        defined |= thread_locals(lib, section=".dynsym")[1]
    return sorted(used - defined)


def init_function(name: str) -> str:
    """The Itanium C++ ABI's name of a thread-local's initialisation function (``_ZTH``)."""
    return "_ZTH" + (name[2:] if name.startswith("_Z") else f"{len(name)}{name}")


def unit(names: list[str], wanted: set[str]) -> str:
    """The C++ unit that defines ``names``, and the thread-local initialisers of theirs that the objects call
    (``wanted``: what they leave undefined). GCC calls an 'extern thread_local' variable's initialiser (``_ZTH``), and
    one of an anonymous namespace through its unit's ``__tls_init``; these arrays need no initialising, so those are
    empty functions."""
    lines = ["// written by porter (porter.emulate.shared): the dynamic shared memory of this module's kernels, one",
             "// array per 'extern __shared__' name, each as large as a launch may ask", ""]
    inits = [f for f in ("__tls_init", *(init_function(n) for n in names)) if f in wanted]
    for i, name in enumerate(names):
        lines.append(f'alignas(64) __thread unsigned char porter_dynamic_shared_{i}[{CAPACITY}] __asm__("{name}");')
    for i, init in enumerate(inits):
        lines += [f'extern "C" void porter_no_init_{i}() __asm__("{init}");', f'extern "C" void porter_no_init_{i}() {{}}']
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv.count("--") < 2:
        print("usage: python -m porter.emulate.shared [--rev R] --lib DIR --out DEFS.o -- CXX [FLAGS...] -- OBJ...",
              file=sys.stderr)
        return 2
    first = argv.index("--")
    second = argv.index("--", first + 1)
    ap = argparse.ArgumentParser(prog="python -m porter.emulate.shared")
    ap.add_argument("--lib", type=Path, required=True, help="torch's library folder")
    ap.add_argument("--rev", default="", help="porter.emulate.revision(): changes the command when porter's do")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv[:first])
    compiler, objects = argv[first + 1:second], [Path(o) for o in argv[second + 1:]]
    libs = [args.lib / name for name in TORCH_LIBS if (args.lib / name).is_file()]
    names = extern_shared(objects, libs)
    src = args.out.with_suffix(".cpp")
    wanted = set().union(*(undefined(o) for o in objects)) if names else set()
    src.write_text(unit(names, wanted))
    args.out.with_name(args.out.name + ".d").write_text(f"{args.out}: \\\n  {src}\n")
    return subprocess.run([*compiler, "-fPIC", "-c", str(src), "-o", str(args.out)]).returncode


if __name__ == "__main__":
    sys.exit(main())
