"""Archives a user hands porter (sdists, source tarballs, net-plugin packages; a wheel's zip), checked before anything
is written: one error per kind of damage, naming the file and, where it can, the member. The unpacking itself is the standard library's, with its
``data`` filter (nothing outside the destination, no device files, no links out); porter checks every member with the
same filter first, so a refused archive leaves nothing behind."""

from __future__ import annotations

import errno
import gzip
import lzma
import posixpath
import tarfile
import zipfile
import zlib
from pathlib import Path

from porter.errors import ConfigError

DOWNLOAD_AGAIN = ("download it again (an interrupted download or a copy cut short leaves such a file) and compare "
                  "its sha256 with the one its index or release page lists")
UNTRUSTED = ("porter unpacks only archives whose members stay inside their folder; get the archive from the "
             "project's own release, or unpack and inspect it yourself and pass the folder")


class DamagedFile(ConfigError):
    """A file from the user that is not what it claims to be (truncated, of another format, or hostile): exit 2."""


ENDED = (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)
"""What reading a compressed stream that ends early or fails its check raises."""


def _kind(path: Path) -> str:
    """What the file is, by its first bytes (for the message)."""
    with open(path, "rb") as f:
        head = f.read(8)
    for magic, what in ((b"PK\x03\x04", "a zip archive"), (b"\x1f\x8b", "gzip data"), (b"\xfd7zXZ", "xz data"),
                        (b"BZh", "bzip2 data"), (b"<", "text (an HTML page?)"), (b"{", "text (JSON?)")):
        if head.startswith(magic):
            return what
    return "not a tar archive"


def members(path: Path) -> list[tarfile.TarInfo]:
    """Every member of the tar archive ``path``, each one passed through the ``data`` filter as if extracted;
    refused with a :class:`DamagedFile`."""
    size = path.stat().st_size
    if size == 0:
        raise DamagedFile(f"{path} is empty (0 bytes)", hint=DOWNLOAD_AGAIN)
    try:
        with tarfile.open(path) as tar:
            found = tar.getmembers()
            while tar.fileobj is not None and tar.fileobj.read(1 << 20):  # to the stream's end: its length and CRC
                pass
    except tarfile.ReadError as exc:
        if "unexpected end" in str(exc) or isinstance(exc.__cause__ or exc.__context__, ENDED):
            raise truncated(path, size) from None
        kind = _kind(path)
        raise DamagedFile(f"{path} is not a tar archive (gzip, xz or bzip2 compressed, or plain): "
                          + ("it holds " + kind if kind != "not a tar archive" else "its first bytes are no archive's")
                          + (" that does not unpack to a tar archive" if kind.endswith("data") else ""),
                          hint=DOWNLOAD_AGAIN if kind != "a zip archive" else
                          "pass the .tar.gz sdist, or unpack the zip and pass its folder") from None
    except ENDED:
        raise truncated(path, size) from None
    if not found:
        raise DamagedFile(f"{path} is a tar archive with no member", hint=DOWNLOAD_AGAIN)
    _refuse_hostile(path, found)
    return found


def zip_members(path: Path) -> list[str]:
    """The member names of the zip archive ``path`` (a wheel), or a :class:`DamagedFile` saying what it is."""
    size = path.stat().st_size
    if size == 0:
        raise DamagedFile(f"{path} is empty (0 bytes)", hint=DOWNLOAD_AGAIN)
    if not zipfile.is_zipfile(path):
        if _kind(path) == "a zip archive":
            raise DamagedFile(f"{path} is truncated or damaged: a zip archive whose end (its table of contents) is "
                              f"missing ({size} bytes on disk)", hint=DOWNLOAD_AGAIN)
        raise DamagedFile(f"{path} is not a zip archive (a wheel is one): it holds {_kind(path)}", hint=DOWNLOAD_AGAIN)
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, NotImplementedError, ValueError, *ENDED) as exc:
        raise DamagedFile(f"{path} is damaged: {exc}", hint=DOWNLOAD_AGAIN) from None


def truncated(path: Path, size: int) -> DamagedFile:
    return DamagedFile(f"{path} is truncated or damaged: its data ends early or fails its check ({size} bytes "
                       "on disk)", hint=DOWNLOAD_AGAIN)


def _refuse_hostile(path: Path, found: list[tarfile.TarInfo]) -> None:
    """Any member the ``data`` filter would refuse (an absolute path, a link out of the tree, a device file), and
    what it lets through that no source tarball holds and that fails or misleads an unpack: ``..`` in a path, a
    member twice, a hard link to nothing before it, a link to nothing, a non-folder named ``.`` or ending in ``/``
    (the filter checks such a link from the wrong folder), a file that other members are inside. Named."""
    seen: set[str] = set()
    probe = Path("/nonexistent-porter-destination")
    folders: set[str] = set()  # every folder some member is inside of
    for m in found:
        parent = posixpath.dirname(posixpath.normpath(m.name))
        while parent not in ("", "/", ".", "..") and parent not in folders:
            folders.add(parent)
            parent = posixpath.dirname(parent)
    for m in found:
        name = posixpath.normpath(m.name.rstrip("/"))
        if name in seen and not m.isdir():
            raise DamagedFile(f"{path}: member {m.name!r} appears twice (the second would overwrite the first)",
                              hint=UNTRUSTED)
        to_nothing = m.islnk() and posixpath.normpath(m.linkname) not in seen  # (before this member)
        seen.add(name)
        if m.name.startswith(("/", "\\")) or (len(m.name) > 1 and m.name[1] == ":"):
            raise DamagedFile(f"{path}: member {m.name!r} is refused: it has an absolute path", hint=UNTRUSTED)
        if ".." in m.name.replace("\\", "/").split("/"):
            raise DamagedFile(f"{path}: member {m.name!r} is refused: it has '..' in its path (it would be written "
                              "outside the unpacked tree, or through a folder above itself)", hint=UNTRUSTED)
        try:
            tarfile.data_filter(m, str(probe))
        except tarfile.FilterError as exc:
            raise DamagedFile(f"{path}: member {m.name!r} is refused: {_why(exc)}", hint=UNTRUSTED) from None
        why = ("it is a link to nothing (an empty target)" if (m.issym() or m.islnk()) and not m.linkname else
               "it is a hard link to a member that is not before it in the archive" if to_nothing else
               "its name ends in '/', but it is not a folder" if not m.isdir() and m.name.endswith(("/", "\\")) else
               "it is not a folder, but names the unpacked tree itself" if not m.isdir() and name in (".", "") else
               "it is not a folder, but other members are inside it" if not m.isdir() and name in folders else "")
        if why:
            raise DamagedFile(f"{path}: member {m.name!r} is refused: {why}", hint=UNTRUSTED)


def _why(exc: tarfile.FilterError) -> str:
    # read here, not at import: a python before 3.11.4 (Debian bookworm's, in an image) has no tar filters, and
    # porter still runs there (install, verify)
    why = ((tarfile.AbsolutePathError, "it has an absolute path"),
           (tarfile.OutsideDestinationError, "it would be written outside the unpacked tree"),
           (tarfile.AbsoluteLinkError, "it is a link to an absolute path"),
           (tarfile.LinkOutsideDestinationError, "it is a link that points outside the unpacked tree"),
           (tarfile.SpecialFileError, "it is a device file, FIFO or other special file"))
    return next((text for kind, text in why if isinstance(exc, kind)), str(exc))


def unpack(path: Path, dest: Path, *, checked: bool = False) -> None:
    """The archive ``path`` unpacked into the (empty, temporary) folder ``dest``, every member checked first
    (:func:`members`; ``checked``: the caller just did): a refused archive writes nothing."""
    if not checked:
        members(path)
    try:
        with tarfile.open(path) as tar:
            tar.extractall(dest, filter="data")
    except tarfile.FilterError as exc:  # (checked above: a file changed underneath)
        raise DamagedFile(f"{path}: a member is refused: {_why(exc)}", hint=UNTRUSTED) from None
    except (tarfile.ReadError, *ENDED):
        raise truncated(path, path.stat().st_size) from None
    except OSError as exc:  # a member the checks let through that the file system cannot take (not the disk's fault)
        if exc.errno not in (errno.ENOENT, errno.EEXIST, errno.EISDIR, errno.ENOTDIR, errno.EINVAL, errno.ENAMETOOLONG):
            raise
        raise DamagedFile(f"{path} cannot be unpacked: {exc.strerror}: {exc.filename}", hint=UNTRUSTED) from None
