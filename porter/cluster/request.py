"""A build written down as data, which ``porter build --request FILE`` runs: a Slurm shard, a matrix cell, a CI job.

```
{"schema": "porter.request/1",
 "component": "deepspeed",              the component to build (its build command is the CLI's business)
 "options": {"source": "...", "toolchain_ref": "mi300x", "ops": ["cpu_adam"], "jobs": 8},
 "args": ["--pch"],                     more options as a user typed them (a matrix file's 'args')
 "last": {"link_only": true}}           what only the run after every shard sets (link, or report every unit)
```

``options`` are the build command's parameters by name (``porter COMMAND --help`` lists them), as JSON: what the
submitting command parsed, frozen (a job's environment does not change them), or a matrix cell's source,
toolchain, ops, python and jobs. Nothing spells them as a command line again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from porter.errors import ConfigError

SCHEMA = "porter.request/1"
RUNNER_OWNS = ("shard", "shards", "use_slurm", "shards_dir", "wait", "dry_run", "as_json")
"""Parameters a request never holds: whoever runs it says them (``porter build --shard``, ``--dry-run``...)."""


def jsonable(value: Any) -> Any:
    """A parsed option as JSON: paths as text, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class BuildRequest:
    component: str
    options: Mapping[str, Any]
    args: tuple[str, ...] = ()
    last: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if owned := sorted(k for k in (*self.options, *self.last) if k in RUNNER_OWNS):
            raise ConfigError(f"a build request may not set {', '.join(owned)}: who runs it says that",
                              hint="porter build --request FILE takes --shard, --dry-run and --json itself")

    @property
    def reports(self) -> bool:
        """The last run reports what the shards compiled (a compile-only build), rather than linking a wheel."""
        return bool(self.last.get("report_only"))

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "component": self.component, "options": jsonable(self.options),
                "args": list(self.args), "last": jsonable(self.last)}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> BuildRequest:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ConfigError(f"{where} is not a {SCHEMA} document",
                              hint="pass the request.json a sharded build or a matrix cell wrote")
        component, options, args, last = (data.get("component"), data.get("options", {}), data.get("args", []),
                                          data.get("last", {}))
        if not isinstance(component, str) or not component:
            raise ConfigError(f"{where}: 'component' must name a component", hint="porter matrix --help lists them")
        if not isinstance(options, dict) or not isinstance(last, dict):
            raise ConfigError(f"{where}: 'options' and 'last' must be tables of option names to values")
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"{where}: 'args' must be a list of strings")
        return cls(component, options, tuple(args), last)


def read_request(path: Path) -> BuildRequest:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no build request at {path}", hint="pass the request.json a sharded build or a matrix "
                                                              "cell wrote") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} cannot be read as a build request: {exc}",
                          hint="it is JSON written by porter; submit the build again to write it anew") from None
    return BuildRequest.from_dict(data, str(path))
