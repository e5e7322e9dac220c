"""A model (not a measurement) of a big compile's wall time on 1..N nodes, from the ``.ninja_log`` of a sample.

The sample is a few TUs of the build (``porter wheel flash-attn --compile-only --units ...``); ninja's log
holds each TU's wall time. The model:

1. **Per-TU time.** Each TU of the sample is one measurement ``t`` for its family (the kind of unit,
   :func:`porter.components.flash_attn.ck_family` of its folder) with ``A`` archs. A TU's cost grows with
   its archs as ``t(A) = t1 * (1 + beta * (A - 1))``: ``beta`` is fitted from units measured with two arch
   counts (the median over such pairs), else taken as given (CK instances: about 1.0, each arch a whole
   compile; docs/wheels.md). A family's single-arch cost ``t1`` is the mean over its sample TUs. A family
   with no TU in the sample gets an assumed cost, said so in the output with its share of the work.
2. **Full build.** Every TU of the full build (counts per family, from the plan) costs its family's
   ``t1 * (1 + beta * (A_target - 1))``, scaled by ``speed`` (a node core's time for a sample second).
3. **Schedule.** Each node runs ``jobs = min(cores, floor(node memory / memory per job))`` compiles at once;
   the TUs are dealt longest first to the least loaded of ``nodes * jobs`` slots (LPT). Each node's shard
   starts ``start latency`` late (job start, reading the tree, generating sources); after the last compile,
   one serial link job starts (the same latency) and links for ``link`` seconds.

Nothing here queues behind other users' jobs, shares a filesystem, or hits a compiler cache: the
prediction is a lower bound for a busy cluster and an estimate for an idle one.
"""

from __future__ import annotations

import heapq
import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from porter.components.flash_attn import ck_family
from porter.errors import ConfigError
from porter.toolchain.archs import HOST_ONLY

# TUs per family of flash-attn 2.8.3.post2's CK build (its generator's 2,771 instances + 4 API dispatchers,
# and the extension's 7 own sources in flash_attn_2_cuda), as `porter wheel flash-attn --compile-only
# --dry-run --json` plans them. The count does not depend on the arch list: a TU is one unit whatever its archs
# (one hipcc call, or under --compile-only its host part and one part per arch).
FA_2_8_3_COUNTS: dict[str, int] = {
    "fmha_bwd": 1280, "fmha_fwd": 576, "fmha_fwd_splitkv": 576, "fmha_fwd_splitkv_combine": 99,
    "fmha_bwd_convert_dq": 96, "fmha_fwd_appendkv": 96, "fmha_bwd_dot_do_o": 48, "flash_attn_2_cuda": 11,
}
BETA_MAX = 2.0
"""A fitted arch scaling above this (or below 0) says the logs do not compare: the default is used."""
_ARCH = re.compile(r"--offload-arch=([A-Za-z0-9_:+-]+)")


@dataclass(frozen=True)
class Sample:
    """One TU as a ninja log saw it."""

    name: str
    """The object's file name (the same unit in two logs has the same name)."""
    family: str
    archs: int
    seconds: float


def read_ninja_log(path: str | Path) -> dict[str, float]:
    """``output -> wall seconds`` from a ``.ninja_log`` (v5 and later: ``start end mtime output hash``, in
    milliseconds). An output logged twice keeps its last entry, as ninja itself reads the file."""
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the ninja log {p}: {exc.strerror}",
                          hint="pass the .ninja_log of a build folder (porter keeps it beside build.ninja)") from None
    if not lines or not lines[0].startswith("# ninja log v"):
        raise ConfigError(f"{p} is not a ninja log (no '# ninja log vN' header)")
    out: dict[str, float] = {}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) < 4:
            raise ConfigError(f"{p}:{n}: not a ninja log entry: {line[:80]!r}")
        try:
            start, end = int(parts[0]), int(parts[1])
        except ValueError:
            raise ConfigError(f"{p}:{n}: start and end must be milliseconds: {line[:80]!r}") from None
        out[parts[3]] = (end - start) / 1000.0
    return out


def archs_in_build_ninja(path: str | Path) -> dict[str, int]:
    """``output -> number of archs`` from a build.ninja porter wrote (its ``--offload-arch=`` flags)."""
    archs: dict[str, int] = {}
    current: str | None = None
    for line in Path(path).read_text().splitlines():
        if line.startswith("build "):
            current = line[len("build "):].split(": ", 1)[0].replace("$ ", " ").replace("$:", ":")
            archs[current] = 0
        elif current is not None and line.startswith("  "):
            found = set(_ARCH.findall(line))
            if found and HOST_ONLY not in line:  # a unit's host part compiles no device code
                archs[current] = len(found)
        else:
            current = None
    return {k: v for k, v in archs.items() if v}


def family_of(output: str) -> str:
    """The family of a TU from its object's path: porter puts each op's objects in a folder named after
    the op (a CK instance, or flash_attn_2_cuda for the extension's own sources)."""
    return ck_family(Path(output).parent.name)


def load_samples(spec: str) -> list[Sample]:
    """The TUs of one log: ``LOG`` (archs read from the build.ninja beside it) or ``LOG@gfx90a,gfx942``
    (these archs for every TU of the log)."""
    path, _, arch_list = spec.partition("@")
    log = read_ninja_log(path)
    if arch_list:
        n = len({a for a in arch_list.split(",") if a})
        known = {out: n for out in log}
    else:
        ninja_file = Path(path).parent / "build.ninja"
        if not ninja_file.is_file():
            raise ConfigError(f"{path}: no build.ninja beside it to read each TU's archs from",
                              hint=f"name them: {path}@gfx90a (or @gfx942,gfx950)")
        known = archs_in_build_ninja(ninja_file)
    samples = [Sample(Path(out).name, family_of(out), known[out], secs) for out, secs in sorted(log.items())
               if out in known and out.endswith(".o")]
    if not samples:
        raise ConfigError(f"{path}: no compile of an object file with a known arch list",
                          hint="the log of a --compile-only run, with its build.ninja beside it or LOG@ARCHS")
    return samples


def arch_scaling(samples: Sequence[Sample]) -> float | None:
    """``beta`` from units measured with two different arch counts: for a pair ``t_b / t_a = r`` with
    ``A_a < A_b``, ``beta = (r - 1) / ((A_b - 1) - r (A_a - 1))``; the median over pairs. None: no pair."""
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    estimates: list[float] = []
    for group in by_name.values():
        for a in group:
            for b in group:
                if a.archs < b.archs and a.seconds > 0:
                    r = b.seconds / a.seconds
                    denom = (b.archs - 1) - r * (a.archs - 1)
                    if denom > 0:
                        estimates.append((r - 1) / denom)
    return statistics.median(estimates) if estimates else None


@dataclass(frozen=True)
class FamilyCost:
    family: str
    seconds_one_arch: float
    """t1: one TU of the family, one arch (sample seconds)."""
    samples: int
    """Sample TUs behind it; 0: assumed."""


@dataclass(frozen=True)
class Fit:
    beta: float
    beta_source: str
    """'fitted from N pair(s)' or 'assumed'."""
    families: dict[str, FamilyCost]

    def tu_seconds(self, family: str, archs: int) -> float:
        return self.families[family].seconds_one_arch * (1 + self.beta * (archs - 1))


def fit(samples: Sequence[Sample], *, beta: float | None = None, default_beta: float = 1.0) -> Fit:
    """Per-family single-arch cost and the arch scaling (``beta`` given wins over the fit, the fit over
    ``default_beta``)."""
    fitted = arch_scaling(samples)
    pairs = sum(1 for _ in _pairs(samples))
    if beta is not None:
        b, source = beta, "given"
    elif fitted is not None and 0.0 <= fitted <= BETA_MAX:
        b, source = fitted, f"fitted from {pairs} unit(s) measured with two arch counts"
    elif fitted is not None:
        b, source = default_beta, (f"assumed: the fit over {pairs} unit(s) gave {fitted:.2f}, outside 0..{BETA_MAX:g} "
                                   "(logs measured under different machine loads do not compare)")
    else:
        b, source = default_beta, "assumed (the sample has one arch count per unit)"
    per: dict[str, list[float]] = {}
    for s in samples:
        per.setdefault(s.family, []).append(s.seconds / (1 + b * (s.archs - 1)))
    return Fit(b, source, {f: FamilyCost(f, statistics.fmean(v), len(v)) for f, v in sorted(per.items())})


def _pairs(samples: Sequence[Sample]) -> Iterable[tuple[Sample, Sample]]:
    for a in samples:
        for b in samples:
            if a.name == b.name and a.archs < b.archs:
                yield a, b


def with_assumed(f: Fit, counts: Mapping[str, int], assumed: Mapping[str, float],
                 default: float | None = None) -> Fit:
    """The fit completed for every family the build has: ``assumed`` (single-arch seconds) first, else
    ``default`` (None: the largest measured family's cost) for families the sample lacks."""
    fams = dict(f.families)
    fallback = default if default is not None else max(c.seconds_one_arch for c in f.families.values())
    for fam in counts:
        if fam in assumed:
            fams[fam] = FamilyCost(fam, assumed[fam], 0)
        elif fam not in fams:
            fams[fam] = FamilyCost(fam, fallback, 0)
    return Fit(f.beta, f.beta_source, fams)


@dataclass(frozen=True, kw_only=True)
class Nodes:
    """What one node offers the build, and the fixed costs around the compiles."""

    cores: int = 64
    mem_gib: float = 256.0
    mem_per_job_gib: float = 2.8
    """Peak memory of one compile job (FlashAttention's CK build: about 2.8 GB)."""
    start_latency_s: float = 60.0
    """From a job's start to its first compile (job start, reading the tree, generating sources)."""
    link_s: float = 300.0
    """The serial link and packaging after the last compile."""
    speed: float = 1.0
    """A node core's seconds per sample second (0.5: twice as fast as the machine the sample ran on)."""

    def __post_init__(self) -> None:
        if self.cores < 1 or self.mem_gib <= 0 or self.mem_per_job_gib <= 0 or self.speed <= 0:
            raise ConfigError("cores, memory, memory per job and speed must be positive")
        if self.start_latency_s < 0 or self.link_s < 0:
            raise ConfigError("start latency and link time cannot be negative")

    @property
    def jobs(self) -> int:
        """Compile jobs at once on one node: its cores, unless memory allows fewer."""
        by_mem = math.floor(self.mem_gib / self.mem_per_job_gib)
        if by_mem < 1:
            raise ConfigError(f"a node with {self.mem_gib} GiB cannot hold one {self.mem_per_job_gib} GiB compile")
        return min(self.cores, by_mem)


def lpt(times: Sequence[float], slots: int) -> list[float]:
    """Longest processing time first: each time (longest first) goes to the least loaded slot; the loads."""
    loads = [0.0] * slots
    heap = [(0.0, i) for i in range(slots)]
    for t in sorted(times, reverse=True):
        load, i = heapq.heappop(heap)
        loads[i] = load + t
        heapq.heappush(heap, (loads[i], i))
    return loads


@dataclass(frozen=True)
class Prediction:
    nodes: int
    jobs_per_node: int
    slots: int
    work_s: float
    """All compiles, one after another."""
    compile_s: float
    """The LPT makespan of the compiles."""
    total_s: float
    """start latency + compile + start latency + link."""

    @property
    def efficiency(self) -> float:
        """Busy share of the compile slots during the compile phase."""
        return self.work_s / (self.slots * self.compile_s) if self.compile_s else 1.0


def predict(f: Fit, counts: Mapping[str, int], archs: int, nodes: Iterable[int], machine: Nodes) -> list[Prediction]:
    missing = [fam for fam in counts if fam not in f.families]
    if missing:
        raise ConfigError(f"no cost for famil{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)}",
                          hint="complete the fit with with_assumed()")
    times = [f.tu_seconds(fam, archs) * machine.speed for fam, n in counts.items() for _ in range(n)]
    work = sum(times)
    out = []
    for n in nodes:
        if n < 1:
            raise ConfigError(f"{n} nodes: at least 1")
        slots = n * machine.jobs
        span = max(lpt(times, slots))
        out.append(Prediction(n, machine.jobs, slots, work, span,
                              machine.start_latency_s + span + machine.start_latency_s + machine.link_s))
    return out


@dataclass
class Model:
    """Everything a report needs: the fit, the counts, the target and the predictions."""

    fit: Fit
    counts: dict[str, int]
    archs: int
    machine: Nodes
    predictions: list[Prediction]
    samples: list[Sample] = field(default_factory=list)

    def assumed_share(self) -> float:
        """The share of the predicted work resting on families the sample did not measure."""
        work = {fam: n * self.fit.tu_seconds(fam, self.archs) for fam, n in self.counts.items()}
        total = sum(work.values())
        return sum(w for fam, w in work.items() if self.fit.families[fam].samples == 0) / total if total else 0.0
