"""Verify a built RCCL network plugin where it will be used: the package porter wrote (tarball + manifest) or
a bare library.

Each library is dlopened (RTLD_NOW) inside the target environment (the toolchain's chroot or container, or
the host), in a fresh process per library: it loads or the dlopen error names the missing dependency; the
shared objects the load mapped are listed (``libamdhip64`` among them: it was built with ROCm); its
``ncclNetPlugin_vN`` / ``ncclCollNetPlugin_vN`` symbols are listed with their API versions, and set against
the net API versions the environment's RCCL knows (from its ``nccl_net.h``): RCCL takes the newest both know.
The plugin's functions are never called and no NIC is touched. With ``--site``, :mod:`porter.components.netplugin.checks`
says whether it fits the site.
"""

from __future__ import annotations

import json
import sys
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from porter.artifacts.manifest import SCHEMA, manifest_path
from porter.cluster.site.profiles import Site
from porter import archive
from porter.errors import ConfigError
from porter.executor import HOST, Executor
from porter.fs import cache_dir, owned_temp
from porter.log import Logger
from porter.components.netplugin.build import MANIFEST_MEMBER, header_dirs, probe_env
from porter.components.netplugin.checks import site_refusals
from porter.components.netplugin.node import links_hip
from porter.run import Runner, make_env
from porter.toolchain.profile import Toolchain, toolchain_env


@dataclass(frozen=True)
class LibraryReport:
    name: str
    loads: bool
    error: str | None
    net_api: tuple[int, ...]
    collnet_api: tuple[int, ...]
    links: tuple[str, ...]
    hip_runtime: bool | None
    """Loading it mapped the HIP runtime (None: not known)."""
    rccl_uses: int | None
    """The net API version RCCL here would take (the newest both know); None: none or RCCL unknown."""


@dataclass
class VerifyReport:
    target: str
    where: str
    site: str | None
    built_with_rocm: bool | None
    rccl_built: str | None
    rccl_env: dict[str, Any] | None
    """The environment's RCCL: header version and net API versions, runtime version."""
    libraries: list[LibraryReport]
    manifest: dict[str, Any] | None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:  # the fields in their order, with ok after where
        return {"target": self.target, "where": self.where, "ok": self.ok} | asdict(self)

    def lines(self) -> list[str]:
        out = [f"{self.target} in {self.where}:"]
        for lib in self.libraries:
            if not lib.loads:
                out.append(f"  {lib.name}: does not load: {lib.error}")
                continue
            api = ", ".join(f"ncclNetPlugin_v{v}" for v in lib.net_api) or "no ncclNetPlugin_vN"
            coll = ", ".join(f"ncclCollNetPlugin_v{v}" for v in lib.collnet_api)
            out.append(f"  {lib.name}: loads; exports {api}" + (f", {coll}" if coll else "")
                       + (f"; RCCL here would use net API v{lib.rccl_uses}" if lib.rccl_uses else ""))
            out.append(f"    loaded with {', '.join(lib.links) or '(nothing new)'}")
        if self.rccl_env:
            out.append(f"  RCCL here: {self.rccl_env.get('version') or 'unknown'} (net API "
                       f"v{', v'.join(map(str, self.rccl_env.get('net_api') or [])) or '?'})")
        out.append(f"  built with ROCm: {'unknown' if self.built_with_rocm is None else self.built_with_rocm}; "
                   f"against RCCL {self.rccl_built or 'unknown'}")
        out += [f"  note: {n}" for n in self.notes]
        out += [f"  PROBLEM: {p}" for p in self.problems]
        out.append(f"verify {'ok' if self.ok else 'FAILED'}" + (f" for site {self.site}" if self.site else ""))
        return out


def read_package(path: Path) -> tuple[dict[str, Any] | None, list[tuple[str, bytes]]]:
    """The manifest (the sidecar, else the copy inside) and the libraries of a package tarball."""
    manifest: dict[str, Any] | None = None
    libs: list[tuple[str, bytes]] = []
    try:
        archive.members(path)  # empty, truncated, not a tarball, hostile: named
        with tarfile.open(path, "r:*") as tar:
            for member in tar.getmembers():
                parts = member.name.split("/")
                if member.isfile() and len(parts) == 2 and parts[1] == MANIFEST_MEMBER:
                    f = tar.extractfile(member)
                    manifest = json.loads(f.read()) if f else None
                elif member.isfile() and len(parts) == 3 and parts[1] == "lib" and ".so" in parts[2]:
                    if f := tar.extractfile(member):
                        libs.append((parts[2], f.read()))
    except (tarfile.TarError, OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not a readable plugin package: {exc}",
                          hint="pass a tarball 'porter net-plugin build' wrote, or the plugin library itself") from None
    except archive.ENDED:
        raise archive.truncated(path, path.stat().st_size) from None
    side = manifest_path(path)
    if side.is_file():
        try:
            manifest = json.loads(side.read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"manifest corrupt: {side}: {exc}", hint="rebuild the plugin with porter") from None
    if manifest is not None and manifest.get("schema") != SCHEMA:
        raise ConfigError(f"{path}: its manifest is not a {SCHEMA} document", hint="rebuild the plugin with porter")
    if not libs:
        raise ConfigError(f"{path} holds no lib/*.so plugin library", hint="rebuild the plugin with porter")
    return manifest, libs


def plugin_facts(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
    facts = (manifest or {}).get("target", {}).get("net_plugin")
    return facts if isinstance(facts, dict) else None


def rccl_picks(plugin_api: tuple[int, ...], rccl_api: list[int]) -> int | None:
    return max(set(plugin_api) & set(rccl_api), default=None)


def verify_plugin(target: Path, *, tc: Toolchain | None, site: Site | None, python: str | None, runner: Runner,
                  log: Logger) -> VerifyReport:
    """Load the plugin (package or library) in ``tc``'s environment (the host without one) and check it."""
    if not target.exists():
        raise ConfigError(f"{target} does not exist", hint="pass a plugin package (.tar.gz) or library (.so)")
    ex: Executor = tc.executor if tc is not None else HOST
    ex.preflight()
    env = toolchain_env(tc) if tc is not None else make_env()
    py = python or ("python3" if ex.kind != "host" else sys.executable)
    parent = ex.work_dir(cache_dir()) / "netplugin-verify"
    parent.mkdir(parents=True, exist_ok=True)
    with owned_temp(parent, "netplugin-verify-") as scratch:
        if target.is_file() and target.name.endswith((".tar.gz", ".tgz", ".tar")):
            manifest, members = read_package(target)
            paths = [scratch / name for name, _ in members]
            for p, (_, data) in zip(paths, members):
                p.write_bytes(data)
                p.chmod(0o755)
        else:
            # its sidecar, or the manifest of the unpacked package it lies in (<package>/lib/<library>)
            side = manifest_path(target)
            side = side if side.is_file() or target.parent.name != "lib" else target.parent.parent / MANIFEST_MEMBER
            manifest = json.loads(side.read_text()) if side.is_file() else None
            paths = [target]
        facts = plugin_facts(manifest)
        env_doc = probe_env(ex, py, runner, env, headers=header_dirs(tc), rccl_runtime=True)
        rccl_head = env_doc["headers"].get("rccl") or {}
        runtime = env_doc.get("rccl_runtime") or {}
        rccl_api: list[int] = list(rccl_head.get("net_api") or [])
        rccl_env = {"version": runtime.get("version") or rccl_head.get("version"),
                    "header_version": rccl_head.get("version"), "net_api": rccl_head.get("net_api") or [],
                    "runtime": runtime} if (rccl_head or runtime.get("loads")) else None
        libs: list[LibraryReport] = []
        for p in paths:
            with log.step(f"loading {p.name} in {ex.describe()}"):
                doc = probe_env(ex, py, runner, env, library=ex.visible(p))["libraries"][0]
            net = tuple(doc["net_api"])
            if doc["loads"]:
                libs.append(LibraryReport(p.name, True, None, net, tuple(doc["collnet_api"]),
                                          tuple(sorted({m.rsplit("/", 1)[-1] for m in doc["mapped"]})),
                                          links_hip(doc), rccl_picks(net, rccl_api) if rccl_env else None))
            else:
                libs.append(LibraryReport(p.name, False, doc["error"], (), (), (), False, None))
    known = [lib.hip_runtime for lib in libs if lib.loads and lib.hip_runtime is not None]
    evidence = any(known) if known else None
    built_with_rocm = bool(facts["built_with_rocm"]) if facts and "built_with_rocm" in facts else evidence
    rccl_built = ((facts or {}).get("rccl") or {}).get("version")
    rep = VerifyReport(str(target), ex.describe(), site.name if site else None, built_with_rocm, rccl_built, rccl_env,
                       libs, facts)
    for lib in libs:
        if not lib.loads:
            rep.problems.append(f"{lib.name} does not load in {ex.describe()}: {lib.error} (a dependency that does "
                                "not resolve there is named in the error: libfabric, the HIP runtime)")
        elif not lib.net_api:
            rep.problems.append(f"{lib.name} loads but exports no ncclNetPlugin_vN symbol: not an RCCL network plugin")
        elif rccl_env and rccl_env["net_api"] and lib.rccl_uses is None:
            rep.problems.append(f"{lib.name} offers net API v{', v'.join(map(str, lib.net_api))}; the RCCL here "
                                f"({rccl_env['version']}) knows v{', v'.join(map(str, rccl_env['net_api']))}: "
                                "no version in common, RCCL would not use it")
    if rccl_env is None:
        rep.notes.append(f"no RCCL found in {ex.describe()} (no librccl.so.1, no rccl/rccl.h): which net API "
                         "version RCCL would use is not checked")
    if facts is None:
        rep.notes.append("no porter manifest: built-with-ROCm is read from the library's dependencies; the RCCL "
                         "it was built against is unknown")
    elif evidence is not None and bool(facts.get("built_with_rocm")) != evidence:
        rep.notes.append(f"the manifest says built_with_rocm={facts.get('built_with_rocm')}, but loading it "
                         f"{'mapped' if evidence else 'did not map'} the HIP runtime")
    if site is not None:
        rep.problems += site_refusals(site, what=target.name, built_with_rocm=built_with_rocm, rccl_version=rccl_built,
                                      rocm_version=((facts or {}).get("rocm") or {}).get("version"))
    return rep
