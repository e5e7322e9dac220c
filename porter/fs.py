"""Files that matter: atomic writes (a temp file *beside* its destination, then a rename), hashes,
porter's cache folder, and writability judged by trying.

A temp file beside the destination is on the same filesystem, so the final ``os.replace`` never
crosses devices (``TMPDIR=/dev/shm`` on a login node is the usual way to hit EXDEV otherwise).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from porter.errors import ConfigError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable


def sha256_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def files_digest(root: Path, files: Iterable[Path]) -> str:
    """The identity of ``files`` under ``root``: sha256 over each one's path (from ``root``) and bytes, in order."""
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + bytes.fromhex(sha256_file(p)))
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def cache_dir() -> Path:
    """porter's cache: ``$PORTER_CACHE_DIR``, else ``$XDG_CACHE_HOME/porter``, else ``~/.cache/porter``."""
    return Path(os.environ.get("PORTER_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "porter"))


def _killed_here(pid: str, host: str) -> bool:
    """A temp name's owner (its pid and host) was a process on this host that is gone."""
    if not pid.isdigit() or host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # alive, someone else's
    return False


def _remove(paths: Iterable[Path]) -> list[Path]:
    """Remove each path (a folder with all it holds) and return those removed; one that cannot be removed stays."""
    removed = []
    for path in paths:
        with suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
    return removed


def remove_stale(folder: Path, prefix: str) -> list[Path]:
    """Remove what writers on this host left in ``folder`` under ``prefix`` (temp files and folders named by
    :func:`owned_prefix`) when they were killed: their pid is gone. A live writer's, and another host's, stay."""
    try:
        owners = {name: name[len(prefix):].partition("@") for name in os.listdir(folder) if name.startswith(prefix)}
    except OSError:
        return []
    return _remove(folder / name for name, (pid, _, rest) in owners.items()
                   if _killed_here(pid, rest.removesuffix(".tmp").rsplit(".", 1)[0]))


_PRIVATE_OUTPUT = re.compile(r"\.(\d+)@(.+)\.tmp(?:\.[^./]+)?$")


def remove_stale_outputs(folder: Path) -> list[Path]:
    """Remove the private outputs (``X.<pid>@<host>.tmp.o``, :mod:`ops_prebuild.publish`) that compiles killed on
    this host left under ``folder`` (a build folder): their pid is gone. A running compile's, and another
    host's, stay."""
    paths = [Path(top, n) for top, _, names in os.walk(folder) for n in names if ".tmp" in n]
    return _remove(path for path in paths
                   if (m := _PRIVATE_OUTPUT.search(path.name)) and _killed_here(m.group(1), m.group(2)))


def owned_prefix(prefix: str) -> str:
    """``prefix`` plus this process's pid and host: a temp name that says whose it is (:func:`remove_stale`)."""
    return f"{prefix}{os.getpid()}@{socket.gethostname()}."


def owned_temp_dir(parent: Path | None, prefix: str) -> Path:
    """A new temp folder in ``parent`` (None: the system's temp folder) named by :func:`owned_prefix`, after
    removing the ones killed writers left there under the same prefix."""
    parent = parent or Path(tempfile.gettempdir())
    remove_stale(parent, prefix)
    return Path(tempfile.mkdtemp(prefix=owned_prefix(prefix), dir=parent))


@contextmanager
def owned_temp(parent: Path | None, prefix: str) -> Iterator[Path]:
    """:func:`owned_temp_dir` removed again when the block ends (a kill leaves it to the next writer)."""
    tmp = owned_temp_dir(parent, prefix)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``dest``; on success it replaces ``dest``, on error it is removed. The temp's
    name carries this process's pid and host, so the next writer of ``dest`` removes what a killed one left."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(dest.parent, f".{dest.name}.porter-")
    fd, tmp = tempfile.mkstemp(prefix=owned_prefix(f".{dest.name}.porter-"), suffix=".tmp", dir=dest.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are meant to be read by others
    try:
        yield Path(tmp)
        os.replace(tmp, dest)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(dest)  # zipfile's write() names no file: say which one was being written
        raise


_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the kernel, libc or file
    system cannot (then nothing moved)."""
    import ctypes
    import errno

    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if call(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def publish_dir(new: Path, dest: Path) -> None:
    """Put the folder ``new`` at ``dest`` (same file system), replacing a folder there without a moment in which
    ``dest`` is missing: the two swap in one step, and the earlier folder is left at ``new`` for the caller to
    remove. Where the swap is not possible (an older kernel; NFS), the earlier folder is moved to ``new`` +
    ``.old`` first, which leaves a short window."""
    if not dest.exists():
        os.replace(new, dest)
    elif not _exchange(new, dest):
        old = new.with_name(new.name + ".old")
        os.replace(dest, old)
        os.replace(new, dest)
        os.replace(old, new)


def atomic_write_bytes(dest: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(dest: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(dest, text.encode())


def atomic_write_json(dest: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_folder_document(folder: Path, name: str, schema: str, *, missing: str, missing_hint: str,
                         unreadable_hint: str, other_hint: str) -> dict[str, Any]:
    """The JSON document ``name`` that a job folder holds, checked against its ``schema`` (ConfigError, with
    the caller's words, when it is missing, unreadable or another document)."""
    path = folder / name
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{folder} holds no {missing} ({name} missing)", hint=missing_hint) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read: {exc}", hint=unreadable_hint) from None
    if not isinstance(data, dict) or data.get("schema") != schema:
        raise ConfigError(f"{path} is not a {schema} document", hint=other_hint)
    return data


def ensure_writable_dir(path: str | os.PathLike[str], *, what: str = "output folder",
                        option: str = "-o", create: bool = False) -> Path:
    """Prove ``path`` is (or can be made) a writable folder by writing a file in it, or in its nearest
    existing parent when it does not exist yet (mode bits lie: root writes into a 0555 folder, a
    read-only mount refuses even root). Nothing is left behind unless ``create``. ConfigError names it."""
    p = Path(path)
    hint = f"pass {option} with a folder you can write"
    probe_dir = p
    while not probe_dir.exists() and probe_dir.parent != probe_dir:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise ConfigError(f"cannot create the {what} {p}: {probe_dir} is not a folder", hint=hint)
    try:
        tempfile.TemporaryFile(dir=probe_dir).close()
    except OSError as exc:
        verb = "is not writable" if probe_dir == p else f"cannot be created ({probe_dir} is not writable)"
        raise ConfigError(f"the {what} {p} {verb}: {exc.strerror}", hint=hint) from None
    if create:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the {what} {p}: {exc.strerror}", hint=hint) from None
    return p


def exists(path: Path | Traversable, *, file: bool = False) -> bool:
    """``path.exists()`` (``path.is_file()`` with ``file``; a package resource has no ``exists()``, so a file or a
    folder), False for a name no file can have (too long, a NUL byte) instead of an OSError or a ValueError: a
    user's reference may be a name rather than a path."""
    try:
        return path.is_file() if file else path.exists() if isinstance(path, Path) else path.is_file() or path.is_dir()
    except (OSError, ValueError):
        return False


def read_user_text(path: Path, where: str, *, kind: str, unreadable_hint: str | None = None) -> str:
    """A user's text file (a profile, a patch set, a site): UTF-8, or a ConfigError naming the file and saying
    what ``kind`` of file it should be; a missing file, a folder or a device (read forever), and a file that cannot
    be read are ConfigErrors too, never a traceback."""
    try:
        if path.exists() and not path.is_file():
            raise ConfigError(f"{where}: not a file", hint=f"pass the path of {kind}")
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                          hint=f"{kind} is a UTF-8 file") from None
    except FileNotFoundError:
        raise ConfigError(f"{where}: not found", hint=f"pass the path of {kind}") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read the file: {exc.strerror or exc}", hint=unreadable_hint) from None
