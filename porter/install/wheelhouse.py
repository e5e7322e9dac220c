"""A wheelhouse: a folder of wheels, porter's with a sidecar ``<wheel>.porter.json`` manifest.

Scanning reads every wheel's name, version and tags (``packaging``) and its manifest. Wheels porter
built (a known component, or a porter local label such as ``+rocm5.7.gfx90a`` / ``+cpu.x86_64_v2``)
must have a valid manifest; other wheels are dependencies, offered to pip as ``--find-links`` only.

``mismatches`` says why a porter wheel does not fit a target (python/platform tags, torch version and
kind, ROCm/CUDA version, GPU arch, wavefront), one reason per line; ``select`` picks one wheel per
component. ``check_wheel`` proves a wheel file is the one its manifest describes and that no entry
escapes the install target. ``write_index`` makes a PEP 503 simple index plus a combined manifest.
"""

from __future__ import annotations

import email.parser
import html
import os
import re
import shutil
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from porter import __version__
from porter.archive import DamagedFile
from porter.errors import ConfigError, NothingToDo
from porter.artifacts import labels
from porter.components import all_dists
from porter.install.env import Node, TargetEnv
from porter.artifacts.manifest import SUFFIX, Manifest, manifest_path, read_manifest
from porter.fs import atomic_write_json, atomic_write_text, owned_temp_dir, sha256_bytes, sha256_file
from porter.toolchain.archs import ARCHS

INDEX_SCHEMA = "porter.wheelhouse/1"
INDEX_NAME = "porter-wheelhouse.json"


@dataclass(frozen=True)
class Wheel:
    """One wheel file in a wheelhouse, with its manifest when porter built it."""

    path: Path
    project: NormalizedName
    version: Version
    tags: frozenset[Tag]
    manifest: Manifest | None = None
    manifest_error: str | None = None     # missing / corrupt, for a wheel that needs one

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def version_text(self) -> str:
        """The version as in the file name (labels are in normal form, so this is ``str(version)``)."""
        return str(self.version)

    @property
    def is_porter(self) -> bool:
        return self.manifest is not None or self.manifest_error is not None

    @property
    def component(self) -> str:
        return str(self.manifest["component"]) if self.manifest else str(self.project)


def scan(directory: str | os.PathLike[str]) -> list[Wheel]:
    """Every ``*.whl`` in ``directory`` (not recursive), sorted by name; manifests read and checked."""
    root = Path(directory)
    if not root.is_dir():
        raise ConfigError(f"wheelhouse not found: {root}", hint="pass the folder that holds the wheels")
    wheels: list[Wheel] = []
    for path in sorted(root.glob("*.whl")):
        try:
            project, version, _build, tags = parse_wheel_filename(path.name)
        except (InvalidWheelFilename, InvalidVersion) as exc:
            raise ConfigError(f"not a valid wheel file name: {path}: {exc}",
                              hint="remove or rename the file; wheel names follow PEP 427") from None
        mpath = manifest_path(path)
        manifest: Manifest | None = None
        error: str | None = None
        # a known component's wheel, or one with a porter label, must have one
        if mpath.exists() or project in all_dists() or (version.local and labels.parse(version.local)):
            try:
                manifest = read_manifest(mpath)
                if (named := manifest["wheel"].get("filename")) != path.name:
                    error = f"manifest {mpath.name} describes {named!r}, not {path.name}"
                    manifest = None
            except ConfigError as exc:
                error = exc.message
        wheels.append(Wheel(path, project, version, frozenset(tags), manifest, error))
    return wheels


def orphan_manifests(directory: str | os.PathLike[str]) -> list[Path]:
    """Manifests whose wheel is gone."""
    root = Path(directory)
    return sorted(p for p in root.glob(f"*.whl{SUFFIX}") if not (root / p.name[:-len(SUFFIX)]).exists())


# -- does a wheel fit the target? ----------------------------------------------------------------

def _major_minor(version: str | None) -> str:
    return ".".join(re.findall(r"\d+", version or "")[:2])


def same_version(a: str, b: str | Version) -> bool:
    try:
        return Version(a) == (b if isinstance(b, Version) else Version(b))
    except InvalidVersion:
        return a == str(b)


def _release(version: str) -> str:
    try:
        return ".".join(str(p) for p in Version(version).release)
    except InvalidVersion:
        return version.split("+")[0]


_TOOLKITS = {"rocm": ("ROCm", "hip", "HIP"), "cuda": ("CUDA", "cuda", "CUDA")}
"""A GPU build's toolkit: its name, the torch attribute with torch's version of it, and what torch calls it."""


def runtime_mismatches(manifest: Manifest, env: TargetEnv, node: Node) -> list[str]:
    """Why this build does not fit the environment's torch and the node's GPU ([] when it does)."""
    out: list[str] = []
    target: dict[str, Any] = dict(manifest.get("target") or {})
    built_torch: dict[str, Any] = dict(manifest.get("torch") or {})
    kind = str(target.get("kind", "cpu"))
    tver = built_torch.get("version")
    toolchain: dict[str, Any] = dict(manifest.get("toolchain") or {})
    if tver:
        # a GPU build runs only on that GPU kind's torch, whatever torch the headers came from
        tkind = kind if kind in ("rocm", "cuda") else str(built_torch.get("kind") or "cpu")
        want = f"{_release(str(tver))} ({tkind})"
        if env.torch is None:
            out.append(f"torch: built for {want}, not installed in this environment")
        elif _release(str(tver)) != env.torch.release or tkind != env.torch.kind:
            out.append(f"torch: built for {want}, found {env.torch.release} ({env.torch.kind})")
    if kind in _TOOLKITS:
        name, attr, torch_name = _TOOLKITS[kind]
        want_kit = _major_minor(str(target.get("toolkit_version") or toolchain.get("toolkit_version")
                                    or built_torch.get(attr) or ""))
        have = getattr(env.torch, attr) if env.torch is not None else None
        if want_kit and have and want_kit != _major_minor(have):
            out.append(f"{name}: built for {name} {want_kit}, torch here is built for {torch_name} {have}")
        built = [str(a).split(":")[0] for a in target.get("archs") or []]
        if not node.archs:
            out.append(f"GPU arch: built for {','.join(built) or '?'}; no GPU visible here and no --arch given")
        else:
            missing = [a for a in node.archs if a not in built]
            if missing:
                out.append(f"GPU arch: node has {','.join(node.archs)}, wheel has code for {','.join(built) or 'none'}")
            wave = target.get("wavefront")
            node_waves = sorted({ARCHS[a].wavefront for a in node.archs if a in ARCHS})
            if wave is not None and node_waves and node_waves != [int(wave)]:
                out.append(f"wavefront: built for wave{wave}, {','.join(node.archs)} runs "
                           f"wave{'/'.join(map(str, node_waves))}")
    return out


def mismatches(wheel: Wheel, env: TargetEnv, node: Node) -> list[str]:
    out: list[str] = []
    env_tags = set(env.tags)
    if env_tags and not {str(t) for t in wheel.tags} & env_tags:
        tags = ".".join(sorted({str(t) for t in wheel.tags}))
        out.append(f"python/platform: wheel is {tags}, this python takes {env.python_tag} ({env.tags[0]} ...)")
    if wheel.manifest is not None:
        out += runtime_mismatches(wheel.manifest, env, node)
    return out


@dataclass(frozen=True)
class Selection:
    chosen: tuple[Wheel, ...]
    rejected: tuple[tuple[Wheel, tuple[str, ...]], ...]


def _matches_only(wheel: Wheel, only: Sequence[str]) -> bool:
    names = {canonicalize_name(n) for n in only}
    return not names or wheel.project in names or canonicalize_name(wheel.component) in names


def select(wheels: Sequence[Wheel], env: TargetEnv, node: Node, only: Sequence[str] = (),
           wheelhouse: str = "") -> Selection:
    """One wheel per component that fits; raises when a manifest is bad or nothing fits."""
    porter = [w for w in wheels if w.is_porter and _matches_only(w, only)]
    if bad := [w for w in porter if w.manifest_error]:
        lines = "\n".join(f"  {w.filename}: {w.manifest_error}" for w in bad)
        raise ConfigError(f"{len(bad)} wheel(s) in {wheelhouse or 'the wheelhouse'} have no usable manifest:\n{lines}",
                          hint="rebuild them with porter (the manifest is written beside the wheel), "
                               "or remove them from the wheelhouse")
    fits: dict[str, list[Wheel]] = {}
    rejected: list[tuple[Wheel, tuple[str, ...]]] = []
    for w in porter:
        if why := mismatches(w, env, node):
            rejected.append((w, tuple(why)))
        else:
            fits.setdefault(w.component, []).append(w)
    chosen = tuple(sorted((max(ws, key=lambda w: (w.version, w.filename)) for ws in fits.values()),
                          key=lambda w: w.component))
    missing = [n for n in only if not any(_matches_only(w, [n]) for w in chosen)]
    if not chosen or missing:
        have = "\n".join(f"  {w.filename}:\n" + "\n".join(f"      {r}" for r in why) for w, why in rejected)
        others = [w.filename for w in wheels if not w.is_porter]
        what = f" for {', '.join(missing)}" if missing else ""
        raise NothingToDo(
            f"no wheel in {wheelhouse or 'the wheelhouse'}{what} fits {env.describe()}, GPU {node.describe()}\n"
            + (f"what it has:\n{have}" if have else "it holds no porter wheels"
               + (f" (only dependencies: {', '.join(others)})" if others else "")),
            hint="build wheels for this environment (python, torch, ROCm, arch) with porter, "
                 "or pass --python / --arch for the environment and node you mean")
    return Selection(chosen, tuple(rejected))


# -- is the file the one the manifest describes, and is it safe to unpack? -----------------------

def unsafe_entries(names: Iterable[str]) -> list[str]:
    """Archive names that would land outside the install target (``../``, absolute, drive letters)."""
    return [name for name in names if "\0" in name or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name)
            or ".." in name.replace("\\", "/").split("/")]


def check_intact(path: Path, manifest: Manifest, *, label: str | None = None, nothing: str = "installed") -> str:
    """The wheel's sha256, once it is the file its manifest describes, checked before anything reads inside it: one
    truncated or damaged on the way (not a readable zip) is refused as a damaged file (exit 2), one changed since as
    tampered (``nothing``: what the refusal left undone)."""
    want = manifest["wheel"].get("sha256", "")
    found = sha256_file(path)
    if found == want:
        return found
    if not zipfile.is_zipfile(path):
        raise DamagedFile(f"{path} is truncated or damaged: not a readable zip ({path.stat().st_size} bytes), and its "
                          f"sha256 is not its manifest's ({want[:16]}...)",
                          hint="copy it again from where it was built (an interrupted copy or download leaves such "
                               f"a file), and compare 'sha256sum' with its manifest's wheel.sha256; nothing was "
                               f"{nothing}")
    raise DamagedFile(f"{label or path.name}: sha256 does not match its manifest (tampered or rebuilt without its "
                      f"manifest): expected {want}, found {found}",
                      hint=f"rebuild the wheel with porter, or restore the original file; nothing was {nothing}")


def check_wheel(path: Path, manifest: Manifest, *, label: str | None = None) -> None:
    """Refuse a wheel whose sha256 or extension contents differ from the manifest, or that escapes."""
    label = label or path.name
    check_intact(path, manifest, label=label)
    try:
        with zipfile.ZipFile(path) as zf:
            if escaping := unsafe_entries(zf.namelist()):
                raise DamagedFile(f"{label}: entries escape the install target: {', '.join(escaping)}",
                                  hint="this wheel is unsafe to install; rebuild it with porter")
            links = [i.filename for i in zf.infolist() if (i.external_attr >> 16) & 0o170000 == 0o120000]
            if links:
                raise DamagedFile(f"{label}: holds symbolic links: {', '.join(links)}",
                                  hint="wheels must not carry symlinks; rebuild it with porter")
            for ext in manifest.get("extensions") or []:
                try:
                    data = zf.read(ext["path"])
                except KeyError:
                    raise DamagedFile(f"{label}: manifest lists {ext['path']}, the wheel does not hold it",
                                      hint="rebuild the wheel with porter") from None
                if sha256_bytes(data) != ext["sha256"]:
                    raise DamagedFile(f"{label}: {ext['path']}: sha256 expected {ext['sha256']}, "
                                      f"found {sha256_bytes(data)}", hint="rebuild the wheel with porter")
    except zipfile.BadZipFile as exc:
        raise DamagedFile(f"{label}: not a readable wheel: {exc}", hint="rebuild the wheel") from None
    validate_record(path, label=label)


def validate_record(path: Path, *, label: str | None = None) -> None:
    """Every file in the wheel is listed in its RECORD with the right hash and size (pypa/installer's
    own check, the one an installer runs)."""
    from installer.exceptions import InstallerError
    from installer.sources import WheelFile as InstallerWheel

    try:
        with InstallerWheel.open(path) as source:
            source.validate_record()
    except InstallerError as exc:
        issues = "; ".join(str(i) for i in getattr(exc, "issues", [exc])[:5])
        raise DamagedFile(f"{label or path.name}: RECORD does not match the wheel's files: {issues}",
                          hint="the wheel was changed after it was built; rebuild it with porter") from None
    except (ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise DamagedFile(f"{label or path.name}: not a valid wheel: {exc}", hint="rebuild the wheel") from None


# -- PEP 503 index + combined manifest ----------------------------------------------------------------

def _page(title: str, links: Iterable[tuple[str, str, str | None]]) -> str:
    """A PEP 503 page of links: (href, text, the file's Requires-Python or None)."""
    body = "\n".join(f'    <a href="{html.escape(href)}"' + (f' data-requires-python="{html.escape(rp)}"' if rp else "")
                     + f">{html.escape(text)}</a><br/>" for href, text, rp in links)
    return ("<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.0\">"
            f"<title>{html.escape(title)}</title></head>\n  <body>\n{body}\n  </body>\n</html>\n")


def _requires_python(path: Path) -> str | None:
    with zipfile.ZipFile(path) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        found = email.parser.BytesHeaderParser().parsebytes(zf.read(meta))["Requires-Python"] if meta else None
    return found.strip() if found is not None else None


def write_index(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``simple/`` (PEP 503) and ``porter-wheelhouse.json``; returns the combined manifest.

    Every porter wheel's sha256 is checked against its manifest first; a mismatch writes nothing.
    ``simple`` is a symlink swapped atomically to a freshly written tree, so a reader sees the old
    index or the new one, never half of one.
    """
    root = Path(directory).resolve()
    wheels = scan(root)
    if bad := [w for w in wheels if w.manifest_error]:
        raise ConfigError("no usable manifest for: " + "; ".join(f"{w.filename}: {w.manifest_error}" for w in bad),
                          hint="rebuild those wheels with porter or remove them; nothing was written")
    if not wheels:
        raise ConfigError(f"no wheels in {root}", hint="build wheels into this folder first")
    entries: list[dict[str, Any]] = []
    by_project: dict[str, list[tuple[Wheel, str]]] = {}
    for w in wheels:
        digest = check_intact(w.path, w.manifest, nothing="written") if w.manifest is not None else sha256_file(w.path)
        by_project.setdefault(str(w.project), []).append((w, digest))
        entries.append({"filename": w.filename, "project": str(w.project), "version": w.version_text,
                        "tags": sorted(str(t) for t in w.tags), "sha256": digest, "size": w.path.stat().st_size,
                        "component": w.component if w.manifest else None, "manifest": w.manifest})
    doc = {"schema": INDEX_SCHEMA, "porter_version": __version__,
           "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wheels": entries}
    tmp = owned_temp_dir(root, ".simple-")
    try:
        atomic_write_text(tmp / "index.html", _page("Simple index", ((f"{p}/", p, None) for p in sorted(by_project))))
        for project, items in by_project.items():
            links = [(f"../../{w.filename}#sha256={digest}", w.filename, _requires_python(w.path))
                     for w, digest in sorted(items, key=lambda x: x[0].filename)]
            atomic_write_text(tmp / project / "index.html", _page(f"Links for {project}", links))
        os.chmod(tmp, 0o755)
        _swap_in(root / "simple", tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_json(root / INDEX_NAME, doc)
    return doc


def _swap_in(link: Path, new_tree: Path) -> None:
    old: Path | None = None
    if link.is_symlink():
        old = link.parent / os.readlink(link)
    elif link.exists():
        old = link.with_name(f".simple-old-{os.getpid()}")
        os.replace(link, old)
    tmp_link = link.with_name(f".simple-link-{os.getpid()}")
    tmp_link.unlink(missing_ok=True)
    os.symlink(new_tree.name, tmp_link)
    os.replace(tmp_link, link)
    if old is not None and old.resolve() != new_tree.resolve() and old.name.startswith(".simple-"):
        shutil.rmtree(old, ignore_errors=True)
