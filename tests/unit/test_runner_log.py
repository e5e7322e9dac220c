from __future__ import annotations

import io
import os

from porter.log import Logger
from porter.run import RecordingRunner, env_changes, make_env


def test_make_env_copies_and_never_mutates_os_environ() -> None:
    before = dict(os.environ)
    env = make_env({"PORTER_TEST_X": "1", "HOME": None})
    assert env["PORTER_TEST_X"] == "1" and "HOME" not in env
    assert dict(os.environ) == before


def test_env_changes_lists_only_the_difference() -> None:
    base = {"A": "1", "B": "2"}
    assert env_changes({"A": "1", "C": "3"}, base) == {"C": "3", "B": None}


def test_recording_runner_is_a_dry_run_that_echoes() -> None:
    stream = io.StringIO()
    runner = RecordingRunner(Logger(stream=stream, color=False))
    env = make_env({"PORTER_TEST_ONLY_VAR": "amd"})  # a name no caller's environment has
    res = runner.run(["hipcc", "--offload-arch=gfx90a", "a b.hip"], env=env)
    assert res.ok
    assert runner.recorded == [(["hipcc", "--offload-arch=gfx90a", "a b.hip"], {"PORTER_TEST_ONLY_VAR": "amd"}, None)]
    assert "$ PORTER_TEST_ONLY_VAR=amd hipcc --offload-arch=gfx90a 'a b.hip'" in stream.getvalue()


def test_quiet_logger_still_prints_errors() -> None:
    stream = io.StringIO()
    log = Logger(quiet=True, stream=stream, color=False)
    log.info("hidden")
    log.error("shown")
    assert stream.getvalue() == "ERROR: shown\n"


def test_a_plan_says_a_stop_once_and_keeps_it_when_another_refusal_comes_first() -> None:
    from porter.errors import stop_note
    from porter.run import plan_lines

    stop = "DeepSpeed 0.19.8 for emulate-wave64: 5 warp-size-32 finding(s) refused"
    lines = plan_lines("2 op(s)", ["jobs: 2", stop_note(stop)], {}, [["ninja"]], stop)
    assert sum(stop in ln for ln in lines) == 1 and lines[-1].endswith(stop), lines
    assert "# note: jobs: 2" in lines
    torch = "building DeepSpeed ops for mi300x needs a ROCm torch"
    lines = plan_lines("2 op(s)", [stop_note(stop)], {}, [], torch)
    assert lines[1] == f"# note: {stop_note(stop)}" and lines[-1].endswith(torch), lines
