"""The ETA of a build's progress: from each unit's measured time when an earlier build left one, estimated from its
source's size (and said so) when not, at this run's pace when ninja's unit is not one the plan names."""

from __future__ import annotations

from pathlib import Path

import pytest

from porter.log import Logger, Status


class Lines(Logger):
    def __init__(self) -> None:
        super().__init__(quiet=False)
        self.lines: list[str] = []

    def info(self, msg: str) -> None:
        self.lines.append(msg)


def _status(start: float) -> tuple[Status, Lines]:
    log = Lines()
    st = Status(log, "compiling", start, None)
    st.every = 0.0
    return st, log


def test_the_eta_is_the_measured_time_left_over_the_jobs() -> None:
    import time

    st, log = _status(time.monotonic())
    st.expect({"COMPILE a: a.o": 30.0, "COMPILE b: b.o": 60.0, "COMPILE c: c.o": 90.0, "LINK a: a.so": 4.0}, jobs=2)
    st.ninja_line("[1/4] COMPILE a: a.o")
    assert log.lines[-1].endswith("ETA 1m17s from measured unit times)")  # (60 + 90 + 4) / 2
    st.ninja_line("[3/4] COMPILE c: c.o")
    st.ninja_line("[4/4] LINK a: a.so")
    assert "ETA" not in log.lines[-1]


def test_units_without_a_measured_time_are_estimated_and_said_so() -> None:
    import time

    st, log = _status(time.monotonic())
    st.expect({"COMPILE a: a.o": 30.0, "COMPILE b: b.o": 20.0, "COMPILE c: c.o": 10.0}, jobs=1,
              guessed=["COMPILE c: c.o"])
    st.ninja_line("[1/3] COMPILE a: a.o")
    assert log.lines[-1].endswith("ETA ~30s: 1 of 2 unit(s) left estimated from source size (no measured time yet))")
    st.ninja_line("[2/3] some other line ninja printed")
    assert "at this run's pace" in log.lines[-1]


def test_expected_times_come_from_the_times_file_else_the_source_size(tmp_path: Path) -> None:
    import json

    from ops_prebuild.build import GUESS_SECONDS_PER_KIB, UNIT_TIMES, expected_times
    from ops_prebuild.plan import Plan, Step
    from porter.toolchain.profile import load_toolchain

    tc = load_toolchain("cpu")
    src = tmp_path / "b.cpp"
    src.write_bytes(b"x" * 8192)
    plan = Plan(tmp_path / "build", tc)
    steps = [Step("a", "compile", ("g++",), str(tmp_path / "build/a/a.o"), (str(tmp_path / "a.cpp"),)),
             Step("b", "compile", ("g++",), str(tmp_path / "build/b/b.o"), (str(src),))]
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"schema": UNIT_TIMES, "units": {f"{tc.cpu_isa}|a/a.o": 12.5}}))
    steps.append(Step("b", "link", ("g++",), str(tmp_path / "build/b/b.so"), (str(tmp_path / "build/b/b.o"),)))
    expected, guessed, compiles = expected_times(plan, steps, times)
    assert expected == {"COMPILE a: a.o": 12.5, "COMPILE b: b.o": 8 * GUESS_SECONDS_PER_KIB, "LINK b: b.so": 1.0}
    assert guessed == ["COMPILE b: b.o", "LINK b: b.so"] and compiles == ["COMPILE b: b.o"]
    times.write_text("{garbled")
    assert expected_times(plan, steps, times)[1] == ["COMPILE a: a.o", "COMPILE b: b.o", "LINK b: b.so"]


def test_units_the_compiler_cache_answered_are_not_recorded_as_measured(tmp_path: Path) -> None:
    """A ccache hit takes a copy's time: recorded, it would make the next cold build's ETA far too low."""
    from ops_prebuild.build import _read_times, record_times
    from ops_prebuild.plan import Plan, Step
    from porter.ccache import hit_sources
    from porter.toolchain.profile import load_toolchain

    build = tmp_path / "build"
    stats = tmp_path / "ccache-stats.log"
    # ccache names a source under its base_dir relative to where the compile ran (ninja's folder)
    stats.write_text(f"# ../src/a.cpp\ndirect_cache_hit\nlocal_storage_hit\n# {tmp_path}/src/b.cpp\ncache_miss\n"
                     f"direct_cache_miss\n# {tmp_path}/src/c.cpp\npreprocessed_cache_hit\n")
    hits = hit_sources(stats, str(build))
    assert hits == {str(tmp_path / "src/a.cpp"), str(tmp_path / "src/c.cpp")}
    assert hit_sources(tmp_path / "none.log", str(build)) == set()
    tc = load_toolchain("cpu")
    plan = Plan(build, tc)
    plan.steps = [Step(op, "compile", ("g++", "-c", str(tmp_path / "src" / f"{op}.cpp"), "-o", str(build / f"{op}.o")),
                       str(build / f"{op}.o"), (str(tmp_path / "src" / f"{op}.cpp"),)) for op in ("a", "b", "c")]
    entries = [["0", "40", "1", f"{op}.o", "h"] for op in ("a", "b", "c")]
    times = tmp_path / "times.json"
    record_times(plan, entries, times, hits)
    assert _read_times(times) == {f"{tc.cpu_isa}|b.o": 0.04}  # the miss only
    record_times(plan, entries, times)  # no cache: every unit compiled
    assert set(_read_times(times)) == {f"{tc.cpu_isa}|{op}.o" for op in ("a", "b", "c")}


def _clock_at(monkeypatch: pytest.MonkeyPatch, elapsed: float) -> float:
    """A clock that stands still ``elapsed`` seconds after the step's start, so the ETA is exact under any load."""
    monkeypatch.setattr("porter.log.time.monotonic", lambda: 1000.0 + elapsed)
    return 1000.0


def test_estimated_units_take_this_runs_pace_once_one_has_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen on FlashAttention's CK units (a few KiB of source, megabytes of headers): an ETA of 58 min that stayed
    58 min while every unit took ten minutes. Once an estimated unit finishes, the rest are expected to take as long."""
    guesses = {f"COMPILE u{i}: u{i}.o": 10.0 for i in range(5)}
    st, log = _status(_clock_at(monkeypatch, 200.0))  # two units estimated at 10 s took 200 s on 2 job slots
    st.expect(guesses, jobs=2, guessed=list(guesses))
    st.ninja_line("[1/5] COMPILE u0: u0.o")
    st.ninja_line("[2/5] COMPILE u1: u1.o")
    line = log.lines[-1]
    # 200 s x 2 slots / 2 units = 200 s a unit; 3 left on 2 jobs: 300 s
    assert line.endswith("ETA ~5m00s: 3 of 3 unit(s) left at this run's 3m20s a unit (not measured before))"), line


def test_measured_units_finished_are_not_counted_as_estimated_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    st, log = _status(_clock_at(monkeypatch, 100.0))
    st.expect({"COMPILE m: m.o": 80.0, "COMPILE g: g.o": 10.0, "COMPILE h: h.o": 10.0, "COMPILE k: k.o": 5.0},
              jobs=1, guessed=["COMPILE g: g.o", "COMPILE h: h.o"])
    st.ninja_line("[1/4] COMPILE m: m.o")
    assert "(no measured time yet)" in log.lines[-1]  # no estimated unit has finished: no pace yet
    st.ninja_line("[2/4] COMPILE g: g.o")
    # g took what m's measured 80 s leaves of 100 s: 20 s; h is expected to take as long, k its measured 5 s
    assert "ETA ~25s: 1 of 2 unit(s) left at this run's 20s a unit" in log.lines[-1], log.lines[-1]


def test_a_link_keeps_its_nominal_second_while_the_compiles_take_the_runs_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    st, log = _status(_clock_at(monkeypatch, 30.0))
    units = {"COMPILE a: a.o": 2.0, "COMPILE b: b.o": 2.0, "LINK a: a.so": 1.0}
    st.expect(units, jobs=1, guessed=list(units), paced=["COMPILE a: a.o", "COMPILE b: b.o"])
    st.ninja_line("[1/3] COMPILE a: a.o")
    # a took the 30 s so far; b is expected to take as long, the link its nominal second: 31 s
    assert "ETA ~31s: 1 of 2 unit(s) left at this run's 30s a unit" in log.lines[-1], log.lines[-1]
