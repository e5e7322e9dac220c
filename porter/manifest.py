"""Artifact manifests and the atomic writes behind every file that matters.

Every wheel porter produces gets a sidecar ``<wheel>.porter.json`` (schema below): what it was built
for (toolchain, archs, wavefront, CPU ISA, torch), from what (source hashes) and what is inside
(per-extension sha256). Install and verify read it back.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from porter.errors import ConfigError

SCHEMA = "porter.manifest/1"
SUFFIX = ".porter.json"


class ExtensionEntry(TypedDict):
    module: str            # importable name, e.g. deepspeed.ops.adam.cpu_adam_op
    path: str              # path inside the wheel
    sha256: str
    op: NotRequired[str]
    archs: NotRequired[list[str]]


class OpEntry(TypedDict):
    name: str
    status: str            # built | failed | skipped | cached
    seconds: NotRequired[float]
    log: NotRequired[str]
    reason: NotRequired[str]


class Manifest(TypedDict):
    schema: str
    porter_version: str
    component: str         # deepspeed | apex | flash-attn | megatron-fused-kernels
    version: str           # full PEP 440 version of the wheel, local label included
    wheel: dict[str, str]  # filename, sha256
    python_tag: str
    toolchain: dict[str, Any]
    target: dict[str, Any]  # kind, archs, wavefront, cpu_isa, rocm_version / cuda_version
    torch: dict[str, Any]   # version, kind, hip, cuda
    sources: dict[str, str]
    extensions: list[ExtensionEntry]
    ops: NotRequired[list[OpEntry]]


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path beside ``dest``; on success it replaces ``dest``, on error it is removed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are meant to be read by others
    try:
        yield Path(tmp)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(dest: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(dest: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(dest, text.encode())


def atomic_write_json(dest: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(dest, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def manifest_path(wheel: str | os.PathLike[str]) -> Path:
    wheel = Path(wheel)
    return wheel.with_name(wheel.name + SUFFIX)


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"manifest missing: {path}",
                          hint="rebuild the wheel with porter, or remove it from the wheelhouse") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"manifest corrupt: {path}: {exc}",
                          hint="rebuild the wheel with porter; a manifest is never edited by hand") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"manifest {path} is not a {SCHEMA} document",
                          hint="rebuild the wheel with this porter version")
    for key in ("component", "version", "wheel", "target", "extensions"):
        if key not in data:
            raise ConfigError(f"manifest {path} lacks the key {key!r}", hint="rebuild the wheel with porter")
    return data  # type: ignore[return-value]
