"""``porter image build``: a base userspace + a wheelhouse -> a SIF whose training environment has the wheels
installed and verified by porter.

Always written first, beside the image: ``IMAGE.def`` (the definition a site builds with its own ``apptainer``)
and ``IMAGE.porter-tools/`` (porter and its dependencies as wheels, which that definition installs). Then, where
``apptainer`` is found (on this host, or in ``--apptainer-root``, a chroot whose root is a mount point):

1. the base is made a root folder (a copy of a root folder; a SIF's squashfs unpacked) in a private folder;
2. the definition's ``%post`` lines run in that folder through ``chroot`` (apptainer refuses to run its own
   ``%post`` inside a chroot): porter installs itself apart (``/opt/porter/lib``), then ``porter install`` and
   ``porter verify`` run *inside the image's userspace*, with the node's archs (no GPU here: code objects and
   imports are checked, nothing runs on a GPU); a network plugin is unpacked and loaded there;
3. ``apptainer build`` packs the folder with the labels, environment and ``%test`` of the definition;
4. the image's own ``%test`` runs as packed: its test and environment scripts read back from the SIF into the
   folder that was packed, sourced and run there (``apptainer test`` cannot run in a chroot);
5. the SIF appears at IMAGE only by an atomic rename. A failure or Ctrl-C leaves no IMAGE and no private folder.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

import porter
from porter import __version__
from porter.errors import CommandFailed, ConfigError, ToolError
from porter.fs import atomic_path, atomic_write_bytes, atomic_write_text, owned_temp, owned_temp_dir, sha256_file
from porter.image import COMPRESSION
from porter.image.definition import BASE_KINDS, NET_PLUGIN, TOOLS, WHEELHOUSE, Recipe, base_kind
from porter.log import Logger
from porter.optspec import (Spec, arch_option, opt, output_option, python_option, site_option, toolchain_option,
                            wheelhouse_option)
from porter.run import Runner, make_env, which

apptainer_root_option = Spec(
    ("--apptainer-root",), dict(type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
                                help="Run apptainer inside this chroot (its root a mount point, /proc mounted: 'make "
                                     "chroot-rocm7'); default: the apptainer on PATH."), "apptainer_root")


@dataclass(frozen=True, kw_only=True)
class ImageRequest:
    """``porter image build``'s request: each field declares its own option (``--help`` says what each is)."""

    base: Path = opt("--base", type=click.Path(path_type=Path), required=True,
                     help="The userspace to start from: a site's .sif, a Docker/OCI archive (.tar) or a root folder "
                          "(a chroot).")
    wheelhouse: Path | None = wheelhouse_option.field(
        short="", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None, show_default=False,
        help="porter's wheels (and their dependencies) to install into the image.")
    net_plugin: Path | None = opt(
        "--net-plugin", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None, metavar="PACKAGE",
        help="An RCCL network plugin package ('porter net-plugin build' wrote it) to carry inside: unpacked to "
             "/opt/porter/net-plugin, named by the site's plugin variable (NCCL_NET_PLUGIN) in the image's "
             "environment, and loaded there by the build and by %test. Give --wheelhouse, this, or both.")
    output: Path = output_option.field(type=click.Path(dir_okay=False, path_type=Path), required=True,
                                       help="The image to write (IMAGE.sif); IMAGE.def and IMAGE.porter-tools/ are "
                                            "written beside it.")
    toolchain: str = toolchain_option.field(required=True, help="The toolchain profile the wheels were built with (its "
                                                                "label and archs go into the image's labels).")
    python: str = python_option.field(envvar=None, show_envvar=False, callback=None, default="/opt/venv/bin/python",
                                      show_default=True, help="The interpreter of the image's training environment (a "
                                                              "path inside the image).")
    site: str = site_option.field(default="", help="A site profile whose runtime environment becomes the image's "
                                                   "%environment (frontier, lumi-g, mi300x or a TOML file).")
    archs: tuple[str, ...] = arch_option.field(help="The node's GPU archs the install selects for (default: the "
                                                    "profile's).")
    apptainer_root: Path | None = apptainer_root_option.field()
    tools: Path | None = opt("--tools", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
                             help="porter's wheel and its dependencies (default: built here; fetching the "
                                  "dependencies needs the package index).")
    definition_only: bool = opt("--definition-only", is_flag=True,
                                help="Write IMAGE.def (and the tools) only, for a site to build with its own "
                                     "apptainer.")
    compression: str = opt(
        "--compression", type=click.Choice(COMPRESSION), default="gzip", show_default=True,
        help="How the image's root file system is compressed. gzip: apptainer's own default, read everywhere. zstd "
             "(level 3): packs several times faster (a 1.3 GB root: 29 CPU-seconds against 135) at about the same "
             "size; the node must read zstd squashfs (Linux 4.14 or newer, or a squashfuse built with zstd).")
    """The squashfs compression (:data:`porter.image.COMPRESSION`); gzip is apptainer's default, passed as none."""


@dataclass
class ImageResult:
    definition: Path
    tools: Path
    image: Path | None = None
    labels: dict[str, str] = field(default_factory=dict)
    installed: list[str] = field(default_factory=list)
    tested: bool = False
    """The image's own %test ran (from the packed SIF's root file system) and passed."""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        doc = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        return doc | {"seconds": round(self.seconds, 1)}


def _recipe(req: ImageRequest) -> Recipe:
    from packaging.utils import canonicalize_name

    from porter.artifacts import labels as label_names
    from porter.cluster.site.profiles import load_site, runtime_env
    from porter.install.wheelhouse import scan
    from porter.toolchain.profile import load_toolchain

    tc = load_toolchain(req.toolchain)
    archs = req.archs or tuple(tc.arch_names)
    if req.wheelhouse is None and req.net_plugin is None:
        raise ConfigError("nothing to put into the image", hint="pass --wheelhouse DIR, --net-plugin PACKAGE or both")
    wheels = [w for w in scan(req.wheelhouse) if w.manifest is not None] if req.wheelhouse is not None else []
    if req.wheelhouse is not None and not wheels:
        raise ConfigError(f"{req.wheelhouse} holds no porter wheel (a wheel with its <wheel>.porter.json)",
                          hint="build one with 'porter ops build' / 'porter wheel' / 'porter port' first")
    labels = {"org.porter.version": __version__, "org.porter.toolchain": label_names.make(tc),
              "org.porter.archs": ",".join(archs) or "none (CPU)"}
    for w in sorted(wheels, key=lambda w: w.filename):
        assert w.manifest is not None
        labels[f"org.porter.wheel.{canonicalize_name(w.component)}"] = \
            f"{w.filename} sha256:{w.manifest['wheel'].get('sha256', '?')}"
    site = load_site(req.site) if req.site else None
    env = runtime_env(site) if site is not None else {}
    library = _plugin_library(req.net_plugin) if req.net_plugin is not None else ""
    if req.net_plugin is not None:
        labels["org.porter.net-plugin"] = f"{req.net_plugin.name} sha256:{sha256_file(req.net_plugin)}"
        # the image's own plugin, where RCCL loads it from (a site's module path means nothing inside the image)
        env[site.plugin.env_var if site is not None and site.plugin is not None else "NCCL_NET_PLUGIN"] = \
            f"{NET_PLUGIN}/{library}"
    return Recipe(req.base.resolve(), req.python, archs, labels, env, wheels=bool(wheels),
                  net_plugin=req.net_plugin.name if req.net_plugin is not None else "", net_plugin_library=library,
                  site=req.site)


def _plugin_library(package: Path) -> str:
    """The library RCCL loads from a plugin package (the first its manifest lists), as ``<top>/lib/<name>``."""
    from porter.components.netplugin.verify import read_package

    if not package.is_file() or not package.name.endswith(".tar.gz"):
        raise ConfigError(f"{package} is not a network plugin package",
                          hint="pass the .tar.gz that 'porter net-plugin build' wrote")
    manifest, libs = read_package(package)
    paths = [str(e["path"]) for e in (manifest or {}).get("extensions") or [] if e.get("path")]
    if not paths or not libs:
        raise ConfigError(f"{package} lists no plugin library", hint="rebuild it with 'porter net-plugin build'")
    return paths[0]


def _porter_source() -> Path | None:
    """porter's source tree when it runs from one (an editable install): its wheel is built from it."""
    root = Path(porter.__file__).resolve().parents[1]
    project = root / "pyproject.toml"
    return root if project.is_file() and 'name = "porter"' in project.read_text() else None


def make_tools(dest: Path, runner: Runner, log: Logger) -> None:
    """``dest``: porter's wheel and its dependencies' wheels, for the image's pip (``--no-index``)."""
    if any(dest.glob("porter-*.whl")):
        return
    if (source := _porter_source()) is None:
        raise ConfigError("porter does not run from its source tree here, so it cannot build its own wheel "
                          "for the image", hint="pass --tools DIR holding porter's wheel and its dependencies "
                                                "(pip download porter -d DIR)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with owned_temp(dest.parent, f".{dest.name}.") as tmp:  # renamed to dest when whole
        py = sys.executable
        with log.step("porter's wheel and its dependencies, for the image"):
            runner.run([py, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", tmp,
                        source], timeout=600, hint="pip could not build porter's wheel")
            (wheel,) = Path(tmp).glob("porter-*.whl")
            runner.run([py, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "-d", tmp, wheel],
                       timeout=900, hint="pip could not fetch porter's dependencies (this needs the package "
                                         "index; offline, pass --tools DIR with them)")
        os.replace(tmp, dest)


@dataclass(frozen=True)
class Apptainer:
    """Where ``apptainer`` runs: this host (root ``None``) or a chroot."""

    root: Path | None

    def tool(self, *argv: str) -> list[str]:
        """``argv`` run where apptainer runs (through its chroot, if any)."""
        return (["chroot", str(self.root)] if self.root else []) + list(argv)

    def argv(self, *args: str) -> list[str]:
        return self.tool("apptainer", *args)

    def inside(self, path: Path) -> str:
        return "/" + str(path.relative_to(self.root)) if self.root else str(path)

    def work(self) -> Path:
        return (self.root / "var" / "cache" / "porter" / "images") if self.root else Path()


def mount_point(path: Path) -> bool:
    """Whether ``path`` is a mount point, a bind mount of a folder onto itself included (which
    ``os.path.ismount`` cannot see: same device)."""
    target = os.path.realpath(path)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return os.path.ismount(target)
    # field 5 is the mount point, with spaces and the like written as octal escapes
    return target in {ln.split()[4].encode().decode("unicode_escape") for ln in lines if len(ln.split()) > 4}


def find_apptainer(root: Path | None, definition: Path) -> Apptainer:
    tip = (f"the definition file {definition} is written: build it with apptainer (or cotainr) where they run, "
           f"e.g. 'apptainer build IMAGE.sif {definition.name}'")
    if root is not None:
        if not (root / "usr" / "bin" / "apptainer").exists():
            raise ToolError(f"no apptainer in {root}", hint=f"install it there ('chroot {root} apt-get install "
                                                            f"apptainer squashfs-tools'); or: {tip}")
        if not mount_point(root):
            raise ToolError(f"{root} is not a mount point: apptainer refuses to pack from inside a chroot whose "
                            "root is not one", hint=f"run 'mount --bind {root} {root}' and mount /proc inside "
                                                    f"again ('make chroot-rocm7' does both); or: {tip}")
        return Apptainer(root)
    if which("apptainer") is None:
        raise ToolError("apptainer is not installed here", hint="install apptainer (Debian sid: 'apt-get install "
                                                                f"apptainer squashfs-tools'), or pass "
                                                                f"--apptainer-root CHROOT; or: {tip}")
    return Apptainer(None)


ROOT_LEFT_OUT = ("./tmp/*", "./var/tmp/*", "./var/cache/porter")
"""What a root-folder base's copy leaves out, besides other file systems mounted in it (its /proc, /sys, /dev, bind
mounts): scratch, and porter's own cache when the base is one of porter's chroots (its builds, and this image's
work folder when apptainer runs in that same chroot)."""


def unpack_base(base: Path, kind: str, into: Path, app: Apptainer, runner: Runner, only: tuple[str, ...] = ()) -> None:
    """The base as a root folder at ``into`` (empty, existing); of a SIF, ``only`` these paths when given."""
    if kind == "root":
        # tar, not cp -a: one file system only (a chroot's /proc is mounted), and nothing of the folder the copy
        # goes into when that lies inside the base (cp refuses "a directory into itself" after copying the rest)
        skip = [f"--exclude={pat}" for pat in ROOT_LEFT_OUT]
        if into.resolve().is_relative_to(base.resolve()):
            skip.append(f"--exclude=./{into.resolve().relative_to(base.resolve()).parent}")
        pack = ["tar", "-C", str(base), "--one-file-system", "--numeric-owner", "--xattrs", *skip, "-cf", "-", "."]
        unpack = ["tar", "-C", str(into), "--numeric-owner", "--xattrs", "-xpf", "-"]
        runner.run(["bash", "-c", f"set -o pipefail; {shlex.join(pack)} | {shlex.join(unpack)}"],
                   timeout=3600, hint=f"could not copy the base root folder {base}")
        return
    if kind == "sif":
        staged, fs = into.parent / f"{into.name}.base.sif", into.parent / f"{into.name}.base.squashfs"
        shutil.copyfile(base, staged)
        try:
            listing = runner.run(app.argv("sif", "list", app.inside(staged)), timeout=120).output
            ids = [ln.split("|")[0].strip() for ln in listing.splitlines() if "Squashfs" in ln]
            if not ids:
                raise ConfigError(f"{base} holds no squashfs root file system", hint="pass another base image")
            runner.run(["sh", "-c", shlex.join(app.argv("sif", "dump", ids[0], app.inside(staged)))
                        + " > " + shlex.quote(str(fs))], timeout=3600, hint=f"could not read {base}")
            runner.run(app.tool("unsquashfs", "-f", "-q", "-d", app.inside(into), app.inside(fs), *only),
                       timeout=3600, hint=f"could not unpack {base}")
        finally:
            staged.unlink(missing_ok=True)
            fs.unlink(missing_ok=True)
        return
    raise ConfigError(f"porter builds from a root folder or a SIF here; {base} is a {kind}",
                      hint="build the written definition file with apptainer (it reads OCI archives itself), or "
                           "turn the archive into a SIF first ('apptainer build base.sif docker-archive:FILE')")


def run_inside(root: Path, line: str, runner: Runner, log: Logger, what: str, *, show: bool) -> None:
    """One shell line in the root folder's userspace: a mount namespace of its own (its /proc goes with it,
    whatever happens), minimal /dev nodes, no network needed (pip --no-index). ``show``: its output is logged
    after the step, as the user's own run would show it."""
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("random", 1, 8), ("urandom", 1, 9)):
        if not (dev / name).exists():
            os.mknod(dev / name, 0o666 | 0o020000, os.makedev(major, minor))
    (root / "proc").mkdir(exist_ok=True)
    script = f"mount -t proc proc {shlex.quote(str(root / 'proc'))} && exec chroot {shlex.quote(str(root))} " \
             f"/bin/sh -c {shlex.quote(line)}"
    with log.step(what):
        try:
            said = runner.run(["unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script],
                              env=make_env({"PORTER_CACHE_DIR": None, "HOME": "/root"}), timeout=3600).output
        except CommandFailed as exc:
            exc.message = f"{what}: failed with exit code {exc.returncode}; no image was written"
            exc.hint = (f"it ran '{line}' in the base's userspace; its output is above. What fails there fails on a "
                        "node that runs this base: use a base that has what the output names, or rebuild for it")
            raise
    for shown in said.strip().splitlines() if show else []:
        log.info(f"    {shown}")


def build_image(req: ImageRequest, runner: Runner, log: Logger) -> ImageResult:
    start = time.monotonic()
    kind = _checked(req)
    recipe = _recipe(req)
    output = req.output.resolve()
    definition = output.with_suffix(".def")
    tools = (req.tools or output.with_name(output.stem + ".porter-tools")).resolve()
    result = ImageResult(definition, tools, labels=recipe.labels)
    if req.tools is None:
        make_tools(tools, runner, log)
    atomic_write_text(definition, recipe.for_site(req.wheelhouse.resolve() if req.wheelhouse else None, tools,
                                                  req.net_plugin.resolve() if req.net_plugin else None))
    log.info(f"definition file: {definition}")
    if req.definition_only:
        result.seconds = time.monotonic() - start
        return result
    app = find_apptainer(req.apptainer_root, definition)
    work = app.work() if app.root else output.parent
    work.mkdir(parents=True, exist_ok=True)
    with owned_temp(work, f".{output.stem}.image.") as scratch:
        root = scratch / "root"
        root.mkdir()
        with log.step(f"unpacking the base {req.base} ({kind})"):
            unpack_base(req.base.resolve(), kind, root, app, runner)
        if not (root / req.python.lstrip("/")).exists():
            raise ConfigError(f"the base has no {req.python}", hint="pass --python with the interpreter of the "
                                                                    "image's training environment")
        _put_inputs(root, req, tools)
        checks = recipe.test()
        for what, line in recipe.post():  # what the verify found inside is shown
            run_inside(root, line, runner, log, what, show=(what, line) in checks)
        shutil.rmtree(root / "root" / ".cache", ignore_errors=True)
        result.installed = write_image_sbom(root, req.python, output.stem, wheels=recipe.wheels,
                                            net_plugin=req.net_plugin)
        recipe.labels["org.porter.sbom"] = SBOM
        inner = scratch / "image.def"
        atomic_write_text(inner, recipe.for_root(app.inside(root)))
        packed = scratch / "image.sif"
        with log.step(f"packing {output.name} with apptainer"):
            squash = ("--mksquashfs-args", SQUASH_ARGS[req.compression]) if req.compression != "gzip" else ()
            runner.run(app.argv("build", "--notest", "--force", *squash, app.inside(packed), app.inside(inner)),
                       timeout=3600, hint="apptainer could not pack the image")
        # the image's own %test, run with what was packed (apptainer cannot run it in a chroot): the test and
        # environment scripts apptainer wrote, read back from the SIF into the folder it packed, sourced and run
        # there (not the whole root file system unpacked again: on a file system with slow deletes, as with
        # online discard or Lustre, a second copy costs more than the rest of the build)
        shutil.rmtree(root / ".singularity.d", ignore_errors=True)
        unpack_base(packed, "sif", root, app, runner, only=(".singularity.d",))
        run_inside(root, 'for f in /.singularity.d/env/*.sh; do . "$f"; done; exec /bin/sh /.singularity.d/test',
                   runner, log, "the image's own %test, as packed in the SIF", show=True)
        result.tested = True
        with atomic_path(output) as tmp:
            shutil.copyfile(packed, tmp)
        result.image = output
    result.seconds = time.monotonic() - start
    return result


def _checked(req: ImageRequest) -> str:
    """The base's kind, once the request is one porter can build (else a ConfigError naming what is wrong)."""
    kind = base_kind(req.base)
    if not req.base.exists():
        raise ConfigError(f"base {req.base} does not exist", hint="pass a .sif, a Docker/OCI archive or a root folder")
    if not kind:
        raise ConfigError(f"base {req.base} is not a .sif, a Docker/OCI archive (.tar) or a root folder",
                          hint=f"porter image takes one of: {', '.join(BASE_KINDS)}")
    if req.output.suffix != ".sif":
        raise ConfigError(f"the image {req.output} should end in .sif", hint="name it IMAGE.sif")
    if req.compression not in COMPRESSION:
        raise ConfigError(f"compression {req.compression!r} is not one of {', '.join(COMPRESSION)}",
                          hint="gzip (read everywhere) or zstd (packs faster)")
    return kind


def _put_inputs(root: Path, req: ImageRequest, tools: Path) -> None:
    """The wheelhouse, porter's tools and the network plugin package where the image's recipe installs them from."""
    for src, dest in ((req.wheelhouse, WHEELHOUSE), (tools, TOOLS), (req.net_plugin, NET_PLUGIN)):
        target = root / dest.lstrip("/")
        shutil.rmtree(target, ignore_errors=True)
        if src is not None and src.is_dir():
            shutil.copytree(src.resolve(), target)
        elif src is not None:  # the plugin package, into its folder
            target.mkdir(parents=True)
            shutil.copyfile(src, target / src.name)


SQUASH_ARGS = {"zstd": "-comp zstd -Xcompression-level 3"}
"""mksquashfs's arguments per ``--compression`` other than gzip. zstd at level 3, not mksquashfs's default 15: 15
costs about what gzip does, 3 packs several times faster for about the same size."""

SBOM = "/opt/porter/sbom.cdx.json"
"""In the image: one CycloneDX document for every wheel porter installed there, and its network plugin."""


def write_image_sbom(root: Path, python: str, name: str, *, wheels: bool, net_plugin: Path | None) -> list[str]:
    """The image's combined SBOM, from porter's install records in its training environment and the network
    plugin's manifest; the installed wheels' names."""
    from porter.artifacts.sbom import image_document
    from porter.artifacts.wheelfile import source_date_epoch
    from porter.components.netplugin.verify import read_package

    prefix = Path(python).parents[1]  # a venv's, or /usr for /usr/bin/python3
    found = [root / d.lstrip("/") / "share" / "porter" / "installed" for d in (str(prefix), "/usr/local")]
    records = [json.loads(f.read_text()) for d in found if d.is_dir() for f in sorted(d.glob("*.json"))]
    if wheels and not records:
        raise ToolError(f"porter install left no install records under {', '.join(str(d) for d in found)}",
                        hint="the install step inside the image did not run to its end; its output is above")
    parts = [(str(r["project"]), str(r["version"]), r["manifest"], "pypi") for r in records]
    plugin = read_package(net_plugin)[0] if net_plugin is not None else None
    if plugin is not None:
        parts.append((str(plugin.get("component")), str(plugin.get("version") or ""), plugin, "generic"))
    atomic_write_bytes(root / SBOM.lstrip("/"), image_document(parts, name=name, epoch=source_date_epoch()))
    return [str(r["wheel"]) for r in records]


def inspect_image(image: Path, apptainer_root: Path | None, runner: Runner) -> dict[str, Any]:
    """The image's labels and definition, as apptainer reads them back."""
    app = find_apptainer(apptainer_root, image.with_suffix(".def"))
    path = image.resolve()
    staged: Path | None = None
    if app.root is not None and not path.is_relative_to(app.root):
        staged = owned_temp_dir(app.work(), ".inspect.") / image.name
        shutil.copyfile(path, staged)
        path = staged
    try:
        labels, deffile, test = (runner.run(app.argv("inspect", *what, app.inside(path)), timeout=120).output
                                 for what in (("--json", "--labels"), ("--deffile",), ("--test",)))
    finally:
        if staged is not None:
            shutil.rmtree(staged.parent, ignore_errors=True)
    return {"image": str(image), "labels": json.loads(labels).get("data", {}).get("attributes", {}).get("labels", {}),
            "definition": deffile, "test": test}
