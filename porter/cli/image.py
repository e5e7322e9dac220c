"""porter image: node-ready Apptainer images of a base userspace plus porter's wheels."""

from __future__ import annotations

from pathlib import Path

import click

from porter.cli import emit
from porter.cli.options import json_option, options
from porter.image.build import ImageRequest, apptainer_root_option, build_image, inspect_image
from porter.log import Logger
from porter.run import Runner


@click.group("image")
def image() -> None:
    """Node-ready Apptainer images: a base + a wheelhouse, installed and verified by porter."""


@image.command("build")
@options(ImageRequest)
@json_option
@click.pass_obj
def build_cmd(log: Logger, /, req: ImageRequest, as_json: bool) -> None:
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
    result = build_image(req, Runner(log, echo=log.verbose), log)
    emit(as_json, result.to_json(), lambda: [f"definition: {result.definition}", *(
        [f"image: {result.image} ({result.seconds:.0f} s)"] if result.image is not None else [])])


@image.command("inspect")
@click.argument("image_path", metavar="IMAGE", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@apptainer_root_option
@json_option
@click.pass_obj
def inspect_cmd(log: Logger, image_path: Path, apptainer_root: Path | None, as_json: bool) -> None:
    """What an image porter built says about itself: its labels (toolchain, archs, wheels) and its %test."""
    doc = inspect_image(image_path, apptainer_root, Runner(log, echo=log.verbose))
    emit(as_json, doc, lambda: [*(f"{key.removeprefix('org.porter.'):<24} {value}"
                                  for key, value in sorted(doc["labels"].items()) if key.startswith("org.porter.")),
                                f"test: {' '.join(doc['test'].split())}"])
