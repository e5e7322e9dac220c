"""A component porter does not ship (tests/toy, found through the ``porter.components`` entry point with tests/toy
on the path), with nothing changed under porter/: it builds a wheel, compiles its HIP kernels only, shards that on
the one-node Slurm, is a matrix cell, and is reported by the audit."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT
from tests.integration.conftest import run_porter
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.integration
TOY = FIXTURES / "toy-src"
PLUGIN = {"PYTHONPATH": f"{ROOT / 'tests' / 'toy'}:{ROOT}"}


def test_the_toy_builds_a_verified_labelled_wheel(tmp_path: Path) -> None:
    env = {**PLUGIN, "PORTER_CACHE_DIR": str(tmp_path / "cache")}
    assert "toy" in run_porter("wheel", "--help", env=env).stdout
    assert "toy" not in run_porter("wheel", "--help", env={"PORTER_CACHE_DIR": str(tmp_path / "cache")}).stdout
    res = run_porter("wheel", "toy", "--source", str(TOY), "-t", "cpu", "-o", str(tmp_path / "wh"), "--json", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    wheel = Path(doc["wheel"])
    assert wheel.name.startswith("toy-0.3.0+cpu.") and wheel.parent == tmp_path / "wh"
    with zipfile.ZipFile(wheel) as z:
        assert any(n.startswith("toy/_kern") and n.endswith(".so") for n in z.namelist())
    manifest = json.loads(Path(doc["manifest"]).read_text())
    assert manifest["component"] == "toy" and manifest["version"].startswith("0.3.0+cpu.")


@pytest.mark.rocm7
def test_the_toy_compiles_only_for_every_arch(rocm7: Path, tmp_path: Path) -> None:
    env = {**PLUGIN, "PORTER_CACHE_DIR": str(tmp_path / "cache"), "PORTER_ROCM7_ROOT": str(rocm7)}
    res = run_porter("wheel", "toy", "--source", str(TOY), "-t", "debian-rocm7", "--arch", "gfx90a,gfx942",
                     "--compile-only", "--json", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert {r["name"]: r["archs"] for r in doc["compiled"]} == {
        "toy_scale": {"gfx90a": "compiled", "gfx942": "compiled"},
        "toy_add": {"gfx90a": "compiled", "gfx942": "compiled"}}


@pytest.mark.slurm
@pytest.mark.rocm7
def test_the_toy_compiles_in_two_shards_on_slurm(slurm: SlurmCluster, rocm7: Path, tmp_path: Path) -> None:
    env = {**slurm.env, **PLUGIN, "PORTER_CACHE_DIR": str(tmp_path / "cache"), "PORTER_ROCM7_ROOT": str(rocm7)}
    d = tmp_path / "shared"
    res = run_porter("wheel", "toy", "--source", str(TOY), "-t", "debian-rocm7", "--arch", "gfx942", "--compile-only",
                     "--shards", "2", "--slurm", "--dir", str(d), "-o", str(tmp_path / "w"), "--cpus-per-task", "1",
                     "--time", "20:00", "--wait", "--json", env=env, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:] + "".join(p.read_text()[-2000:]
                                                             for p in sorted((d / "logs").glob("*.log")))
    doc = json.loads(res.stdout)
    assert doc["status"]["state"] == "finished" and [t["objects"] for t in doc["status"]["tasks"]] == [1, 1]
    assert json.loads((d / "request.json").read_text())["component"] == "toy"
    report = json.loads((d / "results" / "link.json").read_text())
    assert sorted(r["name"] for r in report["compiled"]) == ["toy_add", "toy_scale"]


def test_the_toy_is_a_matrix_cell(tmp_path: Path) -> None:
    (tmp_path / "m.toml").write_text(f'name = "toy"\ntoolchains = ["cpu"]\n[[component]]\nname = "toy"\n'
                                     f'sources = ["{TOY}"]\n')
    env = {**PLUGIN, "PORTER_CACHE_DIR": str(tmp_path / "cache")}
    res = run_porter("matrix", "run", str(tmp_path / "m.toml"), "--local", "-d", str(tmp_path / "d"), "--json", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    (cell,) = json.loads(res.stdout)["report"]["cells"]
    assert cell["status"] == "built" and cell["wheel"].startswith("toy-0.3.0+cpu.")
    request = json.loads((tmp_path / "d" / "cells" / cell["id"] / "request.json").read_text())
    assert request["component"] == "toy" and request["options"]["source"] == str(TOY)


def test_the_audit_asks_the_toy(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("from torch.utils import cpp_extension\n"
                                       "kern = cpp_extension.load(name='toy_scale', sources=['k.hip'])\n")
    res = run_porter("audit", str(tmp_path), "--no-python", "--json", env=PLUGIN)
    assert res.returncode == 1, res.stderr
    (site,) = json.loads(res.stdout)["sites"]
    assert (site["kind"], site["status"], site["module"]) == ("toy", "compiles", "toy.toy_scale")
    assert "porter wheel toy" in site["detail"] and site["cost"] == "the toy's kernels JIT-build at first use"
