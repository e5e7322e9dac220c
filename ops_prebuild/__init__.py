"""The one ahead-of-time engine: any project's op catalogue (its translation units, flags and modules) compiled
for an explicit toolchain profile in one ninja graph, then linked per op; it knows no project (DeepSpeed's,
Megatron's, APEX's and FlashAttention's catalogues come from their components under ``porter/components/``).

Library entry points: :func:`ops_prebuild.source.fetch_tree` (an sdist, tree or ``NAME==X``) and
:func:`ops_prebuild.source.build_copy` (porter's patched copy of it), :class:`ops_prebuild.catalogue.Catalogue`,
:func:`ops_prebuild.plan.make_plan`, :func:`ops_prebuild.build.compile_catalogue`; the one build flow that calls
them for every component is :mod:`porter.wheels`.
"""
