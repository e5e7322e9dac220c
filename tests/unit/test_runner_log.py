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
