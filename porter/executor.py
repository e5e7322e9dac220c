"""Where commands run: the host, a chroot, or a container (apptainer / singularity).

An :class:`Executor` owns the three things that differ between them, and nothing else does:

- the argv prefix (``chroot ROOT``, ``apptainer exec --bind W:W IMAGE``);
- the mapping from host paths to the paths the launched programs see (``inside``), and the files
  porter must make visible there (``visible``: work files live under ``work_root``, anything else a
  command needs is copied into ``work_root/staged`` once, keyed by its host path);
- what the root needs before anything runs there (``preflight``: a chroot whose compiler reads
  ``/proc/self/exe`` needs /proc mounted).

Host paths are :class:`pathlib.Path`; paths as the launched programs see them are plain ``str``
(POSIX), so the two cannot be mixed up silently. Every toolchain program and every build python is
run through one executor: the toolchain's (:func:`for_toolchain`), or :data:`HOST`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from porter.errors import ConfigError, ToolError
from porter.fs import atomic_write_json, owned_temp, owned_temp_dir

Kind = Literal["host", "chroot", "container", "prefix"]
CONTAINER_RUNTIMES = ("apptainer", "singularity")
STAGED = "staged"
_DONE = ".porter-staged"


@dataclass(frozen=True)
class Executor:
    kind: Kind = "host"
    prefix: tuple[str, ...] = ()
    """argv prefix (empty on the host)."""
    root: Path | None = None
    """chroot: the host path of the root. Other kinds: None."""
    work_root: Path | None = None
    """Host folder for porter's work files that the launched programs see under the same name
    (container: bound at its own path) or under ``inside()`` (chroot). None on the host (any path)."""
    needs_proc: bool = False
    """The programs read /proc (hipcc 7 resolves its own path through /proc/self/exe)."""
    setup: str = ""
    """The command that makes this root (named in errors): ``make chroot-trixie``."""
    cache: Path | None = None
    """chroot: the host cache whose copy ``work_root`` is (:func:`chroot_work_root`), made on first use, so a
    dry run writes nothing into the root."""

    # -- commands --------------------------------------------------------------------------------
    def argv(self, program: str, *args: str) -> list[str]:
        """A command for a program that lives where this executor runs things."""
        return [*self.prefix, program, *args]

    def describe(self) -> str:
        return "the host" if self.kind == "host" else f"the chroot {self.root}" if self.kind == "chroot" else \
            " ".join(self.prefix)

    # -- paths -----------------------------------------------------------------------------------
    def sees(self, host_path: str | os.PathLike[str]) -> bool:
        """Whether the launched programs see ``host_path`` without staging."""
        if self.kind in ("host", "prefix"):
            return True
        folder = self.root if self.kind == "chroot" else self.work_root  # (a container's: its bound work folder)
        return folder is not None and Path(os.path.abspath(host_path)).is_relative_to(os.path.abspath(folder))

    def inside(self, host_path: str | os.PathLike[str]) -> str:
        """The path the launched programs see for a host path they can see (else ConfigError)."""
        p = Path(os.path.abspath(host_path))
        if self.kind != "chroot":
            if not self.sees(p):
                raise ConfigError(f"{p} is not visible in {self.describe()}",
                                  hint=f"put it under {self.work_root} (porter does this for its own files)")
            return str(p)
        assert self.root is not None
        root = Path(os.path.abspath(self.root))
        if not p.is_relative_to(root):
            raise ConfigError(f"{p} is not inside the chroot {root}",
                              hint="porter stages files it needs into the root; pass paths under the root")
        return str(PurePosixPath("/") / p.relative_to(root))

    def outside(self, inside_path: str) -> Path:
        """The host path of a path the launched programs reported (the reverse of :meth:`inside`): under the root
        for a chroot; the same path elsewhere (a container sees porter's folders at their own paths)."""
        if self.kind == "chroot" and self.root is not None:
            return Path(self.root) / inside_path.lstrip("/")
        return Path(inside_path)

    def staged_path(self, host_path: str | os.PathLike[str]) -> Path:
        """Where ``host_path`` goes when staged: ``work_root/staged/<hash>-<name>``."""
        assert self.work_root is not None
        p = os.path.abspath(host_path)
        key = hashlib.sha256(p.encode()).hexdigest()[:12]
        return self.work_root / STAGED / f"{key}-{os.path.basename(p.rstrip('/')) or 'root'}"

    def visible(self, host_path: str | os.PathLike[str], *, stage: bool = True,
                within: tuple[str | os.PathLike[str], ...] = ()) -> str:
        """The path the launched programs use for ``host_path``: itself if they see it, else a copy
        staged under ``work_root`` (made once; ``stage=False`` only names it: dry runs write nothing).

        ``within``: folders that are staged whole. A path inside one of them is that folder's copy plus
        the rest of the path, never a copy of its own: clang de-duplicates ``#pragma once`` headers by
        file identity, so a header reached through two copies (torch's ``include/`` and the
        ``include/torch/csrc/api/include/`` inside it) would be two headers and define everything twice."""
        if self.sees(host_path):
            return self.inside(host_path)
        src = Path(os.path.abspath(host_path))
        outer = [Path(os.path.abspath(w)) for w in within]
        holder = min((w for w in outer if src != w and src.is_relative_to(w)), key=lambda w: len(w.parts),
                     default=None)
        if holder is not None:
            return str(PurePosixPath(self.visible(holder, stage=stage)) / src.relative_to(holder).as_posix())
        dest = self.staged_path(src)
        if stage and not self._staged(src, dest):
            self._make_work_root()  # made (with its owner) before anything goes into it
            if not src.exists():
                raise ConfigError(f"cannot stage {src} into {self.describe()}: it does not exist")
            from porter.locks import hold

            with hold(dest, f"staging {src}"):  # one copier; the others wait, then use its copy (hold makes the folder)
                if not self._staged(src, dest):
                    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}")
                    shutil.rmtree(tmp, ignore_errors=True)
                    if src.is_dir():
                        shutil.copytree(src, tmp, symlinks=True)
                        (tmp / _DONE).write_text(str(src) + "\n")
                        shutil.rmtree(dest, ignore_errors=True)  # unfinished (no marker): removed under the lock
                    else:
                        shutil.copy2(src, tmp)
                    os.replace(tmp, dest)
        return self.inside(dest)

    @staticmethod
    def _staged(src: Path, dest: Path) -> bool:
        """A complete copy of ``src`` at ``dest``: a folder with its marker, or a file of the same size."""
        if src.is_dir():
            return (dest / _DONE).is_file()
        try:
            return dest.is_file() and dest.stat().st_size == src.stat().st_size
        except OSError:
            return False

    def work_dir(self, host_default: Path, *, make: bool = True) -> Path:
        """The host folder for porter's work files of a build: ``host_default`` on the host, else
        the same layout under ``work_root`` (inside the chroot / bound into the container); ``make=False`` only
        names it (a dry run writes nothing)."""
        if self.work_root is None:
            return host_default
        if make:
            self._make_work_root()
        return self.work_root

    @contextmanager
    def scratch(self, prefix: str) -> Iterator[Path]:
        """A temp folder this executor's commands see (the host's temp folder, or the work root of a chroot or
        container), removed when the block ends; one a killed porter left is removed by the next."""
        parent = self.work_dir(Path(tempfile.gettempdir()))
        parent.mkdir(parents=True, exist_ok=True)
        with owned_temp(parent, prefix) as tmp:
            yield tmp

    def _make_work_root(self) -> None:
        """A chroot's copy of the host cache, made on first use (:func:`chroot_work_root`)."""
        if self.kind == "chroot" and self.root is not None:
            chroot_work_root(self.root, self.cache, make=True)

    # -- readiness -------------------------------------------------------------------------------
    def preflight(self) -> None:
        """Refuse, with the command that fixes it, a root that cannot run the toolchain."""
        if self.kind != "chroot":
            return
        assert self.root is not None
        fix = self.setup or "create the chroot"
        if not self.root.is_dir():
            raise ToolError(f"chroot {self.root} does not exist", hint=f"run '{fix}' (or fix the profile's launcher)")
        if self.needs_proc and not (self.root / "proc" / "self").exists():
            raise ToolError(f"chroot {self.root} has no /proc mounted; this compiler reads /proc/self/exe "
                            "and fails without it",
                            hint=f"run 'mount -t proc proc {self.root}/proc' as root (or '{fix}', which mounts it)")


HOST = Executor()


CACHE_ID = "porter-cache-id"
"""In a host cache: a random id written when the cache is first used with a chroot. The chroot's copy is named by
it, so a cache removed and made again at the same path (a CI run's temp folder) starts empty in the chroot too."""
CACHE_OWNER = "host-cache.json"
"""In a chroot's copy of a host cache: which host cache (path and id) it belongs to."""


def _cache_id(cache: Path) -> str:
    """The host cache's id (written once, first writer wins); a path hash where the cache cannot be written."""
    path = cache / CACHE_ID
    try:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            cache.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        pass  # another writer's id, read below
    except OSError:
        return hashlib.sha256(str(cache).encode()).hexdigest()[:12]
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(6) + "\n")
    return path.read_text().strip()


def _orphaned(copy: Path) -> bool:
    """A chroot's copy of a host cache whose host cache is gone or is another cache now (another id)."""
    try:
        owner = json.loads((copy / CACHE_OWNER).read_text())
        return bool((Path(owner["path"]) / CACHE_ID).read_text().strip() != owner["id"])
    except FileNotFoundError:
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False  # unreadable: leave it, it may be another porter's


def chroot_work_root(root: Path, cache: Path | None, *, make: bool = False) -> Path:
    """Where a chroot's builds of the host cache ``cache`` live, inside the root: ``ROOT/var/cache/porter`` for
    the default cache (``~/.cache/porter``), the cache itself when it already lies inside the root, and
    ``ROOT/var/cache/porter/caches/<the cache's id>`` for any other (``PORTER_CACHE_DIR``): two caches are two
    caches in the chroot too, never one build folder written by both, and a cache made again at a path is a new
    cache there. ``make``: the copy is made (with its owner file) unless it exists; copies whose host cache is
    gone are removed when a new one is made."""
    base = root / "var" / "cache" / "porter"
    if cache is None:
        return base
    resolved = Path(os.path.abspath(cache))
    if resolved.is_relative_to(os.path.abspath(root)):
        return resolved
    if resolved == Path(os.path.abspath(os.path.expanduser("~/.cache/porter"))):
        return base
    ident = _cache_id(resolved)
    copy = base / "caches" / ident
    if make and not copy.is_dir() and os.access(root, os.W_OK):
        with suppress(OSError):  # a read-only root: the build says so where it writes
            (base / "caches").mkdir(parents=True, exist_ok=True)
            for other in (base / "caches").iterdir():
                if other.is_dir() and not other.name.startswith(".") and _orphaned(other):
                    shutil.rmtree(other, ignore_errors=True)
            new = owned_temp_dir(base / "caches", f".{ident}.")  # made whole, then named: never seen ownerless
            atomic_write_json(new / CACHE_OWNER, {"path": str(resolved), "id": ident})
            try:
                new.rename(copy)
            except OSError:  # another porter named its copy first
                shutil.rmtree(new, ignore_errors=True)
    return copy


def make_executor(launcher: tuple[str, ...], launcher_root: str = "", *, work_root: Path | None = None,
                  needs_proc: bool = False, setup: str = "") -> Executor:
    """An executor from a profile's ``launcher`` (argv prefix) and ``launcher_root``."""
    if not launcher:
        return HOST
    root = Path(launcher_root) if launcher_root else None
    if os.path.basename(launcher[0]) == "chroot":
        if len(launcher) != 2:
            raise ConfigError(f"launcher {list(launcher)!r}: a chroot launcher is [\"chroot\", ROOT]")
        root = Path(launcher[1])
        if launcher_root and os.path.abspath(launcher_root) != os.path.abspath(root):
            raise ConfigError(f"launcher_root {launcher_root} differs from the chroot {root}",
                              hint="leave launcher_root out for a chroot: the root is the chroot's folder")
    elif os.path.basename(launcher[0]) in CONTAINER_RUNTIMES:
        if len(launcher) < 3 or launcher[1] != "exec":
            raise ConfigError(f"launcher {list(launcher)!r}: a container launcher is "
                              "[\"apptainer\", \"exec\", (options...), IMAGE]")
        if work_root is None:
            raise ConfigError("a container executor needs a work folder to bind")
        wr = str(work_root)
        return Executor("container", (launcher[0], "exec", "--bind", f"{wr}:{wr}", *launcher[2:]), None, work_root)
    # a chroot, or any other prefix (a wrapper script) with launcher_root: paths map like a chroot's
    if root is not None:
        return Executor("chroot", tuple(launcher), root, chroot_work_root(root, work_root),
                        needs_proc=needs_proc, setup=setup, cache=work_root)
    return Executor("prefix", tuple(launcher))


def build_python(executor: Executor, profile_python: str = "", python: str | None = None) -> tuple[Executor, str]:
    """Where the build python runs, and its path as seen there.

    ``--python`` (or ``PORTER_PYTHON``) and a profile's ``python`` name an interpreter *as the
    toolchain's executor sees it*, in every command. With neither, porter's own interpreter runs on the
    host, and files it names are staged into the executor's root when a command there needs them.
    """
    chosen = python or os.environ.get("PORTER_PYTHON") or profile_python
    return (executor, chosen) if chosen else (HOST, sys.executable)
