"""A normal, non-editable install ships every data file porter reads at run time."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT


def test_wheel_of_porter_carries_presets_patch_sets_and_op_data(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("porter-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = {f"porter/toolchain/presets/{p}.toml" for p in
               ("frontier", "lumi-g", "mi300x", "debian-rocm", "debian-trixie-rocm", "cuda-h100", "cpu")}
    assert presets <= names
    shipped = {p.relative_to(ROOT / "patches").as_posix() for p in (ROOT / "patches").rglob("*.toml")}
    assert shipped and {f"porter/patchsets/{s}" for s in shipped} <= names
    for needed in ("porter/hipify/extra_map.toml", "ops_prebuild/data/isa.toml", "ops_prebuild/_probe.py",
                   "ops_prebuild/_torch_probe.py", "porter/py.typed"):
        assert needed in names, needed
    assert not any(n.startswith("tests/") for n in names)
