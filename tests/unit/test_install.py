"""porter install's engine with a fake runner: selection, checks before pip, pip argv, records, lock."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from porter.archive import DamagedFile

from porter.errors import CheckFailed, ConfigError, NothingToDo, ToolError
from porter.install.engine import InstallOptions, install, parse_only
from porter.install.env import Node, TargetEnv, detect_node, node_from_option, parse_nvidia_smi, parse_rocminfo
from porter.install.records import read_records
from porter.artifacts.manifest import manifest_path
from tests.fixtures.install.fakes import FakeRunner, env_json, slow_pip
from tests.fixtures.install.wheels import deepspeed_wheel, make_manifest, make_wheel

# a real shared object (one of this python's own extension modules): install reads each .so's ELF before anything
# is written, and this one loads here (it needs only the C library)
import _json  # noqa: E402

SO = Path(_json.__file__).read_bytes()


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    wh = tmp_path / "wheelhouse"
    deepspeed_wheel(wh, {"cpu_adam": SO})
    return wh, env_json(tmp_path / "venv")


def opts(wh: Path, **kw: object) -> InstallOptions:
    return InstallOptions(wheelhouse=wh, python="/venv/bin/python", **kw)  # type: ignore[arg-type]


def test_installs_a_checked_copy_offline_and_records_it(setup: tuple[Path, dict[str, object]]) -> None:
    wh, state = setup
    runner = FakeRunner(state)
    result = install(opts(wh), runner)
    [pip] = runner.pip_calls()
    assert pip[:4] == [state["executable"], "-m", "pip", "install"]
    for flag in ("--no-index", "--disable-pip-version-check"):
        assert flag in pip
    assert pip[pip.index("--find-links") + 1] == str(wh.resolve())
    assert pip[pip.index("--only-binary") + 1] == ":all:"
    copy = Path(pip[-1])
    assert copy.name == "deepspeed-0.19.8+cpu.x86.64.v2-cp311-cp311-linux_x86_64.whl"
    assert copy.parent != wh.resolve() and not copy.exists()  # a private copy, removed afterwards
    pip_env = next(e for a, e in runner.calls if a == pip)
    assert pip_env["PIP_CONFIG_FILE"] == "/dev/null"
    assert [w.version_text for w in result.installed] == ["0.19.8+cpu.x86.64.v2"]
    env = TargetEnv.from_json(state)
    rec = read_records(env)["deepspeed"].record
    assert rec is not None and rec["manifest"]["component"] == "deepspeed" and rec["version"] == "0.19.8+cpu.x86.64.v2"
    assert (env.porter_dir / "install.lock").exists()
    assert result.lock["acquired_at"] <= result.lock["released_at"]


def test_second_install_of_the_same_wheel_changes_nothing(setup: tuple[Path, dict[str, object]]) -> None:
    wh, state = setup
    runner = FakeRunner(state)
    install(opts(wh), runner)
    result = install(opts(wh), runner)
    assert len(runner.pip_calls()) == 1 and [w.project for w in result.skipped] == ["deepspeed"]
    install(opts(wh, reinstall=True), runner)
    last = runner.pip_calls()[-1]
    assert "--force-reinstall" in last and "--no-deps" in last


def test_reinstall_into_an_environment_without_the_wheel_installs_its_dependencies(
        setup: tuple[Path, dict[str, object]]) -> None:
    """Seen on a GPU node: 'porter install --reinstall' into a fresh venv forced the wheel in with --no-deps, so
    DeepSpeed was installed without pydantic and every op failed to load. Only a wheel whose version is there is
    forced (without its dependencies, which are there too)."""
    wh, state = setup
    runner = FakeRunner(state)
    install(opts(wh, reinstall=True), runner)
    [pip] = runner.pip_calls()
    assert "--force-reinstall" not in pip and "--no-deps" not in pip


def test_tampered_wheel_never_reaches_pip(setup: tuple[Path, dict[str, object]]) -> None:
    wh, state = setup
    [whl] = wh.glob("*.whl")
    with whl.open("ab") as f:
        f.write(b"evil")
    runner = FakeRunner(state)
    with pytest.raises(DamagedFile, match="sha256 does not match its manifest"):
        install(opts(wh), runner)
    assert runner.pip_calls() == [] and read_records(TargetEnv.from_json(state)) == {}


def test_escaping_wheel_never_reaches_pip(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    whl = make_wheel(wh, "deepspeed", "0.19.8+cpu.x86.64.v2", {"deepspeed/__init__.py": b"", "../x.pth": b"import os"})
    make_manifest(whl, component="deepspeed", version="0.19.8+cpu.x86.64.v2")
    runner = FakeRunner(env_json(tmp_path / "venv"))
    with pytest.raises(DamagedFile, match=r"\.\./x\.pth"):
        install(opts(wh), runner)
    assert runner.pip_calls() == []


def test_missing_manifest_and_no_match(tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    whl = deepspeed_wheel(wh, {"cpu_adam": SO})
    manifest_path(whl).unlink()
    with pytest.raises(ConfigError, match="manifest missing"):
        install(opts(wh), FakeRunner(env_json(tmp_path / "v")))
    deepspeed_wheel(wh, {"cpu_adam": SO})
    runner = FakeRunner(env_json(tmp_path / "v", torch={"version": "2.14.1+cu130", "cuda": "13.0", "hip": None}))
    with pytest.raises(NothingToDo, match=r"found 2\.14\.1 \(cuda\)"):
        install(opts(wh), runner)
    assert runner.pip_calls() == []


def test_target_without_pip(setup: tuple[Path, dict[str, object]]) -> None:
    wh, state = setup
    state["pip"] = None
    with pytest.raises(ToolError, match="has no pip"):
        install(opts(wh), FakeRunner(state))


def test_concurrent_installs_take_turns(setup: tuple[Path, dict[str, object]]) -> None:
    wh, state = setup
    spans: list[tuple[float, float]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            install(opts(wh, reinstall=True), FakeRunner(json.loads(json.dumps(state)), on_pip=slow_pip(0.3, spans)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(spans) == 2
    (a0, a1), (b0, b1) = sorted(spans)
    assert a1 <= b0, f"pip runs overlapped: {spans}"


def test_node_detection(tmp_path: Path) -> None:
    out = "Agent 1\n  Name:                    AMD EPYC 7A53\nAgent 2\n  Name:                    gfx90a\n" \
          "  Marketing Name:          AMD Instinct MI250X\nAgent 3\n  Name:                    gfx90a\n"
    assert parse_rocminfo(out) == ["gfx90a"]
    assert parse_nvidia_smi("NVIDIA H100 80GB HBM3, 9.0\nNVIDIA H100 80GB HBM3, 9.0\n") == ["sm_90"]
    assert node_from_option(["gfx90a:xnack-"]) == Node(("gfx90a",), "--arch")
    with pytest.raises(ConfigError, match="unknown GPU arch"):
        node_from_option(["gfx9000"])

    class Rocm(FakeRunner):
        def run(self, argv, **kw):  # type: ignore[no-untyped-def]
            from porter.run import Result
            return Result([str(a) for a in argv], 0, out, 0.0)

    node = detect_node(Rocm({}), (), {"PATH": str(tmp_path)})
    assert node.archs == () and node.source == "none"  # no rocminfo on that PATH
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "rocminfo").write_text("")
    (tmp_path / "bin" / "rocminfo").chmod(0o755)
    runner = Rocm({})
    assert detect_node(runner, (), {"PATH": "", "ROCM_PATH": str(tmp_path)}) == Node(("gfx90a",), "rocminfo")
    assert detect_node(runner, ("gfx942",), {"PATH": ""}) == Node(("gfx942",), "--arch")


def test_parse_only() -> None:
    assert parse_only(("deepspeed,apex", "flash-attn")) == ("deepspeed", "apex", "flash-attn")
    with pytest.raises(ConfigError):
        parse_only(("deep speed",))
