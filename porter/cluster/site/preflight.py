"""The preflight a training job runs on every node before its ranks start (``porter site preflight``).

Checks, each one named so a job may skip it (``--skip``):

- ``env``: every variable the site's ranks need is set, with the site's value (values the job's shell
  expands, ``$VAR``, need only be set);
- ``miopen``: MIOpen's user DB and custom cache folders are set, on node-local storage (not a network or
  parallel filesystem, read from the node's mount table) and writable (tried by writing);
- ``plugin``: the RCCL network plugin the site names loads (dlopen) and exports ``ncclNetPlugin_vN``, and fits
  the site as ``porter net-plugin verify --site`` judges it (built with ROCm for an AMD site; the site's RCCL
  major, read from porter's manifest of the plugin); a one-node job uses no network plugin, so there it is a note;
- ``ops``: the prebuilt kernels of the training python load with no compiler and no JIT, and carry code for
  the node's arch (:func:`porter.install.verify.verify`);
- ``archs``: the node's GPUs are the site's arch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from porter.cluster.site.profiles import Site, runtime_env
from porter.errors import ConfigError, PorterError
from porter.fs import ensure_writable_dir
from porter.install.env import Node, detect_node, inspect_env
from porter.run import Runner

CHECKS = ("env", "miopen", "plugin", "ops", "archs")
# filesystems shared between nodes: a MIOpen DB there is one SQLite file under every rank's writes
SHARED_FS = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph", "cephfs", "dvs",
             "panfs", "wekafs", "glusterfs", "fuse.glusterfs", "fuse.sshfs", "9p", "virtiofs", "orangefs"}


@dataclass(frozen=True)
class Check:
    name: str
    status: str           # ok | failed | skipped | note
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == "failed"


@dataclass(frozen=True)
class Report:
    site: str
    host: str
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"site": self.site, "host": self.host, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def check_env(site: Site, environ: Mapping[str, str]) -> Check:
    wrong: list[str] = []
    want = runtime_env(site)
    for key, value in want.items():
        got = environ.get(key)
        if got is None or got == "":
            wrong.append(f"{key} is not set (the site sets {value})")
        elif "$" not in value and got != value:
            wrong.append(f"{key}={got}, the site sets {value}")
    if wrong:
        return Check("env", "failed", "; ".join(wrong))
    return Check("env", "ok", f"{len(want)} variables set as site {site.name} wants")


def mount_of(path: Path, mounts_text: str) -> tuple[str, str]:
    """(mount point, filesystem type) holding ``path``, from /proc/mounts text (longest matching prefix)."""
    best = ("/", "unknown")
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (str(path) == point or str(path).startswith(point.rstrip("/") + "/")) and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best


def check_miopen(environ: Mapping[str, str], mounts_text: str) -> Check:
    problems: list[str] = []
    seen: list[str] = []
    for key in ("MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR"):
        if not (value := environ.get(key)):
            problems.append(f"{key} is not set: MIOpen would put its DB in ~/.config/miopen on the shared home")
            continue
        path = Path(value)
        if not path.is_absolute():
            problems.append(f"{key}={value} is not an absolute path")
            continue
        point, fstype = mount_of(path.resolve() if path.exists() else path, mounts_text)
        if fstype in SHARED_FS:
            problems.append(f"{key}={value} is on {fstype} ({point}), shared between nodes: use node-local "
                            "storage such as /tmp")
            continue
        try:
            ensure_writable_dir(path, what=f"{key} folder", option=key)
        except ConfigError as exc:
            problems.append(exc.message)
            continue
        seen.append(f"{key}={value} ({fstype} at {point})")
    if problems:
        return Check("miopen", "failed", "; ".join(problems))
    return Check("miopen", "ok", "node-local and writable: " + ", ".join(seen))


def check_plugin(site: Site, environ: Mapping[str, str], nodes: int) -> Check:
    from porter.components.netplugin.node import inspect_library, manifest_near
    from porter.components.netplugin.checks import site_refusals

    if site.plugin is None:
        return Check("plugin", "skipped", f"site {site.name} names no network plugin")
    if not (path := environ.get(site.plugin.env_var) or os.path.expandvars(site.plugin.library)):
        status = "note" if nodes == 1 else "failed"
        return Check("plugin", status, f"no {site.plugin.name} library: {site.plugin.env_var} is not set"
                     + (f" (load module {site.plugin.module})" if site.plugin.module else "")
                     + ("; a one-node job uses no network plugin" if nodes == 1 else
                        "; RCCL would fall back to TCP sockets, which do not scale across nodes"))
    if "/" not in path:  # a plugin *name* (RCCL looks up librccl-net-NAME.so): nothing to dlopen here
        return Check("plugin", "note", f"{site.plugin.env_var}={path} names a plugin, not a file; RCCL resolves it")
    try:
        info = inspect_library(Path(path))
    except PorterError as exc:
        return Check("plugin", "failed", exc.message)
    if not info.net_versions:
        return Check("plugin", "failed", f"{path} loads but exports no ncclNetPlugin_vN symbol: not an RCCL net plugin")
    facts = (manifest_near(Path(path)) or {}).get("target", {}).get("net_plugin") or {}
    why = site_refusals(site, what=path, built_with_rocm=facts.get("built_with_rocm", info.hip_runtime),
                        rccl_version=(facts.get("rccl") or {}).get("version"),
                        rocm_version=(facts.get("rocm") or {}).get("version"))
    if why:
        return Check("plugin", "failed", "; ".join(why))
    return Check("plugin", "ok", f"{path} loads; net API v{', v'.join(map(str, info.net_versions))}"
                 + (f", collnet v{', v'.join(map(str, info.collnet_versions))}" if info.collnet_versions else ""))


def check_archs(site: Site, node: Node) -> Check:
    if site.node.arch in node.archs:
        return Check("archs", "ok", f"node GPUs {node.describe()} include {site.node.arch}")
    return Check("archs", "failed", f"site {site.name} runs {site.node.arch}; this node has {node.describe()}")


def check_ops(python: str, node: Node, runner: Runner) -> Check:
    from porter.components import all_dists, registry
    from porter.install.verify import verify

    rep = verify(inspect_env(python, runner, dists=all_dists()), node, runner)
    if not rep.components:
        titles = "/".join(c.title for c in registry().values() if c.dists)
        return Check("ops", "failed", f"no prebuilt {titles} kernels in {python}: every op would JIT-compile "
                                      "on every rank ('porter install WHEELHOUSE')")
    if rep.problems:
        return Check("ops", "failed", "; ".join(str(p) for p in rep.problems[:5]))
    return Check("ops", "ok", ", ".join(f"{c.component} {c.version} ({len(c.modules)} prebuilt)"
                                        for c in rep.components) + ": no JIT")


def preflight(site: Site, *, python: str, nodes: int, skip: set[str], environ: Mapping[str, str],
              runner: Runner) -> Report:
    if unknown := skip - set(CHECKS):
        raise ConfigError(f"unknown preflight check(s): {', '.join(sorted(unknown))}", hint=f"checks: {', '.join(CHECKS)}")
    try:
        mounts_text = Path("/proc/mounts").read_text()
    except OSError:
        mounts_text = ""
    node = functools.cache(lambda: detect_node(runner))  # asked once, only when archs or ops run
    run: dict[str, Callable[[], Check]] = {"env": lambda: check_env(site, environ),
                                           "miopen": lambda: check_miopen(environ, mounts_text),
                                           "plugin": lambda: check_plugin(site, environ, nodes),
                                           "archs": lambda: check_archs(site, node()),
                                           "ops": lambda: check_ops(python, node(), runner)}
    checks = [Check(name, "skipped", "--skip") if name in skip else check() for name, check in run.items()]
    checks[3:] = sorted(checks[3:], key=lambda c: c.status == "skipped")  # the node's skipped checks come last
    return Report(site=site.name, host=os.uname().nodename, checks=tuple(checks))


def describe(rep: Report) -> list[str]:
    return [f"{rep.host}: {c.status:<7} {c.name}: {c.detail}" for c in rep.checks] + \
        [f"{rep.host}: preflight {'ok' if rep.ok else 'FAILED'} for site {rep.site}"]

