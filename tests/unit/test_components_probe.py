"""The component registry and the probe protocol (no subprocess)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from ops_prebuild.source import Source
from porter import components
from porter.components.op_builder import read_installed_ops
from porter.errors import ConfigError
from porter.probe import parse_output, script_text
from porter.probes.protocol import MARKER
from tests.conftest import FIXTURES


def test_registry_knows_each_project_once() -> None:
    assert set(components.REGISTRY) == {"deepspeed", "megatron-deepspeed", "apex", "flash-attn", "netplugin"}
    dists = components.all_dists()
    assert len(dists) == len(set(dists))
    assert components.for_dist("megatron-fused-kernels") is components.get("megatron-deepspeed")
    assert components.for_dist("hjson") is None
    assert set(components.wheel_drivers()) == {"apex", "deepspeed", "flash-attn"}
    with pytest.raises(ConfigError, match="did you mean apex"):
        components.get("apx")


@pytest.mark.parametrize("tree,name", [
    ("patch/megatron-deepspeed", "megatron-deepspeed"), ("patch/deepspeed", "deepspeed"),
    ("apex-env", "apex"), ("apex-flags", "apex"), ("flash-attn-mini", "flash-attn"),
    ("aws-ofi-nccl-mini", "netplugin"), ("aws-ofi-rccl-mini", "netplugin"),
])
def test_each_fixture_tree_is_recognised_by_its_component(tree: str, name: str) -> None:
    found = components.recognise(FIXTURES / tree)
    assert found is not None and found.project == name


class ToyComponent:
    """A project porter does not ship, defined here: registering it touches nothing under porter/."""

    name = "toy"
    title = "Toy"
    dists: tuple[str, ...] = ("toy-kernels",)

    def recognise(self, tree: Path) -> Source | None:
        marker = tree / "toy.txt"
        return Source(self.name, marker.read_text().strip(), tree) if marker.is_file() else None

    def check_installed(self, dist: object, manifest: object, kind: str) -> components.InstalledCheck:
        return components.InstalledCheck(facts={"toy": True})


def test_a_component_defined_outside_porter_joins_the_registry(tmp_path: Path) -> None:
    (tmp_path / "toy.txt").write_text("1.2\n")
    assert components.recognise(tmp_path) is None
    toy = ToyComponent()
    components.register(toy)
    try:
        assert components.get("toy") is toy and components.for_dist("toy-kernels") is toy
        assert "toy-kernels" in components.all_dists()
        found = components.recognise(tmp_path)
        assert found is not None and (found.project, found.version) == ("toy", "1.2")
        assert components.recognise(FIXTURES / "apex-env").project == "apex"  # the others are as they were
    finally:
        components.unregister("toy")
    assert "toy" not in components.registry() and components.recognise(tmp_path) is None


def test_unknown_tree_is_nobodys(tmp_path: Path) -> None:
    assert components.recognise(tmp_path) is None


def test_installed_ops_reader() -> None:
    assert read_installed_ops("version='1'\ninstalled_ops={'cpu_adam': True, 'x': 0}\n") == \
        {"cpu_adam": True, "x": False}
    assert read_installed_ops("installed_ops=compute()\n") is None
    assert read_installed_ops("def (\n") is None


@pytest.mark.parametrize("name", ["torch", "env", "imports", "ds_catalogue", "hipify_ext"])
def test_every_probe_is_one_self_contained_script(name: str) -> None:
    text = script_text(name)
    ast.parse(text)  # valid Python once concatenated
    assert "porter.probes" not in text and "import porter" not in text  # the foreign python has no porter
    assert text.count("from __future__ import annotations") == 1 and text.startswith("from __future__")
    assert "def emit(" in text


def test_probe_output_is_read_after_the_last_marker() -> None:
    out = f"noise\n{MARKER}{{\"a\": 1}}\nmore noise\n{MARKER}{json.dumps({'b': [1, 2]})}\n"
    assert parse_output(out) == {"b": [1, 2]}
    assert parse_output("no marker here\n") is None
