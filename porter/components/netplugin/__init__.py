"""The RCCL network plugin as a component: aws-ofi-nccl (``--with-rocm``) and the older aws-ofi-rccl.

- :mod:`.projects`: recognise a tree (project, version, configure or autogen.sh), the
  configure options per project and toolchain;
- :mod:`.build`: configure / make / install through the toolchain's executor, load what was
  built there, package it with a manifest (``porter net-plugin build``);
- :mod:`.verify`: load a package or library in the target environment and list its plugin
  symbols (``porter net-plugin verify``);
- :mod:`.checks`: whether a plugin fits a site (ROCm, RCCL major); the preflight asks it too;
- :mod:`.node`: a plugin as a node sees it (does it load here, what it exports, the manifest beside
  an installed one), for the preflight.
"""

from __future__ import annotations

from pathlib import Path

from ops_prebuild.source import Source
from porter.components.base import Component
from porter.errors import ConfigError


class NetPluginComponent(Component):
    name = "netplugin"
    title = "RCCL network plugin (aws-ofi-nccl)"
    dists: tuple[str, ...] = ()
    """Not a wheel: a package folder with a manifest, installed where RCCL looks (NCCL_NET_PLUGIN); no distribution
    to check (the default check_installed): 'porter net-plugin verify' loads the package itself."""

    def recognise(self, tree: Path) -> Source | None:
        from porter.components.netplugin.projects import recognise

        try:
            found = recognise(tree)
        except ConfigError:
            return None
        return Source(self.name, found.version, tree, regime="configure" if found.has_configure else "autogen.sh")


NETPLUGIN = NetPluginComponent()
