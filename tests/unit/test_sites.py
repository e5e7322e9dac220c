"""Site profiles: the built-in data, loading files, unknown keys and sites, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from porter.cli import cli
from porter.cluster.site.profiles import load_site, runtime_env, site_names
from porter.errors import ConfigError

MINIMAL = """\
source = "written for this test"
[node]
gpus = 2
device_memory_gib = 16
arch = "gfx942"
cores = 4
cores_per_gcd = 1
"""


def invoke(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(cli, ["-q", *args])
    return result.exit_code, result.stdout, result.exception


def test_builtin_sites_load_and_name_their_sources() -> None:
    assert site_names() == ["frontier", "lumi-g", "mi300x"]
    for name in site_names():
        s = load_site(name)
        assert s.name == name and s.source.strip() and s.toolchain == name
    f = load_site("frontier")
    assert "olcf/olcf-user-docs" in f.source and "pytorch_frontier.rst" in f.source
    assert "lumi-userguide" in load_site("lumi-g").source


def test_frontier_node_layout_from_olcf_docs() -> None:
    n = load_site("frontier").node
    assert (n.gpus, n.gcds_per_gpu, n.devices, n.device_memory_gib, n.arch) == (4, 2, 8, 64.0, "gfx90a")
    assert n.cores_per_gcd * n.devices == 56  # 64 cores less the 8 that -S 8 reserves
    assert n.numa_of_gcd == (3, 3, 1, 1, 0, 0, 2, 2)
    assert n.nics == ("hsn0", "hsn1", "hsn2", "hsn3") and n.gcds_per_nic == 2


def test_runtime_env_derives_miopen_on_node_local_storage_and_omp() -> None:
    s = load_site("frontier")
    env = runtime_env(s)
    assert env["MIOPEN_USER_DB_PATH"].startswith("${PORTER_LOCAL_DIR}/") and env["PORTER_LOCAL_DIR"] == "/tmp"
    assert env["MIOPEN_CUSTOM_CACHE_DIR"] == "${MIOPEN_USER_DB_PATH}"
    assert env["OMP_NUM_THREADS"] == "7" and env["FI_CXI_RDZV_PROTO"] == "alt_read"
    assert s.plugin is not None and s.plugin.module == "rccl-net-plugin"
    assert "--network=disable_rdzv_get" in s.scheduler.sbatch_args
    lumi = runtime_env(load_site("lumi-g"))
    assert lumi["NCCL_SOCKET_IFNAME"] == "hsn" and lumi["CXI_FORK_SAFE"] == "1"


def test_a_site_file(tmp_path: Path) -> None:
    p = tmp_path / "mine.toml"
    p.write_text(MINIMAL)
    s = load_site(p)
    assert s.name == "mine" and s.node.devices == 2 and s.plugin is None and s.runtime.env == {}


@pytest.mark.parametrize("extra, words", [
    ("[node]\n", "Cannot declare"),  # duplicate table: TOML error
])
def test_bad_toml(tmp_path: Path, extra: str, words: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(MINIMAL + extra)
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_site(p)


@pytest.mark.parametrize("text, words", [
    (MINIMAL + "colour = 'red'\n", "unknown key 'colour'"),
    (MINIMAL.replace("cores = 4", "cores = 4\ncores_per_gpu = 2"), "unknown key 'cores_per_gpu' in [node] (did you mean 'cores_per_gcd'?)"),
    (MINIMAL + "[runtime]\nmodule = ['rocm']\n", "unknown key 'module' in [runtime] (did you mean 'modules'?)"),
    (MINIMAL + "[plugin]\nname = 'x'\nlib = 'y'\n", "unknown key 'lib' in [plugin]"),
    (MINIMAL.replace('arch = "gfx942"', 'arch = "gfx9422"'), "gfx9422"),
    (MINIMAL.replace("gpus = 2", "gpus = '2'"), "[node] gpus must be a whole number"),
    (MINIMAL.replace("cores = 4", "cores = 1"), "more than the node's 1 cores"),
    (MINIMAL.replace('source = "written for this test"', ""), "no source"),
    (MINIMAL + "[runtime.env]\nMIOPEN_USER_DB_PATH = '/x'\n", "sets MIOPEN_USER_DB_PATH, which porter derives"),
    (MINIMAL.replace("cores_per_gcd = 1", ""), "[node] lacks cores_per_gcd"),
])
def test_bad_site_files_name_the_key(tmp_path: Path, text: str, words: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_site(p)
    assert words in err.value.message and str(p) in err.value.message


def test_unknown_site_exits_2_with_close_matches() -> None:
    code, _, exc = invoke("site", "show", "lumi")
    assert isinstance(exc, ConfigError) and exc.exit_code == 2
    assert "unknown site 'lumi' (did you mean 'lumi-g'?)" in exc.message and "frontier" in (exc.hint or "")
    code, _, exc = invoke("site", "show", "nowhere.toml")
    assert isinstance(exc, ConfigError) and "does not exist" in exc.message


def test_cli_list_and_show_json() -> None:
    code, out, _ = invoke("site", "list", "--json")
    assert code == 0 and [d["name"] for d in json.loads(out)] == ["frontier", "lumi-g", "mi300x"]
    code, out, _ = invoke("site", "show", "frontier", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["node"]["devices"] == 8 and doc["rank_env"]["OMP_NUM_THREADS"] == "7"
    assert doc["node"]["numa_of_gcd"] == [3, 3, 1, 1, 0, 0, 2, 2]
    code, out, _ = invoke("site", "show", "lumi-g")
    assert code == 0 and "standard-g" in out and "aws-ofi-rccl 1.4.0" in out and "NCCL_SOCKET_IFNAME=hsn" in out
