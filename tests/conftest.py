"""Shared test set-up.

Tiers: tests/unit (fast, no subprocess: an autouse fixture makes any subprocess fail) and
tests/integration (real compilers, real sdists). A resource an integration test needs (hipcc, the
trixie chroot, the CUDA venv, network to PyPI) is skipped when absent, unless PORTER_REQUIRE_ALL=1
(as in CI), where its absence is a failure.
"""

from __future__ import annotations

import fcntl
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the integration tier, and orders the files: the integration files holding a test marked slow (over a
    minute) first, then the other integration files, then the unit tier's (seconds in all); each file's tests stay
    together, in their order. ``make test`` hands its pytest-xdist workers whole files in this order (--dist
    loadfile): a file's module fixtures are made once, its tests that hand results on run on one worker, and what
    starts last is short (the run ends when the later worker does)."""
    slow: set[Path] = set()
    for item in items:
        if "tests/integration" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.integration)
            if item.get_closest_marker("slow"):
                slow.add(item.path)

    def order(item: pytest.Item) -> int:
        if "tests/integration" not in str(item.path).replace(os.sep, "/"):
            return 2
        return 0 if item.path in slow else 1

    items.sort(key=order)  # stable


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """When every test passed, pytest removes the session's temp folder (tmp_path_retention_policy = "failed"):
    gigabytes of venvs and build folders, minutes of unlinking on a file system mounted with ``discard``. Move it
    aside as pytest's own ``garbage-*`` (which pytest's next session removes if this one could not) and remove it
    in a process of its own, so the run ends when its tests do."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)
    if exitstatus != 0 or basetemp is None or session.config.option.basetemp \
            or session.config.getini("tmp_path_retention_policy") != "failed" or not basetemp.is_dir():
        return
    import uuid

    aside = basetemp.parent / f"garbage-{uuid.uuid4()}"  # (pytest-xdist gives its workers --basetemp)
    try:
        basetemp.rename(aside)
    except OSError:
        return  # pytest removes it as usual
    subprocess.Popen(["rm", "-rf", "--one-file-system", str(aside)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.fixture(scope="session", autouse=True)
def _session_porter_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Set before any other session fixture (autouse comes first in its scope), so the session's builds
    (cpu_ops_wheelhouse, ...) and the tests that read them share this cache."""
    path = tmp_path_factory.mktemp("porter-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PORTER_CACHE_DIR", str(path))
        yield path


@pytest.fixture(autouse=True)
def _hermetic_porter_env(monkeypatch: pytest.MonkeyPatch, _session_porter_cache: Path) -> None:
    """No PORTER_* setting of the caller's shell (PORTER_ARCHS, PORTER_TOOLCHAIN, ...) reaches a test;
    the test-suite's own knobs (which chroot, which CUDA python, require-all) stay. porter's cache is the
    session's own: another porter run on this machine (another checkout's tests, a user's build) never
    rewrites a build folder a test reads, and nothing of an earlier session helps a test."""
    keep = {"PORTER_REQUIRE_ALL", "PORTER_TRIXIE_ROOT", "PORTER_ROCM7_ROOT", "PORTER_CUDA_PYTHON",
            "PORTER_TEST_CACHE"}
    for name in list(os.environ):
        if name.startswith("PORTER_") and name not in keep:
            monkeypatch.delenv(name)
    monkeypatch.setenv("PORTER_CACHE_DIR", str(_session_porter_cache))


_CALL_PASSED = pytest.StashKey[bool]()
_CPU = pytest.StashKey[dict[str, float]]()
_CPU_ROWS: list[tuple[float, str, str]] = []
_SESSION_START = [time.monotonic()]


def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSION_START[0] = time.monotonic()


def _cpu_seconds() -> float:
    """CPU time of this process and of every program it (or they) waited for: a compile inside a chroot
    counts, a Slurm job (the cluster's daemons start it) does not."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(phase: str) -> Callable[[pytest.Item], Iterator[None]]:
    def hook(item: pytest.Item) -> Iterator[None]:
        start = _cpu_seconds()
        try:
            yield
        finally:
            item.stash.setdefault(_CPU, {})[phase] = _cpu_seconds() - start
    hook.__name__ = f"pytest_runtest_{phase}"
    return pytest.hookimpl(wrapper=True, tryfirst=True)(hook)


pytest_runtest_setup, pytest_runtest_call, pytest_runtest_teardown = map(_timed, ("setup", "call", "teardown"))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_CALL_PASSED] = report.passed
    if report.when in item.stash.get(_CPU, {}):
        report.user_properties.append(("cpu_seconds", item.stash[_CPU][report.when]))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """(On pytest-xdist's controller too: a worker's report carries its user_properties.)"""
    cpu = dict(report.user_properties).get("cpu_seconds")
    if isinstance(cpu, float) and cpu >= 0.5:
        _CPU_ROWS.append((cpu, report.when, report.nodeid))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """With --durations: the phases that used the most CPU, beside the wall-clock durations. On a machine whose
    cores every worker keeps busy, CPU seconds are what a test costs the whole run; a test waiting on Slurm, pip's
    downloads or a sleep has a long duration and costs little."""
    if not config.option.durations or not _CPU_ROWS:
        return
    terminalreporter.write_sep("=", f"most CPU, {config.option.durations} phases")
    for cpu, when, nodeid in sorted(_CPU_ROWS, reverse=True)[:config.option.durations]:
        terminalreporter.write_line(f"{cpu:7.1f}s cpu {when:<8} {nodeid}")
    wall = time.monotonic() - _SESSION_START[0]
    used = sum(r[0] for r in _CPU_ROWS)
    cores = os.cpu_count() or 1
    terminalreporter.write_line(f"{used:7.0f}s cpu in all (phases of 0.5 s or more): {used / (wall * cores):.0%} of "
                                f"{cores} cores over {wall:.0f}s")


@pytest.fixture(autouse=True)
def _build_folders_go_with_a_passed_test(request: pytest.FixtureRequest, _session_porter_cache: Path) -> Iterator[None]:
    """The build folders a passed integration test made in the session's cache go when it ends, as its tmp_path
    does (tmp_path_retention_policy): each is keyed to what the test built (often a tree in its own temp folder,
    which no other test builds again), and one of the emulated target's holds two precompiled headers of about
    750 MB. A later test that builds the same again finds its objects in the compiler cache, which stays."""
    if "tests/integration" not in str(request.node.path).replace(os.sep, "/"):
        yield
        return
    wheels = _session_porter_cache / "wheels"
    before = set(os.listdir(wheels)) if wheels.is_dir() else set()
    yield
    if not request.node.stash.get(_CALL_PASSED, False) or not wheels.is_dir():
        return
    for name in set(os.listdir(wheels)) - before:
        path = wheels / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _no_subprocess_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if "tests/unit" not in str(request.node.path).replace(os.sep, "/"):
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unit tests must not start subprocesses; use a fake runner or move the test "
                             "to tests/integration")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)


def require(what: str, present: bool, how: str) -> None:
    """Skip (or, with PORTER_REQUIRE_ALL=1, fail) when a resource is missing."""
    if present:
        return
    msg = f"{what} not available: {how}"
    if os.environ.get("PORTER_REQUIRE_ALL") == "1":
        pytest.fail(msg + " (PORTER_REQUIRE_ALL=1)")
    pytest.skip(msg)


def trixie_root() -> Path:
    return Path(os.environ.get("PORTER_TRIXIE_ROOT") or "/var/lib/porter/trixie-rocm")


@pytest.fixture
def hipcc() -> str:
    path = shutil.which("hipcc")
    require("Debian hipcc", path is not None, "apt-get install hipcc libamdhip64-dev rocm-device-libs")
    return path  # type: ignore[return-value]


@pytest.fixture
def trixie() -> Path:
    root = trixie_root()
    require("trixie ROCm chroot", (root / "usr/bin/hipcc").exists(), "run 'make chroot-trixie'")
    return root


def rocm7_root() -> Path:
    return Path(os.environ.get("PORTER_ROCM7_ROOT") or "/var/lib/porter/sid-rocm7")


@pytest.fixture
def rocm7() -> Path:
    """The sid/experimental ROCm 7.2 chroot (``make chroot-rocm7``), with /proc mounted (hipcc 7 needs it)."""
    root = rocm7_root()
    require("sid ROCm 7 chroot", (root / "usr/bin/hipcc").exists(), "run 'make chroot-rocm7'")
    require(f"/proc inside {root}", (root / "proc/self").exists(),
            "run 'make chroot-rocm7' (it mounts /proc there; hipcc 7 fails without it)")
    return root


@pytest.fixture
def porter_cli() -> list[str]:
    """argv prefix that runs this checkout's CLI in the current interpreter."""
    return [sys.executable, "-m", "porter"]


SDIST_CACHE = Path(os.environ.get("PORTER_TEST_CACHE") or Path.home() / ".cache" / "porter-tests") / "sdists"


def fetch_sdist(name: str, version: str, env: dict[str, str] | None = None) -> Path:
    """Download (once, cached across runs, under a lock that pytest-xdist's workers share) an sdist from PyPI;
    returns the .tar.gz path."""
    dest = SDIST_CACHE / f"{name}-{version}"
    dest.mkdir(parents=True, exist_ok=True)
    with (SDIST_CACHE / f"{name}-{version}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (found := sorted(dest.glob("*.tar.gz"))):
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                   "--no-build-isolation", "-d", str(dest), f"{name}=={version}"],
                                  env={**os.environ, **(env or {})}, capture_output=True, text=True)
            found = sorted(dest.glob("*.tar.gz"))
            require(f"sdist {name}=={version}", proc.returncode == 0 and bool(found),
                    f"pip download failed: {proc.stderr[-500:]}")
    return found[0]


@pytest.fixture(scope="session")
def deepspeed_sdist() -> Path:
    return fetch_sdist("deepspeed", "0.19.8")


@pytest.fixture(scope="session")
def flash_attn_sdist() -> Path:
    return fetch_sdist("flash-attn", "2.8.3.post2", env={"FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"})
