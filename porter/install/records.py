"""Install records: how a wheel's manifest travels with the install.

After pip has installed a porter wheel, porter writes ``<data>/share/porter/installed/<project>.json``
in the target environment (``<data>`` is ``sysconfig.get_path("data")``, the venv root for a venv):
the wheel's full manifest, its sha256, where it came from and when. ``verify`` and ``report`` read
these back. They live outside site-packages so pip's RECORD and uninstall stay pip's own business;
a record whose distribution is gone or has another version is reported as stale.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, cast

from packaging.utils import canonicalize_name

from porter import __version__
from porter.install.env import TargetEnv
from porter.artifacts.manifest import Manifest
from porter.fs import atomic_write_json

RECORD_SCHEMA = "porter.install-record/1"


class InstallRecord(TypedDict):
    schema: str
    porter_version: str
    project: str
    version: str
    wheel: str
    sha256: str
    source: str
    installed_at: str
    python: str
    manifest: Manifest


@dataclass(frozen=True)
class RecordFile:
    path: Path
    record: InstallRecord | None
    error: str | None = None


def records_dir(env: TargetEnv) -> Path:
    return env.porter_dir / "installed"


def lock_path(env: TargetEnv) -> Path:
    return env.porter_dir / "install.lock"


def write_record(env: TargetEnv, project: str, manifest: Manifest, sha256: str, source: str) -> None:
    rec: InstallRecord = {
        "schema": RECORD_SCHEMA, "porter_version": __version__, "project": str(canonicalize_name(project)),
        "version": manifest["version"], "wheel": manifest["wheel"].get("filename", ""), "sha256": sha256,
        "source": source, "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": env.executable, "manifest": manifest,
    }
    atomic_write_json(records_dir(env) / f"{rec['project']}.json", rec)


def read_records(env: TargetEnv) -> dict[str, RecordFile]:
    """project -> record (or the reason it could not be read)."""
    out: dict[str, RecordFile] = {}
    for p in sorted(records_dir(env).glob("*.json")):  # none when the folder is not there
        try:
            data: Any = json.loads(p.read_text())
            if not isinstance(data, dict) or data.get("schema") != RECORD_SCHEMA or "manifest" not in data:
                raise ValueError(f"not a {RECORD_SCHEMA} document")
            out[p.stem] = RecordFile(p, cast(InstallRecord, data))
        except (OSError, ValueError) as exc:
            out[p.stem] = RecordFile(p, None, f"{p}: unreadable install record: {exc}")
    return out


def carried_manifest(text: str) -> Manifest | None:
    """A manifest copy shipped inside a wheel's dist-info as ``porter.json`` (optional fallback); None if corrupt."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or "extensions" not in data:
        return None
    return data  # type: ignore[return-value]
