"""``porter toolchain check``: compile a small kernel for every target arch, then link them all.

This finds "gfx942 is not supported by this compiler" in seconds, before an hour of building.
"""

from __future__ import annotations

import shutil
import string
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from porter import emulate
from porter.codeobjects import CodeObject, read_code_objects
from porter.errors import PorterError, ToolError, first_error
from porter.log import Logger
from porter.run import Result, Runner
from porter.toolchain.archs import Target
from porter.toolchain.discover import Program, probe
from porter.toolchain.profile import Toolchain, toolchain_env

_GPU_KERNEL = string.Template(r"""
#include <$header>
// porter toolchain check: $what
__global__ void porter_check_kernel(float* out, const float* in, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = i < n ? in[i] : 0.0f;
  for (int offset = warpSize / 2; offset > 0; offset /= 2) v += $shuffle;
  if (i < n) out[i] = v;
}
extern "C" int porter_check_launch(float* out, const float* in, int n) {
  $launch;
  return static_cast<int>(${api}GetLastError());
}
""")
_KERNEL = {
    "rocm": _GPU_KERNEL.substitute(
        header="hip/hip_runtime.h", what="one wave-wide reduction, so the wavefront size matters.", api="hip",
        shuffle="__shfl_xor(v, offset)",
        launch="hipLaunchKernelGGL(porter_check_kernel, dim3((n + 255) / 256), dim3(256), 0, 0, out, in, n)"),
    "cuda": _GPU_KERNEL.substitute(
        header="cuda_runtime.h", what="one warp-wide reduction.", api="cuda",
        shuffle="__shfl_xor_sync(0xffffffffu, v, offset)",
        launch="porter_check_kernel<<<(n + 255) / 256, 256>>>(out, in, n)"),
    "cpu": r"""
// porter toolchain check: a loop the compiler may vectorize for the profile's ISA.
extern "C" float porter_check_sum(const float* in, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += in[i];
  return s;
}
""",
}
_KERNEL["emulated"] = _KERNEL["rocm"]  # the same HIP source, through porter's HIP-on-CPU headers
_SUFFIX = {"rocm": ".hip", "cuda": ".cu", "cpu": ".cpp", "emulated": ".cpp"}


@dataclass
class ArchResult:
    arch: str
    ok: bool
    seconds: float
    message: str = ""


@dataclass
class CheckReport:
    toolchain: Toolchain
    compiler: Program
    archs: list[ArchResult] = field(default_factory=list)
    shared_object: str | None = None
    link_error: str = ""
    code_objects: list[CodeObject] = field(default_factory=list)
    version_problem: str = ""

    @property
    def missing(self) -> list[str]:
        """Requested archs that compiled but are absent from the linked shared object."""
        if self.toolchain.kind in ("cpu", "emulated") or not self.shared_object:
            return []
        inside = {c.arch for c in self.code_objects}
        return [a.arch for a in self.archs if a.ok and a.arch.split(":")[0] not in inside]

    @property
    def ok(self) -> bool:
        return (not self.version_problem and all(a.ok for a in self.archs) and not self.link_error
                and self.shared_object is not None and not self.missing)

    def to_dict(self) -> dict[str, Any]:
        return {
            "toolchain": self.toolchain.name, "kind": self.toolchain.kind, "ok": self.ok,
            "compiler": {"path": self.compiler.path, "version": self.compiler.version},
            "version_problem": self.version_problem or None,
            "wavefront": self.toolchain.wavefront,
            "archs": [{**asdict(a), "seconds": round(a.seconds, 2)} for a in self.archs],
            "shared_object": self.shared_object, "link_error": self.link_error or None,
            "code_objects": [{"target": c.target, "kind": c.kind, "size": c.size} for c in self.code_objects],
            "missing": self.missing,
        }


def _flags(tc: Toolchain, targets: Sequence[Target]) -> list[str]:
    """The check's compiler flags: the host's (position-independent, the profile's ISA, cflags and defines), then
    the device's for ``targets``."""
    march = f"-march={tc.cpu_isa}"
    common = [*tc.cflags, *(f"-D{d}" for d in tc.defines)]
    if tc.kind == "rocm":
        return ["-fPIC", march, *common, *(f"--offload-arch={t.spec}" for t in targets)]
    if tc.kind == "cuda":
        nums = (t.name.removeprefix("sm_") for t in targets)
        return ["-Xcompiler", "-fPIC", "-Xcompiler", march, *common,
                *(f"-gencode=arch=compute_{num},code=sm_{num}" for num in nums)]
    if tc.kind == "emulated":
        return ["-fPIC", march, *emulate.compile_flags(tc.wavefront or 64), *common]
    return ["-fPIC", march, *common]


def check_toolchain(tc: Toolchain, *, log: Logger, runner: Runner | None = None,
                    keep: Path | None = None) -> CheckReport:
    runner = runner or Runner(log)
    env = toolchain_env(tc)
    ex = tc.executor
    with log.step(f"probing {tc.compiler}"):
        ex.preflight()
        compiler = probe(tc.compiler, runner, launcher=ex.prefix, env=env)
    report = CheckReport(tc, compiler)
    if tc.compiler_version:
        try:
            ok = Version(compiler.version) in SpecifierSet(tc.compiler_version)
        except InvalidVersion:
            ok = False
        if not ok:
            report.version_problem = (f"{tc.compiler} is version {compiler.version}, but the profile asks "
                                      f"{tc.compiler_version}")
    with ex.scratch("porter-check-") as work:
        src = work / f"check{_SUFFIX[tc.kind]}"
        src.write_text(_KERNEL[tc.kind])

        def run_cc(what: str, targets: Sequence[Target], out: Path, how: str, timeout: int) -> Result:
            argv = ex.argv(tc.compiler, *_flags(tc, targets), how, ex.inside(src), "-o", ex.inside(out))
            with log.step(what):
                return runner.run(argv, env=env, timeout=timeout, check=False)

        good: list[Target] = []
        for target in tc.targets or (None,):
            label = target.spec if target else f"host ({tc.cpu_isa})"
            obj = work / f"check-{(target.spec if target else 'host').replace(':', '_')}.o"
            start = time.monotonic()
            res = run_cc(f"compiling for {label}", (target,) if target else (), obj, "-c", 600)
            msg = "" if res.ok else first_error(res.output)
            report.archs.append(ArchResult(label, res.ok, time.monotonic() - start, msg))
            if res.ok and target is not None:
                good.append(target)
        if any(a.ok for a in report.archs):
            so = work / "libporter_check.so"
            res = run_cc("linking one shared object for all archs that compiled", good, so, "-shared", 900)
            if res.ok:
                report.code_objects = read_code_objects(so)
                if keep is not None:
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(so, keep / so.name)
                    report.shared_object = str(keep / so.name)
                else:
                    report.shared_object = so.name
            else:
                report.link_error = first_error(res.output)
    return report


ARCH_HINT = ("drop the failing archs from the profile, or use a ROCm that knows them (debian-trixie-rocm, "
             "ROCm 5.7: gfx942; debian-rocm7, ROCm 7.2: gfx942 and gfx950)")


def checked_compiler(tc: Toolchain, log: Logger) -> str:
    """Every build's compiler step, before any work: the compiler's version; a CPU profile's is only asked its
    version. A GPU profile's gets the toolchain check as a gate before a long build: a compiler that rejects an
    arch of the profile (or has another version than it asks) stops the build in seconds, naming the arch and the
    version."""
    quiet = Runner(log, echo=log.verbose)
    if tc.kind == "cpu":
        return probe(tc.compiler, quiet, launcher=tc.executor.prefix, env=toolchain_env(tc)).version
    with log.step(f"checking {tc.compiler} for {', '.join(t.spec for t in tc.targets)}"):
        report = check_toolchain(tc, runner=quiet, log=log)
        if failed := [a for a in report.archs if not a.ok]:
            why = failed[0].message.splitlines()[0] if failed[0].message else ""
            raise ToolError(f"{tc.compiler} {report.compiler.version} ({tc.name}) cannot compile for "
                            f"{', '.join(a.arch for a in failed)}: {why}", hint=ARCH_HINT)
        if report.version_problem:
            raise ToolError(f"toolchain {tc.name}: {report.version_problem}",
                            hint="fix compiler_version in the profile, or point it at the compiler it names")
        return report.compiler.version


def ready(tc: Toolchain, runner: Runner, log: Logger, *, compiler: bool = True) -> tuple[str, PorterError | None]:
    """Every build's readiness step, before any work: the toolchain's root (``Executor.preflight``), then (with
    ``compiler``) its compiler, :func:`checked_compiler`. A real run raises what fails and returns the compiler's
    version; a dry run asks the root only and returns what a real run here would refuse."""
    try:
        tc.executor.preflight()
    except PorterError as exc:
        if not runner.dry:
            raise
        return "", exc
    return ("" if runner.dry or not compiler else checked_compiler(tc, log)), None
