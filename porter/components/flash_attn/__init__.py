"""FlashAttention 2 for ROCm: recognise the tree and plan a wheel for the CK or the Triton backend.

The knobs of flash-attention's setup.py that matter on ROCm, all set explicitly by porter (a stray
value in the caller's shell would silently change the build, so the others are unset):

- ``BUILD_TARGET=rocm``: otherwise "auto" asks the installed torch.
- ``GPU_ARCHS``: ``;``-separated; upstream's default ``native`` asks the build host's GPU, so porter
  always passes the profile's archs, checked first against the list the tree's setup.py accepts.
- ``FLASH_ATTENTION_FORCE_BUILD=TRUE``: otherwise setup.py first tries to download a prebuilt wheel.
- ``FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE``: the Triton backend; no C++ extension is compiled
  (``FLASH_ATTENTION_SKIP_CK_BUILD`` defaults to TRUE with it), the wheel is pure Python.
- ``FLASH_ATTENTION_SKIP_CUDA_BUILD``: unset (TRUE gives an empty wheel).
- ``MAX_JOBS``: compile jobs; CK units take GBs each and there are thousands of generated sources.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING, Any

from packaging.version import InvalidVersion, Version

from porter.artifacts import labels
from porter.components import jit, static
from porter.components.base import FromDriver
from ops_prebuild.catalogue import OpSpec
from porter.errors import ConfigError
from porter.wheels.base import (BACKENDS, SAMPLE_MODES, GiB, BuildPlan, Expectation, KernelSet, Machine, SourceInfo,
                                WheelRequest, choose_jobs, drop_flags, per_job)

if TYPE_CHECKING:
    from porter.wheels.base import KernelContext

CK_DIR = "csrc/composable_kernel"
CK_GENERATOR = f"{CK_DIR}/example/ck_tile/01_fmha/generate.py"
FRONTEND = "flash_attn_2_cuda"
"""The op of the extension's own TUs (csrc/flash_attn_ck and the generated API dispatchers); the
generated CK kernel instances are one op each."""
EXTENSION = "flash_attn_2_cuda"
TRITON_PACKAGE = "flash_attn/flash_attn_triton_amd"
EARLY_INLINE = "-amdgpu-early-inline-all=true"
"""An ``-mllvm`` flag of upstream's (HIP > 6.2): every function inlined before LLVM simplifies any; the CK
backward instances then take hours per arch with upstream LLVM 22 (Debian's clang)."""

# What each generator direction writes: the kinds ("families") of CK instances, which differ in cost.
_FAMILIES: dict[str, tuple[str, ...]] = {
    "fwd": ("fmha_fwd",), "fwd_splitkv": ("fmha_fwd_splitkv", "fmha_fwd_splitkv_combine"),
    "fwd_appendkv": ("fmha_fwd_appendkv",), "bwd": ("fmha_bwd", "fmha_bwd_convert_dq", "fmha_bwd_dot_do_o"),
}
_FAMILY = re.compile(r"^(fmha_[a-z0-9_]+?)_d\d+")


_STRATUM = re.compile(r"^(fmha_[a-z0-9_]+?)_d(\d+)_([a-z]+\d+)_")


def ck_stratum(unit: str) -> str:
    """What ``--sample`` takes N of: a CK unit's family, head-dim bucket and dtype (``fmha_bwd_d128_bf16``), so a
    sample covers every kind of kernel at every size and type the build generates; else its family."""
    m = _STRATUM.match(unit)
    return f"{m.group(1)}_d{m.group(2)}_{m.group(3)}" if m else ck_family(unit)


# Families from the cheapest to compile to the dearest, as measured with Debian's clang 22 (per arch): a bwd
# dot_do_o or convert_dq unit under a minute and a half, an appendkv unit about two, a bwd unit over an hour.
_CHEAPEST_FIRST = ("fmha_bwd_dot_do_o", "fmha_bwd_convert_dq", "fmha_fwd_splitkv_combine", "fmha_fwd_appendkv",
                   "fmha_fwd_splitkv", "fmha_fwd", "fmha_bwd")


def ck_cost_rank(unit: str) -> tuple[int, int, int]:
    """How dear a CK unit is to compile, for ordering only: its family (:data:`_CHEAPEST_FIRST`), then its head dim,
    then the length of its name (each tile and feature the instance has is a token of it)."""
    fam, m = ck_family(unit), _STRATUM.match(unit)
    rank = _CHEAPEST_FIRST.index(fam) if fam in _CHEAPEST_FIRST else len(_CHEAPEST_FIRST)
    return rank, int(m.group(2)) if m else 0, len(unit)


def ck_cover(units: Sequence[str], mode: str) -> list[str]:
    """A covering sample of CK units (:data:`SAMPLE_MODES`), greedy: the unit that covers most of what is still
    uncovered, the cheapest (:func:`ck_cost_rank`) and then the first in the given order on a tie, until everything
    the units hold is covered. Units without a head dim and dtype in their name cover their family only."""
    def needs(unit: str) -> set[tuple[str, ...]]:
        m = _STRATUM.match(unit)
        if not m:
            return {("family", ck_family(unit))}
        fam, hdim, dtype = m.group(1), m.group(2), m.group(3)
        return ({("family", fam), ("hdim", hdim), ("dtype", dtype)} if mode == "cover" else
                {("family", fam), ("family-hdim", fam, hdim), ("family-dtype", fam, dtype)})

    if mode not in SAMPLE_MODES:
        raise ConfigError(f"unknown sample mode {mode!r}", hint=f"a count, or one of {', '.join(SAMPLE_MODES)}")
    covers = {u: needs(u) for u in units}
    cost = {u: ck_cost_rank(u) for u in units}
    left = set().union(*covers.values()) if covers else set()
    chosen: list[str] = []
    while left:
        best = min(units, key=lambda u: (-len(covers[u] & left), cost[u]))  # min keeps the first of equals
        chosen.append(best)
        left -= covers[best]
    return sorted(chosen, key={u: i for i, u in enumerate(units)}.__getitem__)


def ck_family(unit: str) -> str:
    """The kind of a CK unit: ``fmha_fwd_splitkv_d128_...`` -> ``fmha_fwd_splitkv``; the extension's own
    sources and the API dispatchers -> :data:`FRONTEND`."""
    m = _FAMILY.match(unit)
    return m.group(1) if m else FRONTEND


def ck_families(directions: tuple[str, ...]) -> tuple[str, ...]:
    """The unit families a CK build with these generator directions compiles (the frontend included)."""
    return (*dict.fromkeys(f for d in directions for f in _FAMILIES.get(d, (f"fmha_{d}",))), FRONTEND)


# Peak resident memory of one hipcc job on a generated CK fmha unit (several GiB; upstream budgets 9 GiB
# per job for its CUDA build with 4 nvcc threads). The Triton backend compiles nothing.
PER_JOB_CK = 6 * GiB
PER_JOB_TRITON = 1 * GiB

# The GPU_ARCHS check of releases whose setup.py porter cannot read (a list literal is read first).
_ALLOWED_BY_VERSION: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("2.7.4", ("gfx90a", "gfx942", "gfx950")),
    ("0", ("gfx90a", "gfx940", "gfx941", "gfx942")),
)


class FlashAttnDriver:
    name = "flash-attn"
    title = "FlashAttention"
    # pip download runs setup.py for metadata; without this it would try to compile
    sdist_env: Mapping[str, str] = {"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"}

    def detect(self, root: Path) -> SourceInfo | None:
        setup_py = root / "setup.py"
        init = root / "flash_attn" / "__init__.py"
        if not (setup_py.is_file() and init.is_file()):
            return None
        m = re.search(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", init.read_text(errors="replace"), re.MULTILINE)
        if not m:
            raise ConfigError(f"{init} has no __version__ = \"...\" line", hint="is this a complete flash-attention tree?")
        version = m.group(1)
        text = setup_py.read_text(errors="replace")
        if "BUILD_TARGET" not in text:
            raise ConfigError(f"flash-attn {version} at {root} has no ROCm build (its setup.py has no BUILD_TARGET)",
                              hint="use flash-attn 2.6 or newer (the PyPI sdist), or ROCm's fork")
        return SourceInfo("flash-attn", version, root, regime="env", allowed_archs=allowed_archs(text, version),
                          backends=("ck", "triton") if "FLASH_ATTENTION_TRITON_AMD_ENABLE" in text else ("ck",))

    def plan(self, info: SourceInfo, request: WheelRequest, machine: Machine) -> BuildPlan:
        tc = request.toolchain
        backend = request.backend
        if backend not in BACKENDS:
            raise ConfigError(f"unknown flash-attn backend {backend!r}", hint=f"use one of: {', '.join(BACKENDS)}")
        if request.regime not in (None, "env"):
            raise ConfigError(f"flash-attn has one build regime (env); {request.regime!r} does not apply")
        if tc.kind != "rocm":
            raise ConfigError(f"toolchain {tc.name!r} is a {tc.kind} profile; porter builds flash-attn for ROCm only",
                              hint="pick a rocm profile, e.g. --toolchain mi300x or --toolchain frontier")
        if backend not in info.backends:
            raise ConfigError(f"flash-attn {info.version} has no Triton backend for AMD "
                              "(setup.py lacks FLASH_ATTENTION_TRITON_AMD_ENABLE)",
                              hint="use --backend ck, or flash-attn 2.7.3 or newer")
        archs = tc.arch_names
        outside = [a for a in archs if a not in info.allowed_archs]
        # the GPU_ARCHS check is upstream's CK build's own; the Triton backend compiles nothing here
        if outside and backend == "ck":
            raise ConfigError(f"flash-attn {info.version} does not support {', '.join(outside)} "
                              f"(its setup.py accepts GPU_ARCHS {', '.join(info.allowed_archs)})",
                              hint="pick a profile or --arch from that list; upstream would stop the build "
                                   "with an assertion after codegen")
        if backend == "ck" and not (info.tree / CK_GENERATOR).is_file():
            raise ConfigError(f"the composable_kernel submodule is missing: {info.tree / CK_DIR} is empty "
                              f"(no {CK_GENERATOR})",
                              hint="run 'git submodule update --init csrc/composable_kernel' in the checkout, "
                                   "or build from the PyPI sdist (it ships the submodule)")
        if request.ops:
            raise ConfigError("flash-attn has no op selection; --ops applies to apex")
        if backend == "ck":
            ck = _ck_build(info, tc.toolkit_version)
            per_job_bytes, source, cost_note = per_job(PER_JOB_CK, request, ck_families(ck.directions), ck_family)
        else:
            per_job_bytes, source, cost_note = PER_JOB_TRITON, "guess", ""
        jobs = choose_jobs(per_job_bytes, machine, request.jobs)
        env: dict[str, str | None] = {
            "BUILD_TARGET": "rocm",
            "GPU_ARCHS": ";".join(archs),
            # torch's cpp_extension adds --offload-arch for these too; unset it adds torch's whole default list
            "PYTORCH_ROCM_ARCH": ";".join(archs),
            "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
            "FLASH_ATTENTION_SKIP_CUDA_BUILD": None,
            "FLASH_ATTN_LOCAL_VERSION": None,
            "MAX_JOBS": str(jobs),
        }
        notes: list[str] = [cost_note] if cost_note else []
        if any(t.features for t in tc.targets):
            notes.append("flash-attn's GPU_ARCHS takes bare arch names; target features "
                         f"({', '.join(t.spec for t in tc.targets if t.features)}) are dropped")
        if backend == "triton":
            env.update({"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE", "FLASH_ATTENTION_SKIP_CK_BUILD": "TRUE"})
            expect = Expectation(packages=(TRITON_PACKAGE,))
            notes.append("Triton backend: no extension is compiled; kernels are JIT-compiled by Triton at run time "
                         "and need a ROCm torch and triton on the compute node")
            if outside:
                notes.append(f"{', '.join(outside)}: outside the CK backend's GPU_ARCHS list, which does not apply "
                             "to Triton; whether Triton supports the arch is decided at run time")
        else:
            env.update({"FLASH_ATTENTION_TRITON_AMD_ENABLE": None, "FLASH_ATTENTION_SKIP_CK_BUILD": None})
            expect = Expectation(modules=(EXTENSION,), prebuilt=True, archs=archs,
                                 empty_hint="FLASH_ATTENTION_SKIP_CUDA_BUILD or the Triton switch must have been "
                                            "set inside the build; check the tree's setup.py")
        return BuildPlan(project="flash-attn", version=info.version, regime="env", backend=backend,
                         label=labels.make(tc), pip_args=(), env=env, jobs=jobs, per_job_bytes=per_job_bytes,
                         per_job_source=source,
                         needs_torch="rocm" if backend == "ck" else None, expect=expect, notes=tuple(notes))

    def device_sources(self, info: SourceInfo, plan: BuildPlan,
                       request: WheelRequest) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """The CK backend's extension: its own sources (CUDA code, hipified) and their headers. composable_kernel's
        headers are not followed: they are AMD's own HIP code, written for the arch's wavefront (ck_tile's
        get_warp_size()), not CUDA code ported; the Triton backend compiles nothing."""
        if plan.backend != "ck":
            return {}
        return {EXTENSION: (_ck_build(info, request.toolchain.toolkit_version).sources, ("csrc/flash_attn_ck",))}

    # -- compile only ----------------------------------------------------------------------------
    def kernel_ops(self, info: SourceInfo, request: WheelRequest, ctx: KernelContext) -> KernelSet:
        """The CK backend's translation units: the tree's own generator (run in the build python, as
        setup.py runs it) writes the fmha instances; each instance is one op, and the extension's own
        sources plus the generated API dispatchers are the op :data:`FRONTEND`. Flags, include dirs and
        the generator's arguments are read from setup.py (:func:`read_ck_build`). ``request.units``
        (fnmatch patterns), ``request.sample`` (the first N of each family, head dim and dtype, or a covering sample: :func:`ck_cover`) and ``request.instances`` (the
        first N, in name order) select; the frontend is compiled unless patterns or ``instances`` narrow the
        selection without naming it."""
        if request.backend != "ck":
            raise ConfigError("the Triton backend compiles nothing ahead of time; --compile-only applies to --backend ck",
                              hint="drop --compile-only, or use --backend ck")
        ck = _ck_build(info, request.toolchain.toolkit_version)
        fmha = f"{CK_DIR}/example/ck_tile/01_fmha"
        ctx.copy(fmha)  # the generator and its codegen package, and fmha_*.hpp
        gen_out = (ctx.scratch or ctx.tree) / "ck-generated"
        gen_out.mkdir(parents=True, exist_ok=True)
        script = ctx.seen(ctx.tree / CK_GENERATOR)
        for direction in ck.directions:
            ctx.run_python(["-B", script, "-d", direction, "--output_dir", ctx.seen(gen_out),
                            *(["--receipt", ck.receipt] if ck.receipt else []),
                            *(["--optdim", ck.optdim] if ck.optdim else [])],
                           cwd=ctx.tree, what=f"the CK fmha generator (-d {direction})")
        generated = sorted(gen_out.glob("fmha_*.cpp"))
        if not generated:
            raise ConfigError(f"the CK generator of flash-attn {info.version} wrote no fmha_*.cpp",
                              hint=f"run it by hand to see why: python {CK_GENERATOR} -d fwd --output_dir OUT")
        api = [g for g in generated if g.stem.endswith("_api")]
        instances = [g for g in generated if not g.stem.endswith("_api")]
        pats = [u for spec in request.units for u in re.split(r"[,\s]+", spec) if u]
        chosen = _chosen_instances(instances, pats, request)
        frontend = (not pats and request.instances is None) or any(fnmatch.fnmatch(FRONTEND, pt) for pt in pats)
        if not chosen and not frontend:
            example = f", e.g. {instances[0].stem}" if instances else ""
            raise ConfigError(f"no CK instance of flash-attn {info.version} matches {', '.join(pats) or '--instances 0'}"
                              f" ({len(instances)} generated{example})",
                              hint="patterns are fnmatch globs on the generated file names (fmha_fwd_d128_*); "
                                   f"{FRONTEND} selects the extension's own sources")
        if not ctx.planning:  # the compiler needs the headers; a dry run only names them
            for inc in ck.include_dirs:
                if inc.startswith(CK_DIR) and inc != fmha:
                    ctx.copy(inc)
        includes = tuple(ck.include_dirs)
        flags, dropped = drop_flags(ck.flags, request.drop_flags, what=f"flash-attn {info.version}'s CK build")
        ops: list[OpSpec] = []
        for g in chosen:
            rel = f"gen/{g.stem}.cu"  # setup.py renames them to .cu for hipcc; so does porter
            ctx.put(rel, g.read_bytes())
            ops.append(OpSpec(name=g.stem, builder="csrc/composable_kernel generate.py", module=EXTENSION,
                              sources=(rel,), include_paths=includes, device=True, cxx_args=ck.cxx, nvcc_args=flags))
        if frontend:
            for folder in sorted({str(Path(s).parent) for s in ck.sources}):
                ctx.copy(folder)  # its headers (flash_common.hpp), which the sources include by a quoted name
            as_cu = {**{str(Path(s).with_suffix(".cu")): info.tree / s for s in ck.sources},
                     **{f"gen/{g.stem}.cu": g for g in api}}
            srcs = [ctx.put(rel, src.read_bytes()).relative_to(ctx.tree).as_posix() for rel, src in as_cu.items()]
            # the frontend is hipified (torch's headers); CK's headers are HIP already and stay where they are
            ck_abs = tuple(str(ctx.plan_tree / i) for i in includes)
            ops.append(OpSpec(name=FRONTEND, builder="setup.py", module=EXTENSION, sources=tuple(srcs),
                              include_paths=(*ck_abs, "csrc/flash_attn_ck"), device=True, cxx_args=ck.cxx,
                              nvcc_args=flags))
        notes = [f"CK fmha instances: {len(chosen)} of {len(instances)} generated (receipt {ck.receipt or 'none'}, "
                 f"optdim {ck.optdim or 'none'}, directions {', '.join(ck.directions)})"
                 + (f", plus {FRONTEND} ({len(ck.sources)} sources + {len(api)} API dispatchers)" if frontend else ""),
                 *(["not read from setup.py (left out): " + "; ".join(ck.skipped[:4])] if ck.skipped else [])]
        if dropped:
            notes.append(f"upstream's flags left out (--drop-flag): {shlex.join(dropped)}; the objects are not "
                         "what upstream's build makes")
        if EARLY_INLINE in flags and any(ck_family(g.stem) == "fmha_bwd" for g in chosen):  # an hour per instance
            notes.append(f"{EARLY_INLINE} (upstream's, for HIP > 6.2): with Debian's clang 22 one CK backward "
                         "instance ran over 70 min per arch with it and 35 s without (docs/wheels.md); "
                         f"--drop-flag={EARLY_INLINE.split('=')[0]} leaves it out")
        return KernelSet(ops=tuple(ops), hipify=(FRONTEND,) if frontend else (),
                         total_units=len(instances) + len(api) + len(ck.sources), notes=tuple(notes))


def _chosen_instances(instances: list[Path], pats: list[str], request: WheelRequest) -> list[Path]:
    """The generated CK instances ``--units`` patterns, ``--sample`` and ``--instances`` select, in that order."""
    chosen = [g for g in instances if not pats or any(fnmatch.fnmatch(g.stem, pt) for pt in pats)]
    if isinstance(request.sample, str):  # a covering sample (cover, pairs)
        keep = set(ck_cover([g.stem for g in chosen], request.sample))
        chosen = [g for g in chosen if g.stem in keep]
    elif request.sample is not None:  # the first N of each family x head-dim bucket x dtype
        strata: dict[str, list[Path]] = {}
        for g in chosen:
            strata.setdefault(ck_stratum(g.stem), []).append(g)
        firsts = {g for group in strata.values() for g in group[:request.sample]}
        chosen = [g for g in chosen if g in firsts]
    if request.instances is not None:
        if request.instances < 0:
            raise ConfigError(f"--instances must be 0 or more, not {request.instances}")
        chosen = chosen[:request.instances]
    return chosen


@dataclass(frozen=True)
class CkBuild:
    """What flash-attention's setup.py compiles for the CK backend, read from it for one HIP version."""

    directions: tuple[str, ...]
    """The generator's ``-d`` runs (fwd, fwd_appendkv, fwd_splitkv, bwd)."""
    receipt: str
    optdim: str
    flags: tuple[str, ...]
    """hipcc flags (its ``cc_flag`` on the ROCm branch), without ``--offload-arch`` (porter adds the profile's)."""
    cxx: tuple[str, ...]
    include_dirs: tuple[str, ...]
    """Relative to the tree."""
    sources: tuple[str, ...]
    """The extension's own sources (csrc/flash_attn_ck/*.cpp); the generated ones come from the generator."""
    skipped: tuple[str, ...] = ()


# What 2.8.3's setup.py declares (its flags without the ones it gates on the HIP version), used for whatever
# porter cannot read from a tree (and said in the plan).
_CK_DEFAULTS = CkBuild(
    directions=("fwd", "fwd_appendkv", "fwd_splitkv", "bwd"), receipt="2", optdim="32,64,128,256",
    flags=("-O3", "-std=c++17", "-DCK_TILE_FMHA_FWD_FAST_EXP2=1", "-fgpu-flush-denormals-to-zero", "-DCK_ENABLE_BF16",
           "-DCK_ENABLE_BF8", "-DCK_ENABLE_FP16", "-DCK_ENABLE_FP32", "-DCK_ENABLE_FP64", "-DCK_ENABLE_FP8",
           "-DCK_ENABLE_INT8", "-DCK_USE_XDL", "-DUSE_PROF_API=1", "-D__HIP_PLATFORM_HCC__=1",
           "-DCK_TILE_FLOAT_TO_BFLOAT16_DEFAULT=3"),
    cxx=("-O3", "-std=c++17"),
    include_dirs=(f"{CK_DIR}/include", f"{CK_DIR}/library/include", f"{CK_DIR}/example/ck_tile/01_fmha"),
    sources=())


def _version(text: str) -> Version | None:
    """``text`` as a version; None when it is none."""
    try:
        return Version(text)
    except InvalidVersion:
        return None


def read_ck_build(text: str, where: str, toolkit_version: str) -> CkBuild:
    """Run setup.py's ROCm CK branch in porter's evaluator (:mod:`porter.components.static`): IS_ROCM,
    the CK build on, ``hip_version`` the profile's ROCm version, upstream defaults for its environment
    knobs (``OPT_DIM``, ``CK_TILE_FLOAT_TO_BFLOAT16_DEFAULT``). Reads the generator runs, ``cc_flag``,
    ``include_dirs`` and the extension's own sources; whatever it cannot read falls back to 2.8.3's."""
    runs: list[list[str]] = []
    fixed = {"IS_ROCM": True, "SKIP_CUDA_BUILD": False, "SKIP_CK_BUILD": False, "USE_TRITON_ROCM": False,
             "FORCE_BUILD": True, "BUILD_TARGET": "rocm", "this_dir": static.ROOT,
             "hip_version": _version(toolkit_version) or Version("0"), "archs": ["porter"]}

    def call(node: ast.Call, scope: static.Scope) -> Any:
        name = static.dotted(node.func)
        if name in ("Version", "parse", "packaging.version.Version") and len(node.args) == 1:
            v = static.value(node.args[0], scope)
            return (_version(v) if isinstance(v, str) else None) or static.UNKNOWN
        if name.endswith(("subprocess.run", "subprocess.check_call", "subprocess.call")) and node.args:
            argv = static.value(node.args[0], scope)
            if isinstance(argv, list) and any(isinstance(a, str) and a.endswith("generate.py") for a in argv):
                runs.append([a for a in argv if isinstance(a, str)])
            return None
        if name == "os.system" and node.args:  # 2.6: os.system(f"{sys.executable} .../generate.py -d fwd ...")
            words = shlex.split(_shell_text(node.args[0], scope))
            if any(w.endswith("generate.py") for w in words):
                runs.append(words)
            return 0
        return static.UNKNOWN

    def truth(node: ast.expr, scope: static.Scope) -> bool | None:
        # the fixed flags (IS_ROCM, ...) need no answer here: the evaluator reads a name's bool from the scope
        if isinstance(node, ast.Call) and static.dotted(node.func) in ("os.path.isdir", "os.path.exists"):
            arg = static.value(node.args[0], scope) if node.args else static.UNKNOWN
            return False if arg == ".git" else None  # porter builds copies without .git
        return None

    scope = static.Scope(names=dict(fixed), truth=truth, call=call, source=text, fixed=frozenset(fixed))
    static.run(static.parse(text, where).body, scope)

    def arg_after(argv: list[str], opt: str) -> str | None:
        return argv[argv.index(opt) + 1] if opt in argv and argv.index(opt) + 1 < len(argv) else None

    directions = tuple(d for d in (arg_after(r, "-d") or arg_after(r, "--direction") for r in runs) if d)
    receipt = next((x for x in (arg_after(r, "--receipt") or arg_after(r, "-r") for r in runs) if x), None)
    optdim = next((x for x in (arg_after(r, "--optdim") for r in runs) if x), None)
    cc = scope.names.get("cc_flag")
    flags = [f for f in static.strings(cc) if not f.startswith("--offload-arch")] if isinstance(cc, list) else []
    args = scope.names.get("extra_compile_args")
    cxx = static.strings(args.get("cxx")) if isinstance(args, dict) else []
    incs = static.strings(scope.names.get("include_dirs"))
    srcs = [x for x in static.strings(scope.names.get("sources")) if x.startswith("csrc/flash_attn_ck/")]
    d = _CK_DEFAULTS
    if directions:  # the tree's own generator runs: what they pass, and nothing they do not (2.6's has no --optdim)
        receipt, optdim = receipt or "", optdim or ""
    read = (("generator runs", directions), ("receipt", receipt), ("optdim", optdim), ("cc_flag", flags),
            ("cxx flags", cxx), ("include_dirs", incs), ("sources", srcs))
    skipped = [f"{what}: using flash-attn 2.8.3's" for what, got in read
               if got is None or not (got or what in ("receipt", "optdim"))]
    return CkBuild(directions=directions or d.directions, receipt=d.receipt if receipt is None else receipt,
                   optdim=d.optdim if optdim is None else optdim,
                   flags=tuple(flags) or d.flags, cxx=tuple(cxx) or d.cxx, include_dirs=tuple(incs) or d.include_dirs,
                   sources=tuple(srcs) or d.sources, skipped=tuple(skipped))


def _ck_build(info: SourceInfo, toolkit_version: str) -> CkBuild:
    setup_py = info.tree / "setup.py"
    return read_ck_build(setup_py.read_text(errors="replace"), str(setup_py), toolkit_version)


def _shell_text(node: ast.expr, scope: static.Scope) -> str:
    """A shell line's text, a placeholder word for what porter cannot evaluate (``{sys.executable}``)."""
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            v = static.value(part.value, scope) if isinstance(part, ast.FormattedValue) else \
                part.value if isinstance(part, ast.Constant) else None
            parts.append(str(v) if isinstance(v, (str, int)) and v != static.ROOT else "UNKNOWN")
        return "".join(parts)
    v = static.value(node, scope)
    return v if isinstance(v, str) else ""


def allowed_archs(setup_text: str, version: str) -> tuple[str, ...]:
    """The archs the tree's GPU_ARCHS check accepts: the ``allowed_archs = [...]`` literal, else by version."""
    try:
        nodes = list(ast.walk(ast.parse(setup_text)))
    except SyntaxError:
        nodes = []
    for node in nodes:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "allowed_archs"
                                                 for t in node.targets)
                and isinstance(node.value, (ast.List, ast.Tuple))):
            archs = tuple(e.value for e in node.value.elts
                          if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value != "native")
            if archs:
                return archs
    v = _version(version) or Version("0")
    return next((archs for floor, archs in _ALLOWED_BY_VERSION if v >= Version(floor)), _ALLOWED_BY_VERSION[-1][1])


class FlashAttnComponent(FromDriver, jit.NoSites):
    """FlashAttention 2 as a component: built by ``porter wheel flash-attn`` with :class:`FlashAttnDriver`."""

    name = "flash-attn"
    title = "FlashAttention"
    dists: tuple[str, ...] = ("flash-attn",)
    fetches = True
    takes_ops = False
    driver = FlashAttnDriver()
    def installed_sites(self, ctx: jit.Audit, imports: set[str]) -> list[jit.Site]:
        """(JitSites) An installation with no compiled extension: its Triton backend compiles every kernel at first
        use."""
        dist = ctx.target.dists.get(self.name) if ctx.target else None
        if dist is None or dist.shared_objects:
            return []
        return [jit.Site("triton", "flash_attn", 0, "FlashAttention with no compiled extension (its Triton backend)",
                         f"{self.name} {dist.version}", "call", "compiles",
                         "every attention kernel is compiled by Triton at first use; build the CK backend with "
                         "'porter wheel flash-attn' or warm TRITON_CACHE_DIR on node-local disk")]


FLASH_ATTN = FlashAttnComponent()
