"""Issue 21: a long build shows where it is while it runs: ninja's units done of the total, the unit, the time so
far and an ETA (estimated from source sizes on a first build, from the units' measured times after one); as plain
lines when porter's output is a file (a CI log, a Slurm job's output), on the spinner's line on a terminal. The two
builds are the default (--debug-info lines) and --debug-info full: the same machine code, the default's module the
smaller.

The builds are of DeepSpeed's cpu_lion with small sources (``small_ops_sdist``) and a compiler that waits before
each compile (``slow_cpu_profile``): a unit long enough to be seen, at no CPU cost. What is tested is porter's
progress, not DeepSpeed's sources."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import slow_cpu_profile

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _argv(sdist: Path, profile: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "porter", "ops", "build", "--source", str(sdist), "-t", str(profile), "--ops",
            "cpu_lion", "--no-cache", "-j", "1", "-o", str(out)]


def _slow(where: Path, seconds: int) -> Path:
    """A profile whose every compile first waits ``seconds``."""
    profile, marks = slow_cpu_profile(where)
    (marks / "compile").write_text(str(seconds))
    return profile


def _module(wheel: Path, where: Path) -> tuple[bytes, int]:
    """The machine code (.text) of the wheel's cpu_lion module, and the module's size."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if "cpu_lion_op" in n and n.endswith(".so"))
        so = where / "module.so"
        so.write_bytes(z.read(name))
    out = where / "text.bin"
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.text", str(so), str(out)], check=True)
    return out.read_bytes(), so.stat().st_size


def _on_terminal(argv: list[str], env: dict[str, str], *, columns: int) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal ``columns`` wide: its exit code and the screen's text (escapes removed)."""
    import fcntl
    import struct
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, close_fds=True,
                            env={**env, "COLUMNS": str(columns)})
    os.close(child)
    screen = b""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            screen += chunk
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(main)
    return proc.returncode, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))


@pytest.fixture(scope="module")
def default_wheel(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The first test's wheel, kept for the second (a passing test's own tmp_path is removed)."""
    folder = tmp_path_factory.mktemp("default-wheel")
    return {"dir": folder, "profile": _slow(folder, 16)}  # a plain line is written at most every 15 s


def test_progress_lines_reach_a_log_file_before_the_build_ends(deepspeed_small_sdist: Path, tmp_path: Path,
                                                              default_wheel: dict[str, Path]) -> None:
    log = tmp_path / "build.log"
    env = {**os.environ, "PORTER_CACHE_DIR": str(default_wheel["dir"] / "cache")}  # the next test reuses it
    with log.open("w") as err:
        proc = subprocess.Popen(_argv(deepspeed_small_sdist, default_wheel["profile"], tmp_path / "wh"),
                                stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline and proc.poll() is None and "[1/3]" not in log.read_text():
                time.sleep(0.2)
            running = proc.poll() is None
            seen = log.read_text()
        finally:
            proc.wait(timeout=900)
    assert running, f"the build ended before any progress line reached its log:\n{seen[-2000:]}"
    first = next(ln for ln in seen.splitlines() if ln.startswith("[1/3]"))
    # a first build: no unit has a measured time yet, so the ETA is estimated from the sources' sizes, and says so;
    # the unit just finished was one of them, so the other two are each expected to take as long as it did
    # (a unit's time is '2m14s' past a minute: a loaded machine)
    assert re.fullmatch(r"\[1/3\] COMPILE cpu_lion: \S+\.o \((?:\d+m)?\d+s, ETA ~\S+: 1 of 2 unit\(s\) left at "
                        r"this run's \S+ a unit \(not measured before\)\)", first), first
    assert proc.returncode == 0, log.read_text()[-3000:]
    lines = [ln for ln in log.read_text().splitlines() if re.match(r"\[\d+/3\]", ln)]
    assert lines[-1].startswith("[3/3] LINK cpu_lion") and "ETA" not in lines[-1]  # the last one always comes
    default_wheel["lines"] = default_wheel["dir"] / "default.whl"
    default_wheel["lines"].write_bytes(next((tmp_path / "wh").glob("*.whl")).read_bytes())


def test_progress_on_a_terminal_shows_units_and_an_eta_and_the_last_line_is_intact(
        deepspeed_small_sdist: Path, tmp_path: Path, default_wheel: dict[str, Path]) -> None:
    # the cache of the build before: its units' times are measured now, and the ETA comes from them
    cache = default_wheel["dir"] / "cache" if "lines" in default_wheel else tmp_path / "cache"
    env = {**os.environ, "PORTER_CACHE_DIR": str(cache), "TERM": "xterm"}
    (default_wheel["profile"].parent / "marks" / "compile").write_text("3")  # each status seen for 3 s
    argv = [*_argv(deepspeed_small_sdist, default_wheel["profile"], tmp_path / "wh"), "--debug-info", "full"]
    code, text = _on_terminal(argv, env, columns=200)
    assert code == 0, text[-3000:]
    assert re.search(r"\[[12]/3\] (?:\d+m)?\d+s, ETA ~?\d\S*  COMPILE cpu_lion", text), text[-3000:]
    if "lines" in default_wheel:  # measured: no '~'
        assert re.search(r"\[\d/3\] (?:\d+m)?\d+s, ETA \d", text), text[-3000:]
    lines = [ln.rstrip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    # the results after the live line are whole lines: the wheel's, and the last one
    assert any(re.fullmatch(r"wheel: \S+/deepspeed-0\.19\.8\+cpu\S+\.whl", ln) for ln in lines), lines[-12:]
    assert re.fullmatch(r"  deepspeed_not_implemented +a placeholder in DeepSpeed's catalogue, not an op", lines[-1]), \
        lines[-3:]
    # --debug-info full (DeepSpeed's own -g) against the default (-g1): the same machine code, a larger module
    full = next((tmp_path / "wh").glob("*.whl"))
    if "lines" not in default_wheel:
        pytest.skip("the default build of the test before did not run")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (full_text, full_size), (lines_text, lines_size) = _module(full, tmp_path / "a"), _module(default_wheel["lines"],
                                                                                              tmp_path / "b")
    assert full_text == lines_text and lines_size < full_size / 2, (lines_size, full_size)


def test_on_a_terminal_80_columns_wide_a_first_build_shows_where_it_is_and_an_eta(deepspeed_small_sdist: Path,
                                                                                    tmp_path: Path) -> None:
    """#40: the status line was cut at the right ('[1/8] COMPILE cpu_adag…'): the ETA and time it ends with were
    never seen, and the ETA came only once a unit had finished. Now ``[n/N]``, the time and the ETA come first, the
    unit last, the line cut to the terminal's width; a first build (a fresh cache: no unit measured) has an
    estimate from its sources' sizes from the start."""
    env = {**os.environ, "PORTER_CACHE_DIR": str(tmp_path / "cache"), "TERM": "xterm"}
    code, text = _on_terminal(_argv(deepspeed_small_sdist, _slow(tmp_path, 3), tmp_path / "wh"), env, columns=80)
    assert code == 0, text[-3000:]
    shown = [ln.strip() for ln in re.split(r"[\r\n]", text) if re.search(r"\[\d+/3\] (?:\d+m)?\d+s, ETA ~\d", ln)]
    assert shown, text[-3000:]
    assert any(ln.lstrip("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ ").startswith("[0/3]") for ln in shown), shown  # before any unit finished
    assert all(len(ln) <= 80 for ln in shown), [ln for ln in shown if len(ln) > 80]
