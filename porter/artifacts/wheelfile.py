"""The one wheel writer.

Every wheel porter ships is written here: a new one (:func:`write_wheel`) or an upstream-built one
with a new version, tag and extra files (:func:`rewrite_wheel`). Output is reproducible: entries
sorted, dist-info last, fixed timestamps (``SOURCE_DATE_EPOCH`` when set, else 1980-01-01) and fixed
permissions, so the same inputs give a byte-identical wheel. RECORD is computed here; file names and
tags come from ``packaging``. The wheel appears in its folder only by an atomic rename. A wheel that
carries porter's manifest (``{dist_info}/porter.json``) gets its SBOM (PEP 770,
``{dist_info}/sboms/porter.cdx.json``, :mod:`porter.artifacts.sbom`) made from it here.
"""

from __future__ import annotations

import base64
import email.parser
import hashlib
import json
import os
import re
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import parse_tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from porter import __version__
from porter.errors import ConfigError
from porter import faults
from porter.fs import atomic_path

Payload = bytes | Path
EPOCH_1980 = 315532800
MANIFEST = "porter.json"
"""The manifest a porter wheel carries in its .dist-info (:func:`porter.artifacts.manifest.carried`)."""


def source_date_epoch() -> int:
    """The time every file porter packs is stamped with: ``SOURCE_DATE_EPOCH`` when set (not before 1980, which
    zip cannot hold), else 1980-01-01."""
    raw = os.environ.get("SOURCE_DATE_EPOCH", "")
    return max(int(raw), EPOCH_1980) if raw.isdigit() else EPOCH_1980


def dist_filename_part(name: str) -> str:
    """The distribution name as wheel file names and .dist-info folders spell it."""
    return re.sub(r"[-_.]+", "_", canonicalize_name(name))


def module_name(path: str) -> str:
    """The module an extension file is: ``deepspeed/ops/adam/cpu_adam_op.cpython-311-x86_64-linux-gnu.so`` ->
    ``deepspeed.ops.adam.cpu_adam_op``."""
    *package, leaf = path.split("/")
    return ".".join([*package, leaf.split(".")[0]])


@dataclass(frozen=True)
class WheelSpec:
    name: str
    version: str
    tag: str
    """``cp311-cp311-linux_x86_64`` (compressed tag sets allowed), or ``py3-none-any``."""
    purelib: bool = False


def write_wheel(dest_dir: str | os.PathLike[str], spec: WheelSpec, files: Mapping[str, Payload], *,
                metadata: bytes | None = None, summary: str = "") -> Path:
    """Write ``files`` (archive name -> bytes or a host file) as a wheel into ``dest_dir``.

    ``metadata`` is the METADATA body (its Name/Version are set here); default: a minimal one. Names
    under ``{dist_info}/`` go into the wheel's .dist-info folder.
    """
    version = str(Version(spec.version))
    if not (tags := list(parse_tag(spec.tag))):
        raise ConfigError(f"wheel tag {spec.tag!r} names no tag")
    dist_info = f"{dist_filename_part(spec.name)}-{version}.dist-info"
    entries: dict[str, Payload] = {}
    for arc, payload in files.items():
        arc = arc.replace("{dist_info}", dist_info)
        if arc.startswith("/") or ".." in arc.split("/") or arc.endswith("/"):
            raise ConfigError(f"wheel entry {arc!r} is not a relative file path")
        entries[arc] = payload
    carried = entries.get(f"{dist_info}/{MANIFEST}")
    if carried is not None:  # the SBOM (PEP 770) of every wheel that carries a porter manifest
        from porter.artifacts.sbom import WHEEL_PATH

        entries[f"{dist_info}/{WHEEL_PATH}"] = sbom_of(carried, spec.name, version)
    entries[f"{dist_info}/METADATA"] = _metadata(metadata, spec.name, version, summary)
    entries[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: porter {__version__}\n"
                                     f"Root-Is-Purelib: {'true' if spec.purelib else 'false'}\n"
                                     + "".join(f"Tag: {t}\n" for t in tags)).encode()
    record_name = f"{dist_info}/RECORD"
    entries.pop(record_name, None)
    order = sorted(entries, key=lambda n: (n.startswith(dist_info + "/"), n))
    fname = f"{dist_filename_part(spec.name)}-{version}-{spec.tag}.whl"
    parse_wheel_filename(fname)  # validates name, version and tag together
    dest = Path(dest_dir) / fname
    stamp = time.gmtime(source_date_epoch())[:6]
    record: list[str] = []
    with atomic_path(dest) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc in order:
            payload = entries[arc]
            data = payload.read_bytes() if isinstance(payload, Path) else payload
            _add(zf, arc, data, stamp)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{_csv(arc)},sha256={digest},{len(data)}")
            faults.reached("wheel")
        record.append(f"{_csv(record_name)},,")
        _add(zf, record_name, ("\n".join(record) + "\n").encode(), stamp)
    return dest


def sbom_of(carried: Payload, name: str, version: str, *, purl_type: str = "pypi") -> bytes:
    """The SBOM of the wheel (or, ``purl_type="generic"``, the package) ``name`` ``version`` that carries the
    manifest ``carried``, stamped with the time its files are."""
    from porter.artifacts import sbom

    data = carried.read_bytes() if isinstance(carried, Path) else carried
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ConfigError(f"the porter manifest of {name} {version} is not JSON: {exc}",
                          hint="pass the manifest as porter.artifacts.manifest.carried() makes it") from None
    return sbom.document(doc, name=name, version=version, epoch=source_date_epoch(), purl_type=purl_type)


def _csv(name: str) -> str:
    return f'"{name}"' if "," in name or '"' in name else name


def _add(zf: zipfile.ZipFile, arc: str, data: bytes, stamp: tuple[int, int, int, int, int, int]) -> None:
    info = zipfile.ZipInfo(arc, date_time=stamp)
    mode = 0o755 if arc.endswith(".so") or ".so." in arc.rsplit("/", 1)[-1] else 0o644
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def _metadata(body: bytes | None, name: str, version: str, summary: str) -> bytes:
    if body is None:
        text = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        return (text + (f"Summary: {summary}\n" if summary else "")).encode()
    text = body.decode("utf-8")
    head, sep, rest = text.partition("\n\n")
    head = re.sub(r"(?m)^Version: .*$", f"Version: {version}", head, count=1)
    if not re.search(r"(?m)^Version: ", head):
        head += f"\nVersion: {version}"
    return (head + sep + rest).encode()


@dataclass(frozen=True)
class WheelIn:
    """A wheel read back: its name, version and entries (RECORD and signatures dropped)."""

    name: str
    version: str
    dist_info: str
    files: dict[str, bytes]


def read_wheel(path: str | os.PathLike[str]) -> WheelIn:
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        infos = sorted({n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")})
        if len(infos) != 1:
            raise ConfigError(f"{path}: expected one .dist-info folder, found {len(infos)}")
        dist_info = infos[0]
        files = {n: zf.read(n) for n in names
                 if n not in (f"{dist_info}/RECORD", f"{dist_info}/RECORD.jws", f"{dist_info}/RECORD.p7s")}
    msg = email.parser.BytesParser().parsebytes(files[f"{dist_info}/METADATA"])
    return WheelIn(str(msg["Name"]), str(msg["Version"]), dist_info, files)


def rewrite_wheel(src: str | os.PathLike[str], dest_dir: str | os.PathLike[str], *, version: str, tag: str,
                  purelib: bool = False, add: Mapping[str, Payload] | None = None) -> Path:
    """``src`` written anew into ``dest_dir`` with another version (its .dist-info renamed), tag and
    purelib flag, and ``add`` entries added."""
    from porter.artifacts.sbom import WHEEL_PATH

    w = read_wheel(src)
    # write_wheel writes these anew (porter's SBOM of the old wheel included)
    anew = {f"{w.dist_info}/{n}" for n in ("WHEEL", "METADATA", WHEEL_PATH)}
    files: dict[str, Payload] = {"{dist_info}" + n[len(w.dist_info):] if n.startswith(w.dist_info + "/") else n: data
                                 for n, data in w.files.items() if n not in anew}
    files.update(add or {})
    return write_wheel(dest_dir, WheelSpec(w.name, version, tag, purelib), files,
                       metadata=w.files[f"{w.dist_info}/METADATA"])
