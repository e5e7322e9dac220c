"""``porter audit``: every place a training stack would compile at start-up, and what covers it.

A training tree (Megatron-DeepSpeed, a fork, a DeepSpeed tree) and the target python it runs with are read,
never run: the tree's Python files are parsed (``ast``), and the target's installed DeepSpeed, APEX and
FlashAttention are found through its own interpreter (one probe, :func:`porter.install.env.inspect_env`) and
then read from disk. A *site* is one place that compiles when it runs:

========== =============================================================================================
torch-jit  ``torch.utils.cpp_extension.load`` / ``load_inline`` (Megatron's fused kernels)
make       a ``make`` subprocess (Megatron's ``compile_helper()`` building ``megatron/data/helpers.cpp``)
deepspeed  ``XBuilder().load()``, ``create_op_builder("X")``, or a DeepSpeed optimizer class that loads its
           op (``DeepSpeedCPUAdam`` -> ``cpu_adam``), for an op the target's DeepSpeed does not mark prebuilt
apex       an APEX op builder's ``load()`` at import (ROCm apex is JIT by default) without its module shipped
triton     a ``@triton.jit`` / ``@triton.autotune`` kernel (compiled at its first call), or a FlashAttention
           install with no compiled extension (its Triton backend)
probe      DeepSpeed's ``has_function`` feature probe (compiles a test program to ask for a library)
========== =============================================================================================

Each site gets a status: ``covered`` (a prebuilt module is installed and nothing compiles), ``guarded``
(porter's patch makes it import a prebuilt module, which is not installed in this python: start-up stops with
an error naming the porter command, nothing compiles), ``compiles`` (it would compile on a compute node), or
``probe`` (a feature probe: it builds nothing, but answers "absent" on a node without a compiler). What a
site costs where a compiler exists, and what happens where none does, is said per kind. The audit fails
(exit 1) when any site compiles.

In the target's installed DeepSpeed and APEX, a site is module-level code of a module the tree imports (and the
packages on its way; what those import in turn is not followed), besides DeepSpeed's feature probes: which of
DeepSpeed's ops a training loads is read from the training tree itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from porter.components import all_dists, registry
from porter.components.jit import (KINDS, At, Audit, JitSites, Kind, Raw, Site, Target, builder_names,
                                   python_files, relevant, scan)
from porter.install.env import TargetEnv


def components() -> list[JitSites]:
    """The components the audit asks, in the registry's order (the first to claim a site answers for it)."""
    return [c for c in registry().values() if isinstance(c, JitSites)]


def target_of(env: TargetEnv) -> Target:
    """The target python as the audit reads it: its prebuilt modules, and what each component reads of its own
    installation."""
    target = Target.of(env)
    for c in components():
        c.read_target(target)
    return target


@dataclass
class AuditReport:
    tree: Path
    python: str
    sites: list[Site] = field(default_factory=list)
    installed: dict[str, str] = field(default_factory=dict)
    """Distributions of the target that the audit read (name -> version)."""
    kinds: Mapping[str, Kind] = field(default_factory=dict)
    files: int = 0
    """Python files of the tree that were read."""

    @property
    def compiles(self) -> list[Site]:
        return [s for s in self.sites if s.status == "compiles"]

    @property
    def ok(self) -> bool:
        return not self.compiles

    def counts(self) -> dict[str, int]:
        return {s: sum(site.status == s for site in self.sites) for s in ("compiles", "guarded", "probe", "covered")}

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "porter.audit/1", "tree": str(self.tree), "python": self.python, "ok": self.ok,
                "files": self.files, "installed": self.installed, "counts": self.counts(),
                "fail_without_compiler": sum(1 for s in self.compiles if self.kinds[s.kind].fails),
                "sites": [s.to_dict(self.kinds) for s in self.sites]}


def _porter_answer(raw: Raw, at: At) -> Site:
    """A site no component claims: it compiles, and porter prebuilds nothing for it."""
    if raw.kind == "triton":
        return at.site(raw, "compiles", "porter prebuilds no Triton kernels: warm TRITON_CACHE_DIR on node-local "
                                        "disk once per node type, or use a compiled backend")
    return at.site(raw, "compiles", "porter knows no prebuilt module for this site; prebuild it ahead of time or keep "
                                    "it off the start-up path")


def audit(tree: str | os.PathLike[str], target: Target | None) -> AuditReport:
    """Every compile site of ``tree`` and of what ``target`` (None: no python given) has installed."""
    root = Path(tree).resolve()
    comps = components()
    report = AuditReport(root, target.python if target else "",
                         kinds={**KINDS, **{k: v for c in comps for k, v in c.jit_kinds.items()}})
    if target is not None:
        shown = {*all_dists(), "triton"}
        report.installed = {d.name: d.version for k, d in sorted(target.dists.items()) if k in shown}
    loads = {pkg: ops for c in comps for pkg, ops in c.loads_on_import.items()}

    def resolve(raw: Raw, at: At) -> Site:
        return next((s for c in comps if (s := c.resolve(raw, at, ctx)) is not None), None) or _porter_answer(raw, at)

    ctx = Audit(target, {c.name: builder_names(c.builder_roots(root, target)) for c in comps}, loads, resolve)
    imports: set[str] = set()
    for path in python_files(root):
        at = At(path.relative_to(root).as_posix(), path.read_text(errors="replace"), "tree", path)
        report.files += 1
        found = scan(at.text, loads)
        imports |= found.imports
        report.sites += [resolve(raw, at) for raw in found.sites if relevant(raw, path, loads)]
    if target is not None:
        report.sites += [s for c in comps for s in c.installed_sites(ctx, imports)]
    return report


def render(report: AuditReport) -> list[str]:
    """The text report: one line per site, most urgent first, then what it costs and what to do."""
    order = {"compiles": 0, "guarded": 1, "probe": 2, "covered": 3}
    lines = [f"audit of {report.tree}" + (f" with {report.python}" if report.python else " (no target python)")]
    if report.installed:
        lines.append("installed: " + ", ".join(f"{k} {v}" for k, v in report.installed.items()))
    for s in sorted(report.sites, key=lambda s: (order[s.status], s.origin != "tree", s.file, s.line)):
        where = f"{s.file}:{s.line}" if s.line else s.file
        origin = "" if s.origin == "tree" else f" [{s.origin}]"
        lines.append(f"{s.status.upper():<9} {s.kind:<10} {where}{origin}  {s.what} (at {s.when})")
        if s.status != "covered":
            k = report.kinds[s.kind]
            lines.append(f"          cost: {k.cost}; without a compiler: {k.no_compiler}")
        lines.append(f"          {s.detail}")
    c = report.counts()
    fails = sum(1 for s in report.compiles if report.kinds[s.kind].fails)
    lines.append(f"{len(report.sites)} site(s): {c['compiles']} would compile on a compute node ({fails} of them "
                 f"fail there without a compiler), {c['guarded']} guarded by porter's patches but without their "
                 f"prebuilt module, {c['probe']} feature probe(s), {c['covered']} covered by prebuilt modules")
    return lines


__all__ = ["AuditReport", "audit", "render", "target_of"]
