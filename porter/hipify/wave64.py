"""Every warp-size-32 finding in a kernel porter builds for a 64-lane wavefront, with its state.

hipify's scanner flags code that assumes 32-lane warps (:mod:`porter.hipify.scan`). A build for a 64-lane target
(gfx90a, gfx942, gfx950; porter's emulated wave-64 target) gives each finding in a file an op compiles (its sources
and the tree's headers they include, followed through ``#include``) one of these states:

- ``fixed``: a shipped patch removed it (the patched copy no longer has it); ``by`` names the patch set.
- ``safe``: the project's ledger (``patches/<project>/wave64.toml``) says so for this op, naming the emulated
  wave-64 checks that prove it (``porter emulate check``; CI and the gauntlet run them); ``by`` names the checks.
- ``refused``: neither. The build stops (exit 1) naming file, line and finding, before anything is compiled...
- ``allowed``: ...unless the user allowed the op (``--allow-wave32 OP``, or ``all``): then it is built and the
  plan, the manifest and the SBOM record each such finding as ``allowed``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from porter.errors import CheckFailed, ConfigError, ToolError
from porter.hipify.scan import Finding
from porter.log import Logger
from porter.userdata import check_keys, parse_toml

LEDGER = "wave64.toml"
ALL = "all"
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)
_KEYS = {"file", "rule", "text", "ops", "checks", "why"}


@dataclass(frozen=True)
class Proof:
    """A ledger entry: findings of ``rule`` in ``file`` (on a line holding ``text``, when given) are safe for
    ``ops``, as the emulated wave-64 ``checks`` of those ops prove."""

    file: str
    rule: str
    ops: tuple[str, ...]
    checks: tuple[str, ...]
    text: str = ""

    def covers(self, op: str, f: Finding) -> bool:
        return op in self.ops and f.path == self.file and f.identifier == self.rule and self.text in f.text


def parse_ledger(text: str, where: str) -> tuple[Proof, ...]:
    """The ``[[safe]]`` entries of a ledger file (each key checked; bad input is a ConfigError naming it)."""
    data = parse_toml(text, where)
    check_keys(data, {"safe"}, where)
    entries = data.get("safe", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: safe must be an array of tables ([[safe]])")
    out: list[Proof] = []
    for i, e in enumerate(entries, 1):
        at = f"{where} [[safe]] #{i}"
        if not isinstance(e, dict):
            raise ConfigError(f"{at}: must be a table")
        check_keys(e, _KEYS, at, required={"file", "rule", "ops", "checks", "why"})
        for key in ("file", "rule", "why", "text"):
            if not isinstance(e.get(key, ""), str) or (key != "text" and not e[key].strip()):
                raise ConfigError(f"{at}: {key} must be a non-empty string")
        for key in ("ops", "checks"):
            if not isinstance(e[key], list) or not e[key] or not all(isinstance(v, str) and v for v in e[key]):
                raise ConfigError(f"{at}: {key} must be a non-empty array of names",
                                  hint="a finding is safe only with the emulated checks that prove it")
        out.append(Proof(file=e["file"], rule=e["rule"], ops=tuple(e["ops"]), checks=tuple(e["checks"]),
                         text=e.get("text", "")))
    return tuple(out)


def load_ledger(project: str) -> tuple[Proof, ...]:
    """The shipped ledger of ``project`` (none: no finding of it is safe)."""
    from porter.patching.model import PROJECTS_PACKAGE

    path = resources.files(PROJECTS_PACKAGE).joinpath(project, LEDGER)
    return parse_ledger(path.read_text(encoding="utf-8"), f"patches/{project}/{LEDGER}") if path.is_file() else ()


def files_of(tree: Path, sources: Iterable[str], include_paths: Sequence[str]) -> set[str]:
    """The tree's files one op compiles: its sources and every header of the tree they include, transitively
    (``"x.h"`` from the including file's folder, then the op's include paths; ``<x.h>`` from those paths only).
    Conditionals are not evaluated: a header included in any branch counts."""
    root = tree.resolve()
    dirs = [root / p for p in include_paths]
    todo = [root / s for s in sources]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for m in _INCLUDE.finditer(text):
            for d in ([path.parent] if m.group(1) == '"' else []) + dirs:
                cand = (d / m.group(2)).resolve()
                if cand.is_file() and cand.is_relative_to(root):
                    todo.append(cand)
                    break
    return {p.relative_to(root).as_posix() for p in seen}


@dataclass(frozen=True)
class State:
    op: str
    finding: Finding
    state: str  # fixed | safe | refused | allowed
    by: str = ""

    def to_dict(self) -> dict[str, Any]:
        f = self.finding
        return {"op": self.op, "file": f.path, "line": f.line, "rule": f.identifier, "text": f.text,
                "state": self.state, "by": self.by}

    def format(self) -> str:
        f = self.finding
        return f"{f.path}:{f.line}: {f.identifier} ({f.text}) in op {self.op}"


@dataclass(frozen=True)
class Wave64:
    """The states of one build's findings and the override it was given."""

    states: tuple[State, ...] = ()
    allowed: tuple[str, ...] = ()
    unscanned: str = ""
    """Why the sources could not be scanned (porter's hipify needs torch in porter's own environment)."""

    def of(self, state: str) -> list[State]:
        return [s for s in self.states if s.state == state]

    def to_dict(self) -> dict[str, Any]:
        return {"counts": dict(Counter(s.state for s in self.states)), "allowed": list(self.allowed),
                "findings": [s.to_dict() for s in self.states], **({"unscanned": self.unscanned}
                                                                  if self.unscanned else {})}

    def error(self, what: str, leave: str = "leave {ops} out") -> CheckFailed | None:
        if self.unscanned and ALL not in self.allowed:
            return CheckFailed(f"{what}: porter cannot check the sources for warp-size-32 code for a 64-lane "
                               f"wavefront: {self.unscanned}",
                               hint="install torch (the CPU wheel is enough) in the environment that runs porter, "
                                    "or build without the check with --allow-wave32 all (the manifest and the SBOM "
                                    "record it)")
        refused = self.of("refused")
        if not refused:
            return None
        ops = sorted({s.op for s in refused})
        lines = "\n".join(f"  {s.format()}" for s in refused[:20])
        more = f"\n  ... and {len(refused) - 20} more" if len(refused) > 20 else ""
        return CheckFailed(
            f"{what}: {len(refused)} warp-size-32 assumption(s) in {len(ops)} op(s) for a 64-lane wavefront, "
            f"neither fixed by a shipped patch nor proven safe by an emulated wave-64 check:\n{lines}{more}",
            hint=leave.format(ops=", ".join(ops), minus=",".join(f"-{o}" for o in ops))
                 + f", or build anyway with --allow-wave32 {','.join(ops)} (the manifest and the SBOM then record "
                 "each finding as allowed); docs/emulate.md lists the states")

    def allowed_notes(self) -> list[str]:
        """One line per finding built by the override (the plan's notes, the log's warnings)."""
        unchecked = [f"built without the wave-64 check (--allow-wave32 all): {self.unscanned}"] if self.unscanned \
            else []
        return unchecked + [f"built although wave-64 unproven (--allow-wave32): {s.format()}"
                            for s in self.of("allowed")]

    def say(self, log: Logger, where: str) -> None:
        """The counts per state, then each finding built by the override as a warning."""
        counts = ", ".join(f"{n} {k}" for k, n in sorted(Counter(s.state for s in self.states).items()))
        log.info(f"wave 64: {counts or 'no'} warp-size-32 finding(s) in {where}")
        for line in self.allowed_notes():
            log.warn(f"wave 64: {line}")


def assess(findings: Sequence[Finding], op_files: Mapping[str, set[str]], ledger: Sequence[Proof], *,
           fixed: Mapping[Finding, str] | None = None, allow: Sequence[str] = ()) -> Wave64:
    """Each finding (paths relative to the tree), once per op that compiles its file, with its state.

    ``findings``: those of the tree as built, plus those a shipped patch removed (keys of ``fixed``, valued with
    the patch set). ``allow``: ops built despite a refused finding (``all``: every op)."""
    fixed = fixed or {}
    unknown = sorted(set(allow) - set(op_files) - {ALL})
    if unknown:
        raise ConfigError(f"--allow-wave32 names op(s) this build does not build: {', '.join(unknown)}",
                          hint=f"the ops of this build: {', '.join(sorted(op_files)) or '(none)'}; or 'all'")
    states: list[State] = []
    for f in [*findings, *fixed]:
        for op in sorted(o for o, files in op_files.items() if f.path in files):
            if f in fixed:
                states.append(State(op, f, "fixed", fixed[f]))
            elif (proof := next((p for p in ledger if p.covers(op, f)), None)) is not None:
                states.append(State(op, f, "safe", ", ".join(proof.checks)))
            elif ALL in allow or op in allow:
                states.append(State(op, f, "allowed", "--allow-wave32"))
            else:
                states.append(State(op, f, "refused"))
    return Wave64(tuple(states), tuple(allow))


def scan_tree(tree: Path) -> list[Finding]:
    """porter's hipify scan of ``tree`` (nothing written): its warp-size-32 findings, paths relative to it."""
    from porter.hipify.engine import hipify_tree

    return list(hipify_tree(tree, check=True, use_cache=False).warp32)


def lost_lines(found: Sequence[Finding], tree: Path, after: Callable[[str], str | None],
               by: str) -> dict[Finding, str]:
    """The findings a patch removed: ``after(path)`` (the file as the build compiles it; None: as it is in ``tree``)
    no longer holds the finding's line as many times as the source does. A line hipify rewrote (the scanner's text
    is not the source's) is never taken as removed."""
    left: dict[str, tuple[Counter[str], Counter[str]] | None] = {}
    out: dict[Finding, str] = {}
    for f in found:
        if f.path not in left:
            text = after(f.path)
            left[f.path] = None if text is None else (
                Counter(line.strip() for line in text.splitlines()),
                Counter(line.strip() for line in (tree / f.path).read_text(errors="replace").splitlines()))
        lines = left[f.path]
        if lines is None or not lines[1][f.text]:
            continue
        if lines[0][f.text]:
            lines[0][f.text] -= 1
        else:
            out[f] = by
    return out


def gate(project: str, tree: Path, after: Callable[[str], str | None], by: str,
         ops: Mapping[str, tuple[Sequence[str], Sequence[str]]], allow: Sequence[str], log: Logger) -> Wave64:
    """A build's wave-64 step: the state of each warp-size-32 finding in ``ops`` (name -> sources and include paths,
    relative to ``tree``, the source as it is); ``after``: a file as the build compiles it, when patched (``by``
    names the patches)."""
    if not ops:  # nothing compiled for the device (FlashAttention's Triton backend)
        return Wave64(allowed=tuple(allow))
    with log.step("checking the ops' sources for warp-size-32 assumptions (a 64-lane target)"):
        try:
            found = scan_tree(tree)
        except ToolError as exc:  # no torch next to porter: nothing is known, so nothing is proven
            return Wave64(allowed=tuple(allow), unscanned=exc.message)
        lanes = judge(project, tree, found, lost_lines(found, tree, after, by), ops, allow)
    lanes.say(log, "the selected ops")
    return lanes


def judge(project: str, tree: Path, found: Sequence[Finding], fixed: Mapping[Finding, str],
          ops: Mapping[str, tuple[Sequence[str], Sequence[str]]], allow: Sequence[str]) -> Wave64:
    """The states of ``found`` (paths relative to ``tree``) in ``ops`` (name -> sources and include paths): those
    a shipped patch removed (``fixed``, valued with the patch) are fixed, the rest as ``project``'s ledger says,
    else allowed or refused."""
    files = {name: files_of(tree, sources, includes) for name, (sources, includes) in ops.items()}
    return assess([f for f in found if f not in fixed], files, load_ledger(project), fixed=fixed, allow=allow)
