"""Run a probe script (:mod:`porter.probes`) in a foreign python, through an executor.

One protocol for all of them: the script goes in on stdin (``python - ARGS``), so nothing is written
into a chroot, a container or a cache to run it; its document comes back after the marker line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from porter.errors import ToolError
from porter.executor import HOST, Executor
from porter.run import Runner, make_env
from porter.probes.protocol import MARKER

_DROP = re.compile(r"^.*# porter: concatenated\s*$|^from __future__ import annotations\s*$", re.M)
_PARTS = re.compile(r"^from porter\.probes\.(\w+) import .*# porter: concatenated\s*$", re.M)


@cache
def script_text(name: str) -> str:
    """The self-contained source of probe ``name``: protocol, the parts it imports, then itself."""
    def read(part: str) -> str:
        return resources.files("porter.probes").joinpath(f"{part}.py").read_text()

    own = read(name)
    parts = [p for p in _PARTS.findall(own) if p != "protocol"]
    chunks = [read("protocol"), *(read(p) for p in parts), own]
    return "from __future__ import annotations\n" + "\n".join(_DROP.sub("", c) for c in chunks)


def parse_output(output: str) -> Any | None:
    """The document a probe printed (the last marker line), or None."""
    return next((json.loads(line[len(MARKER):]) for line in reversed(output.splitlines()) if line.startswith(MARKER)),
                None)


def run_probe(name: str, args: Sequence[str], *, python: str, runner: Runner, executor: Executor = HOST,
              env: Mapping[str, str] | None = None, cwd: str | None = None, timeout: float = 600,
              what: str = "") -> Any:
    """Run probe ``name`` with ``python`` through ``executor``; return its document.

    Raises ToolError naming the python (and where it ran) when it cannot run or prints no document.
    """
    argv = executor.argv(python, "-", *args)
    where = "" if executor.kind == "host" else f" in {executor.describe()}"
    try:
        res = runner.run(argv, env=env if env is not None else make_env(), cwd=cwd, timeout=timeout,
                         check=False, input=script_text(name))
    except ToolError:
        raise ToolError(f"python not found{where}: {python}",
                        hint="pass --python with an interpreter that exists there") from None
    doc = parse_output(res.output)
    if doc is None:
        tail = "\n".join(res.output.strip().splitlines()[-12:]) or "no output"
        raise ToolError(f"could not ask {python}{where} {what or 'its facts'} (exit code {res.returncode})",
                        hint=f"pass --python with a working interpreter; its last lines:\n{tail}")
    return doc
