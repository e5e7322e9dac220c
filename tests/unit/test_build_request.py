"""``porter build --request FILE``: a build written down as data runs through the command that builds its component,
each option converted and checked as if typed; the request wins over the environment; bad requests are errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from porter.cli import cli
from porter.cluster.request import BuildRequest, read_request
from porter.errors import ConfigError
from porter.fs import atomic_write_json

ROOT = Path(__file__).resolve().parents[2]
APEX_ENV = ROOT / "tests" / "fixtures" / "apex-flags"  # setup.py builds it: a dry run starts no probe


def run(tmp_path: Path, doc: dict[str, object], *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(doc))
    res = CliRunner().invoke(cli, ["build", "--request", str(path), *args], env=env)
    if isinstance(res.exception, ConfigError):
        return 2, res.exception.message
    return res.exit_code, res.stdout if res.exit_code == 0 else res.output


def apex(tmp_path: Path, **options: object) -> dict[str, object]:
    return BuildRequest("apex", {"source": str(APEX_ENV), "toolchain_ref": "cpu", **options}).to_dict()


def test_a_request_runs_the_components_build_with_its_options(tmp_path: Path) -> None:
    code, out = run(tmp_path, apex(tmp_path, ops=["cpp"], jobs=3, no_torch_check=True), "--dry-run", "--json",
                    "-o", str(tmp_path / "wh"))
    assert code == 0, out
    doc = json.loads(out)
    assert doc["dry_run"] is True and doc["plan"]["project"] == "apex" and doc["plan"]["jobs"] == 3
    assert doc["plan"]["ops"] == ["apex_C"]  # --ops cpp, as the request gave it


def test_the_request_wins_over_the_environment(tmp_path: Path) -> None:
    """A job's environment (PORTER_PYTHON here) does not change what was frozen at submission."""
    code, out = run(tmp_path, apex(tmp_path, python="/frozen/python", no_torch_check=True), "--dry-run", "--json",
                    env={"PORTER_PYTHON": "/from/the/env"})
    assert code == 0, out
    assert "/frozen/python" in " ".join(json.loads(out)["command"]) and "/from/the/env" not in out


def test_a_value_is_checked_as_if_typed(tmp_path: Path) -> None:
    code, out = run(tmp_path, apex(tmp_path, jobs=0), "--dry-run")
    assert code == 2 and "--jobs" in out and "0" in out


def test_an_option_the_command_does_not_take_is_named(tmp_path: Path) -> None:
    code, out = run(tmp_path, apex(tmp_path, backend="ck"), "--dry-run")
    assert code == 2 and "backend" in out and "porter wheel apex" in out


def test_a_component_nothing_builds_and_a_shard_of_an_unsharded_build_are_refused(tmp_path: Path) -> None:
    code, out = run(tmp_path, {**apex(tmp_path), "component": "toy"})
    assert code == 2 and "no component 'toy'" in out
    code, out = run(tmp_path, apex(tmp_path), "--shard", "0/2")
    assert code == 2 and "--shard" in out


def test_a_damaged_or_foreign_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read as a build request"):
        read_request(bad)
    bad.write_text(json.dumps({"schema": "porter.shards/2"}))
    with pytest.raises(ConfigError, match="not a porter.request/1 document"):
        read_request(bad)
    with pytest.raises(ConfigError, match="may not set dry_run"):
        BuildRequest("apex", {"dry_run": True})


def test_a_request_reads_back_as_written(tmp_path: Path) -> None:
    req = BuildRequest("deepspeed", {"source": "/s", "ops": ("a", "b"), "cache_dir": tmp_path}, ("--pch",),
                       {"link_only": True})
    atomic_write_json(tmp_path / "r.json", req.to_dict())
    back = read_request(tmp_path / "r.json")
    assert back.to_dict() == req.to_dict() and back.options["ops"] == ["a", "b"] and back.args == ("--pch",)
