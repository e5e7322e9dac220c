"""The ETA of a build's progress: from each unit's measured time when an earlier build left one, estimated from its
source's size (and said so) when not, at this run's pace when ninja's unit is not one the plan names."""

from __future__ import annotations

from pathlib import Path

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
    expected, guessed = expected_times(plan, steps, times)
    assert expected == {"COMPILE a: a.o": 12.5, "COMPILE b: b.o": 8 * GUESS_SECONDS_PER_KIB}
    assert guessed == ["COMPILE b: b.o"]
    times.write_text("{garbled")
    assert expected_times(plan, steps, times)[1] == ["COMPILE a: a.o", "COMPILE b: b.o"]


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
