"""porter wheelhouse index: serve or mount one wheelhouse for every node."""

from __future__ import annotations

from pathlib import Path

import click

from porter.cli import emit
from porter.cli.options import json_option
from porter.log import Logger


@click.group()
def wheelhouse() -> None:
    """Wheelhouse tools (a folder of wheels, each porter wheel with its <wheel>.porter.json)."""


@wheelhouse.command("index")
@click.argument("directory", type=click.Path(file_okay=False, exists=True, path_type=Path))
@json_option
@click.pass_obj
def index_cmd(log: Logger, directory: Path, as_json: bool) -> None:
    """Write DIRECTORY/simple/ (a PEP 503 index) and DIRECTORY/porter-wheelhouse.json.

    \b
    Every porter wheel's sha256 is checked against its manifest first; nothing is written on a
    mismatch. The index is swapped in atomically. Use it with
    'pip install --index-url file://DIRECTORY/simple/ ...' or serve DIRECTORY over HTTP.
    """
    from porter.install.wheelhouse import INDEX_NAME, write_index

    doc = write_index(directory)
    root = directory.resolve()
    emit(as_json, doc, lambda: [f"indexed {len(doc['wheels'])} wheel(s): {root / 'simple'}/ and {root / INDEX_NAME}"])
    if not as_json:
        log.tip(f"pip install --index-url {(root / 'simple').as_uri()}/ <name>")
