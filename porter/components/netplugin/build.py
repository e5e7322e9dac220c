"""Build an RCCL network plugin from its source tree with a toolchain, and package it.

The flow (every program runs through the toolchain's executor, so against the RCCL, libfabric and HIP
runtime of the chroot or container the toolchain names):

1. recognise the tree (:mod:`porter.components.netplugin.projects`) and refuse what cannot work before any work: a
   ROCm toolchain and a tree without ``--with-rocm``; a site whose GPUs need ROCm and a toolchain without it;
2. read the build environment's versions from its headers (RCCL, libfabric, HIP) with the ``netplugin``
   probe, and refuse a site's other RCCL major;
3. copy the tree into a work folder the executor sees (the user's tree is never touched); run
   ``autogen.sh`` when there is no ``configure``; ``configure``, ``make``, ``make install`` into a stage;
4. load every installed library where it was built (dlopen, RTLD_NOW) and list its ``ncclNetPlugin_vN`` /
   ``ncclCollNetPlugin_vN`` symbols: a library that does not load or exports none fails the build;
5. write ``<project>-<version>-<label>.tar.gz`` (``lib/`` and a ``porter.json`` manifest) and its sidecar
   ``.porter.json`` atomically: nothing half-written is left on failure.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from porter.artifacts import labels
from porter.artifacts.manifest import ExtensionEntry, Manifest, publish
from porter.artifacts.sbom import NAME as SBOM_NAME
from porter.artifacts.wheelfile import sbom_of
from porter.cluster.site.profiles import Site
from porter.errors import CheckFailed, ConfigError, PorterError, ToolError
from porter.executor import Executor
from porter.fs import atomic_write_text, cache_dir, ensure_writable_dir, files_digest, sha256_file
from porter.log import Logger
from porter.components.netplugin.checks import is_rocm_site, site_refusals
from porter.components.netplugin.node import links_hip
from porter.components.netplugin.projects import BuildSettings, Tree, device_of, recognise
from porter.probe import run_probe
from porter.run import RecordingRunner, Runner, env_changes
from porter.toolchain.profile import Toolchain, toolchain_env

MANIFEST_MEMBER = "porter.json"


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    source: Path
    tc: Toolchain
    out_dir: Path
    site: Site | None = None
    """Refuse, before building, what cannot serve this site."""
    settings: BuildSettings = BuildSettings()


@dataclass(frozen=True)
class Step:
    what: str
    argv: list[str]


@dataclass(frozen=True)
class BuildPlan:
    request: BuildRequest
    tree: Tree
    device: str
    """rocm | cuda | none: the device runtime the plugin links."""
    work: Path
    """Host folder of this build's work files (under the executor's root)."""
    steps: tuple[Step, ...]
    env: dict[str, str]
    package: str
    """File name of the tarball."""
    header_dirs: tuple[str, ...]
    refusal: PorterError | None = None

    @property
    def src(self) -> Path:
        return self.work / "src"

    @property
    def stage(self) -> Path:
        return self.work / "stage"


@dataclass
class BuildResult:
    plan: BuildPlan
    package: Path | None = None
    manifest_path: Path | None = None
    manifest: Manifest | None = None

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {"project": p.tree.project.name, "version": p.tree.version, "toolchain": p.request.tc.name,
                "device": p.device, "package": str(self.package) if self.package else None,
                "manifest": str(self.manifest_path) if self.manifest_path else None,
                "net_plugin": self.manifest["target"].get("net_plugin") if self.manifest else None,
                "steps": [{"what": s.what, "argv": s.argv} for s in p.steps],
                "env": env_changes(p.env), "refusal": p.refusal.message if p.refusal else None}


def in_dir(ex: Executor, folder: str, *argv: str) -> list[str]:
    """``argv`` run in ``folder`` (as the executor sees it): a chroot starts in /, so cd there first."""
    return ex.argv("sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", folder, *argv)


def header_dirs(tc: Toolchain | None, libfabric: str = "") -> tuple[str, ...]:
    dirs = [f"{tc.root.rstrip('/')}/include" if tc and tc.root else "",
            f"{libfabric.rstrip('/')}/include" if libfabric else "", "/usr/include", "/opt/rocm/include"]
    return tuple(dict.fromkeys(d for d in dirs if d))


def plan_build(req: BuildRequest) -> BuildPlan:
    """The commands a build runs, and what it would refuse; no writes, no subprocess."""
    tc = req.tc
    tree = recognise(req.source)
    if req.settings.release_version:
        tree = replace(tree, version=req.settings.release_version.removeprefix("v"))
    elif tree.version_script:
        how = (f"the tag of {tree.root}'s HEAD (git -C {tree.root} describe --tags)" if (tree.root / ".git").exists()
               else "the release it is (the tag it was checked out from, e.g. 1.19.2)")
        raise ConfigError(f"{tree.project.name} at {tree.root} takes its version from m4/get_version.sh (a "
                          ".release_version file or the git tag), and porter's work copy has neither: git does not "
                          f"run in {tc.executor.describe()}", hint=f"pass --release-version with {how}")
    device = device_of(tc)
    refusal: PorterError | None = None
    if device == "rocm" and not tree.supports_rocm:
        refusal = ConfigError(f"{tree.project.name} {tree.version} at {tree.root} has no --with-rocm (aws-ofi-nccl "
                              "added it in 1.18.0)", hint="use aws-ofi-nccl 1.18 or later, or aws-ofi-rccl")
    if req.site is not None and refusal is None and is_rocm_site(req.site) and device != "rocm":
        why = site_refusals(req.site, what=f"{tree.project.name} built with toolchain {tc.name} ({tc.kind})",
                            built_with_rocm=False, rccl_version=None)
        refusal = ConfigError(why[0], hint=f"build with the site's ROCm toolchain ({req.site.toolchain or 'a rocm preset'})")
    if req.settings.jobs < 1:
        raise ConfigError(f"-j {req.settings.jobs}: jobs must be >= 1")
    ex = tc.executor
    # named by the tree's content: another tree of the same version (a fork, a patched clone) never shares it
    work = ex.work_dir(cache_dir()) / "netplugin" / \
        f"{tree.project.name}-{tree.version}-{tree_digest(tree.root)[:12]}-{labels.make(tc)}"
    src_in = ex.visible(work / "src", stage=False)
    stage_in = ex.visible(work / "stage", stage=False)
    args = tree.project.configure_args(tc, prefix=stage_in, libfabric=req.settings.libfabric,
                                       extra=req.settings.configure_args)
    make_dir = f"{src_in}/{tree.project.make_dir}" if tree.project.make_dir else src_in
    steps = [Step("autogen", in_dir(ex, src_in, "sh", "./autogen.sh"))] if not tree.has_configure else []
    steps += [Step("configure", in_dir(ex, src_in, "sh", "./configure", *args)),
              Step("make", ex.argv("make", "-C", make_dir, f"-j{req.settings.jobs}")),
              Step("install", ex.argv("make", "-C", make_dir, "install"))]
    package = f"{tree.project.name}-{tree.version}-{labels.make(tc)}.tar.gz"
    return BuildPlan(req, tree, device, work, tuple(steps), toolchain_env(tc), package,
                     header_dirs(tc, req.settings.libfabric), refusal)


def dry_run(plan: BuildPlan, log: Logger) -> BuildResult:
    rec = RecordingRunner(log)
    for step in plan.steps:
        rec.run(step.argv, env=plan.env)
    return BuildResult(plan)


def probe_env(ex: Executor, python: str, runner: Runner, env: dict[str, str], *, headers: tuple[str, ...] = (),
              library: str = "", rccl_runtime: bool = False) -> dict[str, Any]:
    """The ``netplugin`` probe, run where ``ex`` runs things (one library per call: what a load maps is
    read as the difference of /proc/self/maps, so each library gets a fresh process)."""
    req = {"headers": list(headers), "libraries": [library] if library else [], "rccl_runtime": rccl_runtime}
    doc: dict[str, Any] = run_probe("netplugin", [json.dumps(req)], python=python, runner=runner, executor=ex,
                                    env=env, timeout=120, what="the RCCL/libfabric/HIP versions and the plugin's symbols")
    return doc


def tree_digest(root: Path) -> str:
    def files() -> Iterator[Path]:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != ".git")
            yield from (p for p in (Path(dirpath) / n for n in sorted(filenames)) if p.is_file() and not p.is_symlink())
    return files_digest(root, files())


def run_build(plan: BuildPlan, runner: Runner, log: Logger) -> BuildResult:
    req, tc, tree = plan.request, plan.request.tc, plan.tree
    if plan.refusal is not None:
        raise plan.refusal
    ex = tc.executor
    ex.preflight()
    ensure_writable_dir(req.out_dir, create=True)
    with log.step(f"reading RCCL, libfabric and HIP versions in {ex.describe()}"):
        facts = probe_env(ex, req.settings.python, runner, plan.env, headers=plan.header_dirs)["headers"]
    rccl = facts.get("rccl")
    rocm_version = tc.toolkit_version if plan.device == "rocm" else None
    if req.site is not None:
        why = site_refusals(req.site, what=f"{tree.project.name} built with toolchain {tc.name}",
                            built_with_rocm=plan.device == "rocm", rccl_version=rccl.get("version") if rccl else None,
                            rocm_version=rocm_version)
        if why:
            raise ConfigError(why[0], hint="nothing was built; pick the toolchain whose RCCL the site runs")
    if plan.device == "rocm" and not rccl:
        log.warn(f"no rccl/rccl.h under {', '.join(plan.header_dirs)} in {ex.describe()}: the manifest will not "
                 "name the RCCL version (install RCCL's headers there: librccl-dev)")
    work = plan.work
    work.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(work) + ".lock"):
        shutil.rmtree(work, ignore_errors=True)
        with log.step(f"copying {tree.root} to a work tree"):
            shutil.copytree(tree.root, plan.src, symlinks=True)
            plan.stage.mkdir()
            if plan.request.settings.release_version:  # what m4/get_version.sh reads first, as in a release tarball
                atomic_write_text(plan.src / ".release_version", tree.version + "\n")
        if not tree.has_configure:
            if not runner.run(ex.argv("sh", "-c", "command -v autoreconf"), env=plan.env, check=False).ok:
                raise ToolError(f"{tree.root} has no configure script, only autogen.sh, and autoreconf is not "
                                f"installed in {ex.describe()}",
                                hint="install autoconf, automake and libtool there ('make chroot-rocm7' does), or "
                                     "run ./autogen.sh in your clone first, or use a release tarball")
        for step in plan.steps:
            with log.step(f"{step.what} {tree.project.name} {tree.version}"):
                runner.run(step.argv, env=plan.env, cwd=work,
                           hint=f"{tree.project.name}'s {step.what} failed in {ex.describe()}; the output above is "
                                f"upstream's. The work tree is kept at {plan.src}")
        libs = _installed(plan.stage / "lib", tree.project.library_names(plan.device))
        if not libs:
            raise CheckFailed(f"'make install' put no plugin library into {plan.stage / 'lib'}",
                              hint=f"{tree.project.name} should install "
                                   f"{', '.join(tree.project.library_names(plan.device))}")
        with log.step(f"loading {', '.join(p.name for p in libs)} in {ex.describe()}"):
            loaded = [probe_env(ex, req.settings.python, runner, plan.env,
                                library=ex.visible(lib, stage=False))["libraries"][0] for lib in libs]
        bad = [f"{os.path.basename(d['path'])}: {d['error']}" for d in loaded if not d["loads"]] + \
              [f"{os.path.basename(d['path'])} exports no ncclNetPlugin_vN symbol" for d in loaded
               if d["loads"] and not d["net_api"]]
        if bad:
            raise CheckFailed("the built plugin is not usable: " + "; ".join(bad),
                              hint=f"the work tree is kept at {plan.src}")
        result = _package(plan, libs, loaded, facts, rocm_version, log)
        shutil.rmtree(work, ignore_errors=True)
    return result


def _installed(libdir: Path, preferred: tuple[str, ...]) -> list[Path]:
    """The plugin libraries in ``libdir`` under the names RCCL dlopens (``lib*.so``), the one it looks for
    first, first. A libtool library built without ``-avoid-version`` (aws-ofi-rccl's) is installed as
    ``librccl-net.so.0.0.0`` with ``librccl-net.so`` a link to it: the link's name is kept (the file it points
    to is what gets loaded and packaged); the versioned names and libtool's .la files are left out."""
    if not libdir.is_dir():
        return []
    named = [p for p in libdir.iterdir() if p.name.endswith(".so") and p.is_file()
             and p.resolve().parent == libdir.resolve()]
    found = named or [p for p in libdir.iterdir() if ".so" in p.name and not p.name.endswith(".la") and p.is_file()
                      and not p.is_symlink()]
    order = {n: i for i, n in enumerate(preferred)}
    return sorted(found, key=lambda p: (order.get(p.name, len(order)), p.name))


def _package(plan: BuildPlan, libs: list[Path], loaded: list[dict[str, Any]], facts: dict[str, Any],
             rocm_version: str | None, log: Logger) -> BuildResult:
    req, tc, tree = plan.request, plan.request.tc, plan.tree
    top = plan.package[: -len(".tar.gz")]
    rccl = facts.get("rccl") or {}
    libraries: dict[str, Any] = {}
    extensions: list[ExtensionEntry] = []
    for lib, info in zip(libs, loaded):
        libraries[lib.name] = {"net_api": info["net_api"], "collnet_api": info["collnet_api"],
                               "names": info["names"], "links": sorted({os.path.basename(m) for m in info["mapped"]}),
                               "hip_runtime": links_hip(info)}
        extensions.append({"module": lib.name, "path": f"{top}/lib/{lib.name}", "sha256": sha256_file(lib),
                           "host_only": True})
    net_plugin: dict[str, Any] = {
        "project": tree.project.name, "version": tree.version, "device": plan.device,
        "built_with_rocm": plan.device == "rocm",
        "rccl": ({k: rccl.get(k) for k in ("version", "major", "version_code", "net_api")}
                 if rccl and plan.device == "rocm" else None),
        "libfabric": {"version": (facts.get("libfabric") or {}).get("version")},
        "rocm": {"version": rocm_version, "hip": (facts.get("hip") or {}).get("version")} if rocm_version else None,
        "net_api": sorted({v for i in loaded for v in i["net_api"]}),
        "collnet_api": sorted({v for i in loaded for v in i["collnet_api"]}),
        "libraries": libraries,
        "configure": next(s.argv for s in plan.steps if s.what == "configure"),
    }
    def write(folder: Path, data: bytes) -> Path:
        with tarfile.open(folder / plan.package, "w:gz") as tar:
            for lib in libs:  # the file a link names, under the link's name
                tar.add(lib.resolve(), arcname=f"{top}/lib/{lib.name}", recursive=False)
            sbom = sbom_of(data, tree.project.name, tree.version, purl_type="generic")
            for name, payload in ((MANIFEST_MEMBER, data), (SBOM_NAME, sbom)):  # the SBOM beside the manifest
                member = tarfile.TarInfo(f"{top}/{name}")
                member.size, member.mode = len(payload), 0o644
                tar.addfile(member, io.BytesIO(payload))
        return folder / plan.package

    with log.step(f"writing {req.out_dir / plan.package}"):
        dest, mpath, manifest = publish(
            req.out_dir, write, component=tree.project.name, version=tree.version, tc=tc, torch=None,
            python_tag="none", sources={"tree": tree_digest(tree.root), "version": tree.version,
                                        "patches": []},  # porter patches no plugin source
            extensions=extensions, target={"net_plugin": net_plugin})
    return BuildResult(plan, dest, mpath, manifest)
