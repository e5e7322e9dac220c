"""The RCCL network plugin as a component: aws-ofi-nccl (``--with-rocm``) and the older aws-ofi-rccl.

- :mod:`porter.netplugin.projects`: recognise a tree (project, version, configure or autogen.sh), the
  configure options per project and toolchain;
- :mod:`porter.netplugin.build`: configure / make / install through the toolchain's executor, load what was
  built there, package it with a manifest (``porter net-plugin build``);
- :mod:`porter.netplugin.verify`: load a package or library in the target environment and list its plugin
  symbols (``porter net-plugin verify``);
- :mod:`porter.netplugin.checks`: whether a plugin fits a site (ROCm, RCCL major); the preflight asks it too;
- :mod:`porter.netplugin.node`: a plugin as a node sees it (does it load here, what it exports, the manifest beside
  an installed one), for the preflight.
"""
