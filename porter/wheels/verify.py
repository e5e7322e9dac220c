"""Check a built wheel against what was asked for, and give it the target's local version label.

Verification reads the wheel (a zip) in pure Python: which extension modules it holds, and, for GPU
builds, which code objects each ``.so`` carries (:mod:`porter.codeobjects`). Labelling unpacks and
repacks with the ``wheel`` library, which rewrites the ``.dist-info`` name, METADATA and RECORD.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import Version

from porter.codeobjects import archs_in
from porter.errors import CheckFailed, ConfigError
from porter.manifest import ExtensionEntry, sha256_bytes
from porter.wheels.base import Expectation

_EXT_SUFFIX = re.compile(r"(\.cpython-[^.]+|\.abi3|\.cp\d+-[^.]+)?\.so$")


@dataclass(frozen=True)
class WheelExtension:
    path: str        # inside the wheel
    module: str      # importable name
    data: bytes


def module_name(member: str) -> str:
    """``apex/amp_C.cpython-311-x86_64-linux-gnu.so`` -> ``apex.amp_C``."""
    return _EXT_SUFFIX.sub("", member).replace("/", ".")


def extensions_in(wheel: Path) -> list[WheelExtension]:
    with zipfile.ZipFile(wheel) as zf:
        return [WheelExtension(n, module_name(n), zf.read(n)) for n in zf.namelist()
                if n.endswith(".so") and ".data/" not in n.split("/")[0]]


def verify_wheel(wheel: Path, expect: Expectation) -> list[ExtensionEntry]:
    """Raise CheckFailed naming every problem; return the manifest entries of the extensions."""
    exts = extensions_in(wheel)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    problems: list[str] = []
    hint: str | None = None
    if expect.prebuilt and not exts:
        problems.append(f"{wheel.name} holds no prebuilt extension (.so): the build compiled nothing")
        hint = expect.empty_hint or None
    have = {e.module for e in exts}
    missing = [m for m in expect.modules if m not in have]
    if missing and exts:
        problems.append(f"{wheel.name} lacks the extension modules {', '.join(missing)} "
                        f"(it holds {', '.join(sorted(have)) or 'none'})")
    for pkg in expect.packages:
        if not any(n.startswith(pkg.rstrip("/") + "/") for n in names):
            problems.append(f"{wheel.name} lacks the package directory {pkg}/")
    entries: list[ExtensionEntry] = []
    with tempfile.TemporaryDirectory(prefix="porter-verify-") as tmp:
        for ext in exts:
            entry: ExtensionEntry = {"module": ext.module, "path": ext.path, "sha256": sha256_bytes(ext.data)}
            if expect.archs:
                so = Path(tmp) / Path(ext.path).name
                so.write_bytes(ext.data)
                try:
                    found = archs_in(so)
                except ConfigError as exc:
                    problems.append(f"{ext.path}: {exc.message}")
                    continue
                entry["archs"] = found
                lacking = [a for a in expect.archs if a not in found]
                if lacking:
                    problems.append(f"{ext.path} has no code objects for {', '.join(lacking)} "
                                    f"(it holds: {', '.join(found) or 'none'})")
                    hint = hint or "the build did not compile for the profile's archs; check PYTORCH_ROCM_ARCH / " \
                                   "GPU_ARCHS in the build output"
            entries.append(entry)
    if problems:
        raise CheckFailed("wheel refused:\n  " + "\n  ".join(problems),
                          hint=hint or "the wheel was not copied to the wheelhouse; fix the build and run again")
    return entries


# -- labelling -----------------------------------------------------------------------------------

def _wheel_commands() -> tuple[object, object]:
    """unpack/pack from the ``wheel`` library (``wheel._commands`` since 0.46, ``wheel.cli`` before)."""
    try:
        from wheel._commands.pack import pack
        from wheel._commands.unpack import unpack
    except ImportError:  # pragma: no cover - older wheel
        from wheel.cli.pack import pack
        from wheel.cli.unpack import unpack
    return unpack, pack


def relabel(wheel: Path, label: str, dest_dir: Path) -> Path:
    """Write ``wheel`` with the local version ``+label`` into ``dest_dir`` (atomically); return its path."""
    unpack, pack = _wheel_commands()
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".porter-label-", dir=dest_dir) as tmp:
        unpacked, packed = Path(tmp) / "unpacked", Path(tmp) / "packed"
        unpacked.mkdir()
        packed.mkdir()
        sink = io.StringIO()  # the wheel commands report on stdout, which porter keeps for results
        with contextlib.redirect_stdout(sink):
            unpack(str(wheel), str(unpacked))  # type: ignore[operator]
            (root,) = list(unpacked.iterdir())
            if "local_version" in inspect.signature(pack).parameters:  # type: ignore[arg-type]
                pack(str(root), str(packed), None, local_version=label)  # type: ignore[operator]
            else:  # pragma: no cover - wheel < 0.46 has no local_version: rename dist-info + METADATA first
                _set_local_version(root, label)
                pack(str(root), str(packed), None)  # type: ignore[operator]
        (out,) = list(packed.glob("*.whl"))
        want = Version(f"0+{label}").local
        if parse_wheel_filename(out.name)[1].local != want:
            raise CheckFailed(f"relabelled {wheel.name} as {out.name}, which does not carry +{label}")
        final = dest_dir / out.name
        os.replace(out, final)
    return final


def _set_local_version(root: Path, label: str) -> None:
    """What ``pack(local_version=)`` does, for wheel < 0.46: rename the .dist-info, rewrite Version."""
    (dist_info,) = [p for p in root.iterdir() if p.name.endswith(".dist-info")]
    namever = dist_info.name[: -len(".dist-info")]
    name, _, version = namever.partition("-")
    new_version = f"{version.split('+', 1)[0]}+{label}"
    meta = dist_info / "METADATA"
    lines = meta.read_text().splitlines(keepends=True)
    meta.write_text("".join(f"Version: {new_version}\n" if ln.startswith("Version:") else ln for ln in lines))
    shutil.move(str(dist_info), str(root / f"{name}-{new_version}.dist-info"))
