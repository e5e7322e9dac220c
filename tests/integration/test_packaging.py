"""A normal, non-editable install ships every data file porter reads at run time."""
from __future__ import annotations

import os
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
               ("frontier", "lumi-g", "lumi-g-rocm6", "mi300x", "mi355x", "debian-rocm", "debian-trixie-rocm", "debian-rocm7",
                "cuda-h100", "cpu")}
    assert presets <= names
    shipped = {p.relative_to(ROOT / "patches").as_posix() for p in (ROOT / "patches").rglob("*.toml")}
    assert shipped and {f"porter/patchsets/{s}" for s in shipped} <= names
    for needed in ("porter/hipify/extra_map.toml", "porter/components/isa.toml", "porter/probes/ds_catalogue.py",
                   "porter/probes/protocol.py", "porter/probes/torch_facts.py", "porter/py.typed"):
        assert needed in names, needed
    assert not any(n.startswith("tests/") for n in names)


def test_non_editable_install_finds_its_data(tmp_path: Path) -> None:
    """pip install . into a fresh venv (no torch), then the commands that read shipped data."""
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "v")], check=True)
    py = str(tmp_path / "v" / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", str(ROOT)], check=True, capture_output=True)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed copy, not a checkout's
    run = lambda *a: subprocess.run([py, "-m", "porter", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=tmp_path, env=clean)
    show = run("toolchain", "show", "frontier", "--json")
    assert show.returncode == 0 and '"wavefront": 64' in show.stdout, show.stderr
    sets = run("patch", "list", "--json")
    assert sets.returncode == 0 and "no-jit" in sets.stdout and "megatron-deepspeed" in sets.stdout, sets.stderr
