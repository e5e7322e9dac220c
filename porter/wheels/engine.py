"""Turn an upstream tree into a verified, labelled wheel: the one algorithm behind every driver.

    resolve source -> detect -> plan -> check torch -> copy -> patch -> pip wheel -> verify -> label -> manifest

The user's tree is never touched: the build runs on a copy (pip builds in place and setup.py scripts
write into their own tree). ``--dry-run`` stops after the torch check and reports the plan, with the
exact command and environment, through a recording runner.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from porter import __version__
from porter.errors import CheckFailed, ConfigError, ToolError
from porter.log import Logger, quiet_logger
from porter.manifest import ExtensionEntry, Manifest, OpEntry, atomic_write_json, manifest_path, sha256_file
from porter.run import RecordingRunner, Runner, env_changes
from porter.toolchain.profile import Toolchain, toolchain_env
from porter.wheels.base import BuildPlan, Machine, SourceInfo, WheelDriver, WheelRequest
from porter.wheels.verify import relabel, verify_wheel

PatchHook = Callable[..., None]
"""``hook(tree, ref, version, log, dry_run=)``: apply a patch set to the work copy before building."""

_SPEC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+$")
_IGNORE = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".eggs")

TORCH_PROBE = (
    "import json\n"
    "try:\n"
    "    import torch\n"
    "except Exception as exc:\n"
    "    print(json.dumps({'error': f'{type(exc).__name__}: {exc}'}))\n"
    "else:\n"
    "    print(json.dumps({'version': torch.__version__, 'hip': getattr(torch.version, 'hip', None),\n"
    "                      'cuda': getattr(torch.version, 'cuda', None)}))\n"
)


@dataclass(frozen=True)
class TorchInfo:
    version: str
    kind: str          # rocm | cuda | cpu
    hip: str | None = None
    cuda: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "kind": self.kind, "hip": self.hip, "cuda": self.cuda}


@dataclass(frozen=True)
class WheelResult:
    plan: BuildPlan
    argv: list[str]
    env: dict[str, str | None]
    """What the build command's environment changes relative to the caller's."""
    torch: TorchInfo | None
    wheel: Path | None = None
    manifest: Path | None = None
    dry_run: bool = False
    refusal: ConfigError | None = None
    """Dry run only: why the real build would be refused before compiling (e.g. the torch check)."""

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "plan": self.plan.to_dict(), "command": self.argv, "env": self.env,
                "torch": self.torch.to_dict() if self.torch else None,
                "wheel": str(self.wheel) if self.wheel else None,
                "manifest": str(self.manifest) if self.manifest else None,
                "refusal": self.refusal.message if self.refusal else None}

    def describe(self) -> str:
        """The plan as a user can read and replay it (``--dry-run`` prints this)."""
        p = self.plan
        lines = [f"# porter plan: {p.project} {p.version} (regime {p.regime}"
                 + (f", backend {p.backend}" if p.backend else "") + f") -> label +{p.label}"]
        lines += [f"# {n}" for n in p.notes]
        if self.torch:
            lines.append(f"# build torch: {self.torch.version} ({self.torch.kind})")
        lines.append(f"# MAX_JOBS={p.jobs}: {p.per_job_bytes / (1 << 30):.0f} GiB per job")
        sets = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()) if v is not None)
        unsets = " ".join(f"-u {k}" for k, v in sorted(self.env.items()) if v is None)
        lines.append("env " + " ".join(x for x in (unsets, sets) if x) + " \\\n    " + shlex.join(self.argv))
        e = p.expect
        checks = []
        if e.prebuilt:
            checks.append("at least one prebuilt .so")
        if e.modules:
            checks.append("modules " + ", ".join(e.modules))
        if e.packages:
            checks.append("packages " + ", ".join(e.packages))
        if e.archs:
            checks.append("code objects for " + ", ".join(e.archs) + " in every .so")
        lines.append("# verify: " + ("; ".join(checks) or "metadata only"))
        if self.wheel:
            lines.append(f"# wheel: {self.wheel}")
        if self.refusal:
            lines.append(f"# REFUSED before building: {self.refusal.message}")
        return "\n".join(lines)


# -- patch sets ----------------------------------------------------------------------------------

def apply_patch_set(tree: Path, ref: str, version: str, log: Logger, *, dry_run: bool = False) -> None:
    """Apply a patch set (``PROJECT/NAME``, ``PROJECT`` or a file) with porter's patch engine.

    In a dry run the sets are only checked against ``tree`` (nothing is written): a set that does not
    apply to this version stops the build before any compiling.
    """
    from porter.patching import apply, resolve_sets

    sets = resolve_sets(ref)
    applied = apply(tree, sets, target_version=version, dry_run=dry_run)
    if dry_run:
        log.info(f"patch set {ref}: applies to {version} ({len(applied.plan.changes)} file(s) would change)")
    else:
        log.info(f"patch set {ref}: {len(applied.changed)} file(s) changed")


# -- sources -------------------------------------------------------------------------------------

def resolve_source(source: str, driver: WheelDriver, work: Path, runner: Runner) -> tuple[Path, dict[str, str]]:
    """A directory as is; an sdist (.tar.gz) unpacked into ``work``; ``name==version`` downloaded first."""
    path = Path(source)
    provenance: dict[str, str] = {}
    if path.is_dir():
        return path.resolve(), _git_commit(path, provenance)
    if not path.exists() and _SPEC.match(source):
        dl = work / "download"
        dl.mkdir(parents=True, exist_ok=True)
        runner.run([_host_python(), "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "--no-build-isolation", "-d", str(dl), source],
                   env=_with(dict(driver.sdist_env)),
                   hint=f"check that {source} exists on the package index and the index is reachable")
        found = sorted(dl.glob("*.tar.gz"))
        if not found:
            raise ToolError(f"pip download {source} gave no .tar.gz sdist in {dl}")
        path = found[0]
        provenance["requirement"] = source
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
        provenance["sdist"] = path.name
        provenance["sdist_sha256"] = sha256_file(path)
        dest = work / "sdist"
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path) as tar:
            tar.extractall(dest, filter="data")
        tops = [p for p in dest.iterdir() if p.is_dir()]
        if len(tops) != 1:
            raise ConfigError(f"{path} is not an sdist with one top-level folder")
        return tops[0], provenance
    if not path.exists():
        raise ConfigError(f"source not found: {source}",
                          hint="pass a source directory, an sdist .tar.gz, or name==version to download one")
    raise ConfigError(f"{source} is neither a directory nor an sdist (.tar.gz)")


def _host_python() -> str:
    import sys
    return sys.executable


def _with(update: Mapping[str, str | None]) -> dict[str, str]:
    from porter.run import make_env
    return make_env(update)


def _git_commit(root: Path, out: dict[str, str]) -> dict[str, str]:
    """The checkout's commit, read from .git without running git (compute nodes may lack it)."""
    head = root / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            name = ref[5:]
            ref_file = root / ".git" / name
            if ref_file.is_file():
                ref = ref_file.read_text().strip()
            else:
                packed = (root / ".git" / "packed-refs").read_text()
                ref = next(ln.split()[0] for ln in packed.splitlines() if ln.endswith(" " + name))
        if re.fullmatch(r"[0-9a-f]{40}", ref):
            out["git_commit"] = ref
    except (OSError, StopIteration):
        pass
    return out


def detect(driver: WheelDriver, root: Path, others: Mapping[str, WheelDriver]) -> SourceInfo:
    info = driver.detect(root)
    if info is not None:
        return info
    for name, other in others.items():
        if name == driver.name:
            continue
        try:
            if other.detect(root) is not None:
                raise ConfigError(f"{root} is a {other.title} tree, not {driver.title}",
                                  hint=f"run 'porter wheel {name} --source {root}'")
        except ConfigError as exc:
            if "tree, not" in exc.message:
                raise
    raise ConfigError(f"{root} is neither a ROCm apex nor a flash-attention source tree "
                      "(expected setup.py with apex/__init__.py, or setup.py with flash_attn/__init__.py)",
                      hint="point --source at the top of an apex or flash-attention checkout or sdist")


# -- torch -------------------------------------------------------------------------------------

def probe_torch(runner: Runner, python: str, tc: Toolchain) -> TorchInfo:
    """What torch the build python has: torch.version.hip -> rocm, torch.version.cuda -> cuda, else cpu."""
    quiet = replace(runner, echo=False)
    runner.log.detail(f"asking {python} for its torch (torch.__version__, torch.version.hip / .cuda)")
    res = quiet.run(tc.argv(python, "-c", TORCH_PROBE), env=toolchain_env(tc), check=False,
                     hint=f"pass --python with the interpreter that has torch (tried {python})")
    line = next((ln for ln in reversed(res.output.splitlines()) if ln.startswith("{")), "")
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        raise ToolError(f"could not ask {python} for its torch (exit code {res.returncode}): "
                        f"{res.output.strip()[-300:] or 'no output'}",
                        hint="pass --python with the interpreter that has torch") from None
    if "error" in data:
        raise ConfigError(f"{python} cannot import torch: {data['error']}",
                          hint="the build needs torch in the build python (pip wheel --no-build-isolation); "
                               "pass --python with the right interpreter")
    kind = "rocm" if data.get("hip") else "cuda" if data.get("cuda") else "cpu"
    return TorchInfo(str(data.get("version")), kind, data.get("hip"), data.get("cuda"))


def check_torch(plan: BuildPlan, torch: TorchInfo, python: str) -> None:
    if plan.needs_torch == "rocm" and torch.kind != "rocm":
        raise ConfigError(
            f"{plan.project} {plan.version} ({plan.backend or plan.regime} build for +{plan.label}) needs a ROCm build "
            f"of torch, but {python} has torch {torch.version}, a {torch.kind} build "
            f"(torch.version.hip is None" + (f", torch.version.cuda={torch.cuda}" if torch.cuda else "") + ")",
            hint="install the ROCm torch wheel matching the profile's ROCm version into the build python, "
                 "or pass --python with an interpreter that has it; --dry-run shows the plan without one")


# -- the build -----------------------------------------------------------------------------------

def build_wheel(driver: WheelDriver, source: str, request: WheelRequest, *, runner: Runner,
                log: Logger | None = None, dry_run: bool = False, machine: Machine | None = None,
                others: Mapping[str, WheelDriver] | None = None, patch_hook: PatchHook = apply_patch_set,
                torch_info: TorchInfo | None = None) -> WheelResult:
    """The whole flow. ``runner`` runs (or, for probes, asks); in a dry run the build is only recorded.

    ``torch_info`` skips probing the build python (callers that already know it).
    """
    log = log or quiet_logger()
    tc = request.toolchain
    machine = machine or Machine.current()
    scratch = tc.scratch_parent()
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="porter-wheel-", dir=scratch) as tmp:
        work = Path(tmp)
        with log.step(f"reading {driver.title} source {source}"):
            root, provenance = resolve_source(source, driver, work, runner)
            info = detect(driver, root, others or {})
        request = replace(request, source=root, sources={**provenance, **request.sources})
        plan = driver.plan(info, request, machine)
        refusal: ConfigError | None = None
        torch: TorchInfo | None
        if request.torch_check:
            torch = torch_info or probe_torch(runner, request.python, tc)
            try:
                check_torch(plan, torch, request.python)
            except ConfigError as exc:
                if not dry_run:
                    raise
                refusal = exc  # a dry run still shows the plan, then reports why the build would stop
        else:
            torch = torch_info
            if plan.needs_torch:
                log.warn(f"torch check skipped: this build needs a {plan.needs_torch} torch; "
                         "upstream's setup.py fails late if the build python has another")
        tree = work / "tree"
        out = work / "out"
        argv = tc.argv(request.python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                       "--disable-pip-version-check", "-w", tc.inside(out) if tc.launcher_root else str(out),
                       tc.inside(tree) if tc.launcher_root else str(tree), *plan.pip_args)
        env = toolchain_env(tc, plan.env)
        changes = env_changes(env)
        if dry_run:
            if request.patch_set is not None:
                patch_hook(root, request.patch_set, info.version, log, dry_run=True)
            RecordingRunner(log).run(argv, env=env, cwd=tree)
            return WheelResult(plan, argv, changes, torch, dry_run=True, refusal=refusal)
        with log.step(f"copying {root} to a work tree"):
            shutil.copytree(root, tree, ignore=_IGNORE, symlinks=True)
            out.mkdir()
        if request.patch_set is not None:
            with log.step(f"applying patch set {request.patch_set}"):
                patch_hook(tree, request.patch_set, info.version, log)
        with log.step(f"building {plan.project} {plan.version} for +{plan.label} (MAX_JOBS={plan.jobs})"):
            runner.run(argv, env=env, cwd=tree,
                       hint=f"the {plan.project} build failed; the output above is upstream's. "
                            "Run with --dry-run to see the exact command and environment")
        built = sorted(out.glob("*.whl"))
        if len(built) != 1:
            raise CheckFailed(f"pip wheel produced {len(built)} wheels in {out}, expected one")
        with log.step(f"verifying {built[0].name}"):
            entries = verify_wheel(built[0], plan.expect)
        with log.step(f"labelling +{plan.label}"):
            final = relabel(built[0], plan.label, request.output)
        manifest = _manifest(plan, request, final, entries, torch, info)
        mpath = manifest_path(final)
        atomic_write_json(mpath, manifest)
        log.info(f"wrote {final} ({len(entries)} extension module(s)) and {mpath.name}")
        return WheelResult(plan, argv, changes, torch, wheel=final, manifest=mpath)


def _manifest(plan: BuildPlan, request: WheelRequest, wheel: Path, entries: list[ExtensionEntry],
              torch: TorchInfo | None, info: SourceInfo) -> Manifest:
    tc = request.toolchain
    tags = parse_wheel_filename(wheel.name)[3]
    python_tag = ".".join(sorted({t.interpreter for t in tags}))
    target: dict[str, Any] = {"kind": tc.kind, "archs": list(tc.archs), "wavefront": tc.wavefront,
                              "cpu_isa": tc.cpu_isa, "regime": plan.regime, "backend": plan.backend,
                              "label": plan.label}
    if tc.kind == "rocm":
        target["rocm_version"] = tc.toolkit_version
    elif tc.kind == "cuda":
        target["cuda_version"] = tc.toolkit_version
    setup_py = info.root / "setup.py"
    sources: dict[str, str] = {"upstream_version": info.version, "setup.py_sha256": sha256_file(setup_py),
                               **request.sources}
    for module in plan.expect.modules:
        for entry in entries:
            if entry["module"] == module:
                op = next((o.name for o in plan.ops if o.module == module), None)
                if op:
                    entry["op"] = op
    manifest: Manifest = {
        "schema": "porter.manifest/1", "porter_version": __version__, "component": plan.project,
        "version": wheel.name.split("-")[1], "wheel": {"filename": wheel.name, "sha256": sha256_file(wheel)},
        "python_tag": python_tag, "toolchain": tc.to_dict(), "target": target,
        "torch": torch.to_dict() if torch else {"version": None, "kind": None, "hip": None, "cuda": None},
        "sources": sources, "extensions": entries,
    }
    if plan.ops:
        have = {e["module"] for e in entries}
        ops: list[OpEntry] = []
        for o in plan.ops:
            op_entry: OpEntry = {"name": o.name, "status": "built" if o.module in have else "skipped"}
            if o.module not in have:
                op_entry["reason"] = "optional: upstream built it only under further conditions"
            ops.append(op_entry)
        manifest["ops"] = ops
    return manifest
