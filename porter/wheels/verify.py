"""Check a built wheel against what was asked for, and give it the target's local version label.

Verification reads the wheel (a zip) in pure Python: which extension modules it holds, and, for GPU
builds, which code objects each ``.so`` carries (:mod:`porter.codeobjects`). Labelling writes the wheel
anew with porter's one wheel writer (:mod:`porter.artifacts.wheelfile`).
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from porter.artifacts.labels import with_label
from porter.artifacts.manifest import ExtensionEntry, publish
from porter.artifacts.wheelfile import Payload, module_name, rewrite_wheel
from porter.codeobjects import archs_in
from porter.errors import CheckFailed, ConfigError
from porter.fs import owned_temp, sha256_bytes
from porter.wheels.base import Expectation


def verify_wheel(wheel: Path, expect: Expectation, add: Mapping[str, Payload] | None = None) -> list[ExtensionEntry]:
    """Raise CheckFailed naming every problem; return the manifest entries of the extensions. ``add``: files the wheel
    gets on top of (or instead of) its own when it is labelled."""
    add = add or {}
    with zipfile.ZipFile(wheel) as zf:
        names = [*zf.namelist(), *add]
        # extension path inside the wheel -> its bytes: the wheel's own (not those of its .data dirs), then add's
        exts = {n: zf.read(n) for n in zf.namelist()
                if n.endswith(".so") and ".data/" not in n.split("/")[0] and n not in add}
    exts.update((n, p.read_bytes() if isinstance(p, Path) else p) for n, p in add.items() if n.endswith(".so"))
    problems: list[str] = []
    hint: str | None = None
    if expect.prebuilt and not exts:
        problems.append(f"{wheel.name} holds no prebuilt extension (.so): the build compiled nothing")
        hint = expect.empty_hint or None
    have = {module_name(n) for n in exts}
    missing = [m for m in expect.modules if m not in have]
    if missing and exts:
        problems.append(f"{wheel.name} lacks the extension modules {', '.join(missing)} "
                        f"(it holds {', '.join(sorted(have)) or 'none'})")
    for pkg in expect.packages:
        if not any(n.startswith(pkg.rstrip("/") + "/") for n in names):
            problems.append(f"{wheel.name} lacks the package directory {pkg}/")
    entries: list[ExtensionEntry] = []
    with owned_temp(None, "porter-verify-") as tmp:
        for path, data in exts.items():
            entry: ExtensionEntry = {"module": module_name(path), "path": path, "sha256": sha256_bytes(data)}
            if expect.archs and entry["module"] not in expect.host_only:
                so = tmp / Path(path).name
                so.write_bytes(data)
                try:
                    found = archs_in(so)
                except ConfigError as exc:
                    problems.append(f"{path}: {exc.message}")
                    continue
                entry["archs"] = found
                if lacking := [a for a in expect.archs if a not in found]:
                    problems.append(f"{path} has no code objects for {', '.join(lacking)} "
                                    f"(it holds: {', '.join(found) or 'none'})")
                    hint = hint or "the build did not compile for the profile's archs; check PYTORCH_ROCM_ARCH / " \
                                   "GPU_ARCHS in the build output"
            entries.append(entry)
    if problems:
        raise CheckFailed("wheel refused:\n  " + "\n  ".join(problems),
                          hint=hint or "the wheel was not copied to the wheelhouse; fix the build and run again")
    return entries


# -- labelling ----------------------------------------------------------------------------------

def relabel(wheel: Path, label: str, dest_dir: Path, fields: Mapping[str, Any],
            extra: Mapping[str, Any] | None = None, *, add: Mapping[str, Payload] | None = None,
            tag: str | None = None) -> tuple[Path, Path]:
    """Write ``wheel`` with the local version ``+label`` into ``dest_dir``, carrying the manifest of ``fields``
    (:func:`porter.artifacts.manifest.publish`: the manifest beside it first, then the wheel by an atomic rename).
    ``add``: files added to it (extension modules: then it is no longer pure, and takes ``tag``)."""
    new_version = with_label(str(parse_wheel_filename(wheel.name)[1]), label)
    if tag is None:  # the file name's last three fields (python, abi, platform), after any build tag
        tag = "-".join(wheel.name[:-len(".whl")].split("-")[-3:])
    final, mpath, _ = publish(dest_dir, lambda tmp, data: rewrite_wheel(
        wheel, tmp, version=new_version, tag=tag, purelib=_purelib(wheel) and not add,
        add={**(add or {}), "{dist_info}/porter.json": data}), extra=extra, **{**fields, "version": new_version})
    return final, mpath


def _purelib(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        info = next(n for n in zf.namelist() if n.endswith(".dist-info/WHEEL") and n.count("/") == 1)
        return bool(re.search(r"(?mi)^Root-Is-Purelib:\s*true", zf.read(info).decode()))
