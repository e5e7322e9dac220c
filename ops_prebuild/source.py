"""Where a project's source comes from: an sdist file, an unpacked tree, or ``NAME==X`` (the package index).

This engine knows no project by name (a driver's name and download settings come with each call). Unpacked
sdists and patched copies are cache entries: made in a temporary sibling, published once by rename under a lock,
and checked by their marker when reused."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from porter import archive, faults
from porter.errors import CommandFailed, ConfigError, ToolError
from porter.fs import owned_temp, sha256_file
from porter.locks import hold
from porter.patching import PatchSet, failure_message, load_project, load_shipped
from porter.patching import plan as plan_patches
from porter.log import Logger
from porter.run import Runner, make_env


@dataclass(frozen=True)
class Source:
    """A recognised upstream tree: the one type for it (a component's :meth:`recognise`, the engine's source, a
    wheel driver's :class:`porter.wheels.base.SourceInfo`, which adds what its driver read)."""

    project: str
    """The project's (its component's) name: ``deepspeed``."""
    version: str
    tree: Path
    """The unpacked tree (read-only for porter)."""
    origin: str = ""
    """What the user passed."""
    sha256: str = ""
    """Of the sdist, when there was one."""
    regime: str = ""
    """How the tree is told what to build, when a project has several ways (apex: ``env`` or ``flags``)."""


MARK = ".porter-unpacked"


def _unpack(sdist: Path, dest: Path, digest: str, say: Callable[[str], None] | None = None) -> None:
    if _unpacked(dest, digest, say):
        return
    archive.members(sdist)  # a damaged or hostile archive is refused before any folder or lock is made
    with hold(dest, f"unpacking {sdist.name}"):  # one process unpacks; the others wait and reuse its tree
        if _unpacked(dest, digest):
            return
        with owned_temp(dest.parent, ".unpack-") as tmp:
            try:
                archive.unpack(sdist, tmp, checked=True)
            except OSError as exc:
                if exc.filename is None:
                    exc.filename = str(dest)  # a write that failed names no file: say which tree it was
                raise
            faults.reached("unpack")
            tops = list(tmp.iterdir())
            top = tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp
            # written last: its presence means complete; what it lists is checked whenever the tree is reused
            files = {str(p.relative_to(top)): p.stat().st_size for p in sorted(top.rglob("*"))
                     if p.is_file() and not p.is_symlink() and p.name != MARK}
            (top / MARK).write_text(json.dumps({"sha256": digest, "files": files}) + "\n")
            if dest.exists():  # an unpack that did not finish, or one found damaged: set aside, then removed
                os.replace(dest, tmp / "stale")
            os.replace(top, dest)


def _unpacked(dest: Path, digest: str, say: Callable[[str], None] | None = None) -> bool:
    """A complete unpack of the sdist with this sha256 whose files are all there, with the sizes its marker
    recorded (a file deleted or truncated since: not complete, and ``say`` is told)."""
    try:
        text = (dest / MARK).read_text()
    except OSError:
        return False
    if text.strip() == digest:
        return True  # a marker from before the listing: the digest alone
    try:
        doc = json.loads(text)
        want = dict(doc["files"]) if doc.get("sha256") == digest else None
    except (ValueError, KeyError, TypeError, AttributeError):
        want = None
    if want is None:
        if say is not None:
            say(f"the unpacked source {dest} has an unreadable record ({MARK}): unpacked again")
        return False
    damaged = [rel for rel, size in want.items() if not (dest / rel).is_file() or (dest / rel).stat().st_size != size]
    if damaged and say is not None:
        say(f"the unpacked source {dest} lost or changed {len(damaged)} file(s) since it was unpacked "
            f"({', '.join(sorted(damaged)[:3])}{' ...' if len(damaged) > 3 else ''}): unpacked again")
    return not damaged


def _requirement(name: str | None, spec: str) -> tuple[str, str] | None:
    """``NAME==VERSION`` (any project's name when ``name`` is None; else that project's, however spelt)."""
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!_-]*)", spec.strip())
    return None if not m or (name is not None and canonicalize_name(m.group(1)) != canonicalize_name(name)) else (
        m.group(1), m.group(2))


def git_commit(root: Path) -> str | None:
    """The checkout's commit, read from .git without running git (compute nodes may lack it)."""
    try:
        ref = (root / ".git" / "HEAD").read_text().strip()
        if ref.startswith("ref: "):
            name = ref[5:]
            ref_file = root / ".git" / name
            if ref_file.is_file():
                ref = ref_file.read_text().strip()
            else:
                packed = (root / ".git" / "packed-refs").read_text()
                ref = next(ln.split()[0] for ln in packed.splitlines() if ln.endswith(" " + name))
    except (OSError, StopIteration):
        return None
    return ref if re.fullmatch(r"[0-9a-f]{40}", ref) else None


@dataclass(frozen=True)
class Download:
    """How ``pip download`` fetches a project's sdist: pip prepares its metadata, and some setup.py files
    need the build python's torch (``isolated`` False) or variables (``env``) for that."""

    isolated: bool = True
    env: tuple[tuple[str, str], ...] = ()


_INTERRUPTED = re.compile(r"incomplete-download|Connection (?:interrupted|broken|reset)|IncompleteRead|"
                          r"ReadTimeoutError|not enough bytes were received")


def interrupted(spec: str, exc: CommandFailed) -> ToolError | None:
    """pip's download of ``spec`` cut off by the network (its own retries spent): an ERROR that says so and quotes
    pip, rather than a failed command whose TIP suspects the version; None for any other failure."""
    lines = [ln.strip(" ×╰─>") for ln in exc.output.splitlines()]
    hits = [ln for ln in lines if _INTERRUPTED.search(ln)]
    if not hits:
        return None
    said = next((ln for ln in lines if ln.startswith("Download failed")), hits[-1])
    return ToolError(f"the download of {spec} was interrupted: {said}",
                     hint="the network cut the transfer; nothing partial was kept. Run the command again (pip resumes "
                          "and retries by itself, and PIP_RESUME_RETRIES raises how often), or download the sdist "
                          "where the network is steady and pass the .tar.gz")


def fetch_tree(spec: str, *, cache: Path, runner: Runner, hint: str, name: str | None = None,
               download: Download = Download()) -> tuple[Path, dict[str, str]]:
    """``spec`` as an unpacked tree and where it came from (``git_commit``; ``sdist``, ``sdist_sha256``;
    ``requirement``): a folder as it is; an sdist unpacked once into ``cache/sources``; ``NAME==VERSION``
    downloaded once into ``cache/sdists`` first. Each cache entry is published by rename under a lock."""
    got = cached_tree(spec, cache, name, runner, download)
    if got is not None:
        return got
    if Path(spec).exists():
        raise ConfigError(f"{spec} is neither a folder nor a .tar.gz sdist", hint=hint)
    raise ConfigError(f"source not found: {spec}", hint=hint)


def cached_tree(spec: str, cache: Path, name: str | None = None, runner: Runner | None = None,
                download: Download = Download()) -> tuple[Path, dict[str, str]] | None:
    """What :func:`fetch_tree` gives if ``cache`` already holds it (read only: nothing is downloaded or written);
    with a ``runner``, what it lacks is unpacked or downloaded first (:func:`fetch_tree`'s way). None: not found."""
    path = Path(spec)
    if path.is_dir():
        commit = git_commit(path)
        return path.resolve(), ({"git_commit": commit} if commit else {})
    if path.is_file() and spec.endswith((".tar.gz", ".tgz")):
        digest = sha256_file(path)
        dest = cache / "sources" / f"{path.name.removesuffix('.tar.gz')}-{digest[:12]}"
        if runner is not None:
            _unpack(path, dest, digest, runner.log.warn)
        elif not _unpacked(dest, digest):
            return None
        return dest, {"sdist": path.name, "sdist_sha256": digest}
    req = _requirement(name, spec)
    if req is None:
        return None
    dl = cache / "sdists" / "-".join(req)
    if runner is not None and not any(dl.glob("*.tar.gz")):
        with hold(dl, f"downloading {spec}", say=runner.log.info):
            if not any(dl.glob("*.tar.gz")):  # pip writes to a temp folder; the whole sdist is renamed in
                with owned_temp(dl.parent, ".download-") as tmp:
                    try:
                        runner.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                    *(() if download.isolated else ("--no-build-isolation",)), "-d", tmp, spec],
                                   env=make_env(dict(download.env)), timeout=900,
                                   hint="check the version exists on the package index and that it is "
                                        "reachable; offline, pass a downloaded sdist file instead")
                    except CommandFailed as exc:
                        raise interrupted(spec, exc) or exc from None
                    got = sorted(Path(tmp).glob("*.tar.gz"))
                    if not got:
                        raise ConfigError(f"pip downloaded no sdist for {spec}")
                    dl.mkdir(parents=True, exist_ok=True)
                    os.replace(got[0], dl / got[0].name)
    found = sorted(dl.glob("*.tar.gz"))
    tree = cached_tree(str(found[0]), cache, None, runner) if found else None
    return (tree[0], {**tree[1], "requirement": spec}) if tree else None


@dataclass(frozen=True)
class Patched:
    """What :func:`patched_source` did: the source to build from, and in words what was applied."""

    source: Source
    applied: tuple[str, ...] = ()
    """``set: patch, patch`` for each set that changed a file."""
    warning: str = ""
    """Why a set could not be applied (the build then uses the unpatched source)."""
    changed: Mapping[str, bytes] = field(default_factory=dict)
    """The files the sets change, as they are after (also in a dry run, which writes nothing)."""
    records: tuple[dict[str, Any], ...] = ()
    """The sets' patches as a manifest lists them, with their files' sha256 before and after."""

    def after(self, rel: str) -> str | None:
        """A file as the build compiles it, when a set changes it (None: as it is in the source)."""
        data = self.changed.get(rel)
        return None if data is None else data.decode("utf-8", errors="replace")


def build_sets(project: str, kind: str, tree: Path | None = None) -> list[PatchSet]:
    """The shipped patch sets the project's manifest names for building with a ``kind`` toolchain; with ``tree``,
    those that edit a file it has (FlashAttention's ck-rocm7 edits its composable_kernel submodule: a tree
    without one is built as it is)."""
    try:
        proj = load_project(project)
    except ConfigError:
        return []
    sets = [load_shipped(project, name) for name in proj.build.get(kind, ())]
    return sets if tree is None else [s for s in sets if any(p.kind != "edits" or any(
        (tree / f).is_file() for f in p.files) for p in s.patches)]


def build_copy(source: Source, kind: str, cache: Path, runner: Runner, log: Logger, *,
               asked: Sequence[PatchSet] = ()) -> Patched:
    """The project's patch sets for every build with a ``kind`` toolchain (:func:`build_sets`: those that edit a
    file the tree has), after the sets the user ``asked`` for, applied to a copy of the source of
    its own, which is said in the log: the source as it is when none applies. A set that cannot be applied leaves
    the source as it is, with a warning; with sets asked for, it stops the build. A dry run (a recording
    ``runner``) plans it and writes nothing."""
    sets = [*asked, *(s for s in build_sets(source.project, kind, source.tree) if s.ref not in {a.ref for a in asked})]
    patched = patched_source(source, sets, cache, write=not runner.dry)
    if patched.warning and asked:
        raise ConfigError(patched.warning.replace(", built as it is", ""),
                          hint="'porter patch check TREE --set SET' shows which patch no longer applies")
    if patched.warning:
        log.warn(patched.warning)
    elif patched.applied:
        log.info(f"building from a patched copy of the source ({'; '.join(patched.applied)})")
    return patched


def patched_source(source: Source, sets: list[PatchSet], cache: Path, *, write: bool = True) -> Patched:
    """``source`` with ``sets`` applied, as a cache entry of its own beside the unpacked sources (files linked from
    the source, the patched ones written anew): the source stays as it was, and two builds of one source share
    the entry. Published once, by rename, under a lock. A source that needs none of the sets (or has them
    applied already) is returned as it is; a set that cannot be applied (upstream moved its anchor) gives a
    warning and the unpatched source."""
    if not sets:
        return Patched(source)
    planned = plan_patches(source.tree, sets)
    if planned.failed:
        return Patched(source, warning=f"{', '.join(s.ref for s in sets)} cannot be applied to {source.origin}, "
                                       f"built as it is: " + failure_message(planned.failed))
    records = tuple(planned.records())
    changes = [(c.path, c.after, c.mode) for c in planned.changes if c.after is not None and c.after != c.before]
    applied = tuple(f"{s.ref}: {', '.join(sorted({r.patch for r in s.results if r.status == 'would-apply'}))}"
                    for s in planned.sets if any(r.status == "would-apply" for r in s.results))
    if not changes:
        return Patched(source, records=records)
    changed = {path: after for path, after, _ in changes}
    patched = [f"{path}\0".encode() + after for path, after, _ in sorted(changes)]
    digest = hashlib.sha256(b"\0".join([fingerprint(source.tree), *patched])).hexdigest()[:12]
    dest = cache / "sources" / f"{source.tree.name}+{'+'.join(s.name for s in sets)}-{digest}"
    done = Patched(replace(source, tree=dest), applied, changed=changed, records=records)
    if not write or (dest / ".porter-patched").is_file():
        return done
    with hold(dest, f"patching {source.tree.name}"):
        if (dest / ".porter-patched").is_file():  # another build published it while this one waited
            return done
        with owned_temp(dest.parent, ".patch-") as tmp:
            work = tmp / "tree"
            shutil.copytree(source.tree, work, symlinks=True, copy_function=_link_or_copy)
            for rel, after, mode in changes:
                out = work / rel
                if out.is_symlink():  # a source tree's alias (deepspeed/ops/op_builder -> ../../op_builder)
                    out = out.resolve()
                out.unlink(missing_ok=True)  # a new file, never written through a hard link into the source
                out.write_bytes(after)
                if mode is not None:
                    out.chmod(mode)
            (work / ".porter-patched").write_text("\n".join(applied) + "\n")
            shutil.rmtree(dest, ignore_errors=True)
            os.replace(work, dest)
    return done


def fingerprint(tree: Path) -> bytes:
    """The tree as it is now: where it lies, and each file's path, size and modification time. Two trees of one
    name (every tree the gauntlet checks out is called ``tree``) or a tree edited since its patched copy was made
    must not share that copy; the patched files' content alone cannot tell them apart."""
    parts = [str(tree.resolve()).encode()]
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            parts.append(f"{os.path.relpath(path, tree)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return hashlib.sha256(b"\n".join(parts)).digest()


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
