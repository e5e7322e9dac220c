"""ROCm apex: recognise the tree, pick its build regime, and plan a prebuilt wheel.

Two build interfaces exist upstream, and porter reads which one a tree has from the tree itself:

- ``env`` (current ROCm/apex, with an ``op_builder/`` package): installs are JIT by default; an op is
  prebuilt only when ``APEX_BUILD_CPP_OPS=1`` / ``APEX_BUILD_CUDA_OPS=1`` (whole groups) or
  ``APEX_BUILD_<OP>=1`` is set. setup.py still *accepts* ``--cpp_ext --cuda_ext`` but removes them from
  ``sys.argv`` without effect: passing them gives a wheel with no prebuilt extension at all.
- ``flags`` (older release branches): setup.py builds ``apex_C`` when ``--cpp_ext`` is in ``sys.argv``
  and the device extensions (``amp_C``, ``fused_layer_norm_cuda``, ...) with ``--cuda_ext``.

The op catalogue is read from the tree (``op_builder/*.py`` class attributes, or the extensions named
under the flag checks in an old setup.py), never hard-coded, so forks and new ops are picked up.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from typing import TYPE_CHECKING, Any

from porter.artifacts import labels
from porter.components import jit, static
from porter.components.base import FromDriver
from porter.components.op_builder import bf16, profile_simd, set_installed_ops
from porter.errors import ConfigError
from ops_prebuild.catalogue import OpSpec
from porter.wheels.base import (GiB, BuildPlan, Expectation, KernelSet, Machine, SourceInfo, WheelRequest,
                                choose_jobs, per_job)

if TYPE_CHECKING:
    from porter.wheels.base import KernelContext

CPP_GROUP_VAR = "APEX_BUILD_CPP_OPS"
CUDA_GROUP_VAR = "APEX_BUILD_CUDA_OPS"
GROUPS = ("cpp", "cuda")
REGIMES = ("env", "flags")
CORE_OP = "amp_C"
"""apex's multi-tensor kernels: ``apex.multi_tensor_apply`` and ``apex.optimizers`` import it, so every build
with device ops carries it."""
VERSION_MACROS = ("-DVERSION_GE_1_1", "-DVERSION_GE_1_3", "-DVERSION_GE_1_5")
"""What apex's ``version_dependent_macros`` are for every torch since 1.5."""

# Peak memory of one compile job: hipcc on apex's multi-tensor kernels stays under ~2 GiB; g++ on the
# host-only ops well under 1 GiB.
PER_JOB_ROCM = 2 * GiB
PER_JOB_CPU = 1 * GiB


class ApexDriver:
    name = "apex"
    title = "ROCm apex"
    sdist_env: Mapping[str, str] = {}
    version_info = "apex/git_version_info_installed.py"
    """Where apex's op_builder loader (DeepSpeed's, adapted) reads ``installed_ops``."""

    mark_prebuilt = staticmethod(set_installed_ops)  # (EngineDriver) ROCm apex's loader is DeepSpeed's

    def on_engine(self, info: SourceInfo, plan: BuildPlan) -> bool:
        """The op_builder regime (APEX_BUILD_*): its ops are porter's engine's catalogue, compiled and linked there
        as DeepSpeed's are; the older --cpp_ext/--cuda_ext regime builds through setup.py."""
        return plan.regime == "env" and info.regime == "env"

    def python_only_env(self, info: SourceInfo) -> dict[str, str | None]:
        """Every APEX_BUILD_* unset: apex's own default, a wheel of its Python side with no op compiled."""
        return _env_switches(info, ())

    # -- detection -------------------------------------------------------------------------------
    def detect(self, root: Path) -> SourceInfo | None:
        setup_py = root / "setup.py"
        if not (setup_py.is_file() and (root / "apex" / "__init__.py").is_file()):
            return None
        text = setup_py.read_text(errors="replace")
        # the tree's version.txt when it says one, else setup.py's version=, else 0.0
        vfile = root / "version.txt"
        m = re.search(r"""version\s*=\s*['"]([^'"]+)['"]""", text)
        version = (vfile.read_text().strip() if vfile.is_file() else "") or (m.group(1) if m else "0.0")
        if (root / "op_builder").is_dir() and (CPP_GROUP_VAR in text or CUDA_GROUP_VAR in text):
            # classes of op_builder/*.py with string attributes BUILD_VAR, NAME (and INCLUDE_FLAG)
            classes = ({k: v.value for k, v in assigned.items()
                        if isinstance(v, ast.Constant) and isinstance(v.value, str)}
                       for *_, assigned in _classes(root / "op_builder"))
            ops = tuple(OpSpec(a["NAME"], f"apex.{a['NAME']}", a.get("INCLUDE_FLAG") != CPP_GROUP_VAR, a["BUILD_VAR"])
                        for a in classes if "BUILD_VAR" in a and "NAME" in a)
            if not ops:
                raise ConfigError(f"{root}/op_builder declares no ops (no class with BUILD_VAR and NAME)",
                                  hint="is this a complete ROCm/apex checkout?")
            return SourceInfo("apex", version, root, regime="env", ops=ops)
        if "--cpp_ext" in text or "--cuda_ext" in text:
            return SourceInfo("apex", version, root, regime="flags", ops=read_flag_extensions(text, str(setup_py))[0])
        raise ConfigError(f"{setup_py}: an apex tree whose setup.py knows neither APEX_BUILD_* nor --cpp_ext/--cuda_ext",
                          hint="porter supports ROCm/apex trees; check that this is ROCm's apex, not NVIDIA's or PyPI's")

    # -- planning --------------------------------------------------------------------------------
    def plan(self, info: SourceInfo, request: WheelRequest, machine: Machine) -> BuildPlan:
        tc = request.toolchain
        if tc.kind == "cuda":
            raise ConfigError(f"toolchain {tc.name!r} is a cuda profile; porter builds ROCm apex for rocm or cpu profiles",
                              hint="pick a rocm profile (e.g. --toolchain mi300x) or cpu for the host-only ops")
        regime = request.regime or info.regime
        if regime not in REGIMES:
            raise ConfigError(f"unknown apex build regime {regime!r}", hint=f"use one of: {', '.join(REGIMES)}")
        if tc.kind == "emulated" and regime != "env":
            raise ConfigError(f"apex {info.version} builds its device ops through setup.py (--cuda_ext), which cannot "
                              f"target porter's emulated HIP target {tc.name}",
                              hint="the emulated target builds apex trees with op_builder/ (APEX_BUILD_*) on "
                                   "porter's engine")
        selected = select_ops(info, request.ops, tc.kind)
        if regime != info.regime:  # one forced on a tree of the other: said, and the hint for a wheel with no extension
            notes = [f"regime forced to {regime!r}; the tree at {info.tree} is a {info.regime!r} tree "
                     f"(apex {info.version})"]
            why = ("reads APEX_BUILD_* environment variables and silently drops --cpp_ext/--cuda_ext"
                   if info.regime == "env" else "predates APEX_BUILD_* and only builds with --cpp_ext/--cuda_ext")
            empty = f"apex {info.version} {why}; drop --regime and let porter use the tree's own regime"
        else:
            notes = [f"regime {regime!r} detected from the tree (apex {info.version})"]
            empty = "upstream skipped every requested op; look for 'Skip pre-compile' in the build output"
        core = next((op for op in info.ops if op.name == CORE_OP), None)
        if core is not None and any(op.group == "cuda" for op in selected):
            if core not in selected:
                notes.append(f"{CORE_OP} added: apex.multi_tensor_apply and apex.optimizers import it, so every "
                             "build with device ops needs it")
            selected = tuple(sorted({*(o for o in selected if o.name != CORE_OP), replace(core, required=True)},
                                    key=lambda o: o.name))
        # the flags regime: a stray APEX_BUILD_* from the caller's shell would change what an env-regime tree builds
        env: dict[str, str | None] = (_env_switches(info, selected) if regime == "env"
                                      else {CPP_GROUP_VAR: None, CUDA_GROUP_VAR: None})
        pip_args = () if regime == "env" else tuple(f"--config-settings=--build-option=--{g}_ext"
                                                    for g in sorted({o.group for o in selected}))
        modules = tuple(op.module for op in selected if op.required or regime == "env")
        optional = tuple(op.module for op in selected if not (op.required or regime == "env"))
        per_job_bytes, source, cost_note = per_job(PER_JOB_ROCM if tc.kind == "rocm" else PER_JOB_CPU, request)
        jobs = choose_jobs(per_job_bytes, machine, request.jobs)
        # DESIRED_CUDA and APEX_COMMIT unset: apex's own version suffixes (+DESIRED_CUDA) would fight porter's label
        env.update({"MAX_JOBS": str(jobs), "PYTORCH_ROCM_ARCH": ";".join(tc.archs) if tc.kind == "rocm" else None,
                    "DESIRED_CUDA": None, "APEX_COMMIT": None})
        if cost_note:
            notes.append(cost_note)
        if any(op.group == "cpp" for op in selected):
            notes.append(f"apex's host-only ops are compiled for the profile's cpu_isa (-march={tc.cpu_isa}), not "
                         "for the build host (upstream's builder asks for -march=native)" if regime == "env" else
                         "apex's host-only ops are compiled with upstream's own -march choice (native on most "
                         "hosts); a patch set can pin it to the profile's cpu_isa")
        # the torch setup.py needs: a ROCm one to link device ops, or whenever setup.py asks torch for its HIP version
        # at import (none on the emulated target, where setup.py is not run); and why, when it is not the obvious
        line = reads_hip_at_import(info.tree / "setup.py") if tc.kind not in ("rocm", "emulated") else None
        if tc.kind == "emulated":  # setup.py is not run: the engine builds the ops, the tree's package is the rest
            notes.append("the emulated target's Python side is the tree's apex package as it is (apex's setup.py "
                         "needs a ROCm torch at import)")
        return BuildPlan(
            project="apex", version=info.version, regime=regime, backend=None, label=labels.make(tc),
            pip_args=pip_args, env=env, jobs=jobs, per_job_bytes=per_job_bytes, per_job_source=source,
            needs_torch="rocm" if tc.kind == "rocm" or line else None,
            needs_torch_why=f"its setup.py reads torch.version.hip at import (setup.py line {line}), so even the "
                            "host-only ops fail there without a ROCm torch" if line else "",
            expect=Expectation(modules=modules, optional=optional, prebuilt=True,
                               host_only=tuple(op.module for op in selected if op.group == "cpp"),
                               archs=tc.arch_names if tc.kind == "rocm" else (),
                               empty_hint=empty),
            ops=selected, notes=tuple(notes), setup_py=tc.kind != "emulated")

    # -- compile only ----------------------------------------------------------------------------
    def kernel_ops(self, info: SourceInfo, request: WheelRequest, ctx: KernelContext) -> KernelSet:
        """The selected ops' translation units, as the tree declares them (op_builder classes, or the
        extensions of an old setup.py), for porter's planner: device ops are hipified, host-only ops not."""
        selected = self.plan(info, request, Machine(cores=1, free_bytes=0)).ops  # its ops; the jobs do not matter
        specs = _specs(info, request.toolchain.toolkit_version)
        ops: list[OpSpec] = []
        notes: list[str] = []
        unplanned: list[tuple[str, str]] = []
        for op in selected:
            spec = specs.get(op.name)
            if spec is None or not spec.sources:
                unplanned.append((op.name, f"porter cannot read the sources of {op.name} from the tree (its builder "
                                           "computes them at run time)"))
                continue
            if missing := [s for s in spec.sources if not (info.tree / s).is_file()]:
                unplanned.append((op.name, f"{op.name} names sources the tree lacks: {', '.join(missing)}"))
                continue
            macros = VERSION_MACROS if spec.version_macros else ()
            heads = [ctx.py_ex.outside(d) for d in (ctx.torch.include_dirs if ctx.torch else ())]
            ops.append(replace(op, builder=spec.builder, sources=spec.sources, include_paths=spec.include_paths,
                               cxx_args=profile_simd((*_resolve_markers(spec.cxx_args, heads), *macros),
                                                     ctx.toolchain.cpu_isa),
                               nvcc_args=(*_resolve_markers(spec.nvcc_args, heads), *macros) if op.device else (),
                               bf16=bf16(op.device, ctx.toolchain)))
            if spec.skipped:
                notes.append(f"{op.name}: not read from {spec.builder} (left out): {'; '.join(spec.skipped[:3])}")
        for top in sorted({s.split("/")[0] for o in ops for s in (*o.sources, *o.include_paths)} - {".", ""}):
            if (info.tree / top).exists():
                ctx.copy(top)
        return KernelSet(ops=tuple(ops), hipify=tuple(o.name for o in ops if o.device), notes=tuple(notes),
                         unplanned=tuple(unplanned))

    def device_sources(self, info: SourceInfo, plan: BuildPlan,
                       request: WheelRequest) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """The device ops' sources and include paths as the tree declares them (:meth:`kernel_ops`)."""
        specs = _specs(info, request.toolchain.toolkit_version)
        return {op.name: (tuple(spec.sources), tuple(spec.include_paths)) for op in plan.ops
                if op.group == "cuda" and (spec := specs.get(op.name)) is not None}


def _specs(info: SourceInfo, rocm: str) -> dict[str, BuildSpec]:
    """Each op's translation units as the tree declares them (op_builder classes, or an old setup.py's extensions)."""
    if info.regime == "env":
        return builder_specs(info.tree / "op_builder", rocm)
    setup_py = info.tree / "setup.py"
    return read_flag_extensions(setup_py.read_text(errors="replace"), str(setup_py), rocm)[1]


def _env_switches(info: SourceInfo, selected: tuple[OpSpec, ...]) -> dict[str, str | None]:
    """APEX_BUILD_<OP>=1 for each selected op; the group switches and every other op switch unset.

    Per-op switches say exactly what is asked for (a group switch would also pick up ops a fork adds),
    and unsetting the rest keeps a stray value in the caller's shell from changing the build.
    """
    chosen = {op.name for op in selected}
    return {CPP_GROUP_VAR: None, CUDA_GROUP_VAR: None,
            **{op.build_var: "1" if op.name in chosen else None for op in info.ops}}


def select_ops(info: SourceInfo, wanted: Iterable[str], kind: str) -> tuple[OpSpec, ...]:
    """Resolve ``--ops``: names, groups (cpp, cuda) or ``all``; default: all the profile can build."""
    words = [w for spec in wanted for w in re.split(r"[,\s]+", spec) if w]
    drop = [w[1:] for w in words if w.startswith("-")]  # all,-NAME: every op but NAME
    names = [w for w in words if not w.startswith("-")] or ["all"]
    allowed_groups = ("cpp", "cuda") if kind in ("rocm", "emulated") else ("cpp",)
    by_name = {op.name: op for op in info.ops}
    for d in drop:
        if d not in by_name or info.regime == "flags":
            raise ConfigError(f"--ops -{d}: apex {info.version} has no op {d!r} to leave out"
                              + (" (it builds ops in groups only)" if info.regime == "flags" else ""),
                              hint=f"ops in this tree: {', '.join(sorted(by_name))}")
    picked: dict[str, OpSpec] = {}
    for n in names:
        if n == "all":
            picked.update({op.name: op for op in info.ops if op.group in allowed_groups})
            continue
        if n in GROUPS:
            if n not in allowed_groups:
                raise ConfigError(f"apex {n} ops need a rocm toolchain (this profile is {kind})",
                                  hint="pass a rocm profile, e.g. --toolchain mi300x, or --ops cpp")
            picked.update({op.name: op for op in info.ops if op.group == n})
            continue
        op = by_name.get(n)
        if op is None:
            if info.regime == "flags":
                raise ConfigError(f"apex {info.version} builds ops in groups only (--cpp_ext, --cuda_ext); "
                                  f"{n!r} cannot be chosen alone", hint="use --ops cpp, --ops cuda or --ops all")
            import difflib
            close = difflib.get_close_matches(n, by_name, n=3)
            raise ConfigError(f"apex {info.version} has no op {n!r}" + (f"; did you mean {', '.join(close)}?" if close else ""),
                              hint=f"ops in this tree: {', '.join(sorted(by_name))}")
        if op.group not in allowed_groups:
            raise ConfigError(f"apex op {n} is a device (HIP) op and needs a rocm toolchain (this profile is {kind})",
                              hint="pass a rocm profile, e.g. --toolchain mi300x")
        if info.regime == "flags":
            picked.update({o.name: o for o in info.ops if o.group == op.group})
        else:
            picked[op.name] = op
    for d in drop:
        picked.pop(d, None)
    if not picked:
        raise ConfigError(f"no apex op selected (asked: {', '.join(names)}; profile kind {kind})",
                          hint="the cpu profile can build only the cpp ops (apex_C); use a rocm profile for the rest")
    return tuple(sorted(picked.values(), key=lambda o: o.name))


# -- reading the tree ----------------------------------------------------------------------------

def _classes(folder: Path) -> Iterator[tuple[Path, str, ast.ClassDef, dict[str, ast.expr]]]:
    """Each top-level class of ``folder/*.py``, with its file, that file's text and the class's attribute
    assignments (a file that does not parse: an error)."""
    for path in sorted(folder.glob("*.py")):
        text = path.read_text(errors="replace")
        for node in (n for n in static.parse(text, str(path)).body if isinstance(n, ast.ClassDef)):
            yield path, text, node, static.assigns(node.body)


# -- what an apex tree compiles, read without running it -------------------------------------------

@dataclass(frozen=True)
class BuildSpec(OpSpec):
    """One op's translation units and flags as the tree declares them (``builder``: the builder class or setup.py
    they were read from)."""

    version_macros: bool = False
    """The tree adds apex's version_dependent_macros (porter adds :data:`VERSION_MACROS`)."""
    skipped: tuple[str, ...] = ()


def _scope(rocm: str, text: str, fixed: frozenset[str] = frozenset()) -> static.Scope:
    """An evaluator scope for an apex script, seeded with the names it computes from its torch, as they are for any
    torch 2 and the profile's ROCm (6.0 when it names none)."""
    major, _, minor = rocm.partition(".")
    seed = {"this_dir": static.ROOT, "cwd": static.ROOT, "TORCH_MAJOR": 2, "TORCH_MINOR": 0,
            "ROCM_MAJOR": int(major) if major.isdigit() else 6,
            "ROCM_MINOR": int(minor.split(".")[0]) if minor.split(".")[0].isdigit() else 0,
            "IS_ROCM_PYTORCH": True, "version_dependent_macros": list(VERSION_MACROS)}
    return static.Scope(names=seed, truth=_rocm_truth, call=_builder_call, source=text, fixed=fixed)


def _rocm_truth(node: ast.expr, scope: static.Scope) -> bool | None:
    """The conditions porter knows on a ROCm build: the ROCm branch is taken, the CUDA one not, no GPU is
    visible at build time, and a compare of numbers it knows is evaluated."""
    if name := static.dotted(node):
        low = name.lower()
        if "rocm" in low or "hip" in low:
            return True
        if name == "torch.cuda.is_available":
            return False
        v = scope.names.get(name, static.UNKNOWN)
        return bool(v) if isinstance(v, (bool, int)) else None
    if isinstance(node, ast.Call):
        fname = static.dotted(node.func)
        if fname.endswith(("is_rocm_pytorch", "is_hip_extension")):
            return True
        return False if fname == "torch.cuda.is_available" else None
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right = node.left, node.comparators[0]
        if static.dotted(left) == "torch.version.hip" and isinstance(right, ast.Constant) and right.value is None:
            return isinstance(node.ops[0], ast.IsNot)
        if isinstance(node.ops[0], ast.In) and static.dotted(right) == "sys.argv":
            flag = static.value(left, scope)
            return True if isinstance(flag, str) and flag.endswith("_ext") else None
    return None


TORCH_HEADER_ARGS = ("aten_atomic_args", "generator_args", "backward_pass_guard_args")
"""apex's builder methods whose flags depend on which headers the build torch ships: read as a marker here and
answered from the build torch's include folders when the op is planned (:func:`torch_header_flags`)."""
_MARK = "@torch-headers:"


def torch_header_flags(method: str, include_dirs: Iterable[str | Path]) -> list[str]:
    """What apex's ``method`` returns for a torch whose headers are in ``include_dirs`` (upstream's own rule:
    a header's presence, or which guard class ``ATen/Context.h`` declares first)."""
    def find(rel: str) -> Path | None:
        return next((Path(d) / rel for d in include_dirs if (Path(d) / rel).is_file()), None)

    if method == "aten_atomic_args":
        # upstream looks for ATen/Atomic.cuh, which no torch 2 ships (it is ATen/cuda/Atomic.cuh), and falls back
        # to THC/THCAtomics.cuh, which torch removed in 1.11: fused_index_mul_2d compiled nowhere. porter answers
        # what the check means: the torch has ATen's atomics header
        return ["-DATEN_ATOMIC_HEADER"] if find("ATen/Atomic.cuh") or find("ATen/cuda/Atomic.cuh") else []
    if method == "generator_args":
        return ["-DOLD_GENERATOR_PATH"] if find("ATen/CUDAGeneratorImpl.h") else []
    context = find("ATen/Context.h")
    line = next((ln for ln in context.read_text(errors="replace").splitlines() if "BackwardPassGuard" in ln),
                "") if context else ""
    return ["-DBACKWARD_PASS_GUARD", "-DBACKWARD_PASS_GUARD_CLASS="
            + ("ROCmBackwardPassGuard" if "ROCmBackwardPassGuard" in line else "BackwardPassGuard")] if line else []


def _resolve_markers(args: Iterable[str], include_dirs: Sequence[str | Path]) -> tuple[str, ...]:
    return tuple(f for a in args for f in (torch_header_flags(a[len(_MARK):], include_dirs)
                                            if a.startswith(_MARK) else [a]))


def _builder_call(node: ast.Call, scope: static.Scope) -> Any:
    name = static.dotted(node.func)
    method = name.rpartition(".")[2]
    if name.startswith("self.") and method in TORCH_HEADER_ARGS:
        return [_MARK + method]
    if name.endswith("version_dependent_macros"):
        scope.names["__version_macros__"] = True
        return []
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and static.dotted(func.value.func) == "super":
        return []  # the base builder's own flags: porter's planner adds the toolchain's
    return static.UNKNOWN


def _spec_from(name: str, where: str, sources: Any, includes: Any, cxx: Any, nvcc: Any,
               scope: static.Scope) -> BuildSpec:
    cxx, nvcc = static.strings(cxx), static.strings(nvcc)
    return BuildSpec(name=name, builder=where, sources=tuple(static.strings(sources)),
                     include_paths=tuple(p.rstrip("/") or "." for p in static.strings(includes)),
                     cxx_args=tuple(f for f in cxx if f not in VERSION_MACROS),
                     nvcc_args=tuple(f for f in nvcc if f not in VERSION_MACROS),
                     version_macros=bool(scope.names.get("__version_macros__")) or not {*cxx, *nvcc}.isdisjoint(
                         VERSION_MACROS), skipped=tuple(dict.fromkeys(scope.skipped)))


def builder_specs(folder: Path, rocm: str = "") -> dict[str, BuildSpec]:
    """Per op, from ``op_builder/*.py``: ``sources()`` / ``include_paths()`` / ``cxx_args()`` /
    ``nvcc_args()`` as the ROCm branch of each method returns them (or class attributes ``SOURCES``,
    ``INCLUDE_PATHS``, ``CXX_ARGS``, ``NVCC_ARGS``)."""
    out: dict[str, BuildSpec] = {}
    for path, text, node, assigned in _classes(folder):
        scope = _scope(rocm, text)
        attrs = {k: static.value(v, scope) for k, v in assigned.items()}
        methods = {st.name: st for st in node.body if isinstance(st, ast.FunctionDef)}
        if not (isinstance(attrs.get("NAME"), str) and isinstance(attrs.get("BUILD_VAR"), str)):
            continue

        def get(method: str) -> Any:
            if method not in methods:
                return attrs.get(method.upper(), [])
            sub = replace(scope, names={**scope.names, **attrs})  # names of its own; what it skips is the class's
            got = static.run(methods[method].body, sub)
            if sub.names.get("__version_macros__"):
                scope.names["__version_macros__"] = True
            return got

        sources, includes, cxx, nvcc = (get(m) for m in ("sources", "include_paths", "cxx_args", "nvcc_args"))
        out[attrs["NAME"]] = _spec_from(attrs["NAME"], f"{path.name}:{node.name}", sources, includes, cxx, nvcc, scope)
    return out


def read_flag_extensions(text: str, where: str, rocm: str = "") -> tuple[tuple[OpSpec, ...], dict[str, BuildSpec]]:
    """The extensions an old setup.py builds on ROCm under ``--cpp_ext`` / ``--cuda_ext``, by name: each one's
    op, and its sources, include dirs and flags (ROCm branch).

    Those built whenever the flag is given are required (also when they sit behind a guard that stops
    the script otherwise, as in ``if CUDA_HOME is None: raise ... else: ...``: a guard whose one branch ends the
    script is no condition); those behind a further condition porter cannot decide are optional; those only on the
    CUDA branch are left out.
    """
    scope = _scope(rocm, text, frozenset({"this_dir", "cwd", "IS_ROCM_PYTORCH"}))
    ops: dict[str, OpSpec] = {}
    specs: dict[str, BuildSpec] = {}

    def worse(a: str, b: str) -> str:
        return max(a, b, key=("required", "optional", "excluded").index)

    def record(stmt: ast.stmt, group: str, state: str) -> None:
        # each ``...Extension(NAME, ...)`` or ``...Extension(name=NAME, ...)`` call under ``stmt``, with its name
        for call in (c for c in ast.walk(stmt) if isinstance(c, ast.Call)):
            func = call.func
            fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            value = next((k.value for k in call.keywords if k.arg == "name"), call.args[0] if call.args else None)
            if not (fname.endswith("Extension") and isinstance(value, ast.Constant) and isinstance(value.value, str)):
                continue
            name = value.value
            kw = {k.arg: k.value for k in call.keywords if k.arg}
            sources = static.value(kw.get("sources") or (call.args[1] if len(call.args) > 1 else None), scope)
            includes = static.value(kw.get("include_dirs"), scope) if "include_dirs" in kw else []
            args = static.value(kw.get("extra_compile_args"), scope) if "extra_compile_args" in kw else []
            cxx, nvcc = (args.get("cxx", []), args.get("nvcc", [])) if isinstance(args, dict) else (args, [])
            if state != "excluded":
                required = state == "required" or (name in ops and ops[name].required)
                ops[name] = OpSpec(name, name, group == "cuda", f"--{group}_ext", required)
                specs[name] = _spec_from(name, where, sources, includes, cxx, nvcc, scope)

    def visit(body: list[ast.stmt], group: str | None, state: str) -> None:
        for st in body:
            if isinstance(st, ast.If):
                # the group of a test that mentions --cuda_ext / --cpp_ext ('"--distributed_adam" in argv or
                # "--cuda_ext" in argv': the cuda group)
                words = {n.value for n in ast.walk(st.test) if isinstance(n, ast.Constant)}
                flag = next((g for g in ("cuda", "cpp") if f"--{g}_ext" in words), None)
                if flag is not None and (group is None or flag == group):
                    visit(st.body, flag, "required" if group is None else state)
                    visit(st.orelse, group, state)
                    continue
                if group is None:
                    static.run([st], scope)
                    continue
                unsure = worse(state, "optional")
                taken = {None: (unsure, unsure), True: (state, "excluded"), False: ("excluded", state)}
                on, off = taken[static.branch(st, scope)]
                visit(st.body, group, on)
                visit(st.orelse, group, off)
            elif isinstance(st, (ast.For, ast.While, ast.With, ast.Try)) and group is not None:
                inner = [*st.body, *getattr(st, "orelse", []), *getattr(st, "finalbody", [])]
                visit(inner, group, worse(state, "optional"))
            else:
                static.run([st], scope)
                if group is not None:
                    record(st, group, state)

    visit(static.parse(text, where).body, None, "required")
    return tuple(sorted(ops.values(), key=lambda o: o.name)), specs


def reads_hip_at_import(setup_py: Path) -> int | None:
    """The line where setup.py dereferences ``torch.version.hip`` unconditionally at import
    (``int(torch.version.hip.split('.')[0])``, as current ROCm/apex does): with a torch that is not a ROCm
    build that line raises, whatever ops are asked for. None when it does not."""
    try:
        tree = ast.parse(setup_py.read_text(errors="replace"))
    except (OSError, SyntaxError):
        return None
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.Try, ast.With)):
            continue
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Attribute, ast.Subscript)) and static.dotted(node.value) == "torch.version.hip":
                return stmt.lineno
    return None


class ApexComponent(FromDriver, jit.NoSites):
    """ROCm apex as a component: built by ``porter wheel apex`` with :class:`ApexDriver`. Its compile sites for
    ``porter audit`` (JitSites) are its op builders' ``load()`` (ROCm apex JIT-builds at import by default) whose
    module the target does not ship."""

    name = "apex"
    title = "ROCm apex"
    dists: tuple[str, ...] = ("apex",)
    fetches = False
    takes_ops = True
    driver = ApexDriver()
    jit_kinds = {"apex": jit.Kind("APEX's op builder JIT-builds the op when apex is imported (minutes for CUDA/HIP "
                                  "kernels)", "fails: no compiler", True)}

    def builder_roots(self, tree: Path, target: jit.Target | None) -> list[Path]:
        root = target.package_root(self.name, self.name) if target else None
        return [root] if root else []

    def resolve(self, raw: jit.Raw, at: jit.At, audit: jit.Audit) -> jit.Site | None:
        """A load of one of its op builders: covered when the target ships the module the builder names."""
        kind, _, cls = raw.key.partition(":")
        if raw.kind != "op" or kind != "builder" or audit.owner(cls) != self.name:
            return None
        name = audit.builders[self.name][cls]
        modules = audit.target.modules if audit.target else {}
        shipped = [m for m in modules if m.split(".")[-1] == name]
        what = f"{raw.what} -> module {name}"
        if shipped:
            return at.site(raw, "covered", f"prebuilt in {modules[shipped[0]]}", shipped[0], kind=self.name, what=what)
        return at.site(raw, "compiles", f"apex ships no prebuilt {name}: build it with 'porter wheel apex --source "
                                        "<apex tree> --toolchain <profile>' and install that wheel",
                       kind=self.name, what=what)

    def installed_sites(self, audit: jit.Audit, imports: set[str]) -> list[jit.Site]:
        """What runs at import of the installed modules the tree imports (and the packages on their way)."""
        target = audit.target
        root = target.package_root(self.name, self.name) if target else None  # None without the distribution
        if target is None or root is None:
            return []
        out: list[jit.Site] = []
        for path in sorted(jit.imported_files(root, imports)):
            at = jit.At(path.relative_to(root.parent).as_posix(), path.read_text(errors="replace"),
                        f"{self.name} {target.dists[self.name].version}")
            out += [audit.resolve(raw, at) for raw in jit.find_sites(at.text, audit.loads) if raw.when == "import"
                    and raw.kind in ("op", "torch-jit") and jit.relevant(raw, path, audit.loads)]
        return out


APEX = ApexComponent()
