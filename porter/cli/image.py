"""porter image: node-ready Apptainer images of a base userspace plus porter's wheels."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import click

from porter.cli import emit
from porter.cli.options import json_option, options
from porter.image import COMPRESSION as IMAGE_COMPRESSION
from porter.log import Logger
from porter.optspec import (Spec, arch_option, opt, output_option, python_option, site_option, toolchain_option,
                            wheelhouse_option)
from porter.run import Runner

apptainer_root_option = Spec(
    ("--apptainer-root",), dict(type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
                                help="Run apptainer inside this chroot (its root a mount point, /proc mounted: 'make "
                                     "chroot-rocm7'); default: the apptainer on PATH."), "apptainer_root")


@click.group("image")
def image() -> None:
    """Node-ready Apptainer images: a base + a wheelhouse, installed and verified by porter."""


@dataclass(frozen=True)
class ImageCommandOptions:
    """``porter image build``'s options: each field declares its own (``--help`` says what each is)."""

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
        "--compression", type=click.Choice(IMAGE_COMPRESSION), default="gzip", show_default=True,
        help="How the image's root file system is compressed. gzip: apptainer's own default, read everywhere. zstd "
             "(level 3): packs several times faster (a 1.3 GB root: 29 CPU-seconds against 135) at about the same "
             "size; the node must read zstd squashfs (Linux 4.14 or newer, or a squashfuse built with zstd).")


@image.command("build")
@options(ImageCommandOptions)
@json_option
@click.pass_obj
def build_cmd(log: Logger, /, req: ImageCommandOptions, as_json: bool) -> None:
    """Build IMAGE.sif: the base with the wheelhouse installed by porter's installer and verified inside (and an
    RCCL network plugin carried and loaded inside).

    \b
    The definition file IMAGE.def is always written first: a site builds it with its own apptainer or
    cotainr. Here porter runs that definition's install steps itself, in a chroot of the unpacked base
    (apptainer cannot run them inside a chroot), then packs the folder with apptainer: labels (porter's
    version, the toolchain label, the archs, each wheel's sha256), the site's environment, and a %test
    that runs the same 'porter verify'. Nothing runs on a GPU here; verify checks code objects and
    imports with compilers trapped. The image appears only when whole.
    """
    from porter.image.build import ImageRequest, build_image

    # the options are the request's fields, by name
    result = build_image(ImageRequest(**asdict(req)), Runner(log, echo=log.verbose), log)
    emit(as_json, result.to_json(), lambda: [f"definition: {result.definition}", *(
        [f"image: {result.image} ({result.seconds:.0f} s)"] if result.image is not None else [])])


@image.command("inspect")
@click.argument("image_path", metavar="IMAGE", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@apptainer_root_option
@json_option
@click.pass_obj
def inspect_cmd(log: Logger, image_path: Path, apptainer_root: Path | None, as_json: bool) -> None:
    """What an image porter built says about itself: its labels (toolchain, archs, wheels) and its %test."""
    from porter.image.build import inspect_image

    doc = inspect_image(image_path, apptainer_root, Runner(log, echo=log.verbose))
    emit(as_json, doc, lambda: [*(f"{key.removeprefix('org.porter.'):<24} {value}"
                                  for key, value in sorted(doc["labels"].items()) if key.startswith("org.porter.")),
                                f"test: {' '.join(doc['test'].split())}"])
