"""DeepSpeed's compile sites for ``porter audit``: its op loads (``XBuilder().load()``, ``create_op_builder``, an
optimizer class that loads its op) against the installed ops the target's DeepSpeed records, and its
``has_function`` feature probes against the answers porter recorded at build time."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from porter.components.op_builder import read_installed_ops
from porter.components.jit import (At, Audit, Kind, Raw, Site, Target, find_sites, imported_files, python_files,
                                   relevant)

NAME = "deepspeed"
VERSION_INFO = "deepspeed/git_version_info_installed.py"

# DeepSpeed's optimizer classes and the op each one loads when it is built (facts of deepspeed.ops.*);
# the audit reads a training tree's imports of them as start-up op loads.
OPTIMIZER_OPS: dict[str, str] = {
    "DeepSpeedCPUAdam": "cpu_adam", "FusedAdam": "fused_adam", "DeepSpeedCPUAdagrad": "cpu_adagrad",
    "DeepSpeedCPULion": "cpu_lion", "FusedLamb": "fused_lamb", "FusedLion": "fused_lion",
}

KINDS = {NAME: Kind("DeepSpeed JIT-builds the op with ninja into TORCH_EXTENSIONS_DIR on first use (cpu_adam: about "
                    "a minute), on every node",
                    "fails: no ninja, no compiler (with porter's deepspeed/no-jit and PORTER_NO_JIT=1: a clear error "
                    "naming 'porter ops build')", True)}


@dataclass(frozen=True)
class Installed:
    """What the audit reads of an installed DeepSpeed."""

    version: str
    root: Path | None
    ops: dict[str, bool] | None
    """installed_ops (None: not recorded)."""
    accelerator: str = ""
    probes_recorded: bool = False
    no_jit: bool = False
    """The installed builder carries porter's deepspeed/no-jit guard (refuses JIT under PORTER_NO_JIT=1)."""
    probe_patch: bool = False
    """The installed builder answers feature probes from porter's recorded answers."""


def read_target(target: Target) -> None:
    ds = target.dists.get(NAME)
    if ds is None:
        return
    info = Path(ds.location) / VERSION_INFO
    text = info.read_text(errors="replace") if info.is_file() else ""
    m = re.search(r"(?m)^accelerator_name\s*=\s*['\"]([^'\"]*)['\"]", text)
    builder = Path(ds.location) / NAME / "ops" / "op_builder" / "builder.py"
    code = builder.read_text(errors="replace") if builder.is_file() else ""
    target.facts[NAME] = Installed(ds.version, target.package_root(NAME, NAME),
                                   read_installed_ops(text) if text else None, m.group(1) if m else "",
                                   bool(re.search(r"(?m)^porter_feature_probes\s*=", text)),
                                   "_porter_refuse_jit" in code, "_porter_recorded_probe" in code)


def resolve(raw: Raw, at: At, audit: Audit) -> Site | None:
    """Its op loads (those of no other component's builder) and its feature probes."""
    ds: Installed | None = audit.target.facts.get(NAME) if audit.target else None
    if raw.kind == "probe":
        if ds is not None and ds.probes_recorded and (ds.probe_patch or "_porter_recorded_probe" in at.text):
            return at.site(raw, "covered", "answered from the answers porter recorded at build time "
                                           "(porter_feature_probes), with no compiler")
        return at.site(raw, "probe", "install the DeepSpeed wheel 'porter ops build' writes: it records the build "
                                     "host's answer and its copy of the op builder (patched with deepspeed/no-jit) "
                                     "answers from it, so the node compiles no test program")
    if raw.kind != "op":
        return None
    kind, cls = raw.key.split(":", 1)
    if kind == "builder" and audit.owner(cls) not in (None, NAME):
        return None
    op = cls if kind == "op" else audit.builders.get(NAME, {}).get(cls, "")
    what = raw.what if kind == "op" or not op else f"{raw.what} -> op {op}"
    if ds is None or ds.ops is None:
        why = "no DeepSpeed installed in the target python" if ds is None else \
            "the target's DeepSpeed records no installed_ops"
        return at.site(raw, "compiles", f"{why}: nothing is prebuilt", kind=NAME, what=what)
    if not op:
        return at.site(raw, "compiles", f"op builder {cls} is not in the op catalogue porter read", kind=NAME,
                       what=what)
    if ds.ops.get(op):
        modules = audit.target.modules if audit.target else {}
        return at.site(raw, "covered", f"prebuilt in {modules.get(op, '') or 'the installed DeepSpeed'} "
                                       f"(installed_ops[{op!r}] is True)", op, kind=NAME, what=what)
    refuse = " (its no-jit patch raises a clear error under PORTER_NO_JIT=1)" if ds.no_jit else ""
    return at.site(raw, "compiles", f"DeepSpeed in {audit.python} does not mark {op} prebuilt{refuse}: build it "
                                    f"with 'porter ops build --source <deepspeed> --toolchain <profile> --ops {op}' "
                                    "and install the wheel", kind=NAME, what=what)


def installed_sites(audit: Audit, imports: set[str]) -> list[Site]:
    """Module-level code of the installed modules the tree imports, and the feature probes of the accelerator the
    installation was built for (run at import when its git_version_info asks every builder)."""
    ds: Installed | None = audit.target.facts.get(NAME) if audit.target else None
    if ds is None or ds.root is None:
        return []
    info = ds.root / "git_version_info.py"
    at_import = info.is_file() and re.search(r"(?m)^\s*\w+\s*=\s*builder\.is_compatible\(\)",
                                             info.read_text(errors="replace")) is not None
    accel = ds.accelerator or "cuda"
    run_at_import = imported_files(ds.root, imports | {NAME})
    out: list[Site] = []
    for path in python_files(ds.root):
        at = At(path.relative_to(ds.root.parent).as_posix(), path.read_text(errors="replace"), f"{NAME} {ds.version}")
        for raw in (r for r in find_sites(at.text, audit.loads) if relevant(r, path, audit.loads)):
            if raw.kind == "probe":  # only the builders of the accelerator the installation was built for
                sub = path.parent.name if path.parent.name != "op_builder" else "cuda"
                if "op_builder" not in path.parts or sub != (accel if accel != "rocm" else "cuda"):
                    continue
                raw = Raw(raw.kind, raw.line, raw.what, "import" if at_import else "call", raw.key)
            elif raw.when != "import" or path not in run_at_import:
                continue
            out.append(audit.resolve(raw, at))
    return out
