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
import re
from collections.abc import Mapping
from pathlib import Path

from typing import TYPE_CHECKING

from porter.components import InstalledCheck, Recognised
from porter.errors import ConfigError
from porter.wheels.base import BACKENDS, GiB, BuildPlan, Expectation, Machine, SourceInfo, WheelRequest, choose_jobs

if TYPE_CHECKING:
    from porter.artifacts.manifest import Manifest
    from porter.install.env import InstalledDist

CK_GENERATOR = "csrc/composable_kernel/example/ck_tile/01_fmha/generate.py"
EXTENSION = "flash_attn_2_cuda"
TRITON_PACKAGE = "flash_attn/flash_attn_triton_amd"

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
        backends = ("ck", "triton") if "FLASH_ATTENTION_TRITON_AMD_ENABLE" in text else ("ck",)
        return SourceInfo("flash-attn", version, "env", root, allowed_archs=allowed_archs(text, version),
                          backends=backends)

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
        bad = [a for a in archs if a not in info.allowed_archs]
        if bad:
            raise ConfigError(f"flash-attn {info.version} does not support {', '.join(bad)} "
                              f"(its setup.py accepts GPU_ARCHS {', '.join(info.allowed_archs)})",
                              hint="pick a profile or --arch from that list; upstream would stop the build "
                                   "with an assertion after codegen")
        if backend == "ck":
            gen = info.root / CK_GENERATOR
            if not gen.is_file():
                raise ConfigError(f"the composable_kernel submodule is missing: {info.root / 'csrc/composable_kernel'} "
                                  f"is empty (no {CK_GENERATOR})",
                                  hint="run 'git submodule update --init csrc/composable_kernel' in the checkout, "
                                       "or build from the PyPI sdist (it ships the submodule)")
        if request.ops:
            raise ConfigError("flash-attn has no op selection; --ops applies to apex")
        per_job = PER_JOB_CK if backend == "ck" else PER_JOB_TRITON
        jobs = choose_jobs(per_job, machine, request.jobs)
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
        notes: list[str] = []
        if any(t.features for t in tc.targets):
            notes.append("flash-attn's GPU_ARCHS takes bare arch names; target features "
                         f"({', '.join(t.spec for t in tc.targets if t.features)}) are dropped")
        if backend == "triton":
            env.update({"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE", "FLASH_ATTENTION_SKIP_CK_BUILD": "TRUE"})
            expect = Expectation(packages=(TRITON_PACKAGE,), prebuilt=False, archs=())
            notes.append("Triton backend: no extension is compiled; kernels are JIT-compiled by Triton at run time "
                         "and need a ROCm torch and triton on the compute node")
        else:
            env.update({"FLASH_ATTENTION_TRITON_AMD_ENABLE": None, "FLASH_ATTENTION_SKIP_CK_BUILD": None})
            expect = Expectation(modules=(EXTENSION,), prebuilt=True, archs=archs,
                                 empty_hint="FLASH_ATTENTION_SKIP_CUDA_BUILD or the Triton switch must have been "
                                            "set inside the build; check the tree's setup.py")
        return BuildPlan(project="flash-attn", version=info.version, regime="env", backend=backend,
                         label=tc.local_label, pip_args=(), env=env, jobs=jobs, per_job_bytes=per_job,
                         needs_torch="rocm" if backend == "ck" else None, expect=expect, notes=tuple(notes))


def allowed_archs(setup_text: str, version: str) -> tuple[str, ...]:
    """The archs the tree's GPU_ARCHS check accepts: the ``allowed_archs = [...]`` literal, else by version."""
    try:
        tree = ast.parse(setup_text)
    except SyntaxError:
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "allowed_archs"
                                                     for t in node.targets)
                    and isinstance(node.value, (ast.List, ast.Tuple))):
                values = [e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                archs = tuple(v for v in values if v != "native")
                if archs:
                    return archs
    from packaging.version import InvalidVersion, Version
    try:
        v = Version(version)
    except InvalidVersion:
        v = Version("0")
    for floor, archs in _ALLOWED_BY_VERSION:
        if v >= Version(floor):
            return archs
    return _ALLOWED_BY_VERSION[-1][1]


class FlashAttnComponent:
    """FlashAttention 2 as a component: built by ``porter wheel flash-attn`` with :class:`FlashAttnDriver`."""

    name = "flash-attn"
    title = "FlashAttention"
    dists: tuple[str, ...] = ("flash-attn",)
    patch_project = ""
    build_command = "porter wheel flash-attn"
    driver = FlashAttnDriver()

    def recognise(self, tree: Path) -> Recognised | None:
        info = self.driver.detect(tree)
        return Recognised(self.name, info.version, tree, info.regime) if info else None

    def check_installed(self, dist: InstalledDist, manifest: Manifest | None, kind: str) -> InstalledCheck:
        return InstalledCheck()


FLASH_ATTN = FlashAttnComponent()
