"""The compiler cache's key, set-up and stats (no subprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest

from porter.ccache import CompilerCache, identity, read_stats, setup_cache
from porter.errors import ConfigError
from porter.log import Logger
from porter.toolchain.profile import load_toolchain

HIPCC_72 = "HIP version: 7.2.53211-9999 Debian clang version 22.1.8 (3)"


def test_identity_follows_the_toolchain_not_the_order_of_archs() -> None:
    tc = load_toolchain("debian-rocm7", environ={})
    same = load_toolchain("debian-rocm7", environ={}, overrides={"archs": tuple(reversed(tc.archs))})
    assert identity(tc, HIPCC_72) == identity(same, HIPCC_72)
    fewer = load_toolchain("debian-rocm7", environ={}, overrides={"archs": ("gfx942",)})
    assert identity(tc, HIPCC_72) != identity(fewer, HIPCC_72)  # another arch list
    assert identity(tc, HIPCC_72) != identity(tc, HIPCC_72.replace("22.1.8", "22.1.9"))  # another compiler
    isa = load_toolchain("debian-rocm7", environ={}, overrides={"cpu_isa": "x86-64-v3"})
    assert identity(tc, HIPCC_72) != identity(isa, HIPCC_72)


def test_env_names_paths_as_the_compiler_sees_them(tmp_path: Path) -> None:
    tc = load_toolchain("debian-rocm7", environ={"PORTER_ROCM7_ROOT": str(tmp_path)})
    assert tc.executor.work_root is not None
    cache = CompilerCache("/usr/bin/ccache", tc.executor.work_root / "ccache", "abc", "file:///shared/cc")
    env = cache.env(tc, tc.executor.work_root / "ops" / "x" / "ccache-stats.log")
    w = tc.executor.inside(tc.executor.work_root)  # /var/cache/porter[/caches/<hash of PORTER_CACHE_DIR>]
    assert w.startswith("/var/cache/porter")
    assert env == {"CCACHE_DIR": f"{w}/ccache", "CCACHE_COMPILERCHECK": "string:abc",
                   "CCACHE_STATSLOG": f"{w}/ops/x/ccache-stats.log", "CCACHE_NOHASHDIR": "1",
                   "CCACHE_REMOTE_STORAGE": "file:///shared/cc"}


def test_setup_refuses_bad_input_and_degrades_to_uncached(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tc = load_toolchain("cpu", environ={})
    with pytest.raises(ConfigError, match="not a ccache remote storage URL"):
        setup_cache(tc, work=tmp_path, compiler_version_text="12", remote="/shared/dir")
    with pytest.raises(ConfigError, match="exclude each other"):
        setup_cache(tc, work=tmp_path, compiler_version_text="12", enabled=False, remote="file:///x")
    assert setup_cache(tc, work=tmp_path, compiler_version_text="12", enabled=False) is None
    monkeypatch.setattr("porter.ccache.find_ccache", lambda tc: "/usr/bin/ccache")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    log = Logger(quiet=False)
    assert setup_cache(tc, work=tmp_path, compiler_version_text="12", cache_dir=blocker / "cc", log=log) is None
    assert "building uncached" in capsys.readouterr().err
    ok = setup_cache(tc, work=tmp_path, compiler_version_text="12", log=log)
    assert ok is not None and ok.dir == tmp_path / "ccache" and ok.dir.is_dir()


def test_stats_log_is_read_per_compile(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_text("# a.c\ncache_miss\ndirect_cache_miss\nlocal_storage_write\n"
                   "# b.c\ndirect_cache_hit\nlocal_storage_hit\n# c.c\npreprocessed_cache_hit\n"
                   "# d.c\nremote_storage_hit\n# e.c\nunsupported_compiler_option\n")
    assert read_stats(log) == {"hits": 3, "misses": 1, "uncacheable": 1}
    assert read_stats(tmp_path / "none.log") == {"hits": 0, "misses": 0, "uncacheable": 0}


def test_no_ccache_is_a_note_not_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The README's first command builds with whatever is there: a machine without ccache builds uncached, and
    says so once without a WARNING (issue 21); --no-cache says nothing."""
    from porter.log import Logger

    monkeypatch.setattr("porter.ccache.find_ccache", lambda tc: None)
    tc = load_toolchain("cpu", environ={})
    assert setup_cache(tc, work=tmp_path, compiler_version_text="12", log=Logger(quiet=False)) is None
    err = capsys.readouterr().err
    assert "compiles are not cached" in err and "WARNING" not in err
    assert setup_cache(tc, work=tmp_path, compiler_version_text="12", enabled=False, log=Logger(quiet=False)) is None
    assert capsys.readouterr().err == ""
