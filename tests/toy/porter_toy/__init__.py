"""A project porter does not ship, as a plugin would bring it: one package, found through the ``porter.components``
entry point (``tests/toy`` on the path), with nothing changed under ``porter/``.

Its tree (``tests/fixtures/toy-src``) is a setuptools project with one C extension (``toy._kern``) and two HIP
kernels. What it declares, and what porter does with each:

- ``driver`` (a WheelDriver): ``porter wheel toy`` builds, verifies and labels its wheel; ``--compile-only``
  compiles its HIP kernels for every arch of a rocm profile; ``--shards N --slurm`` splits that into Slurm jobs;
  ``porter build --request`` (matrix cells, shards) runs it.
- ``fetches`` / ``takes_ops`` (MatrixBuild): a matrix may list it.
- ``jit_kinds`` / ``resolve`` (JitSites): ``porter audit`` reports a training tree's ``load(name="toy_...")``.
"""

from __future__ import annotations

from pathlib import Path

from ops_prebuild.catalogue import OpSpec
from porter.artifacts import labels
from porter.components.base import FromDriver
from porter.components.jit import At, Audit, Kind, NoSites, Raw, Site
from porter.wheels.base import (BuildPlan, Expectation, KernelContext, KernelSet, Machine, SourceInfo, WheelRequest,
                                choose_jobs)

KERNELS = ("csrc/toy_scale.hip", "csrc/toy_add.hip")


class ToyDriver:
    name = "toy"
    title = "Toy"
    sdist_env: dict[str, str] = {}

    def detect(self, root: Path) -> SourceInfo | None:
        marker = root / "toy.txt"
        if not (marker.is_file() and (root / "setup.py").is_file()):
            return None
        return SourceInfo("toy", marker.read_text().strip(), root, regime="setup")

    def plan(self, info: SourceInfo, request: WheelRequest, machine: Machine) -> BuildPlan:
        tc = request.toolchain
        return BuildPlan(project="toy", version=info.version, regime="setup", backend=None, label=labels.make(tc),
                         pip_args=(), env={}, jobs=choose_jobs(1 << 28, machine, request.jobs), per_job_bytes=1 << 28,
                         needs_torch=None, expect=Expectation(modules=("toy._kern",), prebuilt=True),
                         notes=("the toy's setup.py builds one host extension",))

    def kernel_ops(self, info: SourceInfo, request: WheelRequest, ctx: KernelContext) -> KernelSet:
        ctx.copy("csrc")
        ops = tuple(OpSpec(name=Path(src).stem, builder="setup.py", build_var="", module=f"toy.{Path(src).stem}",
                           sources=(src,), include_paths=("csrc",), device=True, compatible=True)
                    for src in KERNELS)
        return KernelSet(ops=ops)


class ToyComponent(FromDriver, NoSites):
    name = "toy"
    title = "Toy"
    dists: tuple[str, ...] = ("toy",)
    driver = ToyDriver()
    fetches = False  # (MatrixBuild)
    takes_ops = False
    jit_kinds = {"toy": Kind("the toy's kernels JIT-build at first use", "fails: no compiler", True)}  # (JitSites)

    def resolve(self, raw: Raw, at: At, audit: Audit) -> Site | None:
        """A ``load(name="toy_...")``: covered when the target ships the toy's module of that name."""
        if raw.kind != "torch-jit" or not raw.key.startswith("toy_"):
            return None
        module = f"toy.{raw.key}"
        if audit.target is not None and module in audit.target.modules:
            return at.site(raw, "covered", f"prebuilt in {audit.target.modules[module]}", module, kind="toy")
        return at.site(raw, "compiles", "build it with 'porter wheel toy --source <toy tree>' and install the wheel",
                       module, kind="toy")


TOY = ToyComponent()
