"""``porter port``: a tree, ported, the same way for every project: its patch sets checked on the tree before
anything is written (each patch where its problem is present; a fork without a patch's problem is not a failed
port), applied to a copy beside it, and the copy published as OUT by one rename. What a project adds (Megatron's
hipify and fused kernels) lives in its component: :mod:`porter.components.megatron.port`,
:mod:`porter.components.deepspeed.port`.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from porter import __version__, faults
from porter.errors import ConfigError, PorterError
from porter.fs import atomic_write_json, ensure_writable_dir, owned_temp, publish_dir
from porter.log import Logger
from porter.patching import PatchFailed, apply
from porter.patching.model import PatchSet, resolve_sets
from porter.patching.engine import RANK, PatchResult, Plan as PatchPlan, failure_message, plan as patch_plan
from ops_prebuild.plan import Plan

PORT_RECORD = ".porter/port.json"


@dataclass(frozen=True)
class PatchSummary:
    """One patch of one set, as the port saw it: its state over all its files, and each file's."""

    set: str
    patch: str
    state: str
    """applied | would-apply | already | not-needed | skipped | failed (the engine's statuses)."""
    files: tuple[tuple[str, str, str], ...] = ()
    """(file, status, reason) per file the patch looked at."""

    def to_dict(self) -> dict[str, Any]:
        return {"set": self.set, "patch": self.patch, "state": self.state,
                "files": [{"file": f, "status": st, **({"reason": r} if r else {})} for f, st, r in self.files]}


def summarize(plan: PatchPlan, skipped: Mapping[str, Sequence[str]] = {}) -> list[PatchSummary]:
    """Per set and patch, its state (the engine's :meth:`SetPlan.patch_states`) and its files."""
    out: list[PatchSummary] = []
    for sp in plan.sets:
        per: dict[str, dict[str, PatchResult]] = {}
        for r in sp.results:
            files = per.setdefault(r.patch, {})
            if r.file:  # a file's status is the worst its results give it (the first such)
                files[r.file] = min(files.get(r.file, r), r, key=lambda x: RANK.index(x.status))
        for pid, state in sp.patch_states().items():
            out.append(PatchSummary(sp.ref, pid, state, tuple((f, r.status, r.reason) for f, r in per[pid].items())))
        out += [PatchSummary(sp.ref, pid, "skipped", (("", "skipped", "--skip"),)) for pid in skipped.get(sp.ref, ())]
    return out


@dataclass
class PortResult:
    source: Path
    out: Path
    toolchain: str
    version: str
    hipified: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)
    patch_results: list[dict[str, Any]] = field(default_factory=list)
    patches: list[PatchSummary] = field(default_factory=list)
    """Per set and patch: applied / would-apply / already / not-needed / skipped (failures raise)."""
    sets: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Facts worth a warning: no version file in the tree, a version outside what a set was verified on."""
    hipify_groups: list[dict[str, Any]] = field(default_factory=list)
    """The hipify report's findings, grouped per file or op folder, each with its verdict."""
    plan: Plan | None = None
    refusal: PorterError | None = None
    """Dry run only: why a real run here would be refused before any work."""
    kernels: bool = True
    compile_only: bool = False
    compiled: list[dict[str, Any]] = field(default_factory=list)
    """--compile-only: per kernel, per arch, per translation unit (compiled, not linked)."""
    built: list[dict[str, Any]] = field(default_factory=list)
    wave64: dict[str, Any] = field(default_factory=dict)
    """A 64-lane build: each warp-size-32 finding in the kernels with its state (:mod:`porter.hipify.wave64`)."""
    wheel: Path | None = None
    manifest: Path | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"source": str(self.source), "out": str(self.out), "toolchain": self.toolchain,
                "version": self.version, "hipified": self.hipified, "patched": self.patched,
                "patch_results": self.patch_results, "sets": self.sets,
                "patches": [p.to_dict() for p in self.patches], "notes": self.notes,
                "hipify_findings": self.hipify_groups, "kernels": self.kernels,
                **({"wave64": self.wave64} if self.wave64 else {}),
                "refusal": self.refusal.message if self.refusal else None,
                "plan": self.plan.to_dict() if self.plan is not None else None, "built": self.built,
                **({"compile_only": True, "linked": False, "note": "compiled, not linked",
                    "compiled": self.compiled} if self.compile_only else {}),
                "wheel": str(self.wheel) if self.wheel else None,
                "manifest": str(self.manifest) if self.manifest else None}


def destination(tree: Path, out: Path | None, in_place: bool, suffix: str) -> Path:
    if in_place:
        if out is not None and out.resolve() != tree:
            raise ConfigError("--in-place and --dest exclude each other", hint="drop one of them")
        return tree
    dest = (out if out is not None else tree.with_name(f"{tree.name}-{suffix}")).resolve()
    if dest == tree or dest.is_relative_to(tree):
        raise ConfigError(f"output {dest} is the tree or inside it", hint="put the ported copy next to the tree")
    if dest.exists() and not (dest / PORT_RECORD).is_file():
        raise ConfigError(f"{dest} exists and was not written by porter port",
                          hint="pass a new --dest folder, or remove this one")
    return dest


@contextmanager
def staged(src: Path, dest: Path, in_place: bool, log: Logger) -> Iterator[Path]:
    """The tree a port writes: ``dest`` itself in place; else a copy beside it (of ``dest``, a re-run's, or of
    ``src``) published as ``dest`` by one rename once the port is done (a re-run's earlier port is swapped out in
    one step, then removed). A port that fails leaves ``dest`` as it was."""
    if in_place:
        yield dest
        return
    ensure_writable_dir(dest.parent, what="parent folder of the ported tree", option="--dest", create=True)
    with owned_temp(dest.parent, f".{dest.name}.") as staging:
        with log.step("copying the tree"):
            work = staging / "t"
            shutil.copytree(dest if dest.exists() else src, work, symlinks=True)
            atomic_write_json(work / PORT_RECORD, {"source": str(src), "porter_version": __version__})
        yield work
        faults.reached("port")
        publish_dir(work, dest)


def patch_sets(refs: Sequence[str] = (), skip: Sequence[str] = (), *, project: str,
               target_version: str | None = None) -> Patches:
    """The sets a port applies (default: every set of ``project``, in order), each without the patches
    ``skip`` names, and, per set, the ids left out. A set with patches left out gets its own digest,
    so the journal never mistakes it for the whole set."""
    sets = [ps for ref in (refs or [project]) for ps in resolve_sets(ref)]
    known = {p.id for ps in sets for p in ps.patches}
    if unknown := [pid for pid in skip if pid not in known]:
        raise ConfigError(f"--skip {unknown[0]}: no such patch in {', '.join(ps.ref for ps in sets)}",
                          hint=f"patches: {', '.join(sorted(known))}")
    out: list[PatchSet] = []
    skipped: dict[str, list[str]] = {}
    for ps in sets:
        if not (left := [p.id for p in ps.patches if p.id in skip]):
            out.append(ps)
            continue
        skipped[ps.ref] = left
        if kept := tuple(p for p in ps.patches if p.id not in skip):
            digest = hashlib.sha256(f"{ps.digest} without {','.join(sorted(left))}".encode()).hexdigest()
            out.append(replace(ps, patches=kept, digest=digest))
    if not out:
        raise ConfigError("--skip leaves no patch to apply", hint="skip fewer patches, or use 'porter hipify' alone")
    return Patches(out, skipped, target_version)


@dataclass(frozen=True)
class Patches:
    """The patch step both ports run (:func:`patch_sets`): the sets, the ids ``--skip`` left out of each, and the
    version they are checked for (None: the tree's own)."""

    sets: list[PatchSet]
    skipped: dict[str, list[str]]
    target_version: str | None = None

    def take(self, tree: Path, result: PortResult, log: Logger | None = None,
             notes: Callable[[PatchPlan], list[str]] | None = None) -> PatchPlan:
        """The sets checked on ``tree`` (a failure stops the port before anything is written, with every patch's
        state), then, given a ``log``, applied to it (the staged copy). ``result`` takes what they did, or without
        a ``log`` what they would do (a dry run; a real one before any work); ``notes``: its notes from the plan
        (default: the sets' own, each once)."""
        pp = patch_plan(tree, self.sets, target_version=self.target_version)
        if pp.failed:
            lines = [f"  {STATE_WORDS.get(p.state, p.state):<12} {p.set}: {p.patch}"
                     for p in summarize(pp, self.skipped)]
            raise PatchFailed(f"the port stops before writing anything ({result.out} is as it was); per patch:\n"
                              + "\n".join(lines) + "\n" + failure_message(pp.failed), pp.failed,
                              hint="the tree differs where a patch's problem is present: update the anchor in the "
                                   "set, or leave that patch out with --skip PATCH and fix that file by hand")
        result.sets = [ps.ref for ps in self.sets]
        if log is not None:
            skipping = f" (skipping {', '.join(p for v in self.skipped.values() for p in v)})" if self.skipped else ""
            with log.step(f"applying {', '.join(result.sets)}{skipping}"):
                pp = apply(tree, self.sets, target_version=self.target_version).plan
        result.version, result.patched = pp.sets[0].version, [c.path for c in pp.changes]
        result.patch_results = [r.to_dict() for sp in pp.sets for r in sp.results]
        result.patches = summarize(pp, self.skipped)
        result.notes = notes(pp) if notes else list(dict.fromkeys(n for sp in pp.sets for n in sp.notes))
        return pp


STATE_WORDS = {"failed": "FAILED", "would-apply": "would apply", "applied": "applied", "already": "already",
               "not-needed": "not needed", "skipped": "skipped"}
"""A patch's or a file's state in words, worst first."""


__all__ = ["PORT_RECORD", "STATE_WORDS", "PatchSummary", "Patches", "PortResult", "destination", "patch_sets", "staged",
           "summarize"]
