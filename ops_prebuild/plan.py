"""The build plan: every compile and link command of every selected op, as one ninja graph.

Flags come from the toolchain profile (archs, wavefront, CPU ISA) and from the tree's own builders
(their op-specific args), never from the build host: ``-march=native`` and the host-detected SIMD
define are replaced by the profile's ISA, ROCm archs and wavefront come from the profile.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from porter.errors import ConfigError
from porter.ccache import CompilerCache
from porter import emulate
from porter.toolchain.archs import DEVICE_ONLY, HOST_ONLY
from porter.toolchain.profile import Toolchain
from ops_prebuild.catalogue import Catalogue, OpSpec
from ops_prebuild.measure import SUFFIX as COST_SUFFIX

_HOST_DETECTED = ("-march=", "-mcpu=native", "-mtune=native")
DEVICE_SUFFIXES = (".cu", ".hip")
CCACHE_STATS = "ccache-stats.log"
RSP_OVER = 64 * 1024
"""Object lists longer than this (bytes) go to a response file (Linux allows 128 KiB per argument,
2 MB in all; FlashAttention's CK build once failed to link with a 2.27 MB command line)."""


def host_args(args: tuple[str, ...], tc: Toolchain) -> list[str]:
    """A builder's host flags with the build host's -march guess replaced by the profile's ISA (what else a project
    guesses from the build host, its catalogue replaces: DeepSpeed's SIMD define)."""
    if tc.cpu_isa == "native":
        return [a for a in args if a != "-shared"]
    return [*(a for a in args if not a.startswith(_HOST_DETECTED) and a != "-shared"), f"-march={tc.cpu_isa}"]


PUBLISH = (sys.executable, "-m", "ops_prebuild.publish")
"""The wrapper that renames a whole output into place (:mod:`ops_prebuild.publish`)."""


@dataclass(frozen=True)
class Step:
    op: str
    kind: str                  # compile | pch | link
    argv: tuple[str, ...]
    output: str
    inputs: tuple[str, ...]
    wrapper: tuple[str, ...] = ()
    """What ninja puts before ``argv`` (the compile-only cost recorder); not part of the command."""
    rsp: tuple[str, ...] = ()
    """Link only: the objects that go in a response file (``argv`` names it as ``@file``), so a link of
    thousands of objects stays far below the kernel's 2 MB command-line limit."""
    arch: str = ""
    """Compile-only, a device unit of several archs: the one arch this step compiles the device code for
    (``--offload-device-only``); empty for the unit's host part and for every other step."""


@dataclass
class Plan:
    build_dir: Path
    toolchain: Toolchain
    steps: list[Step] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)   # op -> .so path
    env: dict[str, str] = field(default_factory=dict)       # env changes the commands need
    notes: list[str] = field(default_factory=list)
    compile_only: bool = False
    objects: dict[str, list[str]] = field(default_factory=dict)  # op -> its object files
    files: dict[str, str] = field(default_factory=dict)
    """Files the commands read that the plan generates (host path -> text), written before ninja runs."""

    def ninja(self, only: list[Step] | None = None, builddir: str = "", publish: bool = False) -> str:
        """The ninja file: one graph over all ops, so every core stays busy. ``only``: a part of the plan
        (a shard's compiles; the links, whose objects are then plain inputs); ``builddir``: where this
        file's ninja keeps its log, so shards running at once on a shared folder never share one;
        ``publish``: each object appears whole or not at all (:mod:`ops_prebuild.publish`), for a shard,
        whose objects another array's shard on the same folder may compile at the same time."""
        lines = ["# written by porter ops build; do not edit", "ninja_required_version = 1.3",
                 *([f"builddir = {builddir}"] if builddir else []), "",
                 "rule compile", "  command = $cmd", "  description = $desc", "  depfile = $out.d",
                 "  deps = gcc", "", "rule link", "  command = $cmd", "  description = $desc", "",
                 "rule link_rsp", "  command = $cmd", "  description = $desc", "  rspfile = $out.rsp",
                 "  rspfile_content = $rsp", ""]
        steps = self.steps if only is None else only
        for s in steps:
            rule = "link_rsp" if s.rsp else "compile" if s.kind == "pch" else s.kind
            lines.append(f"build {_esc(s.output)}: {rule} {' '.join(_esc(i) for i in s.inputs)}")
            whole = (*PUBLISH, s.output, "--") if publish and s.kind == "compile" else ()
            lines.append(f"  cmd = {shlex.join((*s.wrapper, *whole, *s.argv))}")
            lines.append(f"  desc = {s.kind.upper()} {s.op or 'shared'}: {os.path.basename(s.output)}")
            if s.rsp:
                lines.append(f"  rsp = {' '.join(shlex.quote(o).replace('$', '$$') for o in s.rsp)}")
        final = "compile" if self.compile_only else "link"  # what the whole plan makes: objects, or modules
        targets = [s.output for s in steps if only is not None or s.kind == final]
        lines += ["", f"default {' '.join(_esc(o) for o in targets)}"]
        return "\n".join(lines) + "\n"

    def shard(self, index: int, count: int) -> list[Step]:
        """The compile steps of shard ``index`` of ``count``, dealt round-robin in plan order (a stable
        split: every shard of the same plan names the same objects on every node), after the precompiled
        headers they read (each shard makes those it needs; see :mod:`ops_prebuild.publish`)."""
        if count < 1 or not 0 <= index < count:
            raise ConfigError(f"shard {index}/{count} does not exist", hint="shards are 0/N ... N-1/N")
        mine = [s for s in self.steps if s.kind == "compile"][index::count]
        needed = {i for s in mine for i in s.inputs}
        return [s for s in self.steps if s.kind == "pch" and s.output in needed] + mine

    def links(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "link"]

    def to_dict(self) -> dict[str, Any]:
        return {"build_dir": str(self.build_dir), "env": self.env, "notes": self.notes,
                "outputs": self.outputs, "compile_only": self.compile_only, "objects": self.objects,
                "steps": [{"op": s.op, "kind": s.kind, "argv": list(s.argv), "output": s.output,
                           **({"arch": s.arch} if s.arch else {})} for s in self.steps]}


def _esc(path: str) -> str:
    return path.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def cxx_standard(args: tuple[str, ...] | list[str], cat: Catalogue) -> list[str]:
    """torch's rule for extensions: when the flags name no -std, use the one its headers need
    (C++20 from torch 2.12 on, C++17 before)."""
    return [] if any(a.startswith("-std=") for a in args) else [
        "-std=c++20" if tuple(map(int, cat.torch.major_minor.split("."))) >= (2, 12) else "-std=c++17"]


Visible = Callable[[str | Path], str]
"""A host path -> the path the toolchain's programs see (the executor's mapping, staging included)."""


SYSTEM_INCLUDE_DIRS = ("/usr/include", "/usr/local/include")
"""Searched by every compiler by itself; named with -I they would come before libstdc++'s own wrappers."""


def _includes(op: OpSpec, cat: Catalogue, tree: Path, tc: Toolchain, v: Visible,
              extra: tuple[Path, ...] = ()) -> list[str]:
    """The op's include paths as the compiler sees them, then torch's as system headers. The tree's own are staged
    where needed; an absolute one under the toolchain's root (DeepSpeed's builders join the ROCM_HOME/CUDA_HOME
    porter gives them) is the toolchain's, never staged from the host; a system folder is left to the compiler."""
    inc: list[str] = []
    for p in map(Path, op.include_paths):
        if not (p.is_absolute() and tc.root and p.is_relative_to(tc.root)):
            inc.append(f"-I{v(tree / p)}")
        elif os.path.normpath(p) not in SYSTEM_INCLUDE_DIRS:
            inc.append(f"-I{p}")
    torch_dirs = [v(d) for d in extra if op.device] + [v(d) for d in cat.torch.include_dirs]
    if tc.kind == "rocm" and op.device and tc.root not in ("", "/", "/usr"):
        torch_dirs.append(f"{tc.root}/include")
    if tc.kind == "cuda":
        torch_dirs += [v(d) for d in cat.torch.cuda_include_dirs if v(d) not in torch_dirs]
        nv = Path(cat.torch.site_packages) / "nvidia"
        torch_dirs += [v(p) for p in sorted(nv.glob("cu*/include"))]  # the pip CUDA math headers
    return inc + [x for d in (*torch_dirs, v(cat.torch.python_include)) for x in ("-isystem", d)]


def make_plan(cat: Catalogue, tc: Toolchain, ops: list[OpSpec], build_dir: Path,
              *, sources: dict[str, dict[str, str]] | None = None, stage: bool = True,
              compile_only: bool = False, extra_includes: tuple[Path, ...] = (),
              cache: CompilerCache | None = None, pch: bool = False,
              debug: str = "full") -> Plan:
    """Plan every command. ``sources`` maps op -> {original: hipified path} for ROCm builds. Commands run through
    the toolchain's executor: every path in them is one its programs see (files outside a chroot are staged into
    it; ``stage=False`` only names where: dry runs write nothing).

    ``compile_only``: the same compiles, each recording its time and peak memory, and no link. ``extra_includes``
    come first on device ops' include path (the torch HIP view). ``cache``: every compile goes through ccache where
    the compiler runs (links are not cached), with base_dir at the build folder's grandparent (porter's work
    folder; a port's: the tree it builds in) and the compiler started in the build folder, so the cache key holds
    paths relative to it (a build folder beside the copy of the sources it compiles, as the one build flow's:
    the same for every release). ``pch``: GCC host compiles that differ only in their op's name share one
    precompiled torch header (:func:`_share_torch_header`); not with ``compile_only``, whose costs are per unit.
    ``debug``: what the builders' ``-g`` becomes (:data:`DEBUG_INFO`): ``full`` keeps it; ``lines`` (line tables
    and function names: backtraces keep file:line) and ``none`` compile faster and make smaller objects. nvcc's
    own ``-g`` stays."""
    if debug not in DEBUG_INFO:
        raise ConfigError(f"debug info {debug!r} is not one of {', '.join(DEBUG_INFO)}")
    tree = cat.source.tree
    ex = tc.executor

    within = (*cat.torch.include_dirs, *cat.torch.cuda_include_dirs)  # nested (csrc/api/include): staged as one

    def v(path: str | Path) -> str:
        return ex.visible(path, stage=stage, within=within)

    plan = Plan(build_dir, tc, env=dict(tc.env), compile_only=compile_only)
    measure = (sys.executable, "-m", "ops_prebuild.measure")
    if cache is not None:
        # a port builds inside the tree it ports: from its top, so two ports of one tree in different folders (or
        # with one patch more) hit each other's objects
        in_tree = tree in build_dir.parents
        plan.env.update(cache.env(tc, build_dir / CCACHE_STATS, base=tree if in_tree else build_dir.parent.parent))
    at = len(ex.prefix)
    shareable: list[tuple[int, list[str]]] = []  # (step index, argv before ccache) of GCC host compiles
    emulated: list[tuple[int, list[str]]] = []  # the same, of an emulated build's units (always shared)
    # ccache makes paths under base_dir relative to where the compiler runs: ninja starts it in the build
    # folder, and a chroot's own cwd is its root, so there it is changed back to the build folder
    cwd = ("env", "-C", ex.inside(build_dir)) if cache is not None and ex.kind == "chroot" else ()
    before = [*cwd, *cache.prefix()] if cache is not None else []  # what goes before the compiler
    for op in ops:
        hipified = (sources or {}).get(op.name)
        inc_root = build_dir / "hip" if hipified else tree
        odir = build_dir / op.name
        objs: list[str] = []
        for rel in op.sources:
            src = Path((hipified or {}).get(rel) or tree / rel)
            obj = odir / (rel.replace("/", "__") + ".o")
            dev = src.suffix in DEVICE_SUFFIXES and op.device
            for out, arch, offload in _parts(obj, dev and compile_only and tc.kind == "rocm", tc):
                argv = _compile_argv(op, cat, tc, v(src), v(out), dev, inc_root, v, extra_includes,
                                     arch=arch, offload=offload)
                if debug != "full" and not (dev and tc.kind == "cuda"):
                    argv = [DEBUG_INFO[debug] if a == "-g" else a for a in argv]
                if tc.kind == "emulated" and op.device and not compile_only:
                    emulated.append((len(plan.steps), argv))
                elif pch and not compile_only and not dev and _GCC.fullmatch(os.path.basename(argv[at])):
                    shareable.append((len(plan.steps), argv))
                argv = [*argv[:at], *before, *argv[at:]]
                wrapper = (*measure, f"{out}{COST_SUFFIX}", "--") if compile_only else ()
                plan.steps.append(Step(op.name, "compile", tuple(argv), str(out), (str(src),), wrapper, arch=arch))
                objs.append(str(out))
        plan.objects[op.name] = objs
        if not compile_only:
            _link(plan, op, cat, tc, objs, odir, v)
    if shareable:
        _share_torch_header(plan, shareable, v, before, at)
    if emulated:  # porter's prelude (torch's extension header and the HIP-on-CPU ones), parsed once per flag set
        own_dir = f"-I{v(emulate.INCLUDE_DIR)}"  # the op's own include folders: no header of the prelude is there
        _share_torch_header(plan, emulated, v, before, at, text=f"#include <{emulate.PRELUDE}>\n",
                            replaces=("-include", emulate.PRELUDE), ignore=lambda a: a.startswith("-I") and a != own_dir)
    if cache is not None and any(s.kind == "pch" for s in plan.steps):  # --pch's header too, not only the prelude's
        plan.env["CCACHE_SLOPPINESS"] = "pch_defines,time_macros"  # ccache's condition for caching PCH use
    return plan


def _link(plan: Plan, op: OpSpec, cat: Catalogue, tc: Toolchain, objs: list[str], odir: Path, v: Visible) -> None:
    """The op's link step into its module (after, on the emulated target, the step that defines the module's
    extern __shared__ arrays)."""
    if tc.kind == "emulated" and op.device:
        defs = odir / "porter-dynamic-shared.o"
        link_step = (sys.executable, "-m", "porter.emulate.shared", "--rev", emulate.revision(), "--lib",
                     v(cat.torch.library_dir), "--out", v(defs), "--", *tc.executor.argv(tc.compiler), "--",
                     *(v(o) for o in objs))
        plan.steps.append(Step(op.name, "compile", link_step, str(defs), tuple(objs)))
        objs = [*objs, str(defs)]
    so = odir / f"{op.leaf}{cat.torch.ext_suffix}"
    inside = [v(o) for o in objs]
    rsp: tuple[str, ...] = ()
    if sum(len(o) + 1 for o in inside) > RSP_OVER:
        rsp, inside = tuple(inside), [f"@{v(str(so) + '.rsp')}"]
    libs = ["-L" + v(cat.torch.library_dir), "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    linker = tc.compiler if tc.kind in ("cpu", "emulated") else tc.cxx
    if op.device and tc.kind == "cuda":
        libs += ["-lc10_cuda", "-ltorch_cuda"]
        nv = sorted((Path(cat.torch.site_packages) / "nvidia").glob("cu*/lib"))
        libs += [f"-L{v(p)}" for p in nv] + ([f"-L{tc.root}/lib64"] if tc.root else []) + ["-lcudart"]
    if op.device and tc.kind == "rocm":
        linker = tc.compiler
        libs += ["-lc10_hip", "-ltorch_hip", "-lamdhip64"] + ([f"-L{tc.root}/lib"] if tc.root else [])
    openmp = ["-fopenmp"] if "-fopenmp" in op.cxx_args and "-fopenmp" not in op.extra_ldflags else []
    argv = tc.executor.argv(linker, "-shared", *inside, *op.extra_ldflags, *openmp,
                            *(f"-l{lib}" for lib in op.libraries), *libs, "-o", v(so))
    plan.steps.append(Step(op.name, "link", tuple(argv), str(so), tuple(objs), rsp=rsp))
    plan.outputs[op.name] = str(so)


def _parts(obj: Path, split: bool, tc: Toolchain) -> list[tuple[Path, str, str]]:
    """The compile steps of one unit: ``(output, arch, offload flag)``. A compile-only HIP unit of several archs
    is compiled as its host part (``--offload-host-only``) and one device part per arch
    (``--offload-device-only``, that arch's offload bundle): the same compiler work as one call, but each arch's
    verdict is its own, a stopped run keeps the archs it finished, and the archs of one heavy unit compile on as
    many cores. Anything else is one step."""
    if not split or len(tc.targets) < 2:
        return [(obj, "", "")]
    stem = obj.name[:-len(".o")]
    return [(obj.with_name(f"{stem}.host.o"), "", HOST_ONLY),
            *((obj.with_name(f"{stem}.{t.name}.o"), t.name, DEVICE_ONLY) for t in tc.targets)]


DEBUG_INFO = {"full": "-g", "lines": "-g1", "none": "-g0"}
"""``--debug-info``: what a builder's ``-g`` becomes in host and HIP compiles."""
_GCC = re.compile(r"(.*-)?g\+\+(-[0-9.]+)?")
_TAIL = 7  # -MMD -MF DEP -c SRC -o OBJ: what differs per unit besides the op's name
PCH_HEADER = "torch_ext.h"


def _share_torch_header(plan: Plan, units: list[tuple[int, list[str]]], v: Visible, cache: list[str],
                        at: int, *, text: str = "#include <torch/extension.h>\n",
                        replaces: tuple[str, str] | None = None, ignore: Callable[[str], bool] | None = None) -> None:
    """Most of a host unit's time is GCC parsing torch's headers (about half, with DeepSpeed's -O3 -g).
    Units whose flags are the same but for ``-DTORCH_EXTENSION_NAME`` (which no torch header reads, so a
    header compiled without it serves every op) share one precompiled ``<torch/extension.h>``, made once
    per build and taken in by ``-include`` before the unit's own text (whose include of it is then a
    no-op). Groups of one unit are left alone: a header costs about a unit. ``text``: what the header includes;
    ``replaces``: a ``-include X`` pair of the units that the header stands in for (it must come first); ``ignore``:
    flags that may differ between the units of one group (and that the header is made without)."""
    def without(argv: Sequence[str]) -> list[str]:  # less the ``replaces`` pair: the header includes it itself
        k = next((j for j in range(len(argv) - 1) if (argv[j], argv[j + 1]) == replaces), None)
        return list(argv) if k is None else [*argv[:k], *argv[k + 2:]]

    groups: dict[tuple[str, ...], list[int]] = {}
    for index, argv in units:
        key = tuple(a for a in argv[:-_TAIL] if not a.startswith("-DTORCH_EXTENSION_NAME=")
                    and not (ignore is not None and ignore(a)))
        groups.setdefault(key, []).append(index)
    for key, indexes in groups.items():
        if len(indexes) < 2:
            continue
        # named by the flags as they are in any build folder: the same name (and, through ccache's base_dir,
        # the same cache key) for the next release's build
        where = v(plan.build_dir)
        named = [a.replace(where, "@build") for a in key]
        folder = plan.build_dir / "pch" / hashlib.sha256(json.dumps(named).encode()).hexdigest()[:12]
        header, gch = folder / PCH_HEADER, folder / (PCH_HEADER + ".gch")
        plan.files[str(header)] = ("// written by porter ops build: torch's extension header, precompiled once "
                                   "for the units below\n" + text)
        own = without(key)
        # -c: after a unit's own "-x c++" (the emulated target's device units), GCC's driver takes a second -x
        # without -c for a link; ccache adds -c itself, so only a build without ccache failed
        argv = [*own[:at], *cache, *own[at:], "-c", "-x", "c++-header", v(header), "-MMD", "-MF", f"{v(gch)}.d",
                "-o", v(gch)]
        plan.steps.append(Step("", "pch", tuple(argv), str(gch), (str(header),), (*PUBLISH, str(gch), "--")))
        for i in indexes:
            s = plan.steps[i]
            argv = without(s.argv)
            cut = len(argv) - _TAIL
            plan.steps[i] = replace(s, argv=(*argv[:cut], "-Winvalid-pch", "-include", v(header), *argv[cut:]),
                                    inputs=(*s.inputs, str(gch)))


_HIP_HALF = ("-DHIPBLAS_V2", "-DCUDA_HAS_FP16=1", "-D__HIP_NO_HALF_OPERATORS__=1", "-D__HIP_NO_HALF_CONVERSIONS__=1")
"""torch's ROCm extension defines after the platform's (a device compile's, the emulated target's too)."""


def _compile_argv(op: OpSpec, cat: Catalogue, tc: Toolchain, src: str, obj: str, device: bool,
                  tree: Path, v: Visible, extra: tuple[Path, ...] = (), *, arch: str = "",
                  offload: str = "") -> list[str]:
    common = [f"-DTORCH_EXTENSION_NAME={op.leaf}", "-DTORCH_API_INCLUDE_EXTENSION_H",
              f"-D_GLIBCXX_USE_CXX11_ABI={int(cat.torch.cxx11_abi)}", "-UC10_USE_GLOG",
              *_includes(op, cat, tree, tc, v, extra), *tc.cflags, *(f"-D{d}" for d in tc.defines)]
    half = ["-DBF16_AVAILABLE"] if op.bf16 else []
    cxx, dep = tc.compiler, ("-MMD", "-MF")
    # a unit of a GPU op for porter's emulated HIP target: the host compiler, ROCm's defines as a device compile has
    # them (the wavefront the profile's), porter's HIP-on-CPU headers and prelude
    emulated = tc.kind == "emulated" and op.device
    rocm = ["-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", f"-DROCM_WAVEFRONT_SIZE={tc.wavefront}", *half]
    if device and tc.kind == "cuda":
        march = [a for a in host_args(op.cxx_args, tc) if a.startswith("-march=")]
        # torch's own CUDA extension flags first, so the builder's -U flags can undo them, as in torch
        flags = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
                 "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", *op.nvcc_args,
                 *cxx_standard(op.nvcc_args, cat), *half, "--compiler-options", "-fPIC",
                 *(x for m in march for x in ("--compiler-options", m))]
        dep = ("--generate-dependencies-with-compile", "--dependency-output")
    elif device and emulated:  # compiled as C++ with the op's device flags less those only a GPU compiler takes
        flags = ["-x", "c++", "-fPIC", *_HIP_HALF, *emulate.device_flags(op.nvcc_args),
                 *cxx_standard(op.nvcc_args, cat), f"-march={tc.cpu_isa}", *rocm]
    elif device and tc.kind == "rocm":
        # torch's own ROCm extension flags first, so the builder's -U flags can undo them, as in torch
        flags = ["-fPIC", "-D__HIP_PLATFORM_AMD__=1", "-DUSE_ROCM=1", *_HIP_HALF, *op.nvcc_args,
                 *cxx_standard(op.nvcc_args, cat), f"-DROCM_WAVEFRONT_SIZE={tc.wavefront}", *half, "-fno-gpu-rdc",
                 *(f"--offload-arch={t.spec}" for t in tc.targets if not arch or t.name == arch),
                 *([offload] if offload else [])]
    else:
        host = {"rocm": rocm, "emulated": rocm, "cuda": half}.get(tc.kind, []) if op.device else []
        # a GPU op's host units go through the profile's hip_cxx (ROCm 7's bf16 header is clang-only), except
        # OpenMP ones: torch's OpenMP is GCC's (libgomp), and clang's -fopenmp wants LLVM's omp.h and runtime
        hip_host = tc.kind == "rocm" and op.device and "-fopenmp" not in op.cxx_args
        cxx = tc.compiler if tc.kind == "cpu" or emulated else (tc.hip_cxx or tc.cxx) if hip_host else tc.cxx
        flags = [*host_args(op.cxx_args, tc), *cxx_standard(op.cxx_args, cat), "-fPIC", *host]
    if emulated:
        # after the op's own -O: kernels type-pun freely (float4 loads of half data), and no host optimisation may
        # change what such a load reads; -O1 also compiles the heavy template code in half the time of -O3
        flags += ["-O1", "-fno-strict-aliasing",
                  *(f"-I{v(emulate.INCLUDE_DIR)}" if a == f"-I{emulate.INCLUDE_DIR}" else a
                    for a in emulate.compile_flags(tc.wavefront or 64))]
    return tc.executor.argv(cxx, *flags, *common, *dep, f"{obj}.d", "-c", src, "-o", obj)
