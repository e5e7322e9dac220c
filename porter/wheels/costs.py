"""Measured compile costs: what ``--compile-only`` saw per translation unit, read back by later plans.

A compile-only run records, for every TU it compiled, its wall time and the peak resident memory of
the compiler (``ops_prebuild.measure``). Those numbers are merged into one file per project, upstream
version and compiler line (``<cache>/costs/<project>-<version>-<kind><toolkit_version>.json``), unit by
unit, so that a second run over other instances adds to what the first measured. A later plan of the
same project reads it (another version or ROCm line of the same project when that is all there is, said
so) and sizes MAX_JOBS from the largest peak measured instead of a guess
(:meth:`MeasuredCosts.per_job_bytes`); the plan says so, and how many units the number rests on.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from filelock import FileLock

from porter.fs import atomic_write_json, cache_dir
from porter.toolchain.profile import Toolchain

SCHEMA = "porter.compile-costs/1"
MiB = 1 << 20
GiB = 1 << 30
MARGIN = 1.25
"""Headroom over the largest peak measured: another selection of units may hold a larger one."""
ROUND = 256 * MiB


def budget(peak_bytes: int) -> int:
    """Memory to budget for one job whose peak was measured: :data:`MARGIN` headroom, rounded up."""
    return max(ROUND, -(-int(peak_bytes * MARGIN) // ROUND) * ROUND)


class UnitCost(TypedDict):
    seconds: float
    peak_rss_kib: int
    archs: list[str]
    toolchain: str
    measured_at: str


def costs_path(project: str, version: str, tc: Toolchain, root: Path | None = None) -> Path:
    """Where the measured costs of one upstream version with this compiler line (:attr:`Toolchain.compiler_line`)
    live (``root``: porter's cache)."""
    return (root if root is not None else cache_dir()) / "costs" / f"{project}-{version}-{tc.compiler_line}.json"


@dataclass(frozen=True)
class MeasuredCosts:
    """What the costs file says, summarised for planning."""

    project: str
    version: str
    """Upstream version the units belong to."""
    line: str
    """Compiler line the units were measured with (``rocm7.2``)."""
    units: int
    """Translation units measured."""
    peak_rss_bytes: int
    """Largest peak resident memory of one compile job."""
    median_seconds: float
    max_seconds: float
    path: str = ""
    exact: bool = True
    """False when the costs come from another upstream version or ROCm line than the plan's."""
    unit_peaks: Mapping[str, int] = field(default_factory=dict)
    """Peak resident bytes per unit measured."""

    def per_job_bytes(self) -> int:
        """Memory to budget per compile job: the largest peak measured plus :data:`MARGIN`, rounded up."""
        return budget(self.peak_rss_bytes)

    def for_families(self, families: Sequence[str], family_of: Callable[[str], str],
                     guess: int) -> tuple[int, str, str]:
        """Per-job memory for a build made of these unit families (FA: ``fmha_fwd``, ``fmha_bwd``, ...):
        the largest measured peak of a family the build has, plus headroom; a family nothing was measured
        of keeps ``guess``. Returns (bytes, ``measured`` | ``partly measured`` | ``guess``, a plan note)."""
        peaks: dict[str, int] = {}
        for unit, b in self.unit_peaks.items():
            fam = family_of(unit)
            peaks[fam] = max(peaks.get(fam, 0), b)
        have = [f for f in families if f in peaks]
        missing = [f for f in families if f not in peaks]
        if not have:
            return guess, "guess", (f"no compile costs measured for {', '.join(families)} yet ({self.path}); "
                                    "a --compile-only run that samples them replaces the guess")
        top = max(have, key=lambda f: peaks[f])
        measured = budget(peaks[top])
        if not missing:
            return measured, "measured", (f"per-job memory from measured compile costs: largest peak "
                                          f"{peaks[top] / MiB:.0f} MiB ({top}) over {len(have)} unit famil"
                                          f"{'y' if len(have) == 1 else 'ies'}, +{round((MARGIN - 1) * 100)}% "
                                          f"headroom ({self.path})")
        return max(measured, guess), "partly measured", (
            f"per-job memory: {', '.join(have)} measured (peak {peaks[top] / MiB:.0f} MiB), "
            f"{', '.join(missing)} not yet, so the guess ({guess / GiB:.0f} GiB) still bounds it; a --compile-only "
            f"run with --sample 1 measures every family ({self.path})")

    def describe(self) -> str:
        src = f"of {self.project} {self.version} measured with {self.line}" + \
            ("" if self.exact else " (not this plan's version or ROCm line: the nearest measured)")
        return (f"peak {self.peak_rss_bytes / MiB:.0f} MiB over {self.units} TU(s) {src}, "
                f"+{round((MARGIN - 1) * 100)}% headroom; median {self.median_seconds:.1f} s, "
                f"max {self.max_seconds:.1f} s per TU ({self.path})")

    def to_dict(self) -> dict[str, Any]:
        return {"project": self.project, "version": self.version, "line": self.line, "units": self.units,
                "peak_rss_mib": round(self.peak_rss_bytes / MiB, 1), "median_seconds": self.median_seconds,
                "max_seconds": self.max_seconds, "per_job_bytes": self.per_job_bytes(), "path": self.path,
                "exact": self.exact}


def _read(path: Path) -> tuple[dict[str, Any], dict[str, UnitCost]]:
    """The file's header (project, version, line) and its units; empty when it is not a costs file."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("units"), dict):
        return {}, {}
    out: dict[str, UnitCost] = {}
    for k, v in doc["units"].items():
        if isinstance(v, dict) and isinstance(v.get("peak_rss_kib"), int) and v["peak_rss_kib"] > 0:
            out[str(k)] = {"seconds": float(v.get("seconds") or 0.0), "peak_rss_kib": int(v["peak_rss_kib"]),
                           "archs": [str(a) for a in v.get("archs") or []], "toolchain": str(v.get("toolchain", "")),
                           "measured_at": str(v.get("measured_at", ""))}
    return {k: str(doc.get(k, "")) for k in ("project", "version", "line")}, out


def summarise(project: str, version: str, line: str, units: Mapping[str, UnitCost], path: str = "",
              exact: bool = True) -> MeasuredCosts | None:
    if not units:
        return None
    secs = [float(u["seconds"]) for u in units.values()]
    return MeasuredCosts(project=project, version=version, line=line, units=len(units),
                         peak_rss_bytes=max(int(u["peak_rss_kib"]) for u in units.values()) * 1024,
                         median_seconds=round(statistics.median(secs), 2), max_seconds=round(max(secs), 2),
                         path=path, exact=exact,
                         unit_peaks={k: int(u["peak_rss_kib"]) * 1024 for k, u in units.items()})


def load(project: str, version: str, tc: Toolchain, root: Path | None = None) -> MeasuredCosts | None:
    """The measured costs of this upstream version with the profile's compiler line; else the nearest
    measured of the same project and compiler kind (same ROCm line before same version, then the newest
    file), marked not exact; else None (the plan keeps its guess)."""
    exact = costs_path(project, version, tc, root)
    _head, units = _read(exact)
    if units:
        return summarise(project, version, tc.compiler_line, units, str(exact))
    found = []
    for p in exact.parent.glob(f"{project}-*.json"):  # (none when the folder is missing)
        head, got = _read(p)
        if got and head["project"] == project and head["line"].startswith(tc.kind):
            found.append((head["line"] == tc.compiler_line, head["version"] == version, p.stat().st_mtime, p, head,
                          got))
    if not found:
        return None
    _, _, _, p, head, got = max(found, key=lambda f: f[:3])
    return summarise(project, head["version"], head["line"], got, str(p), exact=False)


def record(project: str, version: str, tc: Toolchain, measured: Iterable[tuple[str, float, int]],
           root: Path | None = None) -> Path | None:
    """Merge ``(unit, seconds, peak_rss_kib)`` into the costs file (a unit measured again replaces its
    entry); returns the file, or None when nothing was measured. Written atomically under a lock."""
    if not (rows := [(name, s, kib) for name, s, kib in measured if kib > 0]):
        return None
    path = costs_path(project, version, tc, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with FileLock(str(path) + ".lock"):
        _head, units = _read(path)
        for name, seconds, kib in rows:
            units[name] = {"seconds": round(seconds, 3), "peak_rss_kib": kib, "archs": list(tc.arch_names),
                           "toolchain": tc.name, "measured_at": now}
        atomic_write_json(path, {"schema": SCHEMA, "project": project, "version": version, "line": tc.compiler_line,
                                 "units": dict(sorted(units.items()))})
    return path
