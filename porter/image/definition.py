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
NET_PLUGIN = "/opt/porter/net-plugin"
"""Where the image keeps the RCCL network plugin's package and its unpacked libraries."""

BASE_KINDS = ("sif", "oci-archive", "root")


def base_kind(base: Path) -> str:
    """``sif`` (an Apptainer image), ``oci-archive`` (a Docker/OCI ``.tar``) or ``root`` (a root folder)."""
    return "root" if base.is_dir() else "sif" if base.suffix == ".sif" else \
        "oci-archive" if base.name.endswith((".tar", ".tar.gz", ".tgz", ".oci")) else ""


@dataclass(frozen=True)
class Recipe:
    base: Path
    python: str
    """The image's interpreter the wheels go into (its training environment)."""
    archs: tuple[str, ...]
    labels: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    wheels: bool = True
    """The image installs a wheelhouse (else only a network plugin)."""
    net_plugin: str = ""
    """The network plugin's package file name (under :data:`NET_PLUGIN`), if the image carries one."""
    net_plugin_library: str = ""
    """The library RCCL loads, relative to :data:`NET_PLUGIN` (``<package>/lib/librccl-net.so``)."""
    site: str = ""

    def porter(self, *args: str) -> str:
        return shlex.join(["env", f"PYTHONPATH={LIB}", self.python, "-m", "porter", *args])

    def arch_args(self) -> list[str]:
        return [a for arch in self.archs for a in ("--arch", arch)]

    def post(self) -> list[tuple[str, str]]:
        """The install steps, as (what, shell line) run inside the image (by ``%post``, or by porter in a chroot);
        the test's lines last."""
        steps = [(f"installing porter in the image ({LIB})",
                  shlex.join([self.python, "-m", "pip", "install", "--quiet", "--no-index", "--find-links", TOOLS,
                              "--target", LIB, "--disable-pip-version-check", "porter"]))]
        if self.wheels:
            steps.append(("porter install, inside the image",
                          self.porter("install", WHEELHOUSE, "--python", self.python, *self.arch_args())))
        if self.net_plugin:
            steps.append((f"unpacking the network plugin into {NET_PLUGIN}",
                          shlex.join(["tar", "-xzf", f"{NET_PLUGIN}/{self.net_plugin}", "-C", NET_PLUGIN])))
        return steps + self.test()

    def test(self) -> list[tuple[str, str]]:
        """What the image's ``%test`` runs, also run at build time: porter's verify of the installed wheels, and
        the network plugin loaded from where RCCL will load it."""
        out = []
        if self.wheels:
            out.append(("porter verify, inside the image", self.porter("verify", "--python", self.python,
                                                                        *self.arch_args())))
        if self.net_plugin:
            site = ["--site", self.site] if self.site else []
            out.append(("porter net-plugin verify, inside the image",
                        self.porter("net-plugin", "verify", f"{NET_PLUGIN}/{self.net_plugin_library}", *site)))
        return out

    def render(self, *, bootstrap: str, source: str, files: dict[str, str] | None = None,
               post: bool = True) -> str:
        """The definition text: ``bootstrap``/``source`` (``From:``), ``files`` (host -> image), ``post``."""
        sections = {"%files": [f"{shlex.quote(a)} {shlex.quote(b)}" for a, b in (files or {}).items()],
                    "%post": ["set -e", *(line for _, line in self.post())] if post else [],
                    "%environment": [f"export {k}={_env_value(v)}" for k, v in self.environment.items()],
                    "%test": ["set -e", *(line for _, line in self.test())],
                    "%labels": [f"{k} {v}" for k, v in self.labels.items()]}
        out = [f"Bootstrap: {bootstrap}", f"From: {source}", ""]
        for head, lines in sections.items():  # a section with no lines is left out
            if lines:
                out += [head, *(f"    {line}" for line in lines), ""]
        return "\n".join(out)

    def for_site(self, wheelhouse: Path | None, tools: Path, net_plugin: Path | None = None) -> str:
        bootstrap = {"sif": "localimage", "root": "localimage", "oci-archive": "docker-archive"}[base_kind(self.base)]
        files = {f"{tools}/*": TOOLS}
        if wheelhouse is not None:
            files[f"{wheelhouse}/*"] = WHEELHOUSE
        if net_plugin is not None:
            files[str(net_plugin)] = f"{NET_PLUGIN}/{net_plugin.name}"
        return self.render(bootstrap=bootstrap, source=str(self.base), files=files)

    def for_root(self, root: str) -> str:
        """For a root folder porter has installed into (``root`` as the builder sees it)."""
        return self.render(bootstrap="localimage", source=root, post=False)


def _env_value(value: str) -> str:
    """A value for an ``export`` line: ``$VAR`` references stay live (the runtime's shell expands them)."""
    if re.fullmatch(r"[\w./:,=+@%-]*", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`") + '"'
