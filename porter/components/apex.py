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
from collections.abc import Iterable, Mapping
from pathlib import Path

from typing import TYPE_CHECKING

from porter.components import InstalledCheck, Recognised
from porter.errors import ConfigError
from porter.wheels.base import GiB, BuildPlan, Expectation, Machine, OpSpec, SourceInfo, WheelRequest, choose_jobs

if TYPE_CHECKING:
    from porter.artifacts.manifest import Manifest
    from porter.install.env import InstalledDist

CPP_GROUP_VAR = "APEX_BUILD_CPP_OPS"
CUDA_GROUP_VAR = "APEX_BUILD_CUDA_OPS"
GROUPS = ("cpp", "cuda")
REGIMES = ("env", "flags")

# Peak memory of one compile job: hipcc on apex's multi-tensor kernels stays under ~2 GiB; g++ on the
# host-only ops well under 1 GiB.
PER_JOB_ROCM = 2 * GiB
PER_JOB_CPU = 1 * GiB


class ApexDriver:
    name = "apex"
    title = "ROCm apex"
    sdist_env: Mapping[str, str] = {}

    # -- detection -------------------------------------------------------------------------------
    def detect(self, root: Path) -> SourceInfo | None:
        setup_py = root / "setup.py"
        if not (setup_py.is_file() and (root / "apex" / "__init__.py").is_file()):
            return None
        text = setup_py.read_text(errors="replace")
        version = _apex_version(root, text)
        has_env = (root / "op_builder").is_dir() and (CPP_GROUP_VAR in text or CUDA_GROUP_VAR in text)
        if has_env:
            ops = read_op_builder(root / "op_builder")
            if not ops:
                raise ConfigError(f"{root}/op_builder declares no ops (no class with BUILD_VAR and NAME)",
                                  hint="is this a complete ROCm/apex checkout?")
            return SourceInfo("apex", version, "env", root, ops=ops)
        if "--cpp_ext" in text or "--cuda_ext" in text:
            return SourceInfo("apex", version, "flags", root, ops=read_flag_extensions(text, str(setup_py)))
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
        if regime != info.regime:
            note = (f"regime forced to {regime!r}; the tree at {info.root} is a {info.regime!r} tree "
                    f"(apex {info.version})")
        else:
            note = f"regime {regime!r} detected from the tree (apex {info.version})"
        selected = select_ops(info, request.ops, tc.kind)
        env: dict[str, str | None] = {}
        pip_args: list[str] = []
        if regime == "env":
            env.update(_env_switches(info, selected))
        else:
            groups = sorted({op.group for op in selected})
            pip_args += [f"--config-settings=--build-option=--{g}_ext" for g in groups]
            # a stray APEX_BUILD_* from the caller's shell would change what an env-regime tree builds
            env.update({CPP_GROUP_VAR: None, CUDA_GROUP_VAR: None})
        per_job = PER_JOB_ROCM if tc.kind == "rocm" else PER_JOB_CPU
        jobs = choose_jobs(per_job, machine, request.jobs)
        env["MAX_JOBS"] = str(jobs)
        if tc.kind == "rocm":
            env["PYTORCH_ROCM_ARCH"] = ";".join(tc.archs)
        else:
            env["PYTORCH_ROCM_ARCH"] = None
        # apex's own version suffixes (+DESIRED_CUDA) would fight porter's label
        env.update({"DESIRED_CUDA": None, "APEX_COMMIT": None})
        if regime == "env":
            modules = tuple(op.module for op in selected)
            optional: tuple[str, ...] = ()
        else:
            modules = tuple(op.module for op in selected if op.required)
            optional = tuple(op.module for op in selected if not op.required)
        if regime == "flags" and info.regime == "env":
            empty_hint = (f"apex {info.version} reads APEX_BUILD_* environment variables and silently drops "
                          "--cpp_ext/--cuda_ext; drop --regime and let porter use the tree's own regime")
        elif regime == "env" and info.regime == "flags":
            empty_hint = (f"apex {info.version} predates APEX_BUILD_* and only builds with --cpp_ext/--cuda_ext; "
                          "drop --regime and let porter use the tree's own regime")
        else:
            empty_hint = "upstream skipped every requested op; look for 'Skip pre-compile' in the build output"
        notes = [note]
        if any(op.group == "cpp" for op in selected):
            notes.append("apex's host-only ops are compiled with upstream's own -march choice (native on most "
                         "hosts); a patch set can pin it to the profile's cpu_isa")
        return BuildPlan(
            project="apex", version=info.version, regime=regime, backend=None, label=tc.local_label,
            pip_args=tuple(pip_args), env=env, jobs=jobs, per_job_bytes=per_job,
            needs_torch="rocm" if tc.kind == "rocm" else None,
            expect=Expectation(modules=modules, optional=optional, prebuilt=True,
                               host_only=tuple(op.module for op in selected if op.group == "cpp"),
                               archs=tc.arch_names if tc.kind == "rocm" else (), empty_hint=empty_hint),
            ops=selected, notes=tuple(notes))


def _env_switches(info: SourceInfo, selected: tuple[OpSpec, ...]) -> dict[str, str | None]:
    """APEX_BUILD_<OP>=1 for each selected op; the group switches and every other op switch unset.

    Per-op switches say exactly what is asked for (a group switch would also pick up ops a fork adds),
    and unsetting the rest keeps a stray value in the caller's shell from changing the build.
    """
    env: dict[str, str | None] = {CPP_GROUP_VAR: None, CUDA_GROUP_VAR: None}
    chosen = {op.name for op in selected}
    for op in info.ops:
        env[op.switch] = "1" if op.name in chosen else None
    return env


def select_ops(info: SourceInfo, wanted: Iterable[str], kind: str) -> tuple[OpSpec, ...]:
    """Resolve ``--ops``: names, groups (cpp, cuda) or ``all``; default: all the profile can build."""
    names = [w for spec in wanted for w in re.split(r"[,\s]+", spec) if w]
    allowed_groups = ("cpp", "cuda") if kind == "rocm" else ("cpp",)
    if not names:
        names = ["all"]
    by_name = {op.name: op for op in info.ops}
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
    if not picked:
        raise ConfigError(f"no apex op selected (asked: {', '.join(names)}; profile kind {kind})",
                          hint="the cpu profile can build only the cpp ops (apex_C); use a rocm profile for the rest")
    return tuple(sorted(picked.values(), key=lambda o: o.name))


# -- reading the tree ----------------------------------------------------------------------------

def _apex_version(root: Path, setup_text: str) -> str:
    vfile = root / "version.txt"
    if vfile.is_file():
        v = vfile.read_text().strip()
        if v:
            return v
    m = re.search(r"""version\s*=\s*['"]([^'"]+)['"]""", setup_text)
    return m.group(1) if m else "0.0"


def read_op_builder(folder: Path) -> tuple[OpSpec, ...]:
    """Ops from ``op_builder/*.py``: classes with string attributes BUILD_VAR, NAME (and INCLUDE_FLAG)."""
    ops: list[OpSpec] = []
    for path in sorted(folder.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(errors="replace"), str(path))
        except SyntaxError as exc:
            raise ConfigError(f"{path}: cannot parse ({exc.msg}, line {exc.lineno})") from None
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            attrs: dict[str, str] = {}
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                    attrs[stmt.targets[0].id] = stmt.value.value
            if "BUILD_VAR" in attrs and "NAME" in attrs:
                group = "cpp" if attrs.get("INCLUDE_FLAG") == CPP_GROUP_VAR else "cuda"
                ops.append(OpSpec(attrs["NAME"], f"apex.{attrs['NAME']}", group, attrs["BUILD_VAR"]))
    return tuple(ops)


def _mentions(node: ast.AST, flag: str) -> bool:
    return any(isinstance(n, ast.Constant) and n.value == flag for n in ast.walk(node))


def _extension_names(node: ast.AST) -> list[str]:
    names: list[str] = []
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if not fname.endswith("Extension"):
            continue
        value: ast.expr | None = next((k.value for k in call.keywords if k.arg == "name"), None)
        if value is None and call.args:
            value = call.args[0]
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            names.append(value.value)
    return names


def read_flag_extensions(text: str, where: str) -> tuple[OpSpec, ...]:
    """Extensions an old setup.py builds under ``if "--cpp_ext"/"--cuda_ext" in sys.argv``.

    Those created directly in such a block are required; those inside a further condition
    (``if not IS_ROCM_PYTORCH:``) are optional.
    """
    try:
        tree = ast.parse(text, where)
    except SyntaxError as exc:
        raise ConfigError(f"{where}: cannot parse ({exc.msg}, line {exc.lineno})") from None
    found: dict[str, OpSpec] = {}
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        for group in GROUPS:
            flag = f"--{group}_ext"
            if not _mentions(node.test, flag):
                continue
            for stmt in node.body:
                nested = isinstance(stmt, (ast.If, ast.Try, ast.For, ast.While, ast.With))
                for name in _extension_names(stmt):
                    prev = found.get(name)
                    required = not nested or (prev is not None and prev.required)
                    found[name] = OpSpec(name, name, group, flag, required)
    return tuple(sorted(found.values(), key=lambda o: o.name))


class ApexComponent:
    """ROCm apex as a component: built by ``porter wheel apex`` with :class:`ApexDriver`."""

    name = "apex"
    title = "ROCm apex"
    dists: tuple[str, ...] = ("apex",)
    patch_project = ""
    build_command = "porter wheel apex"
    driver = ApexDriver()

    def recognise(self, tree: Path) -> Recognised | None:
        info = self.driver.detect(tree)
        return Recognised(self.name, info.version, tree, info.regime) if info else None

    def check_installed(self, dist: InstalledDist, manifest: Manifest | None, kind: str) -> InstalledCheck:
        return InstalledCheck()


APEX = ApexComponent()
