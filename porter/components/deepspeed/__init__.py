"""DeepSpeed: everything porter knows of it, in this package; its ops are compiled ahead of time on the one AOT
engine (:mod:`ops_prebuild`) by ``porter ops build``.

- here: how to recognise a tree and read its version, where prebuilt ops are recorded
  (``deepspeed/git_version_info_installed.py``, ``installed_ops``), and what verify checks beyond files and code
  objects: every op that ships a prebuilt module is marked prebuilt (else DeepSpeed JIT-compiles it anyway), and
  no op is marked prebuilt without its module;
- :mod:`.catalogue`: the op catalogue, read from the tree's own ``op_builder`` in the build python;
- :mod:`.build`: source -> patched copy -> catalogue -> the engine -> DeepSpeed's own wheel with the modules;
- :mod:`.wheel`: that wheel (``installed_ops``, the no-JIT patch set, recorded feature probes).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING

from porter.components.base import InstalledCheck, Recognised

if TYPE_CHECKING:
    from porter.artifacts.manifest import Manifest
    from porter.install.env import InstalledDist

VERSION_INFO = "deepspeed/git_version_info_installed.py"

# DeepSpeed's optimizer classes and the op each one loads when it is built (facts of deepspeed.ops.*);
# the audit reads a training tree's imports of them as start-up op loads.
OPTIMIZER_OPS: dict[str, str] = {
    "DeepSpeedCPUAdam": "cpu_adam", "FusedAdam": "fused_adam", "DeepSpeedCPUAdagrad": "cpu_adagrad",
    "DeepSpeedCPULion": "cpu_lion", "FusedLamb": "fused_lamb", "FusedLion": "fused_lion",
}


def is_tree(tree: Path) -> bool:
    return (tree / "op_builder" / "builder.py").is_file() and (tree / "deepspeed").is_dir()


def tree_version(tree: Path) -> str:
    vfile = tree / "version.txt"
    return vfile.read_text().strip() if vfile.is_file() else "0+unknown"


def read_installed_ops(text: str) -> dict[str, bool] | None:
    """``installed_ops`` from the text of git_version_info_installed.py (None when unreadable)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "installed_ops"
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            if isinstance(value, dict):
                return {str(k): bool(v) for k, v in value.items()}
    return None


class DeepSpeedComponent:
    name = "deepspeed"
    title = "DeepSpeed"
    tree_marks = "op_builder/builder.py and deepspeed/"
    dists: tuple[str, ...] = ("deepspeed",)
    patch_project = "deepspeed"
    fetches = True  # (MatrixBuild) a matrix cell may name a release: NAME==VERSION
    takes_ops = True

    def is_tree(self, tree: Path) -> bool:
        return is_tree(tree)

    def tree_version(self, tree: Path) -> str:
        return tree_version(tree)

    def recognise(self, tree: Path) -> Recognised | None:
        return Recognised(self.name, tree_version(tree), tree) if is_tree(tree) else None

    def check_installed(self, dist: InstalledDist, manifest: Manifest | None, kind: str) -> InstalledCheck:
        out = InstalledCheck()
        if kind == "cpu":
            out.import_env["DS_ACCELERATOR"] = "cpu"
        info = Path(dist.location) / VERSION_INFO
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
        for op in sorted(built):
            if not ops.get(op):
                out.problems.append((str(info), f"installed_ops[{op!r}]", "True (a prebuilt .so ships)",
                                     f"{ops.get(op)!r}: DeepSpeed would JIT-compile {op} anyway"))
        for op in sorted(o for o, v in ops.items() if v and o not in built):
            out.problems.append((str(info), f"installed_ops[{op!r}]", "a prebuilt module listed in the manifest",
                                 "True but no such module shipped"))
        return out


DEEPSPEED = DeepSpeedComponent()
