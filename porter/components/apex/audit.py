"""APEX's compile sites for ``porter audit``: an op builder's ``load()`` (ROCm apex JIT-builds at import by default)
whose module the target does not ship."""

from __future__ import annotations

from pathlib import Path

from porter.components.jit import At, Audit, Kind, Raw, Site, Target, find_sites, imported_files, relevant

NAME = "apex"
KINDS = {NAME: Kind("APEX's op builder JIT-builds the op when apex is imported (minutes for CUDA/HIP kernels)",
                    "fails: no compiler", True)}


def builder_roots(tree: Path, target: Target | None) -> list[Path]:
    root = target.package_root(NAME, NAME) if target else None
    return [root] if root else []


def resolve(raw: Raw, at: At, audit: Audit) -> Site | None:
    """A load of one of its op builders: covered when the target ships the module the builder names."""
    kind, _, cls = raw.key.partition(":")
    if raw.kind != "op" or kind != "builder" or audit.owner(cls) != NAME:
        return None
    name = audit.builders[NAME][cls]
    modules = audit.target.modules if audit.target else {}
    shipped = [m for m in modules if m.split(".")[-1] == name]
    what = f"{raw.what} -> module {name}"
    if shipped:
        return at.site(raw, "covered", f"prebuilt in {modules[shipped[0]]}", shipped[0], kind=NAME, what=what)
    return at.site(raw, "compiles", f"apex ships no prebuilt {name}: build it with 'porter wheel apex --source "
                                    "<apex tree> --toolchain <profile>' and install that wheel", kind=NAME, what=what)


def installed_sites(audit: Audit, imports: set[str]) -> list[Site]:
    """What runs at import of the installed modules the tree imports (and the packages on their way)."""
    target = audit.target
    dist = target.dists.get(NAME) if target else None
    root = target.package_root(NAME, NAME) if target else None
    if dist is None or root is None:
        return []
    out: list[Site] = []
    for path in sorted(imported_files(root, imports)):
        at = At(path.relative_to(root.parent).as_posix(), path.read_text(errors="replace"), f"{NAME} {dist.version}")
        out += [audit.resolve(raw, at) for raw in find_sites(at.text, audit.loads)
                if raw.when == "import" and raw.kind in ("op", "torch-jit") and relevant(raw, path, audit.loads)]
    return out
