"""Ahead-of-time DeepSpeed ops: read the op catalogue from a DeepSpeed tree, plan one ninja graph for
all selected ops with flags from an explicit toolchain profile, compile, and package one DeepSpeed
wheel whose ``installed_ops`` make DeepSpeed load the prebuilt modules with no JIT.

Library entry points: :func:`ops_prebuild.source.resolve_source`,
:func:`ops_prebuild.catalogue.read_catalogue`, :func:`ops_prebuild.plan.make_plan`,
:func:`ops_prebuild.build.build_ops`.
"""
