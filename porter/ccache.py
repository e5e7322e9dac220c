"""The compiler cache: ccache in front of every compile porter plans, keyed to the toolchain.

ccache runs where the compiler runs (on the host, or inside the chroot / container: the command is
``chroot ROOT ccache hipcc ...``), so the compiler it sees and hashes is the real one. Its default
compiler check looks only at the *wrapper's* mtime (hipcc is a script calling clang by absolute path),
so porter sets ``compiler_check=string:<identity>``: a hash of the profile (compiler, archs in
canonical order, flags, defines, ISA, where it runs) and of the compiler's own ``--version`` text
(HIP and clang versions). Another arch list or another compiler version is another identity, so two
profiles never share a stale object. The cache folder is porter's (``<work>/ccache``) unless given;
``remote`` is ccache's remote storage (``file:///shared/dir``, ``redis://host``) for many nodes and CI.
Per-build hits and misses come from ccache's stats log, one file per build.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from porter.errors import ConfigError
from porter.log import Logger
from porter.toolchain.profile import Toolchain

REMOTE_SCHEMES = ("file://", "redis://", "redis+unix://", "http://", "https://")


@dataclass(frozen=True)
class CacheRequest:
    """What the user asked for (``--no-cache``, ``--cache-dir``, ``--cache-remote``)."""

    enabled: bool = True
    dir: Path | None = None
    remote: str = ""


@dataclass(frozen=True)
class CompilerCache:
    program: str
    """ccache as the executor sees it."""
    dir: Path
    """Host path of the cache folder."""
    identity: str
    remote: str = ""

    def prefix(self) -> tuple[str, ...]:
        return (self.program,)

    def env(self, tc: Toolchain, stats_log: Path, base: Path | None = None) -> dict[str, str]:
        """What ccache reads, with paths as the launched programs see them. ``base``: ccache's base_dir
        (paths under it enter the key relative to the compiler's working folder)."""
        ex = tc.executor
        return {"CCACHE_DIR": ex.inside(self.dir), "CCACHE_COMPILERCHECK": f"string:{self.identity}",
                "CCACHE_STATSLOG": ex.inside(stats_log), "CCACHE_NOHASHDIR": "1",
                **({"CCACHE_BASEDIR": ex.inside(base)} if base is not None else {}),
                **({"CCACHE_REMOTE_STORAGE": self.remote} if self.remote else {})}

    def to_dict(self) -> dict[str, str]:
        return {"dir": str(self.dir), "identity": self.identity, "remote": self.remote}


def identity(tc: Toolchain, compiler_version_text: str) -> str:
    """The toolchain identity the cache is keyed to (16 hex digits)."""
    doc = {"kind": tc.kind, "compiler": tc.compiler, "cxx": tc.cxx, "hip_cxx": tc.hip_cxx, "root": tc.root,
           "archs": sorted(tc.archs), "cpu_isa": tc.cpu_isa, "cflags": list(tc.cflags),
           "defines": sorted(tc.defines), "env": dict(sorted(tc.env.items())), "launcher": list(tc.launcher),
           "compiler_version": " ".join(compiler_version_text.split())}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def find_ccache(tc: Toolchain) -> str | None:
    """ccache where the toolchain's programs run, or None."""
    ex = tc.executor
    if ex.kind == "chroot" and ex.root is not None:
        return next((f"/usr/{d}/ccache" for d in ("bin", "local/bin") if (ex.root / "usr" / d / "ccache").is_file()),
                    None)
    if ex.kind == "host":
        return shutil.which("ccache")
    return "ccache"  # a container or wrapper: ccache is expected on its PATH


def planned_cache(tc: Toolchain, *, work: Path, compiler_version_text: str, enabled: bool = True,
                  cache_dir: Path | None = None, remote: str = "", log: Logger | None = None,
                  make: bool = False) -> CompilerCache | None:
    """The cache a build would use, named without writing anything (a dry run's); None: disabled or no ccache.
    ``make`` (:func:`setup_cache`, a real build's): its folder is made, and None where it is unusable (the build then
    goes on uncached, with a warning that says why)."""
    if remote and not remote.startswith(REMOTE_SCHEMES):
        raise ConfigError(f"--cache-remote {remote!r} is not a ccache remote storage URL",
                          hint="use file:///shared/dir or redis://host[:port]")
    if remote and not enabled:
        raise ConfigError("--cache-remote and --no-cache exclude each other", hint="drop one of them")
    if not enabled:
        return None
    program = find_ccache(tc)
    if program is None:
        if log is not None:
            # not a fault: the build is the same, only not cached (a newcomer's first run stays free of warnings)
            log.info("note: no ccache where the compiler runs, so compiles are not cached (apt-get install ccache "
                     "caches them; --no-cache says so and drops this note)")
        return None
    folder = cache_dir or tc.executor.work_dir(work, make=make) / "ccache"
    if not tc.executor.sees(folder):
        raise ConfigError(f"cache folder {folder} is not visible in {tc.executor.describe()}",
                          hint="leave --cache-dir out (porter puts it under the root), or pick a folder inside it")
    if make:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as exc:
            if log is not None:
                log.warn(f"compiler cache {folder} is not usable ({exc.strerror}): building uncached")
            return None
    return CompilerCache(program, folder, identity(tc, compiler_version_text), remote)


setup_cache = functools.partial(planned_cache, make=True)


_HIT = frozenset({"direct_cache_hit", "preprocessed_cache_hit", "remote_storage_hit"})


def _records(stats_log: Path) -> list[tuple[str, set[str]]]:
    """ccache's stats log, one record per compile: the source as the compile named it, and its counters."""
    if not stats_log.is_file():
        return []
    records = [rec.removeprefix("# ").splitlines() for rec in stats_log.read_text(errors="replace").split("\n# ")]
    return [(lines[0].strip(), set(lines[1:])) for lines in records if len(lines) > 1]


def hit_sources(stats_log: Path, cwd: str) -> set[str]:
    """The sources that ccache answered from its cache in this build (their compile times are a copy's, not a
    compile's), as absolute paths where the compiler runs: ccache names a source under its base_dir relative to
    the compile's working folder ``cwd`` (as the compiler sees it)."""
    return {os.path.normpath(os.path.join(cwd, source)) for source, ids in _records(stats_log) if ids & _HIT}


def read_stats(stats_log: Path) -> dict[str, int]:
    """Hits and misses of one build, from ccache's stats log (one record per compile)."""
    records = [ids for _, ids in _records(stats_log)]
    hits = sum(1 for ids in records if ids & _HIT)
    misses = sum(1 for ids in records if not ids & _HIT and "cache_miss" in ids)
    return {"hits": hits, "misses": misses, "uncacheable": len(records) - hits - misses}
