"""DeepSpeed's driver of the one build flow (:func:`porter.wheels.engine.build_wheel`, ``porter ops build``): its
ops are read from the tree's own ``op_builder`` in the build python (:mod:`.catalogue`), compiled and linked on the
AOT engine, and put, marked prebuilt, into the wheel DeepSpeed's own setup.py writes with no op
(``DS_BUILD_OPS=0``), with the feature-probe answers and the no-JIT guard (:mod:`.wheel`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from porter.artifacts import labels
from porter.components.deepspeed.audit import VERSION_INFO
from porter.components.deepspeed.catalogue import read_catalogue
from porter.components.deepspeed.wheel import guarded
from porter.components.op_builder import set_installed_ops
from porter.run import Runner, make_env
from porter.torch_facts import need_for
from porter.wheels.base import (BuildPlan, Expectation, KernelContext, KernelSet, Machine, SourceInfo,
                                WheelRequest)
from ops_prebuild.catalogue import source_tops
from ops_prebuild.source import Source


class DeepSpeedDriver:
    """(WheelDriver, EngineDriver, WheelEdits) DeepSpeed's op_builder family on porter's engine."""

    name = "deepspeed"
    title = "DeepSpeed"
    sdist_env: Mapping[str, str] = {"DS_BUILD_OPS": "0"}
    version_info = VERSION_INFO
    """Where DeepSpeed's loader reads ``installed_ops`` (and porter's ``porter_feature_probes``)."""

    def detect(self, root: Path) -> SourceInfo | None:
        if not is_tree(root):
            return None
        version = root / "version.txt"
        return SourceInfo(self.name, version.read_text().strip() if version.is_file() else "0+unknown", root,
                          str(root), regime="op_builder")

    def plan(self, info: SourceInfo, request: WheelRequest, machine: Machine) -> BuildPlan:
        """The Python side: DeepSpeed's setup.py with no op, for the accelerator of the profile (the emulated target's
        modules run on a CPU torch, with which setup.py for "cuda" looks for a CUDA toolkit; its ops are read as for
        ROCm all the same). The jobs are the engine's to choose unless asked."""
        tc = request.toolchain
        return BuildPlan(project=self.name, version=info.version, regime="op_builder", backend=None,
                         label=labels.make(tc), pip_args=(), jobs=request.jobs or 0, per_job_bytes=0,
                         env={"DS_ACCELERATOR": "cuda" if tc.kind in ("rocm", "cuda") else "cpu"},
                         needs_torch=need_for(tc.kind), per_job_source="the engine's",
                         expect=Expectation(prebuilt=True, archs=tc.arch_names if tc.kind == "rocm" else ()))

    def kernel_ops(self, info: SourceInfo, request: WheelRequest, ctx: KernelContext) -> KernelSet:
        """The ops asked for, as the tree's own builders declare them, with the ops they load at run time (said: a node
        would compile those otherwise)."""
        cat = read_catalogue(Source(self.name, info.version, ctx.source, info.origin), ctx.toolchain,
                             python=ctx.python, runner=ctx.runner, executor=ctx.py_ex)
        selected = cat.select(list(request.ops) or None, request.all_compatible)
        for dep in (o for o in selected if not request.all_compatible and o.name not in request.ops):
            users = [o.name for o in selected if dep.name in o.loads]
            ctx.log.info(f"also building {dep.name}: {', '.join(users)} load{'s' if len(users) == 1 else ''} it at "
                         "run time (a node would compile it otherwise)")
        for top in source_tops(selected):
            ctx.copy(top)
        return KernelSet(ops=tuple(selected), hipify=tuple(o.name for o in selected if o.device), declared=cat.ops,
                         probes=cat.feature_probes)

    def on_engine(self, info: SourceInfo, plan: BuildPlan) -> bool:
        return True

    mark_prebuilt = staticmethod(set_installed_ops)

    def python_only_env(self, info: SourceInfo) -> dict[str, str | None]:
        # its setup.py lists extras from sets: a fixed hash seed keeps METADATA's order (the wheel's bytes) the same
        return {"DS_BUILD_OPS": "0", "PYTHONHASHSEED": "0"}

    def wheel_edits(self, files: Mapping[str, bytes],
                    probes: Mapping[str, bool]) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
        """The feature-probe answers beside ``installed_ops``, and the no-JIT guard in the wheel's own copy of the op
        builder (:mod:`.wheel`)."""
        edits, patches = guarded(files)
        edits[VERSION_INFO] = set_installed_ops(files[VERSION_INFO].decode(), probes, "porter_feature_probes").encode()
        return edits, patches


DRIVER = DeepSpeedDriver()


def is_tree(tree: Path) -> bool:
    return (tree / "op_builder" / "builder.py").is_file() and (tree / "deepspeed").is_dir()


def download_dependencies(wheel: Path, wheelhouse: Path, *, python: str, runner: Runner) -> list[str]:
    """Binary wheels of the wheel's runtime requirements, so compute nodes can install offline.

    torch is left out on purpose: the node's torch comes from the site (module, container, venv).
    """
    import email.parser
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.BytesParser().parsebytes(z.read(meta))
    reqs = [Requirement(r) for r in msg.get_all("Requires-Dist") or []]
    wanted = [str(r) for r in reqs if r.name.lower() != "torch" and "extra" not in str(r.marker or "")]
    if wanted:
        runner.run([python, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d",
                    str(wheelhouse), *wanted], env=make_env(), timeout=1800,
                   hint="the package index must be reachable from the build host; or fill the wheelhouse yourself")
    return wanted
