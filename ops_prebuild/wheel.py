"""Package prebuilt ops into the project's own wheel.

DeepSpeed's own setup.py builds the pure-Python wheel (``DS_BUILD_OPS=0``; cached per source), then
porter writes a new wheel with the same files plus the prebuilt ``.so`` modules, ``installed_ops``
set for them, the target named in the PEP 440 local label, and a platform tag. The ``wheel``
library's :class:`WheelFile` writes RECORD.
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version
from wheel.wheelfile import WheelFile

from porter.errors import ToolError
from porter.run import Runner, make_env

VERSION_INFO = "deepspeed/git_version_info_installed.py"


def base_wheel(tree: Path, cache: Path, *, python: str, accelerator: str, runner: Runner) -> Path:
    """The pure-Python DeepSpeed wheel built by its own setup.py with no ops (cached)."""
    found = sorted(cache.glob("*.whl")) if cache.is_dir() else []
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="porter-ds-") as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(tree, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        out = Path(tmp) / "out"
        runner.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), "."],
                   cwd=copy, env=make_env({"DS_BUILD_OPS": "0", "DS_ACCELERATOR": accelerator}), timeout=1800,
                   hint="DeepSpeed's setup.py failed to build its pure-Python wheel; see its output above")
        wheels = sorted(out.glob("*.whl"))
        if not wheels:
            raise ToolError(f"pip wheel produced no wheel for {tree}")
        os.replace(wheels[0], cache / wheels[0].name)
    return cache / wheels[0].name


def relabel(version: str, label: str) -> str:
    """``0.19.8`` (or ``0.19.8+abc``) -> ``0.19.8+<label>``, validated by packaging."""
    public = Version(version).public
    new = f"{public}+{label}"
    Version(new)  # validates; kept as written (normalizing would turn x86_64_v2 into x86.64.v2)
    return new


def compose(base: Path, dest: Path, *, version: str, tag: str, extensions: Mapping[str, Path],
            installed_ops: Mapping[str, bool], extra_files: Mapping[str, bytes]) -> None:
    """Write the final wheel at ``dest`` (callers pass a temp path and rename it into place)."""
    with zipfile.ZipFile(base) as zin:
        names = zin.namelist()
        old_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        dist = old_info[: -len(".dist-info")].rsplit("-", 1)[0]
        new_info = f"{dist}-{version}.dist-info"
        with WheelFile(dest, "w") as wf:
            for name in names:
                if name.endswith("/") or name == f"{old_info}/RECORD":
                    continue
                data = zin.read(name)
                target = new_info + name[len(old_info):] if name.startswith(old_info + "/") else name
                if name == f"{old_info}/METADATA":
                    data = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data, count=1)
                elif name == f"{old_info}/WHEEL":
                    text = data.decode()
                    text = re.sub(r"(?m)^Root-Is-Purelib: .*$", "Root-Is-Purelib: false", text)
                    text = re.sub(r"(?m)^Tag: .*\n?", "", text).rstrip("\n") + f"\nTag: {tag}\n"
                    data = text.encode()
                elif name == VERSION_INFO:
                    data = _installed_ops(data.decode(), installed_ops).encode()
                wf.writestr(target, data)
            for arcname, so in sorted(extensions.items()):
                wf.write(str(so), arcname)
            for arcname, payload in sorted(extra_files.items()):
                wf.writestr(arcname.replace("{dist_info}", new_info), payload)


def _installed_ops(text: str, installed: Mapping[str, bool]) -> str:
    line = "installed_ops=" + repr(dict(sorted(installed.items())))
    if re.search(r"(?m)^installed_ops\s*=", text):
        return re.sub(r"(?m)^installed_ops\s*=.*$", line.replace("\\", "\\\\"), text, count=1)
    return text.rstrip("\n") + "\n" + line + "\n"


def wheel_filename(dist: str, version: str, tag: str) -> str:
    name = re.sub(r"[-_.]+", "_", canonicalize_name(dist))
    return f"{name}-{version}-{tag}.whl"


def dist_version(base: Path) -> tuple[str, str]:
    """(distribution name, version) from a wheel's METADATA."""
    with zipfile.ZipFile(base) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.BytesParser().parsebytes(z.read(meta))
    return str(msg["Name"]), str(msg["Version"])


def python_executable() -> str:
    return sys.executable
