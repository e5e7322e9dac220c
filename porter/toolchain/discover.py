"""Find programs and propose a profile. Detection only *proposes*: no build ever uses it implicitly."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from porter.errors import CommandFailed, ToolError
from porter.run import Runner

_VERSION_PATTERNS = {
    "hipcc": re.compile(r"HIP version:\s*([0-9][0-9.]*)"),
    "nvcc": re.compile(r"release\s+([0-9]+\.[0-9]+)"),
    "clang": re.compile(r"clang version\s+([0-9][0-9.]*)"),
}


@dataclass(frozen=True)
class Program:
    path: str
    version: str


def version_of(kind: str, output: str) -> str:
    """Parse a compiler's ``--version`` output; 'unknown' when it does not match."""
    if kind in ("g++", "gcc", "c++"):
        m = re.search(r"^([0-9]+(?:\.[0-9]+)*)\s*$", output.strip(), re.M)
    else:
        m = _VERSION_PATTERNS.get(kind, _VERSION_PATTERNS["clang"]).search(output)
    return m.group(1).rstrip(".") if m else "unknown"


def probe(program: str, runner: Runner, *, launcher: tuple[str, ...] = (),
          env: Mapping[str, str] | None = None) -> Program:
    """Run a compiler for its version (inside the launcher when given)."""
    base = os.path.basename(program)
    kind = next((k for k in ("hipcc", "nvcc") if base.startswith(k)), "clang" if "clang" in base else "g++")
    try:
        result = runner.run([*launcher, program, "-dumpfullversion" if kind == "g++" else "--version"], env=env,
                            timeout=60, check=False)
    except ToolError:
        raise ToolError(f"compiler not found: {program}",
                        hint="install it, or set 'compiler' in the toolchain profile to its full path") from None
    if result.returncode == 127 or (launcher and "No such file" in result.output):
        raise ToolError(f"compiler not found: {program} (via {' '.join(launcher)})",
                        hint="install it in that environment, or fix the profile's launcher")
    if not result.ok:
        raise CommandFailed(result.argv, result.returncode, result.output)
    return Program(program if launcher else (shutil.which(program) or program), version_of(kind, result.output))


def find(name: str, dirs: list[Path], environ: Mapping[str, str]) -> str | None:
    for d in dirs:
        if (d / name).is_file() and os.access(d / name, os.X_OK):
            return str(d / name)
    return shutil.which(name, path=environ.get("PATH", ""))


def detect(runner: Runner, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What this host has: compilers with versions, visible GPUs, and a *proposed* profile."""
    environ = dict(os.environ if environ is None else environ)
    dirs = {kind: [Path(environ[var]) / "bin" for var in names if environ.get(var)]
            for kind, names in (("rocm", ("ROCM_PATH", "HIP_PATH")), ("cuda", ("CUDA_HOME", "CUDA_PATH")))}
    env = {**environ, "HIP_PLATFORM": environ.get("HIP_PLATFORM", "amd")}
    programs: dict[str, dict[str, str]] = {}
    for name, where in (("hipcc", dirs["rocm"]), ("amdclang++", dirs["rocm"]),
                        ("nvcc", dirs["cuda"]), ("g++", [])):
        if path := find(name, where, environ):
            try:
                prog = probe(path, runner, env=env)
                programs[name] = {"path": prog.path, "version": prog.version}
            except (ToolError, CommandFailed) as exc:
                programs[name] = {"path": path, "version": "unknown", "error": str(exc)}
    gpus = _visible_gpus(runner, environ, dirs)
    proposal: dict[str, Any]
    if "hipcc" in programs:
        ver = programs["hipcc"]["version"]
        archs = sorted({g["arch"] for g in gpus if g["arch"].startswith("gfx")})
        proposal = {"name": "detected", "kind": "rocm", "toolkit_version": ".".join(ver.split(".")[:2]),
                    "root": str(Path(programs["hipcc"]["path"]).parent.parent),
                    "compiler": programs["hipcc"]["path"], "compiler_version": f"=={ver}" if ver != "unknown" else "",
                    "archs": archs or ["gfx90a"], "cpu_isa": "x86-64-v2", "env": {"HIP_PLATFORM": "amd"}}
    elif "nvcc" in programs:
        archs = sorted({g["arch"] for g in gpus if g["arch"].startswith("sm_")})
        proposal = {"name": "detected", "kind": "cuda", "toolkit_version": programs["nvcc"]["version"],
                    "root": str(Path(programs["nvcc"]["path"]).parent.parent),
                    "compiler": programs["nvcc"]["path"], "archs": archs or ["sm_90"], "cpu_isa": "x86-64-v2"}
    else:
        proposal = {"name": "detected", "kind": "cpu", "compiler": programs.get("g++", {}).get("path", "g++"),
                    "cpu_isa": "x86-64-v2"}
    return {"programs": programs, "gpus": gpus, "proposal": proposal,
            "notes": ["no GPU visible: the proposed archs are a placeholder; edit them for your nodes"]
            if proposal["kind"] != "cpu" and not gpus else []}


def _visible_gpus(runner: Runner, environ: Mapping[str, str], dirs: dict[str, list[Path]]) -> list[dict[str, str]]:
    gpus: list[dict[str, str]] = []
    if rocminfo := find("rocminfo", dirs["rocm"], environ):
        res = runner.run([rocminfo], env=dict(environ), timeout=30, check=False)
        if res.ok:
            gpus += [{"arch": m, "source": "rocminfo"}
                     for m in re.findall(r"^\s*Name:\s*(gfx[0-9a-f]+)\s*$", res.output, re.M)]
    if smi := find("nvidia-smi", dirs["cuda"], environ):
        res = runner.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                         env=dict(environ), timeout=30, check=False)
        if res.ok:
            for line in res.output.strip().splitlines():
                name, _, cap = line.rpartition(",")
                if re.fullmatch(r"\s*\d+\.\d+\s*", cap):
                    gpus.append({"arch": "sm_" + cap.strip().replace(".", ""), "name": name.strip(),
                                 "source": "nvidia-smi"})
    return gpus


def to_toml(profile: Mapping[str, Any]) -> str:
    """Render a proposed profile as TOML (flat keys plus an [env] table)."""
    lines = ["# proposed by 'porter toolchain detect': check every value, archs above all"]
    lines += [f"{key} = [{', '.join(_q(v) for v in value)}]" if isinstance(value, list) else f"{key} = {_q(str(value))}"
              for key, value in profile.items() if key != "env"]
    if profile.get("env"):
        lines += ["", "[env]", *(f"{k} = {_q(v)}" for k, v in profile["env"].items())]
    return "\n".join(lines) + "\n"


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
