"""DeepSpeed: everything porter knows of it, in this package; its ops are compiled ahead of time on the one AOT
engine (:mod:`ops_prebuild`) by ``porter ops build``.

- here: how to recognise a tree and read its version, where prebuilt ops are recorded
  (``deepspeed/git_version_info_installed.py``, ``installed_ops``), and what verify checks beyond files and code
  objects: every op that ships a prebuilt module is marked prebuilt (else DeepSpeed JIT-compiles it anyway), and
  no op is marked prebuilt without its module;
- :mod:`.catalogue`: the op catalogue, read from the tree's own ``op_builder`` in the build python;
- :mod:`.build`: its driver of the one build flow (catalogue -> the engine -> DeepSpeed's own wheel with the modules);
- :mod:`.wheel`: what porter changes in that wheel (the no-JIT patch set, recorded feature probes).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from porter.components import jit
from porter.components.base import FromDriver, InstalledCheck
from porter.components.deepspeed import audit
from porter.components.deepspeed.build import DRIVER
from porter.components.op_builder import read_installed_ops

if TYPE_CHECKING:
    from porter.artifacts.manifest import Manifest
    from porter.install.env import InstalledDist

class DeepSpeedComponent(FromDriver):
    name = "deepspeed"
    title = "DeepSpeed"
    dists: tuple[str, ...] = ("deepspeed",)
    fetches = True  # (MatrixBuild) a matrix cell may name a release: NAME==VERSION
    takes_ops = True
    jit_kinds = audit.KINDS  # (JitSites: porter audit asks it)
    loads_on_import = {"deepspeed": audit.OPTIMIZER_OPS}
    driver = DRIVER  # porter ops build (the one build flow)
    # (JitSites) the audit's questions, answered by :mod:`.audit`
    read_target = staticmethod(audit.read_target)
    resolve = staticmethod(audit.resolve)
    installed_sites = staticmethod(audit.installed_sites)

    def builder_roots(self, tree: Path, target: jit.Target | None) -> list[Path]:
        root = target.package_root(self.name, self.name) if target else None
        return [tree, *([root] if root else [])]

    def check_installed(self, dist: InstalledDist, manifest: Manifest | None, kind: str) -> InstalledCheck:
        out = InstalledCheck()
        if kind == "cpu":
            out.import_env["DS_ACCELERATOR"] = "cpu"
        info = Path(dist.location) / audit.VERSION_INFO
        ops = read_installed_ops(info.read_text()) if info.is_file() else None
        out.facts["installed_ops"] = ops
        built = {str(e["op"]) for e in (manifest.get("extensions") or [] if manifest else []) if e.get("op")}
        out.loader_ops = sorted({o for o, v in (ops or {}).items() if v} | built)
        if manifest is None:
            return out
        if ops is None:
            if built:
                out.problems.append((str(info), "installed_ops", f"installed_ops marking {', '.join(sorted(built))} "
                                     "prebuilt", "no readable installed_ops: DeepSpeed would JIT-compile every op"))
            return out
        out.problems += [(str(info), f"installed_ops[{op!r}]", "True (a prebuilt .so ships)",
                          f"{ops.get(op)!r}: DeepSpeed would JIT-compile {op} anyway") for op in sorted(built)
                         if not ops.get(op)]
        out.problems += [(str(info), f"installed_ops[{op!r}]", "a prebuilt module listed in the manifest",
                          "True but no such module shipped") for op in sorted(ops) if ops[op] and op not in built]
        return out


DEEPSPEED = DeepSpeedComponent()
