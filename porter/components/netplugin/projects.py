"""The RCCL network plugin projects porter builds, and how it recognises their source trees.

- **aws-ofi-nccl** (github aws/aws-ofi-nccl): autotools; ``--with-rocm[=PATH]`` (since 1.18.0: its
  ``m4/check_pkg_rocm.m4``) builds ``librccl-net-ofi.so`` and ``librccl-net.so``; ``--with-cuda`` builds the
  ``libnccl-net*.so`` pair. Also ``--with-libfabric=PATH``, ``--with-hwloc=PATH``, ``--disable-tests``
  (the tests need MPI). Its version comes from ``.release_version`` (release tarballs) or the git tag
  (``m4/get_version.sh``).
- **aws-ofi-rccl** (github ROCm/aws-ofi-rccl, what LUMI builds as 1.4.0): autotools, ROCm only;
  ``--with-hip=PATH``, ``--with-rccl=PATH``, ``--with-libfabric=PATH``, ``--with-mpi=PATH``,
  ``--disable-tests`` (1.4.0: without it configure stops when there is no ``mpi.h``); builds ``librccl-net.so``
  in ``src/`` as a versioned libtool library (``librccl-net.so.0.0.0`` + links). porter passes
  ``--disable-tests`` and builds and installs ``src`` only: its tests need MPI. The version is the literal
  in ``AC_INIT``.

A tree as a user clones it has ``autogen.sh`` and ``configure.ac`` but no ``configure``; a release tarball has
``configure``. Both are recognised here; :mod:`porter.components.netplugin.build` runs ``autogen.sh`` when needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from porter.errors import ConfigError
from porter.optspec import jobs_option, opt, python_option

if TYPE_CHECKING:
    from porter.toolchain.profile import Toolchain

_PKG_NAME = re.compile(r"^PACKAGE_NAME='([^']*)'", re.M)
_PKG_VERSION = re.compile(r"^PACKAGE_VERSION='([^']*)'", re.M)
_AC_INIT = re.compile(r"AC_INIT\(\s*\[([^\]]+)\]\s*,\s*(?:\[([^\]]*)\])?")
_PLAIN_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+_-]*$")


@dataclass(frozen=True)
class Project:
    name: str
    rocm_only: bool
    """No CUDA / no-device build exists (aws-ofi-rccl)."""
    make_dir: str
    """Where ``make`` and ``make install`` run, relative to the tree ('' = the top)."""

    def library_names(self, device: str) -> tuple[str, ...]:
        """The libraries a build for ``device`` (rocm | cuda | none) installs, the one RCCL finds first."""
        if self.name == "aws-ofi-rccl":
            return ("librccl-net.so",)
        return (("librccl-net.so", "librccl-net-ofi.so") if device == "rocm" else
                ("libnccl-net.so", "libnccl-net-ofi.so"))

    def configure_args(self, tc: Toolchain, *, prefix: str, libfabric: str = "",
                       extra: tuple[str, ...] = ()) -> list[str]:
        """The configure command line for ``tc`` (paths as the toolchain's executor sees them)."""
        device = device_of(tc)
        # the tests of both need MPI: aws-ofi-rccl 1.4.0's configure stops without mpi.h unless told
        # --disable-tests (older ones do not know it: configure only warns "unrecognized options")
        args = [f"--prefix={prefix}", "--disable-tests"]
        if self.name == "aws-ofi-rccl":
            if device != "rocm":
                raise ConfigError(f"aws-ofi-rccl builds for ROCm only; toolchain {tc.name} is a {tc.kind} toolchain",
                                  hint="pass a ROCm toolchain (-t debian-rocm7, frontier, ...)")
            root = _root(tc)
            args += [f"--with-hip={root}", f"--with-rccl={root}"]
        elif device == "rocm":
            args.append(f"--with-rocm={_root(tc)}")
        elif device == "cuda":
            args.append(f"--with-cuda={_root(tc)}")
        if libfabric:
            args.append(f"--with-libfabric={libfabric}")
        if self.name == "aws-ofi-nccl" and tc.cxx:
            args.append(f"CXX={tc.cxx}")
        return args + list(extra)


AWS_OFI_NCCL = Project("aws-ofi-nccl", rocm_only=False, make_dir="")
AWS_OFI_RCCL = Project("aws-ofi-rccl", rocm_only=True, make_dir="src")
PROJECTS: dict[str, Project] = {p.name: p for p in (AWS_OFI_NCCL, AWS_OFI_RCCL)}


def device_of(tc: Toolchain) -> str:
    """The device runtime a plugin built with ``tc`` links: rocm, cuda, or none (a cpu toolchain)."""
    return {"rocm": "rocm", "cuda": "cuda"}.get(tc.kind, "none")


def _root(tc: Toolchain) -> str:
    if not tc.root:
        raise ConfigError(f"toolchain {tc.name} names no root (where ROCm/CUDA is installed)",
                          hint="set root = \"/opt/rocm-X.Y\" (or \"/usr\" for Debian's packages) in the profile")
    return tc.root


@dataclass(frozen=True)
class Tree:
    project: Project
    version: str
    root: Path
    has_configure: bool
    has_autogen: bool
    supports_rocm: bool
    """aws-ofi-nccl before 1.18 has no ``--with-rocm``."""
    version_script: bool = False
    """A clone whose autogen asks ``m4/get_version.sh`` for its version, which reads ``.release_version`` or the git
    tag (git is not in the toolchain's root, and a tree from an archive or a snapshot has no ``.git``): porter
    writes ``.release_version`` into its work copy, from ``--release-version``."""


def recognise(root: Path) -> Tree:
    """The plugin project, version and build entry of a source tree (ConfigError when it is none)."""
    if not root.is_dir():
        raise ConfigError(f"plugin source {root} is not a folder",
                          hint="pass the top of an aws-ofi-nccl or aws-ofi-rccl clone or release tarball")
    texts = {n: (root / n).read_text(errors="replace") for n in ("configure", "configure.ac") if (root / n).is_file()}
    has_configure, has_autogen = "configure" in texts, (root / "autogen.sh").is_file()
    m, v = _PKG_NAME.search(texts.get("configure", "")), _PKG_VERSION.search(texts.get("configure", ""))
    name, version = (m.group(1) if m else ""), (v.group(1) if v else "")
    if not name and (m2 := _AC_INIT.search(texts.get("configure.ac", ""))):
        name = m2.group(1).strip()
        literal = (m2.group(2) or "").strip()
        version = literal if _PLAIN_VERSION.match(literal) else ""
    project = PROJECTS.get(name)
    if project is None:
        found = f"it names {name!r}" if name else "no configure or configure.ac names a package"
        raise ConfigError(f"{root} is not an aws-ofi-nccl or aws-ofi-rccl tree ({found})",
                          hint="pass the top of a clone (autogen.sh + configure.ac) or of a release tarball "
                               "(configure)")
    release = root / ".release_version"
    if release.is_file() and release.read_text().strip():
        version = release.read_text().strip()
    if not (has_configure or has_autogen):
        raise ConfigError(f"{root}: {project.name} tree without configure or autogen.sh",
                          hint="pass a complete clone or release tarball")
    supports_rocm = project.rocm_only or (root / "m4" / "check_pkg_rocm.m4").is_file() or any(
        "with-rocm" in t or "CHECK_PKG_ROCM" in t for t in texts.values())
    script = not has_configure and not version and (root / "m4" / "get_version.sh").is_file()
    return Tree(project, version or "unknown", root, has_configure, has_autogen, supports_rocm, script)


PROBE_PYTHON = python_option.but(envvar=None, show_envvar=False, callback=None, help=(
    "The python that runs porter's probe where the toolchain runs (inside its chroot or container). Default: python3 "
    "there; porter's own python on the host."))


@dataclass(frozen=True, kw_only=True)
class BuildSettings:
    """How a plugin is built, as ``porter net-plugin build`` takes it: each field declares its option."""

    libfabric: str = opt("--libfabric", default="", metavar="PREFIX",
                         help="libfabric's install prefix as the toolchain sees it (default: where the compiler finds "
                              "it).")
    configure_args: tuple[str, ...] = opt("--configure-arg", multiple=True, metavar="ARG",
                                          help="More configure options, passed last (repeat): --with-hwloc=/opt/hwloc.")
    jobs: int = jobs_option.field(default=2, show_default=True, help="make -j.")
    python: str = PROBE_PYTHON.field(default="python3", show_default=True)
    release_version: str = opt("--release-version", default="", metavar="VERSION",
                               help="The plugin's version, for a clone whose autogen reads it from git "
                                    "(m4/get_version.sh; git does not run in the toolchain's root): written into the "
                                    "work copy as .release_version.")
