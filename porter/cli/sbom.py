"""porter sbom WHEEL: the SBOM (CycloneDX, PEP 770) a porter wheel or net-plugin package carries, in words."""

from __future__ import annotations

from pathlib import Path

import click

from porter.cli import emit
from porter.cli.options import json_option


@click.command("sbom")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@json_option
def sbom_cmd(path: Path, as_json: bool) -> None:
    """Show the SBOM PATH carries: what it is, the upstream source (its sdist sha256 or git commit), each patch
    porter applied, the toolchain, archs, wavefront and CPU ISA, the torch it was built against, and its
    extension modules.

    \b
    PATH: a wheel porter wrote (its .dist-info/sboms/porter.cdx.json) or a net-plugin package (.tar.gz).
    --json prints the CycloneDX document itself.
    """
    from porter.artifacts.sbom import describe, read_sbom

    doc = read_sbom(path)
    emit(as_json, doc, lambda: describe(doc))
