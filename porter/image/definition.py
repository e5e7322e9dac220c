"""The Apptainer definition file of a node-ready image.

One :class:`Recipe` gives both renderings: the one a site builds with its own ``apptainer`` (bootstrap from the
base, ``%files`` bring the wheelhouse and porter, ``%post`` installs and verifies with porter), and the one porter
builds from a root folder it has already installed into (the same ``%post`` steps, run by porter in a chroot,
so only labels, environment and test are left to ``apptainer``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

WHEELHOUSE = "/opt/porter/wheelhouse"
"""Where the image keeps the wheelhouse it was made from (what ``%test`` checks again)."""
TOOLS = "/opt/porter/tools"
"""porter and its dependencies as wheels, in the image."""
LIB = "/opt/porter/lib"
"""porter, installed apart from the training environment (``pip install --target``)."""

BASE_KINDS = ("sif", "oci-archive", "root")


def base_kind(base: Path) -> str:
    """``sif`` (an Apptainer image), ``oci-archive`` (a Docker/OCI ``.tar``) or ``root`` (a root folder)."""
    if base.is_dir():
        return "root"
    if base.suffix == ".sif":
        return "sif"
    if base.name.endswith((".tar", ".tar.gz", ".tgz", ".oci")):
        return "oci-archive"
    return ""


@dataclass(frozen=True)
class Recipe:
    base: Path
    python: str
    """The image's interpreter the wheels go into (its training environment)."""
    archs: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)

    def porter(self, *args: str) -> str:
        return shlex.join(["env", f"PYTHONPATH={LIB}", self.python, "-m", "porter", *args])

    def arch_args(self) -> list[str]:
        return [a for arch in self.archs for a in ("--arch", arch)]

    def post(self) -> list[str]:
        """The install steps, as shell lines run inside the image (by ``%post``, or by porter in a chroot)."""
        return [shlex.join([self.python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", TOOLS,
                            "--target", LIB, "--disable-pip-version-check", "porter"]),
                self.porter("install", WHEELHOUSE, "--python", self.python, *self.arch_args()),
                self.test()]

    def test(self) -> str:
        return self.porter("verify", "--python", self.python, *self.arch_args())

    def render(self, *, bootstrap: str, source: str, files: dict[str, str] | None = None,
               post: bool = True) -> str:
        """The definition text: ``bootstrap``/``source`` (``From:``), ``files`` (host -> image), ``post``."""
        out = [f"Bootstrap: {bootstrap}", f"From: {source}", ""]
        if files:
            out += ["%files"] + [f"    {shlex.quote(a)} {shlex.quote(b)}" for a, b in files.items()] + [""]
        if post:
            out += ["%post", "    set -e"] + [f"    {line}" for line in self.post()] + [""]
        if self.environment:
            out += ["%environment"] + [f"    export {k}={_env_value(v)}" for k, v in self.environment.items()] + [""]
        out += ["%test", "    set -e", f"    {self.test()}", ""]
        if self.labels:
            out += ["%labels"] + [f"    {k} {v}" for k, v in self.labels.items()] + [""]
        return "\n".join(out)

    def for_site(self, wheelhouse: Path, tools: Path) -> str:
        bootstrap = {"sif": "localimage", "root": "localimage", "oci-archive": "docker-archive"}[base_kind(self.base)]
        return self.render(bootstrap=bootstrap, source=str(self.base),
                           files={f"{wheelhouse}/*": WHEELHOUSE, f"{tools}/*": TOOLS})

    def for_root(self, root: str) -> str:
        """For a root folder porter has installed into (``root`` as the builder sees it)."""
        return self.render(bootstrap="localimage", source=root, post=False)


def _env_value(value: str) -> str:
    """A value for an ``export`` line: ``$VAR`` references stay live (the runtime's shell expands them)."""
    if re.fullmatch(r"[\w./:,=+@%-]*", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
