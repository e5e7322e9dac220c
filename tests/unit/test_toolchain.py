from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from porter.artifacts import labels
from porter.cli import cli
from porter.errors import ConfigError
from porter.toolchain.archs import parse_target, wavefront_of
from porter.toolchain.profile import Toolchain, load_toolchain, preset_names

PRESETS = {"frontier", "lumi-g", "lumi-g-rocm6", "mi300x", "mi355x", "debian-rocm", "debian-trixie-rocm", "debian-rocm7", "cuda-h100",
           "cpu"}


def test_all_required_presets_ship_and_load() -> None:
    assert PRESETS <= set(preset_names())
    for name in preset_names():
        tc = load_toolchain(name, environ={})
        assert tc.name == name


@pytest.mark.parametrize("name,label,wave", [
    ("debian-rocm", "rocm5.2.gfx90a.gfx908", 64),
    ("debian-trixie-rocm", "rocm5.7.gfx90a.gfx942", 64), ("cuda-h100", "cu130.sm90", 32),
    ("cpu", "cpu.x86.64.v2", None),
])
def test_labels_and_wavefront(name: str, label: str, wave: int | None) -> None:
    tc = load_toolchain(name, environ={})
    assert labels.make(tc) == label
    assert tc.wavefront == wave


def test_frontier_host_isa_is_zen3_never_native() -> None:
    assert load_toolchain("frontier", environ={}).cpu_isa == "znver3"
    assert all(load_toolchain(n, environ={}).cpu_isa != "native" for n in preset_names())


def test_unknown_arch_suggests_close_matches() -> None:
    with pytest.raises(ConfigError, match="gfx90a"):
        parse_target("gfx90")


def test_feature_suffixes() -> None:
    t = parse_target("gfx90a:xnack-:sramecc+")
    assert t.name == "gfx90a" and t.features == ("xnack-", "sramecc+")
    with pytest.raises(ConfigError, match="no xnack"):
        parse_target("gfx1100:xnack+")
    with pytest.raises(ConfigError, match="bad target feature"):
        parse_target("gfx90a:foo+")


def test_cuda_arch_spellings() -> None:
    assert parse_target("9.0").name == "sm_90"
    assert parse_target("sm_90").arch.vendor == "nvidia"


def test_mixing_wave32_and_wave64_explains_why() -> None:
    with pytest.raises(ConfigError, match="wavefront size"):
        wavefront_of((parse_target("gfx90a"), parse_target("gfx1100")))
    with pytest.raises(ConfigError, match="wave64"):
        Toolchain(name="x", kind="rocm", compiler="hipcc", archs=("gfx942", "gfx1030"))


def test_kind_arch_mismatch() -> None:
    with pytest.raises(ConfigError, match="not rocm archs"):
        Toolchain(name="x", kind="rocm", compiler="hipcc", archs=("sm_90",))
    with pytest.raises(ConfigError, match="takes no GPU archs"):
        Toolchain(name="x", kind="cpu", compiler="g++", archs=("gfx90a",))
    with pytest.raises(ConfigError, match="at least one arch"):
        Toolchain(name="x", kind="rocm", compiler="hipcc")


def test_precedence_cli_over_env_over_file_over_preset(tmp_path: Path) -> None:
    f = tmp_path / "site.toml"
    f.write_text('extends = "frontier"\ncpu_isa = "znver4"\narchs = ["gfx90a:xnack-"]\n')
    tc = load_toolchain(f, environ={})
    assert (tc.name, tc.kind, tc.cpu_isa, tc.archs, tc.toolkit_version) == \
        ("site", "rocm", "znver4", ("gfx90a:xnack-",), load_toolchain("frontier", environ={}).toolkit_version)
    tc = load_toolchain(f, environ={"PORTER_CPU_ISA": "x86-64-v3", "PORTER_ARCHS": "gfx942"})
    assert (tc.cpu_isa, tc.archs) == ("x86-64-v3", ("gfx942",))
    tc = load_toolchain(f, environ={"PORTER_CPU_ISA": "x86-64-v3"}, overrides={"cpu_isa": "znver3"})
    assert tc.cpu_isa == "znver3"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text('kind = "cpu"\ncompiler = "g++"\ncpu_iso = "znver3"\n')
    with pytest.raises(ConfigError, match="unknown key 'cpu_iso'.*cpu_isa"):
        load_toolchain(f, environ={})


def test_unknown_preset_suggests() -> None:
    with pytest.raises(ConfigError, match="frontier"):
        load_toolchain("fronteir", environ={})


def test_launcher_expansion_gives_a_chroot_executor(tmp_path: Path) -> None:
    tc = load_toolchain("debian-trixie-rocm", environ={"PORTER_TRIXIE_ROOT": str(tmp_path)})
    assert tc.launcher == ("chroot", str(tmp_path))
    ex = tc.executor
    assert ex.kind == "chroot" and ex.root == tmp_path and ex.setup == "make chroot-trixie"
    assert ex.inside(tmp_path / "tmp" / "x.hip") == "/tmp/x.hip"
    assert ex.argv("hipcc", "--version") == ["chroot", str(tmp_path), "hipcc", "--version"]
    with pytest.raises(ConfigError, match="not inside the chroot"):
        ex.inside("/elsewhere/x")


def test_cli_show_json_and_error_exit_code() -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["toolchain", "show", "frontier", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["wavefront"] == 64 and doc["archs"] == ["gfx90a"]


def test_main_maps_config_error_to_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from porter.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["toolchain", "show", "no-such-preset"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "ERROR: no toolchain preset or file named 'no-such-preset'" in err and "TIP:" in err
    assert "Traceback" not in err


def test_the_readiness_step_raises_in_a_real_run_and_returns_the_refusal_in_a_dry_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """toolchain.check.ready, every build's one readiness step: a chroot that does not exist stops a real run (exit 2
    with the command that makes it) and is what a dry run says a real run would refuse; a root that is there passes
    a dry run without asking the compiler."""
    from porter.errors import ToolError
    from porter.log import quiet_logger
    from porter.run import RecordingRunner, Runner
    import porter.toolchain.check
    from porter.toolchain.check import ready

    log = quiet_logger()
    tc = load_toolchain("debian-trixie-rocm", environ={"PORTER_TRIXIE_ROOT": str(tmp_path / "missing")})
    with pytest.raises(ToolError, match="does not exist") as exc:
        ready(tc, Runner(log), log)
    assert exc.value.hint and "make chroot-trixie" in exc.value.hint
    version, refused = ready(tc, RecordingRunner(log), log)
    assert version == "" and isinstance(refused, ToolError) and "does not exist" in refused.message
    (tmp_path / "there" / "proc" / "self").mkdir(parents=True)
    tc = load_toolchain("debian-trixie-rocm", environ={"PORTER_TRIXIE_ROOT": str(tmp_path / "there")})
    asked = []
    monkeypatch.setattr(porter.toolchain.check, "checked_compiler", lambda tc, log: asked.append(tc.name) or "22.0")
    assert ready(tc, RecordingRunner(log), log) == ("", None) and asked == []  # a dry run asks no compiler
    assert ready(tc, Runner(log), log, compiler=False) == ("", None) and asked == []
    assert ready(tc, Runner(log), log) == ("22.0", None) and asked == [tc.name]
