"""The real-tree gauntlet: porter run on real upstream trees, one row per target.

    python benchmarks/real_trees.py [--mirrors DIR] [--only 'mds-*'] [--skip-done | --rerun-failed]
                                    [-j N] [--dry-run] [--list] [--render-only]

Targets are data (benchmarks/real_trees.toml): a git tree (repo + ref, read from a bare clone at
<mirrors>/<owner>+<name>/repo) or a PyPI sdist, the porter command to run on it (COMMANDS below, the one
place where a target's command becomes porter's argv), the toolchain and the archs. Each target runs in a
folder of its own under --work (the checked-out tree, porter's outputs, the logs of every step).

Rows go to docs/real-trees.json, keyed by target id; a run merges its rows into the earlier ones (a target
that is only skipped now keeps its earlier result) and rewrites docs/real-trees.md. Both are written
atomically after every target, so an interrupted run keeps what it finished.

A row is "ok" when every step exited 0, printed no Python traceback and no op failed; "failed" otherwise,
with the first error; "skipped" (with why) when its tree, its toolchain or its command is not available.

The Megatron and DeepSpeed compile-only commands also build the same kernels for porter's emulated HIP target
(``-t emulate-wave64``: the hipified sources compiled for the CPU, run with 64-lane wavefronts; docs/emulate.md)
and run ``porter emulate check`` on them: the row's ``wave64`` says which kernel families were built, checked
and passed, and a failed check fails the row. Nothing to check (the check's exit 4) is "0/0", not a failure.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "benchmarks" / "real_trees.toml"
RESULTS = ROOT / "docs" / "real-trees.json"
REPORT = ROOT / "docs" / "real-trees.md"
NODE_TORCH = "torch==2.13.0"  # the Makefile's TORCH_CPU: the torch of the stand-in compute node
TOP_FILES = ":top-files"  # in a checkout's paths: every file (not folder) at the top of the tree
MEGATRON_PATHS = ("megatron", TOP_FILES)


@dataclass(frozen=True)
class Command:
    """What one target command runs: steps of argv templates.

    Templates: ``{porter}`` is porter's own argv (spliced), ``{arch_args}`` ``--arch a,b,c`` (or nothing),
    ``{jobs_args}`` porter's ``-j N``, ``{extra_args}`` the target's ``args``; ``{src}`` the tree or the sdist
    spec, ``{toolchain}``, ``{work}`` the target's folder, ``{python}`` the python that makes the node venv,
    ``{node_torch}`` its torch.
    """

    what: str
    sources: tuple[str, ...]  # "tree" (git) and / or "sdist"
    steps: tuple[tuple[str, tuple[str, ...]], ...]
    toolchain: bool = False  # needs its toolchain's compiler here (a chroot profile: the chroot)
    paths: tuple[str, ...] | None = None  # default checkout of a git tree (None: the whole tree)
    skip: str = ""  # set: the command cannot run here, and why


P = "{porter}"
TC = ("-t", "{toolchain}", "{arch_args}")
WAVE64 = "emulate-wave64"
"""porter's emulated HIP target with 64-lane wavefronts (docs/emulate.md); its steps take no --arch."""
WAVE64_SUFFIX = "-wave64"
"""The names of the steps that build for WAVE64 and check what they built end with it; their JSON documents are
not the row's ROCm build's (ops, patches, notes): they are read into the row's ``wave64`` alone."""
WAVE64_CHECK = "check" + WAVE64_SUFFIX
NOTHING_TO_CHECK = 4
"""porter emulate check's exit code when the wheelhouse holds no kernel porter checks: "0/0", not a failure."""
# A compile row compiles every kernel, refused at wave 64 or not: its row counts each warp-size-32 finding's state
# (fixed, safe, allowed = would be refused without this) from the build's own report.
ALLOW = ("--allow-wave32", "all")
CHECK_WAVE64 = (WAVE64_CHECK, (P, "emulate", "check", "{work}/wheelhouse-wave64", "--json"))
WAVE64_STATES = "states" + WAVE64_SUFFIX
"""A dry run of the row's ROCm build: the states of its warp-size-32 findings, which --wave64-only records."""

# The one table from a target's command to porter's argv. Every porter step prints one JSON document.
COMMANDS: dict[str, Command] = {
    "port-no-kernels": Command(
        "hipify + patch a Megatron-DeepSpeed tree; no kernels built", ("tree",),
        (("port", (P, "port", "megatron-deepspeed", "{src}", "--no-kernels", *TC, "--dest", "{work}/ported",
                   "--json")),),
        paths=MEGATRON_PATHS),
    "port-compile-only": Command(
        "hipify + patch, then compile the fused kernels for every arch (not linked)", ("tree",),
        (("port", (P, "port", "megatron-deepspeed", "{src}", "--compile-only", *TC, "{jobs_args}", *ALLOW,
                   "--dest", "{work}/ported", "-o", "{work}/wheelhouse", "--json")),
         # the same kernels built for the emulated wave-64 target and checked on the CPU (no --arch: one target)
         ("port" + WAVE64_SUFFIX, (P, "port", "megatron-deepspeed", "{src}", "-t", WAVE64, "{jobs_args}", *ALLOW,
                                   "--dest", "{work}/ported-wave64", "-o", "{work}/wheelhouse-wave64", "--json")),
         CHECK_WAVE64),
        toolchain=True, paths=MEGATRON_PATHS),
    "ops-compile-only": Command(
        "every op DeepSpeed says the toolchain can build, compiled for every arch (not linked)", ("sdist", "tree"),
        (("list", (P, "ops", "list", "--source", "{src}", *TC, "--json")),
         ("build", (P, "ops", "build", "--source", "{src}", "--all-compatible", "--compile-only", *TC,
                    "{jobs_args}", *ALLOW, "-o", "{work}/wheelhouse", "--json")),
         # the fused optimizers porter checks, built for the emulated wave-64 target and checked on the CPU
         ("build" + WAVE64_SUFFIX, (P, "ops", "build", "--source", "{src}", "-t", WAVE64, "--ops",
                                    "fused_adam,fused_lamb,fused_lion", "{jobs_args}", "-o", "{work}/wheelhouse-wave64",
                                    "--json")),
         CHECK_WAVE64),
        toolchain=True),
    "ops-cpu-install-verify": Command(
        "every CPU op of the release into a wheel, installed offline into a fresh venv, verified (no JIT)",
        ("sdist", "tree"),
        (("list", (P, "ops", "list", "--source", "{src}", "-t", "{toolchain}", "--json")),
         ("build", (P, "ops", "build", "--source", "{src}", "-t", "{toolchain}", "--all-compatible",
                    "--with-deps", "{jobs_args}", "-o", "{work}/wheelhouse", "--json")),
         ("venv", ("{python}", "-m", "venv", "{work}/node")),
         ("torch", ("{work}/node/bin/python", "-m", "pip", "install", "-q", "{node_torch}")),
         ("install", (P, "install", "{work}/wheelhouse", "--python", "{work}/node/bin/python", "--json")),
         ("verify", (P, "verify", "--python", "{work}/node/bin/python", "--json"))),
        toolchain=True),
    "apex-compile-only": Command(
        "every apex op compiled for every arch (not linked)", ("tree", "sdist"),
        (("compile", (P, "wheel", "apex", "--source", "{src}", "--compile-only", *TC, "{jobs_args}", *ALLOW,
                      "-o", "{work}/wheelhouse", "--json")),
         # every op's warp-size-32 findings with their state, as the compile above gives them (for --wave64-only)
         (WAVE64_STATES, (P, "wheel", "apex", "--source", "{src}", "--compile-only", *TC, *ALLOW, "--dry-run",
                          "-o", "{work}/wheelhouse", "--json")),
         # the ops porter checks, built for the emulated wave-64 target and checked on the CPU
         ("build" + WAVE64_SUFFIX, (P, "wheel", "apex", "--source", "{src}", "-t", WAVE64, "--ops",
                                    "amp_C,fused_layer_norm_cuda,syncbn", "{jobs_args}", "-o",
                                    "{work}/wheelhouse-wave64", "--json")),
         CHECK_WAVE64),
        toolchain=True),
    "fa-ck-sample": Command(
        "FlashAttention CK: a covering sample (every family, head-dim bucket and dtype) and the extension's own "
        "sources, every arch",
        ("tree", "sdist"),
        (("compile", (P, "wheel", "flash-attn", "--source", "{src}", "--backend", "ck", "--compile-only",
                      "--sample", "cover", *TC, "{jobs_args}", "{extra_args}", *ALLOW, "-o", "{work}/wheelhouse",
                      "--json")),),
        toolchain=True),
    "fa-triton-wheel": Command(
        "FlashAttention's Triton backend as a wheel (no extension compiled)", ("tree", "sdist"),
        (("wheel", (P, "wheel", "flash-attn", "--source", "{src}", "--backend", "triton", *TC, "{jobs_args}",
                    "-o", "{work}/wheelhouse", "--json")),),
        toolchain=True),
    "net-plugin": Command(
        "the RCCL network plugin configured, compiled, linked, packaged and loaded", ("tree",),
        # a checkout has no .git: the plugin's version is its tag, as a release tarball's .release_version says
        (("build", (P, "net-plugin", "build", "--source", "{src}", *TC, "{jobs_args}", "--release-version", "{ref}",
                    "-o", "{work}/net-plugin",
                    "--json")),),
        toolchain=True),
}

TARGET_KEYS = {"id", "repo", "ref", "sdist", "command", "toolchain", "archs", "paths", "requires", "submodules",
               "args", "note"}


class TargetError(ValueError):
    """benchmarks/real_trees.toml is not what this script reads."""


@dataclass(frozen=True)
class Target:
    id: str
    command: str
    toolchain: str
    repo: str = ""
    ref: str = ""
    sdist: str = ""
    archs: tuple[str, ...] = ()
    paths: tuple[str, ...] | None = None
    requires: tuple[str, ...] = ()
    submodules: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()  # more porter options, where the command's template has {extra_args}
    note: str = ""

    @property
    def source_text(self) -> str:
        return f"{self.repo}@{self.ref}" if self.repo else self.sdist

    @property
    def mirror_name(self) -> str:
        return mirror_name(self.repo)


def mirror_name(repo: str) -> str:
    """A repository's folder under the mirrors (``<owner>+<name>``; its bare clone is ``repo`` inside)."""
    return repo.replace("/", "+")


def mirror_dir(mirrors: Path, repo: str) -> Path:
    return mirrors / mirror_name(repo) / "repo"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TargetError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


def parse_targets(text: str) -> list[Target]:
    """The [[target]] tables of a targets file, checked: known keys only, one source, a known command."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TargetError(f"not TOML: {exc}") from None
    extra = set(doc) - {"target"}
    if extra:
        raise TargetError(f"unknown top-level key(s): {', '.join(sorted(extra))} (only [[target]] tables)")
    tables = doc.get("target", [])
    if not isinstance(tables, list):
        raise TargetError("'target' must be an array of tables: [[target]]")
    out: list[Target] = []
    seen: set[str] = set()
    for n, t in enumerate(tables, 1):
        name = str(t.get("id") or f"target #{n}")
        unknown = set(t) - TARGET_KEYS
        if unknown:
            raise TargetError(f"{name}: unknown key(s) {', '.join(sorted(unknown))}; known: "
                              f"{', '.join(sorted(TARGET_KEYS))}")
        for key in ("id", "command", "toolchain"):
            if not isinstance(t.get(key), str) or not t[key]:
                raise TargetError(f"{name}: '{key}' is required (a non-empty string)")
        for key in ("repo", "ref", "sdist", "note"):
            if key in t and not isinstance(t[key], str):
                raise TargetError(f"{name}: '{key}' must be a string")
        if t["id"] in seen:
            raise TargetError(f"{name}: the id is used twice")
        seen.add(t["id"])
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", t["id"]):
            raise TargetError(f"{name}: an id is letters, digits and . _ + - (it names a folder)")
        if bool(t.get("repo")) == bool(t.get("sdist")):
            raise TargetError(f"{name}: give either repo (+ ref) or sdist")
        if t.get("repo"):
            if not re.fullmatch(r"[\w.-]+/[\w.-]+", t["repo"]):
                raise TargetError(f"{name}: repo must be 'owner/name', got {t['repo']!r}")
            if not t.get("ref"):
                raise TargetError(f"{name}: a repo needs a ref (branch, tag or commit)")
        elif "ref" in t:
            raise TargetError(f"{name}: ref goes with repo, not with sdist")
        subs = t.get("submodules", {})
        if not isinstance(subs, dict) or not all(isinstance(v, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", v)
                                                 for v in subs.values()):
            raise TargetError(f"{name}: submodules maps a path in the tree to the 'owner/name' whose mirror "
                              f"holds it, e.g. {{\"csrc/composable_kernel\" = \"ROCm/composable_kernel\"}}")
        if subs and not t.get("repo"):
            raise TargetError(f"{name}: submodules go with repo, not with sdist")
        if t.get("sdist") and "==" not in t["sdist"]:
            raise TargetError(f"{name}: sdist must be 'project==version', got {t['sdist']!r}")
        command = COMMANDS.get(t["command"])
        if command is None:
            raise TargetError(f"{name}: unknown command {t['command']!r}; known: {', '.join(COMMANDS)}")
        if "args" in t and not any("{extra_args}" in tpl for _, tpl in command.steps):
            raise TargetError(f"{name}: {t['command']} takes no args")
        kind = "tree" if t.get("repo") else "sdist"
        if kind not in command.sources:
            raise TargetError(f"{name}: {t['command']} takes a {' or '.join(command.sources)}, not a {kind}")
        out.append(Target(
            id=t["id"], command=t["command"], toolchain=t["toolchain"], repo=t.get("repo", ""),
            ref=t.get("ref", ""), sdist=t.get("sdist", ""),
            archs=_strings(t["archs"], f"{name}: archs") if "archs" in t else (),
            paths=_strings(t["paths"], f"{name}: paths") if "paths" in t else None,
            requires=_strings(t["requires"], f"{name}: requires") if "requires" in t else (),
            submodules=tuple(sorted(subs.items())),
            args=_strings(t["args"], f"{name}: args") if "args" in t else (), note=t.get("note", "")))
    return out


def load_targets(path: Path = TARGETS) -> list[Target]:
    try:
        return parse_targets(path.read_text())
    except TargetError as exc:
        raise TargetError(f"{path.name}: {exc}") from None


# ------------------------------------------------------------------------------------------ argv

def expand(template: Sequence[str], ctx: Mapping[str, str | Sequence[str]]) -> list[str]:
    """One argv from a template: a part that is exactly ``{key}`` with a list value is spliced in; every
    other part is formatted with the string values."""
    strings = {k: v for k, v in ctx.items() if isinstance(v, str)}
    out: list[str] = []
    for part in template:
        m = re.fullmatch(r"\{(\w+)\}", part)
        if m and m.group(1) in ctx and not isinstance(ctx[m.group(1)], str):
            out += list(ctx[m.group(1)])
        else:
            out.append(part.format_map(strings))
    return out


def context(target: Target, *, src: str, work: str, porter: Sequence[str], jobs: int | None,
            python: str, node_torch: str = NODE_TORCH) -> dict[str, str | Sequence[str]]:
    return {"porter": list(porter), "src": src, "work": work, "toolchain": target.toolchain, "ref": target.ref,
            "arch_args": ["--arch", ",".join(target.archs)] if target.archs else [],
            "jobs_args": ["-j", str(jobs)] if jobs else [], "extra_args": list(target.args), "python": python,
            "node_torch": node_torch}


def argvs(target: Target, ctx: Mapping[str, str | Sequence[str]]) -> list[tuple[str, list[str]]]:
    """The target's steps as (name, argv)."""
    return [(name, expand(tpl, ctx)) for name, tpl in COMMANDS[target.command].steps]


def plan_only(steps: Sequence[tuple[str, list[str]]], porter: Sequence[str]) -> list[tuple[str, list[str]]]:
    """--porter-dry-run: porter's own plan of each step that has one (port, ops build, wheel, net-plugin
    get --dry-run; ops list runs as it is, it writes nothing); the other steps are left out."""
    out = []
    n = len(porter)
    for name, argv in steps:
        if list(argv[:n]) != list(porter):
            continue
        sub = argv[n:n + 2]
        if sub[:1] in (["port"], ["wheel"], ["net-plugin"]) or sub == ["ops", "build"]:
            out.append((name, [*argv, "--dry-run"]))
        elif sub == ["ops", "list"]:
            out.append((name, list(argv)))
    return out


def display(target: Target, jobs: int | None = None) -> str:
    """The command as a reader would type it (TREE, WORK and NODE stand for this run's folders)."""
    ctx = context(target, src="TREE" if target.repo else target.sdist, work="WORK", porter=["porter"], jobs=jobs,
                  python="python3")
    lines = [shlex.join(argv).replace("WORK/node/bin/python", "NODE/bin/python") for _, argv in argvs(target, ctx)]
    return " && ".join(lines)


# ---------------------------------------------------------------------------------- reading output

_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):", re.M)


def has_traceback(text: str) -> bool:
    return bool(_TRACEBACK.search(text))


def traceback_error(text: str) -> str:
    """The exception line of the last traceback in ``text`` ('' when there is none)."""
    found = list(_TRACEBACK.finditer(text))
    if not found:
        return ""
    for line in text[found[-1].end():].splitlines()[1:]:
        if line.strip() and not line[0].isspace():
            return line.strip()
    return "Traceback (no exception line)"


def parse_json(stdout: str) -> Any:
    try:
        return json.loads(stdout)
    except ValueError:
        return None


HOST_ONLY = ("host-only", "host code only")
"""What a compile report says, per arch, of an op with no device code (porter's words now, and before)."""


def op_from_report(rec: Mapping[str, Any]) -> dict[str, Any]:
    """One op of a compile report (ops_prebuild.build.compile_report): compiled, host-only or failed."""
    archs = dict(rec.get("archs") or {})
    if rec.get("status") == "failed":
        status = "failed"
    elif archs and all(v in HOST_ONLY for v in archs.values()):
        status = "host-only"
    else:
        status = "compiled"
    return {"name": str(rec.get("name")), "status": status, "archs": archs, "error": rec.get("error") or ""}


_LEFT_OUT = re.compile(r"^([\w.-]+): not (?:planned|read from \S+)(?: \(left out\))?: (.+)$")


def collect_ops(docs: Iterable[Any]) -> list[dict[str, Any]]:
    """Per op, what the steps' JSON documents say: a compile report ('compiled'), a build's 'ops'
    (built / failed), an op list's incompatible ops (excluded, with upstream's reason), the ops porter's
    planner left out (its notes: 'NAME: not planned: why')."""
    ops: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        for note in doc.get("notes") or []:
            m = _LEFT_OUT.match(note) if isinstance(note, str) else None
            if m:
                ops.setdefault(m.group(1), {"name": m.group(1), "status": "left-out", "reason": m.group(2)})
        if isinstance(doc.get("compiled"), list):
            for rec in doc["compiled"]:
                ops[str(rec.get("name"))] = op_from_report(rec)
            continue
        for o in doc.get("ops") or []:
            if not isinstance(o, dict) or "name" not in o:
                continue
            if "compatible" in o:  # porter ops list
                if not o["compatible"]:
                    ops.setdefault(o["name"], {"name": o["name"], "status": "excluded",
                                               "reason": " ".join(str(o.get("reason") or "").split())})
            elif "status" in o:  # porter ops build (linked)
                ops[o["name"]] = {"name": o["name"], "status": "failed" if o["status"] == "failed" else "built",
                                  "error": o.get("error") or ""}
    return list(ops.values())


def arch_summary(ops: Sequence[Mapping[str, Any]], archs: Sequence[str] = ()) -> str:
    """'gfx90a 3/3, gfx942 3/3, gfx950 0/3': per arch, the device ops that compiled for it / all device ops
    (failed ones included; excluded and left-out ones not)."""
    device = [o for o in ops if o["status"] in ("compiled", "failed") and o.get("archs")]
    host = sum(o["status"] == "host-only" for o in ops)
    names = list(archs) or sorted({a for o in device for a in o["archs"]})
    parts = [f"{a} {sum(o['archs'].get(a) == 'compiled' for o in device)}/{len(device)}" for a in names] \
        if device else []
    if host:
        parts.append(f"+{host} host-only")
    return ", ".join(parts)


def op_counts(ops: Sequence[Mapping[str, Any]]) -> tuple[int, int, int, int]:
    """(done, total, excluded, left out): ops compiled / host-only / built, ops attempted, ops the tree
    excludes for this toolchain, ops porter's planner left out."""
    excluded = sum(o["status"] == "excluded" for o in ops)
    left_out = sum(o["status"] == "left-out" for o in ops)
    done = sum(o["status"] in ("compiled", "host-only", "built") for o in ops)
    return done, len(ops) - excluded - left_out, excluded, left_out


def detail(docs: Iterable[Any]) -> str:
    """What a step did besides ops: patches, hipified files, a wheel or package, a verify verdict."""
    parts: list[str] = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if isinstance(doc.get("patches"), list):
            states = Counter(str(p.get("state")) for p in doc["patches"] if isinstance(p, dict))
            if states:
                parts.append("patches " + ", ".join(f"{n} {s}" for s, n in states.most_common()))
        if isinstance(doc.get("hipified"), list):
            parts.append(f"{len(doc['hipified'])} hipified")
        findings = [g for g in doc.get("hipify_findings") or [] if isinstance(g, dict)]
        if findings:  # per verdict, the files hipify flagged (warp32: warp-size-32 assumptions)
            verdicts = Counter(str(g.get("verdict_id") or "finding") for g in findings)
            parts.append("hipify " + ", ".join(f"{v} in {n} file(s)" for v, n in verdicts.items()))
        for key in ("wheel", "package"):
            if isinstance(doc.get(key), str) and doc[key]:
                parts.append(f"{key} {Path(doc[key]).name}")
        if isinstance(doc.get("installed"), list):
            parts.append(f"{len(doc['installed'])} wheel(s) installed")
        if "ok" in doc and isinstance(doc.get("components"), list):
            parts.append(f"verify {'ok' if doc['ok'] else 'FAILED'} ({len(doc['components'])} component(s))")
        if isinstance(doc.get("refusal"), str) and doc["refusal"]:
            parts.append(f"refused: {doc['refusal']}")
    return "; ".join(parts)


def source_version(docs: Iterable[Any]) -> str:
    """The version porter read from the tree or sdist ('' when none said)."""
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        v = doc.get("version")
        if not v and isinstance(doc.get("source"), dict):
            v = doc["source"].get("version")
        if isinstance(v, str) and v and v != "unknown":
            return v
    return ""


@dataclass
class Step:
    name: str
    exit_code: int | None
    seconds: float
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False

    @property
    def doc(self) -> Any:
        return parse_json(self.stdout)

    @property
    def failed(self) -> bool:
        if self.timed_out or has_traceback(self.stdout + "\n" + self.stderr):
            return True
        if self.name == WAVE64_CHECK and self.exit_code == NOTHING_TO_CHECK:
            return False  # no kernel porter checks was built: 0/0 checked, not a failure
        return self.exit_code != 0


def is_wave64(step: str) -> bool:
    """A step of the emulated wave-64 target (its build or its check)."""
    return step.endswith(WAVE64_SUFFIX)


def has_wave64(command: str) -> bool:
    """The command checks its kernels at wave 64 (its rows have a ``wave64`` field)."""
    return any(name == WAVE64_CHECK for name, _ in COMMANDS[command].steps)


def check_rows(doc: Any) -> list[dict[str, Any]] | None:
    """porter emulate check --json's rows (a JSON list, one row per check); None when ``doc`` is not that."""
    if isinstance(doc, list) and all(isinstance(r, dict) and isinstance(r.get("kernel"), str) for r in doc):
        return doc
    return None


def _number(value: Any) -> float | str | None:
    """A check's error or tolerance as the row keeps it (NaN and infinities as text: JSON has none)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    v = float(value)
    return v if v == v and abs(v) != float("inf") else str(v)


def _badness(row: Mapping[str, Any]) -> float:
    """How far a check row is from passing: its error over its tolerance (no value, or NaN: infinite)."""
    err, tol = row.get("max_abs_err"), row.get("tolerance")
    if not isinstance(err, (int, float)) or not isinstance(tol, (int, float)) or not tol or err != err:
        return float("inf")
    return float(err) / float(tol)


def check_failure(row: Mapping[str, Any]) -> str:
    """One failed check: 'family: check: its error', or '...: max err E > tolerance T (wave W)'."""
    what = f"{row.get('kernel')}: {row.get('check')}"
    if row.get("error"):
        return f"{what}: {row['error']}"
    err, tol = _number(row.get("max_abs_err")), _number(row.get("tolerance"))
    err_text = f"{err:.2e}" if isinstance(err, float) else str(err)
    tol_text = f"{tol:.1e}" if isinstance(tol, float) else str(tol)
    return f"{what}: max err {err_text} > tolerance {tol_text} (wave {row.get('wave', '?')})"


def wave64_result(step: Step, scrub: Callable[[str], str] = str) -> dict[str, Any]:
    """The row's ``wave64`` from the check step: the kernel families built (every family with a check row: one whose
    check raised, or whose module did not load, was built all the same), those checked (at least one comparison came
    out), those passed (every check ok), and per family its worst check. 'error' when the check gave no rows."""
    out: dict[str, Any] = {"exit_code": step.exit_code, "built": 0, "checked": 0, "passed": 0, "families": {}}
    rows = check_rows(step.doc)
    if rows is None:
        if not step.failed:  # nothing to check (exit 4): 0/0, with porter's words why
            said = [ln[len("ERROR: "):].strip() for ln in step.stderr.splitlines() if ln.startswith("ERROR: ")]
            if said:
                out["note"] = scrub(said[0])[:300]
        else:
            out["error"] = "check timed out" if step.timed_out else f"check exited {step.exit_code}, no rows"
        return out
    families: dict[str, dict[str, Any]] = {}
    for r in rows:
        fam = families.setdefault(r["kernel"], {"ok": True, "checks": 0, "failed": 0, "compared": False,
                                                "worst": None})
        fam["checks"] += 1
        if not r.get("ok"):
            fam["ok"] = False
            fam["failed"] += 1
        if not r.get("error") and r.get("max_abs_err") is not None:
            fam["compared"] = True
        if fam["worst"] is None or _badness(r) > _badness(fam["worst"]):
            fam["worst"] = r
    for name, fam in families.items():
        worst = fam.pop("worst")
        fam["check"] = scrub(str(worst.get("check") or ""))[:200]
        fam["max_abs_err"] = _number(worst.get("max_abs_err"))
        fam["tolerance"] = _number(worst.get("tolerance"))
        if worst.get("error"):
            fam["error"] = scrub(str(worst["error"]))[:300]
    out["families"] = families
    out["built"] = len(families)
    out["checked"] = sum(f.pop("compared") for f in families.values())
    out["passed"] = sum(f["ok"] for f in families.values())
    return out


def first_error(steps: Sequence[Step], ops: Sequence[Mapping[str, Any]]) -> str:
    """The first thing that went wrong: a timeout, a failed kernel check (its first failing check), porter's ERROR
    line and / or a traceback's exception line, a failed op's first error, a verify problem, else the last line the
    failing step printed."""
    prefix = len(steps) > 1

    def failed_check(s: Step) -> str:
        bad = [r for r in check_rows(s.doc) or [] if not r.get("ok")] if s.name == WAVE64_CHECK else []
        return check_failure(bad[0]) if bad else ""

    for s in steps:
        if not s.failed:
            continue
        tag = f"{s.name}: " if prefix else ""
        if s.timed_out:
            return f"{tag}timed out after {s.seconds:.0f} s"
        lines = s.stderr.splitlines()
        at = next((i for i, ln in enumerate(lines) if ln.startswith("ERROR: ")), None)
        tb = traceback_error(s.stdout + "\n" + s.stderr)
        if not tb and failed_check(s):  # exit 1 of porter emulate check: a kernel computed the wrong thing
            return tag + failed_check(s)
        parts = [lines[at][len("ERROR: "):].strip()] if at is not None else []
        if at is not None and not tb and "command failed" in parts[0]:  # what the command itself said last
            said = [ln.strip() for ln in lines[:at] if ln.strip() and not ln.startswith(("$ ", "==> ", " "))]
            parts += [next((ln for ln in said if re.search(r"\berror\b", ln, re.I)), said[-1])] if said else []
        parts += [f"Traceback: {tb}"] if tb else []
        if parts:
            return tag + " — ".join(parts)
        bad = [o for o in ops if o["status"] == "failed"]
        if bad:
            return f"{tag}{bad[0]['name']}: {bad[0].get('error') or 'failed'}"
        doc = s.doc
        if isinstance(doc, dict) and doc.get("problems"):
            p = doc["problems"][0]
            return tag + (": ".join(str(p.get(k)) for k in ("component", "file", "check", "found"))
                          if isinstance(p, dict) else str(p))
        lines = [ln.strip() for ln in (s.stderr or s.stdout).splitlines() if ln.strip()]
        return tag + (lines[-1] if lines else f"exit code {s.exit_code}")
    bad = [o for o in ops if o["status"] == "failed"]
    if bad:
        return f"{bad[0]['name']}: {bad[0].get('error') or 'failed'}"
    return next((f"{s.name}: {failed_check(s)}" if prefix else failed_check(s) for s in steps if failed_check(s)), "")


_PIP_NOISE = re.compile(r"^Location '.*' is ignored|^There was an error checking the latest version of pip")


def warnings(steps: Sequence[Step]) -> list[str]:
    """porter's WARNING lines, in order, once each (not pip's about this machine's own index set-up)."""
    seen: dict[str, None] = {}
    for s in steps:
        for ln in s.stderr.splitlines():
            text = ln[len("WARNING: "):].strip()
            if ln.startswith("WARNING: ") and not _PIP_NOISE.match(text):
                seen.setdefault(text)
    return list(seen)


class Scrub:
    """Takes machine paths and host names out of text that goes into the committed docs."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self.pairs = sorted(((str(a), b) for a, b in pairs if str(a) not in ("", "/", ".")),
                            key=lambda p: -len(p[0]))

    def __call__(self, text: str) -> str:
        for a, b in self.pairs:
            text = text.replace(a, b)
        text = re.sub(r"\b[a-z][a-z0-9+.-]*://\S+", "<url>", text)
        text = re.sub(r"(?<![\w.])/(?:[\w.+@-]+/)*(?:site|dist)-packages/", "SITE/", text)
        text = re.sub(r"(?<![\w.])/(?:[\w.+@-]+/)*lib/python3\.\d+/", "PYLIB/", text)
        text = re.sub(r"(?<![\w.])/var/lib/porter/[\w.+-]+", "ROOT", text)
        text = re.sub(r"(?<![\w.])/tmp/[\w.+-]+", "TMP", text)
        return text


def make_row(target: Target, steps: Sequence[Step], *, started: float, source: Mapping[str, Any],
             generation: str = "", porter_rev: str = "", jobs: int | None = None,
             scrub: Scrub | None = None) -> dict[str, Any]:
    """One result row from the steps a target ran (pure: no files, no processes)."""
    scrub = scrub or Scrub()
    docs = [s.doc for s in steps if not is_wave64(s.name)]  # the wave-64 steps' documents go to wave64 alone
    ops = collect_ops(docs)
    for o in ops:
        for key in ("error", "reason"):
            if o.get(key):
                o[key] = scrub(str(o[key]))[:400]
    check = next((s for s in steps if s.name == WAVE64_CHECK), None)
    wave64 = wave64_result(check, scrub) if check is not None else None
    failed = any(s.failed for s in steps) or any(o["status"] == "failed" for o in ops) \
        or bool(wave64 and (wave64["passed"] < wave64["built"] or wave64.get("error")))
    done, total, excluded, left_out = op_counts(ops)
    src = dict(source)
    version = source_version(docs)
    if version:
        src["version"] = version
    last = steps[-1] if steps else None
    return {
        "id": target.id, "command": target.command, "argv": display(target, jobs), "toolchain": target.toolchain,
        "archs": list(target.archs), "source": src, "generation": generation,
        "result": "failed" if failed else "ok", "exit_code": last.exit_code if last else None,
        "seconds": round(sum(s.seconds for s in steps), 1),
        "date": dt.datetime.fromtimestamp(started, dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "porter": porter_rev,
        "steps": [{"name": s.name, "exit_code": s.exit_code, "seconds": round(s.seconds, 1),
                   **({"timed_out": True} if s.timed_out else {})} for s in steps],
        "traceback": any(has_traceback(s.stdout + "\n" + s.stderr) for s in steps),
        "ops": ops, "arch_summary": arch_summary(ops, target.archs),
        "ops_done": done, "ops_total": total, "ops_excluded": excluded, "ops_left_out": left_out,
        "detail": scrub(detail(docs))[:300],
        "patches": [{"patch": p.get("patch"), "state": p.get("state")} for d in docs if isinstance(d, dict)
                    for p in d.get("patches") or [] if isinstance(p, dict)],
        "warnings": [scrub(w)[:300] for w in warnings(steps)][:8],
        "porter_notes": [scrub(str(n))[:300] for d in docs if isinstance(d, dict)
                         for n in d.get("notes") or [] if isinstance(n, str)][:8],
        "first_error": scrub(first_error(steps, ops))[:400] if failed else "",
        # None: the command checks at wave 64, but the check did not run (an earlier step failed, a plan-only run)
        **({"wave64": wave64, "wave64_states": wave64_states(docs)} if has_wave64(target.command) else {}),
        "note": target.note,
    }


def with_wave64(earlier: Mapping[str, Any] | None, target: Target, steps: Sequence[Step], *, started: float,
                source: Mapping[str, Any], porter_rev: str = "", scrub: Scrub | None = None) -> dict[str, Any]:
    """--wave64-only: the target's earlier row with its wave-64 steps run again (the ROCm steps are not), the
    ``wave64`` field carrying that run's own date, porter and tree commit; a failed check fails the row. Without an
    earlier row, the row is made from these steps alone."""
    scrub = scrub or Scrub()
    check = next((s for s in steps if s.name == WAVE64_CHECK), None)
    if earlier is None or earlier.get("result") == "skipped":
        return make_row(target, steps, started=started, source=source, porter_rev=porter_rev, scrub=scrub)
    row = dict(earlier)
    w = wave64_result(check, scrub) if check is not None else None
    failed = [s for s in steps if s.failed]
    if w is None and failed:
        w = {"error": f"{failed[0].name} exited {failed[0].exit_code}", "built": 0, "checked": 0, "passed": 0}
    if w is not None:
        w.update(date=dt.datetime.fromtimestamp(started, dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                 porter=porter_rev, commit=source.get("commit", ""))
    row["wave64"] = w
    states = next((s for s in steps if s.name == WAVE64_STATES and not s.failed), None)
    if states is not None:
        row["wave64_states"] = wave64_states([states.doc])
    if w is not None and (w["passed"] < w["built"] or w.get("error")):
        row["result"] = "failed"
        row["first_error"] = scrub(first_error(steps, []))[:400]
    elif earlier.get("result") == "failed" and _failed_at_wave64_only(earlier):
        row.update(result="ok", first_error="", traceback=any(has_traceback(s.stdout + "\n" + s.stderr)
                                                               for s in steps))
    return row


def _failed_at_wave64_only(row: Mapping[str, Any]) -> bool:
    """The row failed in its wave-64 steps alone: every other step exited 0, no op failed, and the first error is a
    wave-64 step's (so a passing --wave64-only rerun makes it ok)."""
    others_ok = all(s.get("exit_code") == 0 for s in row.get("steps") or [] if not is_wave64(str(s.get("name"))))
    return others_ok and not [o for o in row.get("ops") or [] if o.get("status") == "failed"] \
        and any(str(row.get("first_error", "")).startswith(n + ":") for n in ("build-wave64", "port-wave64"))


def skipped_row(target: Target, reason: str, *, started: float, source: Mapping[str, Any] | None = None,
                porter_rev: str = "") -> dict[str, Any]:
    return {"id": target.id, "command": target.command, "argv": display(target), "toolchain": target.toolchain,
            "archs": list(target.archs), "source": dict(source or _declared_source(target)), "generation": "",
            "result": "skipped", "reason": reason, "exit_code": None, "seconds": 0.0,
            "date": dt.datetime.fromtimestamp(started, dt.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
            "porter": porter_rev, "steps": [], "traceback": False, "ops": [], "arch_summary": "",
            "ops_done": 0, "ops_total": 0, "ops_excluded": 0, "detail": "", "first_error": "", "note": target.note}


def _declared_source(target: Target) -> dict[str, str]:
    return {"repo": target.repo, "ref": target.ref} if target.repo else {"sdist": target.sdist}


# ---------------------------------------------------------------------------------- results file

def merge_rows(old: Mapping[str, Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Earlier rows with this run's rows on top. A target only skipped now keeps an earlier real result."""
    out: dict[str, Any] = {k: dict(v) for k, v in old.items()}
    for row in new:
        prev = out.get(row["id"])
        if row["result"] == "skipped" and prev is not None and prev.get("result") in ("ok", "failed"):
            continue
        out[row["id"]] = dict(row)
    return out


def ordered(rows: Mapping[str, Any], targets: Sequence[Target]) -> dict[str, Any]:
    ids = [t.id for t in targets if t.id in rows]
    return {k: rows[k] for k in ids + sorted(set(rows) - set(ids))}


def load_rows(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text())
    rows = doc.get("rows", {}) if isinstance(doc, dict) else {}
    return dict(rows) if isinstance(rows, dict) else {}


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def results_text(rows: Mapping[str, Any]) -> str:
    return json.dumps({"about": "porter on real upstream trees: benchmarks/real_trees.py, one row per target of "
                                "benchmarks/real_trees.toml (docs/real-trees.md)", "rows": rows},
                      indent=1, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------------------------- the report

RESULT_MARK = {"ok": "✓", "failed": "✗", "skipped": "skipped"}


def _cell(text: str, limit: int = 0) -> str:
    text = " ".join(str(text).split())
    if limit and len(text) > limit:
        text = text[:limit - 1] + "…"
    return text.replace("|", "\\|")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def tree_cell(row: Mapping[str, Any]) -> str:
    src = row.get("source") or {}
    if src.get("repo"):
        text = f"{src['repo']}@{src.get('ref', '')}"
        if src.get("commit"):
            text += f" `{src['commit'][:9]}`" + (f" ({src['commit_date']})" if src.get("commit_date") else "")
    else:
        text = f"{src.get('sdist', '')} (sdist)"
    if row.get("generation"):
        text += f", {row['generation']} kernels"
    return _cell(text)


def wave64_states(docs: Sequence[Any]) -> dict[str, int]:
    """The warp-size-32 findings of the row's ROCm build per state (fixed, safe, allowed), from its own report."""
    counts: Counter[str] = Counter()
    for d in docs:
        w = d.get("wave64") if isinstance(d, dict) else None
        if isinstance(w, dict) and isinstance(w.get("counts"), dict):
            counts.update({str(k): int(v) for k, v in w["counts"].items() if isinstance(v, int)})
    return dict(sorted(counts.items()))


def wave64_cell(row: Mapping[str, Any]) -> str:
    """'3/3', '2/3 (layer_norm ✗)': the kernel families that passed their checks at wave 64 out of those the
    emulated build produced; '—' for a command that checks nothing at wave 64, a row written before the column, or a
    check that did not run."""
    w = row.get("wave64")
    if not isinstance(w, Mapping):
        return "—"
    if w.get("error"):
        return f"✗ ({w['error']})"
    bad = [str(name).split(".", 1)[-1] for name, f in (w.get("families") or {}).items()
           if isinstance(f, Mapping) and not f.get("ok")]
    states = row.get("wave64_states") or {}
    found = f"; findings: {', '.join(f'{n} {k}' for k, n in states.items())}" if states else ""
    own_run = w.get("date") and (str(w["date"])[:10] != str(row.get("date", ""))[:10]
                                 or w.get("porter") != row.get("porter"))
    if own_run:  # --wave64-only: checked later than the row's ROCm run
        found += f" (checked {str(w['date'])[:10]}, porter {w.get('porter') or '?'})"
    return f"{w.get('passed', 0)}/{w.get('built', 0)}" + (f" ({', '.join(f'{b} ✗' for b in bad)})" if bad else "") \
        + found


def table_row(row: Mapping[str, Any]) -> str:
    """One line of the report's table."""
    done, total = row.get("ops_done", 0), row.get("ops_total", 0)
    extra = [f"+{n} {what}" for n, what in ((row.get("ops_excluded", 0), "excluded"),
                                            (row.get("ops_left_out", 0), "left out")) if n]
    ops = (f"{done}/{total}" + (f" ({', '.join(extra)})" if extra else "")) if total or extra else "—"
    per_arch = row.get("arch_summary") or row.get("detail") or "—"
    error = row.get("reason", "") if row.get("result") == "skipped" else row.get("first_error", "")
    date = str(row.get("date", ""))[:10] + (f" ({row['porter']})" if row.get("porter") else "")
    cells = [f"`{row['id']}`", tree_cell(row), f"`{_cell(command_cell(row.get('argv', '')))}`",
             RESULT_MARK.get(row.get("result", ""), str(row.get("result", ""))), _cell(per_arch, 140), ops,
             _cell(wave64_cell(row), 120),
             _duration(float(row.get("seconds") or 0)) if row.get("result") != "skipped" else "—", date,
             _cell(error, 220)]
    return "| " + " | ".join(cells) + " |"


INTRO = """\
# porter on real trees

What porter does with real upstream trees, not fixtures: Megatron-DeepSpeed (microsoft's, BigScience's, and
national-lab and site ports of both kernel generations), DeepSpeed releases from PyPI, ROCm apex branches,
ROCm FlashAttention and the RCCL network plugin. Each row is one porter command on one tree at one commit, run
by `benchmarks/real_trees.py` from the targets in `benchmarks/real_trees.toml`; the full rows (per op and per
arch, every step's exit code) are in [real-trees.json](real-trees.json).

A row is ✓ when every step exited 0, printed no Python traceback, no op failed and every kernel checked at wave
64 passed. "per arch" counts, for each GPU arch, the kernels that compiled for it out of those with device code;
"ops" counts the ops or kernels compiled (or built) out of those attempted, plus those the tree itself excludes
for this toolchain and those porter's planner left out (both listed below the table, with the reason). Compiles
are compile-only where no ROCm torch exists here: objects for every arch, nothing linked.

"checked at wave 64" is what no compile can show: whether the kernels compute the right thing on the 64-lane
wavefronts of gfx90a, gfx942 and gfx950. The Megatron, DeepSpeed and apex compile-only rows also build the same
hipified kernels for porter's emulated wave-64 target (`-t emulate-wave64`: compiled for the CPU, wavefronts of
64 lanes) and run `porter emulate check` on them against a float32 torch reference ([emulate.md](emulate.md)
says what it models and what a pass cannot prove). The cell counts the kernel families that passed every check
out of those the emulated build produced: the Megatron softmax kernels and the BLOOM-era layer norm, DeepSpeed's
fused_adam, fused_lamb and fused_lion, apex's amp_C, fused_layer_norm_cuda and syncbn; a family that failed is
named (`2/3 (layer_norm ✗)`) and makes the row ✗, with its first failing check as the first error. `0/0`: the
tree has no kernel porter checks. `—`: the command checks nothing at wave 64, the row predates the column, or an
earlier step failed. "findings: 3 safe, 27 allowed": the states the ROCm build gave its warp-size-32 findings (a
compile row builds every kernel with `--allow-wave32 all`; without it the allowed ones are refused; `--wave64-only`
counts them with a dry run of that build). "(checked DATE, porter REV)": the check ran later than the row's ROCm
build (`--wave64-only`), on the same tree commit. Every porter step runs with `--json` (left out of the table), and the rows are read from those documents. Paths in errors are
shortened: TREE, WORK (the target's folder), ROOT (the toolchain's chroot), TMP, SITE (site-packages), `.`
(porter's checkout). "date (porter)" names the porter commit a row ran with (`+dirty`: with changes not yet
committed).

## Run it on your own fork

1. Add a target to `benchmarks/real_trees.toml`:

   ```toml
   [[target]]
   id = "mds-myfork-port"
   repo = "me/Megatron-DeepSpeed"
   ref = "my-branch"
   command = "port-compile-only"   # or port-no-kernels, apex-compile-only, ...
   toolchain = "debian-rocm7"
   archs = ["gfx90a", "gfx942"]
   ```

2. Put a bare clone of it at `MIRRORS/me+Megatron-DeepSpeed/repo` (`git clone --bare <url> ...`). A submodule
   (FlashAttention's `csrc/composable_kernel`) comes from a bare clone of its own project beside it, at the commit
   your tree pins: add `submodules = {"csrc/composable_kernel" = "ROCm/composable_kernel"}` to the target.
3. `PORTER_GAUNTLET_MIRRORS=MIRRORS python benchmarks/real_trees.py --only 'mds-myfork-*'`

What the machine needs: each toolchain's own set-up (`make chroot-rocm7` for `debian-rocm7`) and, for
DeepSpeed's async_io, libaio's headers on the host that runs porter (Debian `libaio-dev`): async_io's
`is_compatible()` asks the build python's C compiler for libaio, and without it the op is listed as excluded,
with DeepSpeed's reason.

`--dry-run` prints the commands, `--list` the targets and their last results, `--skip-done` /
`--rerun-failed` resume a long run, `-j N` runs N targets at once (each compile gets porter's own `-j`).

How long: on a 2-core machine a Megatron port row takes under a second and its compile-only row 2 to 6 minutes,
a DeepSpeed compile-only row 8 to 21 minutes (both before their wave-64 build and check, which a row's wall time
includes), an apex branch 35 to 60 minutes, and a FlashAttention CK covering
sample (7 generated instances and the extension's own sources, for every arch) 10 to 20 minutes. The
FlashAttention rows leave out upstream's `-mllvm -amdgpu-early-inline-all=true` (`--drop-flag`, in the row's
command). With it, Debian's clang 22 inlines every function of a kernel before simplifying any, and the loop
passes then crawl through one function of over a million IR instructions: a backward instance's part for one
arch ran over 70 minutes without finishing, against 35 s without the flag (docs/wheels.md). Compile-only
compiles each arch of a kernel unit as a part of its own, so a run stopped inside a unit keeps the archs it
finished and the rerun compiles the rest. The whole list takes about eight hours of one machine (the sum of the
rows' times).
SIGTERM stops a run without recording the
stopped row, and `--skip-done` picks up where it stopped (finished objects stay in porter's cache).
"""


def command_cell(argv: str) -> str:
    """The report's command: the step that does the work (a multi-step command's build), without --json."""
    steps = argv.split(" && ")
    main = next((st for st in steps if " build " in st or " --compile-only" in st), steps[0])
    return main.replace(" --json", "") + (f" (+{len(steps) - 1} steps)" if len(steps) > 1 else "")


def render(rows: Mapping[str, Any], targets: Sequence[Target]) -> str:
    """docs/real-trees.md: the intro, one table (every target in the targets file's order, run or not), what
    the trees exclude and porter leaves out, notes per tree."""
    rows = ordered(rows, targets)
    counts = Counter(str(r.get("result")) for r in rows.values())
    not_run = [t for t in targets if t.id not in rows]
    summary = ", ".join(f"{counts[k]} {w}" for k, w in (("ok", "✓"), ("failed", "✗"), ("skipped", "skipped"))
                        if counts[k]) + (f", {len(not_run)} not run yet" if not_run else "")
    lines = [INTRO, "## Results", "", f"{len(targets)} targets: {summary}.", "",
             "| target | tree | command | result | per arch | ops | checked at wave 64 | wall | date (porter) "
             "| first error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    by_id = {t.id: t for t in targets}
    for rid in [t.id for t in targets] + [r for r in rows if r not in by_id]:
        if rid in rows:
            lines.append(table_row(rows[rid]))
        else:
            t = by_id[rid]
            lines.append("| " + " | ".join([f"`{t.id}`", _cell(t.source_text), f"`{_cell(command_cell(display(t)))}`",
                                             "not run", "—", "—", "—", "—", "—", ""]) + " |")
    for status, title, words in (
            ("excluded", "Excluded by the tree itself",
             "Ops whose own builder says this toolchain cannot build them (DeepSpeed's `is_compatible()`), with "
             "its reason:"),
            ("left-out", "Left out by porter",
             "Ops porter's planner did not plan (it could not read their sources or flags from the builder), "
             "with why:")):
        found = [(r["id"], [o for o in r.get("ops", []) if o.get("status") == status]) for r in rows.values()]
        found = [(i, ops) for i, ops in found if ops]
        if found:
            lines += ["", f"## {title}", "", words, ""]
            for rid, ops in found:
                lines.append(f"- `{rid}`: " + "; ".join(
                    f"{o['name']} ({_cell(o.get('reason') or 'no reason', 160)})" for o in ops))
    notes: dict[str, list[str]] = {}
    for t in targets:
        if t.note and t.note not in notes.setdefault(t.source_text, []):
            notes[t.source_text].append(t.note)
    if any(notes.values()):
        lines += ["", "## The trees", ""]
        lines += [f"- {src}: {_cell('; '.join(n))}" for src, n in notes.items() if n]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- running

def _git(mirror: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "--git-dir", str(mirror), *args], capture_output=True, text=True,
                          env=dict(env) if env is not None else None)


def resolve(mirror: Path, ref: str) -> tuple[str, str] | None:
    """(commit, commit date) of ref in the mirror, None when it has no such ref."""
    res = _git(mirror, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if res.returncode != 0:
        return None
    commit = res.stdout.strip()
    date = _git(mirror, "log", "-1", "--format=%cs", commit).stdout.strip()
    return commit, date


def checkout_paths(mirror: Path, commit: str, paths: Sequence[str] | None) -> list[str]:
    """The pathspecs to check out: the whole tree ('.'), or the given paths with TOP_FILES expanded."""
    if paths is None:
        return ["."]
    out: list[str] = []
    for p in paths:
        if p == TOP_FILES:
            listing = _git(mirror, "ls-tree", commit).stdout.splitlines()
            out += [ln.split("\t", 1)[1] for ln in listing if "\t" in ln and ln.split()[1] == "blob"]
        else:
            out.append(p)
    return out


def checkout(mirror: Path, commit: str, dest: Path, paths: Sequence[str] | None) -> list[str]:
    """Check out what a command needs of commit into dest through a private index (a snapshot may lack
    its largest files, so a whole-tree checkout can fail): all at once, else one top-level entry (or given
    path) at a time, leaving out those that fail. Returns what was left out."""
    dest.mkdir(parents=True, exist_ok=True)
    index = dest.parent / f"{dest.name}.index"
    env = {**os.environ, "GIT_INDEX_FILE": str(index)}
    base = ["--work-tree", str(dest), "checkout", commit, "--"]
    specs = checkout_paths(mirror, commit, paths)
    try:
        if _git(mirror, *base, *specs, env=env).returncode == 0:
            return []
        if specs == ["."]:
            specs = [ln.split("\t", 1)[1] for ln in _git(mirror, "ls-tree", commit).stdout.splitlines() if "\t" in ln]
        left_out = []
        for spec in specs:
            if _git(mirror, *base, spec, env=env).returncode != 0:
                left_out.append(spec)
        return left_out
    finally:
        index.unlink(missing_ok=True)


def pinned(mirror: Path, commit: str, path: str) -> str:
    """The commit a superproject's commit pins at a submodule path ('' when that path is no submodule there)."""
    out = _git(mirror, "ls-tree", commit, "--", path).stdout.split()
    return out[2] if len(out) >= 3 and out[0] == "160000" else ""


def has_commit(mirror: Path, commit: str) -> bool:
    return _git(mirror, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def megatron_generation(tree: Path) -> str:
    kernels = tree / "megatron" / "fused_kernels"
    if not kernels.is_dir():
        return ""
    if (kernels / "scaled_softmax.cpp").is_file():
        return "2023+"
    if (kernels / "layer_norm_cuda.cpp").is_file():
        return "BLOOM-era"
    return "other"


def run_step(name: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, timeout: float) -> Step:
    """Run one step in a session of its own (a timeout or Ctrl-C stops it and everything it started)."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(env), cwd=cwd, start_new_session=True)
    except OSError as exc:
        return Step(name, 127, 0.0, "", f"ERROR: cannot run {argv[0]}: {exc}")
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        out, err = proc.communicate(timeout=max(timeout, 1))
        timed_out = False
    except subprocess.TimeoutExpired:
        _stop(proc)
        out, err = proc.communicate()
        timed_out = True
    except BaseException:
        _stop(proc)
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    return Step(name, proc.returncode, time.monotonic() - start, out, err, timed_out)


_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()
"""Set by SIGTERM: the steps it stopped failed because of it, so their rows are not recorded (the earlier row
stays)."""


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM (a time limit, kill): stop every running step's process group (its porter stops its compilers),
    whichever thread runs it, then exit; the rows already merged are kept."""
    _STOPPING.set()
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _stop(proc)
    raise SystemExit(128 + signum)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the step's process group (porter stops ninja and its compilers), SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Runner:
    targets: list[Target]
    mirrors: Path | None
    work: Path
    porter: list[str]
    env: dict[str, str]
    jobs: int | None
    timeout: float
    results: Path
    report: Path
    porter_rev: str = ""
    porter_dry_run: bool = False
    wave64_only: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _toolchains: dict[str, str] = field(default_factory=dict)

    def scrub(self, target: Target) -> Scrub:
        home = os.path.expanduser("~")
        return Scrub([(str(self.work / target.id / "tree"), "TREE"), (str(self.work / target.id), "WORK"),
                      (str(self.work), "WORK"), (str(self.mirrors or ""), "MIRRORS"), (str(ROOT), "."),
                      (home, "~")])

    def toolchain_problem(self, name: str) -> str:
        """Why the toolchain cannot compile here ('' when it can): a chroot or a compiler that is missing."""
        if name in self._toolchains:
            return self._toolchains[name]
        res = subprocess.run([*self.porter, "toolchain", "show", name, "--json"], capture_output=True, text=True,
                             env=self.env)
        doc = parse_json(res.stdout)
        problem = ""
        if res.returncode != 0 or not isinstance(doc, dict):
            lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
            problem = f"toolchain {name}: porter toolchain show failed ({lines[-1] if lines else res.returncode})"
        elif doc.get("kind") != "cpu":
            root = doc.get("launcher_root") or ""
            setup = f" (set it up: {doc['setup']})" if doc.get("setup") else ""
            compiler = str(doc.get("compiler") or "")
            path = Path(root or "/") / str(doc.get("root") or "/usr").lstrip("/") / "bin" / compiler
            if root and not Path(root).is_dir():
                problem = f"toolchain {name}: its root is not set up here{setup}"
            elif not path.is_file() and not (not root and shutil.which(compiler)):
                problem = f"toolchain {name}: no {compiler} in it here{setup}"
        self._toolchains[name] = problem
        return problem

    def prepare(self, target: Target, folder: Path, *, dry_run: bool = False) -> tuple[str, dict[str, Any], str]:
        """(src for the argv, the row's source, why it is skipped or '')."""
        command = COMMANDS[target.command]
        if command.skip:
            return "", _declared_source(target), command.skip
        if not target.repo:
            return target.sdist, _declared_source(target), ""
        source: dict[str, Any] = _declared_source(target)
        if self.mirrors is None:
            return "", source, "no --mirrors given (or PORTER_GAUNTLET_MIRRORS): git trees are not read"
        mirror = mirror_dir(self.mirrors, target.repo)
        if not mirror.is_dir():
            return "", source, f"no clone of {target.repo} under the mirrors ({target.mirror_name}/repo)"
        found = resolve(mirror, target.ref)
        if found is None:
            return "", source, f"{target.repo} has no ref {target.ref} in its snapshot"
        source.update(commit=found[0], commit_date=found[1])
        subs: list[tuple[str, Path, str]] = []
        for path, repo in target.submodules:  # a git snapshot carries no submodule: its pinned commit, from a mirror
            pin = pinned(mirror, found[0], path)
            sub = mirror_dir(self.mirrors, repo)
            if not pin:
                return "", source, f"{path} is no submodule of {target.repo}@{found[0][:9]}"
            source.setdefault("submodules", {})[path] = f"{repo}@{pin}"
            if not sub.is_dir():
                return "", source, f"no clone of {repo} under the mirrors for the submodule {path}"
            if not has_commit(sub, pin):
                return "", source, (f"{repo}'s snapshot lacks {pin[:9]}, the commit {target.repo}@{found[0][:9]} "
                                    f"pins at {path}")
            subs.append((path, sub, pin))
        tree = folder / "tree"
        if dry_run:
            return str(tree), source, ""
        left_out = checkout(mirror, found[0], tree, target.paths if target.paths is not None else command.paths)
        for path, sub, pin in subs:
            left_out += [f"{path}/{p}" for p in checkout(sub, pin, tree / path, None)]
        if left_out:
            source["left_out"] = left_out
        missing = [r for r in target.requires if not (tree / r).exists()]
        if missing:
            return str(tree), source, f"the tree lacks {', '.join(missing)} (not in the snapshot)"
        return str(tree), source, ""

    def run_target(self, target: Target) -> dict[str, Any]:
        started = time.time()
        folder = self.work / target.id
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        src, source, reason = self.prepare(target, folder)
        command = COMMANDS[target.command]
        if not reason and command.toolchain:
            reason = self.toolchain_problem(target.toolchain)
        if reason:
            return skipped_row(target, reason, started=started, source=source, porter_rev=self.porter_rev)
        ctx = context(target, src=src, work=str(folder), porter=self.porter,
                      jobs=self.jobs if command.toolchain else None, python=sys.executable)
        steps: list[Step] = []
        deadline = time.monotonic() + self.timeout
        steps_argv = argvs(target, ctx)
        if self.porter_dry_run:
            steps_argv = plan_only(steps_argv, self.porter)
        if self.wave64_only:
            steps_argv = [(n, a) for n, a in steps_argv if is_wave64(n)]
        for name, argv in steps_argv:
            step = run_step(name, argv, env=self.env, cwd=folder, timeout=deadline - time.monotonic())
            (folder / f"{name}.stdout").write_text(step.stdout)
            (folder / f"{name}.stderr").write_text(step.stderr)
            steps.append(step)
            if step.failed:
                break
        if self.wave64_only:
            with self._lock:
                earlier = load_rows(self.results).get(target.id)
            return with_wave64(earlier, target, steps, started=started, source=source, porter_rev=self.porter_rev,
                               scrub=self.scrub(target))
        generation = megatron_generation(folder / "tree") if target.repo else ""
        return make_row(target, steps, started=started, source=source, generation=generation,
                        porter_rev=self.porter_rev, jobs=self.jobs if command.toolchain else None,
                        scrub=self.scrub(target))

    def run_and_record(self, target: Target) -> dict[str, Any] | None:
        """Run a target and merge its row; None when SIGTERM stopped it (nothing recorded: a stopped step is
        not a result)."""
        row = self.run_target(target)
        if _STOPPING.is_set():
            return None
        self.record(row)
        return row

    def record(self, row: Mapping[str, Any]) -> None:
        """Merge the row into the results and rewrite the report, under a lock file beside the results: two runs
        of the gauntlet (a full one, a --wave64-only one) may record into the same files."""
        import fcntl

        with self._lock, open(str(self.results) + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            rows = ordered(merge_rows(load_rows(self.results), [row]), self.targets)
            write_atomic(self.results, results_text(rows))
            write_atomic(self.report, render(rows, self.targets))

    def dry_run(self, targets: Sequence[Target]) -> None:
        for t in targets:
            folder = self.work / t.id
            src, source, reason = self.prepare(t, folder, dry_run=True)
            print(f"# {t.id}: {t.command} on {t.source_text}" + (f" ({source['commit'][:12]})"
                                                                 if source.get("commit") else ""))
            if reason:
                print(f"#   skipped: {reason}")
                continue
            command = COMMANDS[t.command]
            if t.repo:
                mirror = mirror_dir(self.mirrors, t.repo)  # type: ignore[arg-type]
                specs = checkout_paths(mirror, source["commit"], t.paths if t.paths is not None else command.paths)
                print(f"GIT_INDEX_FILE={shlex.quote(str(folder))}/tree.index git --git-dir "
                      f"{shlex.quote(str(mirror))} --work-tree {shlex.quote(src)} checkout {source['commit'][:12]} -- "
                      + shlex.join(specs))
            ctx = context(t, src=src, work=str(folder), porter=self.porter,
                          jobs=self.jobs if command.toolchain else None, python=sys.executable)
            for path, repo in t.submodules:
                print(f"#   submodule {path}: {source['submodules'][path]} from the mirror of {repo}")
            if t.requires:
                print(f"#   requires {', '.join(t.requires)} in the tree (else skipped)")
            steps = argvs(t, ctx)
            for _, argv in plan_only(steps, self.porter) if self.porter_dry_run else steps:
                print(shlex.join(argv))


def porter_revision() -> str:
    """porter's commit, '+dirty' when porter/, ops_prebuild/ or patches/ have changes not committed."""
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if rev.returncode != 0:
        return ""
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "porter", "ops_prebuild",
                            "patches"], capture_output=True, text=True).stdout.strip()
    return rev.stdout.strip() + ("+dirty" if dirty else "")


def select(targets: Sequence[Target], rows: Mapping[str, Any], only: Sequence[str], skip_done: bool,
           rerun_failed: bool) -> list[Target]:
    """The targets this run takes: --only patterns (any), then --skip-done (no row, or only skipped) and
    --rerun-failed (the last row failed); given both, either one."""
    out = [t for t in targets if not only or any(fnmatch.fnmatchcase(t.id, p) for p in only)]
    if skip_done or rerun_failed:
        def keep(t: Target) -> bool:
            result = (rows.get(t.id) or {}).get("result")
            return (skip_done and result in (None, "skipped")) or (rerun_failed and result == "failed")
        out = [t for t in out if keep(t)]
    return out


def run_targets(runner: Runner, chosen: Sequence[Target], parallel: int) -> int:
    """Run ``chosen``, ``parallel`` at once, each row merged as it finishes; 1 when a row failed. After SIGTERM no
    target starts any more (those queued behind the stopped ones are dropped, not run)."""
    failed = finished = 0
    started = time.monotonic()

    def one(t: Target) -> None:
        nonlocal failed, finished
        if _STOPPING.is_set():
            return
        print(f"==> {t.id}: {t.command} on {t.source_text}", file=sys.stderr, flush=True)
        row = runner.run_and_record(t)
        if row is None:
            print(f"    stopped {t.id}: not recorded (its earlier row, if any, stays)", file=sys.stderr, flush=True)
            return
        mark = RESULT_MARK[row["result"]]
        why = row.get("reason") or row.get("first_error") or row.get("arch_summary") or row.get("detail") or ""
        with runner._lock:
            finished += 1
            count = f"[{finished}/{len(chosen)} targets, {_duration(time.monotonic() - started)}]"
        print(f"    {mark} {t.id} ({_duration(row['seconds'])}) {count} {why[:200]}", file=sys.stderr, flush=True)
        if row["result"] == "failed":
            failed += 1

    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        for fut in concurrent.futures.as_completed([pool.submit(one, t) for t in chosen]):
            fut.result()
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=Path, default=TARGETS)
    ap.add_argument("--results", type=Path, default=RESULTS, help="the JSON rows (default docs/real-trees.json)")
    ap.add_argument("--report", type=Path, default=REPORT, help="the table (default docs/real-trees.md)")
    ap.add_argument("--mirrors", type=Path, default=os.environ.get("PORTER_GAUNTLET_MIRRORS") or None,
                    help="folder of bare clones, <owner>+<name>/repo (default $PORTER_GAUNTLET_MIRRORS; "
                         "without it git targets are skipped)")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("PORTER_GAUNTLET_WORK")
                                                      or Path(tempfile.gettempdir()) / "porter-gauntlet"),
                    help="where each target's tree, outputs and logs go ($PORTER_GAUNTLET_WORK)")
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="porter's cache for every run (PORTER_CACHE_DIR; default: porter's own, so the "
                         "compiler cache and downloaded sdists are reused)")
    ap.add_argument("--porter", default="", help="the porter command (default: this python -m porter)")
    ap.add_argument("--only", action="append", default=[], metavar="PATTERN",
                    help="target ids to run (fnmatch; repeatable)")
    ap.add_argument("--skip-done", action="store_true", help="leave out targets that already have a result")
    ap.add_argument("--rerun-failed", action="store_true", help="run only targets whose last result failed")
    ap.add_argument("-j", "--parallel", type=int, default=None,
                    help="targets at once (default: 1 on 2 cores or fewer, else cores // 4)")
    ap.add_argument("--jobs", type=int, default=None, help="porter's -j for a compile (default: cores // -j)")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per target (default 4 h)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands; run and write nothing")
    ap.add_argument("--porter-dry-run", action="store_true",
                    help="run porter's own --dry-run of each step instead (plans: cheap, catches what fails "
                         "before compiling); give --results / --report elsewhere to keep the real rows apart")
    ap.add_argument("--wave64-only", action="store_true",
                    help="run only the wave-64 steps (emulated build and check) of the chosen Megatron and DeepSpeed "
                         "compile targets, into their earlier rows: the row keeps its ROCm run's date and porter, "
                         "its wave64 field gets this run's")
    ap.add_argument("--list", action="store_true", help="list the targets and their last results")
    ap.add_argument("--render-only", action="store_true", help="rewrite the report from the JSON rows")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        targets = load_targets(args.targets)
    except TargetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = load_rows(args.results)
    if args.render_only:
        write_atomic(args.report, render(ordered(rows, targets), targets))
        return 0
    chosen = select(targets, rows, args.only, args.skip_done, args.rerun_failed)
    if args.wave64_only:
        chosen = [t for t in chosen if has_wave64(t.command)]
    if args.list:
        for t in chosen:
            r = rows.get(t.id) or {}
            print(f"{t.id:<34} {t.command:<22} {t.toolchain:<13} {t.source_text:<52} "
                  f"{r.get('result', '-'):<8} {str(r.get('date', ''))[:10]}")
        return 0
    cores = os.cpu_count() or 1
    parallel = max(1, args.parallel or (1 if cores <= 2 else cores // 4))
    env = {**os.environ, "HIP_PLATFORM": "amd"}
    if args.cache_dir:
        env["PORTER_CACHE_DIR"] = str(args.cache_dir.resolve())
    runner = Runner(targets=targets, mirrors=args.mirrors.resolve() if args.mirrors else None,
                    work=args.work.resolve(), porter=shlex.split(args.porter) or [sys.executable, "-m", "porter"],
                    env=env, jobs=args.jobs or max(1, cores // parallel), timeout=args.timeout,
                    results=args.results, report=args.report, porter_rev=porter_revision(),
                    porter_dry_run=args.porter_dry_run, wave64_only=args.wave64_only)
    if args.dry_run:
        runner.dry_run(chosen)
        return 0
    if not chosen:
        print("nothing to run", file=sys.stderr)
        return 0
    return run_targets(runner, chosen, parallel)


if __name__ == "__main__":
    sys.exit(main())
