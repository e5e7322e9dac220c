"""``porter install``: pick the wheels that fit, prove they are untampered, install offline, under a lock.

Order: inspect the target interpreter, find the node's GPU, scan and select (no file is touched
before a wheel is chosen), take the environment's lock, copy each chosen wheel into a private
folder and check the *copy* (sha256 against the manifest, entries that escape the target, each
extension's sha256), then ``python -m pip install --no-index --only-binary :all: --find-links
WHEELHOUSE`` from those copies, then write an install record per wheel. A second install into the
same environment waits on the lock; pip itself rolls back a failed install, and no record is written
for a wheel pip did not install.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from filelock import FileLock, Timeout

from porter.components import all_dists
from porter.errors import CheckFailed, ConfigError, ToolError
from porter.fs import owned_temp
from porter.install.abi import Userspace, check_wheel_abi
from porter.install.env import Node, TargetEnv, detect_node, inspect_env
from porter.install.records import lock_path, read_records, write_record
from porter.install.wheelhouse import (Selection, Wheel, check_intact, check_wheel, orphan_manifests, same_version,
                                      scan, select)
from porter.log import Logger, quiet_logger
from porter.optspec import arch_option, arg, only_option, opt, target_python_option
from porter.run import Runner, make_env

node_arch_option = arch_option.but(help="The node's GPU arch (gfx90a, gfx942, sm_90); default: what rocminfo / "
                                       "nvidia-smi see.")


@dataclass(frozen=True, kw_only=True)
class InstallOptions:
    """``porter install``'s request: each field declares its own option (``--help`` says what each is)."""

    wheelhouse: Path = arg(type=click.Path(file_okay=False, path_type=Path))
    python: str | None = target_python_option.field()
    """None: the python running porter."""
    archs: tuple[str, ...] = node_arch_option.field()
    only: tuple[str, ...] = only_option.field(help="Install only these components or projects (repeat or "
                                                   "comma-separate).")
    reinstall: bool = opt("--reinstall", is_flag=True, help="Install again even when the same wheel is installed.")
    no_deps: bool = opt("--no-deps", is_flag=True, help="Do not let pip install dependencies from the wheelhouse.")
    lock_timeout: float = opt("--lock-timeout", type=float, default=1800.0, show_default=True,
                              help="Seconds to wait for another install into the same environment.")
    node_root: Path = opt("--node-root", type=click.Path(file_okay=False, exists=True, path_type=Path),
                          default=Path("/"), show_default=True,
                          help="The root folder of the userspace the wheels will load in (a chroot, an image's root "
                               "file system); the default is this host.")


@dataclass
class InstallResult:
    env: TargetEnv
    node: Node
    selection: Selection
    installed: list[Wheel] = field(default_factory=list)
    skipped: list[Wheel] = field(default_factory=list)
    lock: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        def w(x: Wheel) -> dict[str, Any]:
            return {"component": x.component, "project": str(x.project), "version": x.version_text,
                    "wheel": x.filename}
        return {"python": self.env.executable, "python_tag": self.env.python_tag,
                "torch": self.env.torch.describe() if self.env.torch else None,
                "node": {"archs": list(self.node.archs), "source": self.node.source},
                "installed": [w(x) for x in self.installed], "skipped": [w(x) for x in self.skipped],
                "rejected": [{**w(x), "reasons": list(r)} for x, r in self.selection.rejected],
                "lock": self.lock}


def install(opts: InstallOptions, runner: Runner, log: Logger | None = None) -> InstallResult:
    """The wheelhouse's wheels for the target environment and node, checked and installed under a lock; a recording
    ``runner`` (a dry run) inspects and checks, and installs nothing."""
    log = log or quiet_logger()
    wheelhouse = opts.wheelhouse.resolve()
    python = opts.python or sys.executable
    probes = runner.real()  # the environment and the node are inspected in a dry run too
    with log.step(f"inspect {python}"):
        wheels = scan(wheelhouse)
        dists = [*(str(w.project) for w in wheels), *all_dists()]
        env = inspect_env(python, probes, dists=dists)
        node = detect_node(probes, opts.archs)
    log.info(f"target: {env.describe()}; GPU: {node.describe()}")
    for orphan in orphan_manifests(wheelhouse):
        log.warn(f"{orphan.name}: manifest without its wheel (ignored)")
    selection = select(wheels, env, node, opts.only, str(wheelhouse))
    for w, why in selection.rejected:
        log.detail(f"not for this target: {w.filename}: {'; '.join(why)}")
    result = InstallResult(env, node, selection)
    for w in selection.chosen:  # (a truncated copy is named before its shared objects are read)
        assert w.manifest is not None
        check_intact(w.path, w.manifest)
    with log.step(f"checking that {len(selection.chosen)} wheel(s) load on {Userspace.of(opts.node_root).describe()}"):
        check_loadable(selection.chosen, Userspace.of(opts.node_root, env.torch.root if env.torch else ""))
    if env.pip is None and not runner.dry:
        raise ToolError(f"{env.executable} has no pip; porter installs through the target's own pip",
                        hint=f"run '{env.executable} -m ensurepip', or create the venv with pip")
    lock = FileLock(str(lock_path(env)), timeout=opts.lock_timeout)
    lock_path(env).parent.mkdir(parents=True, exist_ok=True)
    asked = time.time()
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log.info(f"waiting for the install lock {lock_path(env)} (another install into this environment runs)")
            lock.acquire()
    except Timeout:
        raise ToolError(f"install lock {lock_path(env)} still held after {opts.lock_timeout:.0f}s",
                        hint="another porter install is running or hung; wait, or raise --lock-timeout") from None
    acquired = time.time()
    try:
        # re-inspect under the lock: an install that held it may have changed the environment
        env = result.env = inspect_env(python, probes, dists=dists)
        _install_locked(opts, env, selection, wheelhouse, runner, log, result)
    finally:
        lock.release()
        result.lock = {"path": str(lock_path(env)), "waited_s": round(acquired - asked, 3),
                       "acquired_at": acquired, "released_at": time.time()}
    return result


def _install_locked(opts: InstallOptions, env: TargetEnv, selection: Selection, wheelhouse: Path,
                    runner: Runner, log: Logger, result: InstallResult) -> None:
    with owned_temp(None, "porter-install-") as stage:
        fresh: list[tuple[Wheel, Path, str]] = []
        replace: list[tuple[Wheel, Path, str]] = []
        for w in selection.chosen:
            assert w.manifest is not None
            copy = stage / w.filename
            shutil.copyfile(w.path, copy)
            check_wheel(copy, w.manifest, label=str(w.path))
            sha = w.manifest["wheel"]["sha256"]
            dist = env.dists.get(str(w.project))
            present = dist is not None and same_version(dist.version, w.version)
            rec = read_records(env).get(str(w.project))
            if not opts.reinstall and present and rec is not None and rec.record and rec.record["sha256"] == sha:
                log.info(f"{w.component} {w.version_text}: already installed from this wheel")
                result.skipped.append(w)
                continue
            # a forced install takes no dependencies (pip would reinstall each): only a wheel whose version is
            # there is forced; --reinstall of one that is not there is a fresh install, with its dependencies
            (replace if present else fresh).append((w, copy, sha))
        no_deps = ["--no-deps"] if opts.no_deps else []
        for group, flags in ((fresh, no_deps), (replace, ["--force-reinstall", "--no-deps"])):
            if not group:
                continue
            argv = [env.executable, "-m", "pip", "install", "--no-index", "--only-binary", ":all:", "--find-links",
                    str(wheelhouse), "--disable-pip-version-check", "--no-input", *flags]
            argv += [str(copy) for _, copy, _ in group]
            if runner.dry:
                log.command(argv)
                continue
            with log.step(f"install {', '.join(f'{w.component} {w.version_text}' for w, _, _ in group)}"):
                runner.run(argv, env=make_env({"PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1"}),
                           timeout=3600, hint="pip could not install from the wheelhouse; its output is above "
                                              "(a missing dependency wheel? add it to the wheelhouse)")
            for w, _copy, sha in group:
                assert w.manifest is not None
                write_record(env, str(w.project), w.manifest, sha, str(w.path))
                result.installed.append(w)


def check_loadable(wheels: Sequence[Wheel], node: Userspace) -> None:
    """Refuse, before anything is written, wheels whose shared objects would not load on ``node``."""
    if not (problems := [(w, why) for w in wheels for why in check_wheel_abi(w.path, node)]):
        return
    built = sorted({str((w.manifest["toolchain"] if w.manifest else {}).get("name", "?")) for w, _ in problems})
    lines = "\n".join(f"  {w.filename}: {why}" for w, why in problems)
    raise CheckFailed(f"{len({w.filename for w, _ in problems})} wheel(s) would not load on "
                      f"{node.describe()}:\n{lines}",
                      hint=f"rebuild with a profile whose userspace is not newer than the node's (these were built "
                           f"with {', '.join(built)}; 'porter toolchain list' shows the profiles), or with the "
                           f"node's torch; a library a site module provides: load the module before installing. "
                           f"Nothing was installed")


def parse_only(values: Sequence[str]) -> tuple[str, ...]:
    names = tuple(n.strip() for v in values for n in v.split(",") if n.strip())
    for n in names:
        if not n.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigError(f"--only: {n!r} is not a project name")
    return names
