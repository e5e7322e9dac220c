"""What the engine builds: a catalogue of ops, each with its sources, include dirs, flags and what it links.

A component makes one from its project's own build description (DeepSpeed: its ``op_builder`` classes, asked in the
build python; APEX master: its ``op_builder`` package; Megatron: its fused kernels; FlashAttention and older APEX:
their setup.py's extensions), and the engine plans, compiles, links and reports it the same way for all."""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from porter.errors import ConfigError
from porter.torch_facts import TorchInfo
from ops_prebuild.source import Source

@dataclass(frozen=True)
class OpSpec:
    """One op (an extension module) a project declares: what turns it on, what it compiles, what it needs. A wheel
    driver's tree reading fills the first fields; the engine reads the rest (its catalogue's)."""

    name: str
    module: str = ""
    """Importable module the built ``.so`` provides (``deepspeed.ops.adam.cpu_adam_op``, ``apex.amp_C``)."""
    device: bool = False
    """A CUDA/HIP op (else a host C++ op)."""
    build_var: str = ""
    """What turns it on: an env var (``DS_BUILD_CPU_ADAM``, ``APEX_BUILD_AMP_C``) or a setup.py flag (``--cuda_ext``)."""
    required: bool = True
    """False when upstream builds it only under further conditions (then a missing one is a warning)."""
    builder: str = ""
    """Where the project declares it (its builder class, setup.py, ...)."""
    sources: tuple[str, ...] = ()
    """Relative to the tree."""
    include_paths: tuple[str, ...] = ()
    compatible: bool = True
    reason: str = ""
    cxx_args: tuple[str, ...] = ()
    nvcc_args: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    bf16: bool = False
    """Its device code is built with ``-DBF16_AVAILABLE`` (the project's rule for the toolchain decides)."""
    loads: tuple[str, ...] = ()
    """Ops its builder's ``load()`` loads first at run time (DeepSpeed 0.19.8: async_io and gds load pin_memory), so
    a build that has it must have them too, or the node compiles them (DeepSpeed's setup.py adds pin_memory)."""

    @property
    def group(self) -> str:
        """``cuda`` (device code: HIP on ROCm) or ``cpp`` (host code only), as apex names its groups."""
        return "cuda" if self.device else "cpp"

    @property
    def leaf(self) -> str:
        return self.module.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Catalogue:
    source: Source
    torch: TorchInfo
    accelerator: str
    ops: tuple[OpSpec, ...] = field(default_factory=tuple)
    feature_probes: tuple[tuple[str, bool], ...] = ()
    """Answers of the tree's load-time feature probes (``has_function``: ``"io_submit:aio"`` -> bool) in the build
    python, recorded into the wheel so that a node with no compiler gets the build host's answer."""

    def by_name(self) -> dict[str, OpSpec]:
        return {o.name: o for o in self.ops}

    def select(self, names: list[str] | None, all_compatible: bool) -> list[OpSpec]:
        """The ops asked for: unknown names -> error with close matches; incompatible -> error with why."""
        ops = self.by_name()
        if all_compatible:
            chosen = [o for o in self.ops if o.compatible]
            if not chosen:
                raise ConfigError(f"no op of {self.source.project} {self.source.version} can be built with this "
                                  "toolchain",
                                  hint="run 'porter ops list' to see why each op is left out")
            return self.with_loaded(chosen)
        if not names:
            raise ConfigError("no ops selected", hint="pass --ops a,b or --all-compatible")
        for name in names:
            if name not in ops:
                close = difflib.get_close_matches(name, ops, n=3)
                raise ConfigError(f"unknown op {name!r} in {self.source.project} {self.source.version}"
                                  + (f"; did you mean {', '.join(close)}?" if close else ""),
                                  hint="run 'porter ops list --source ...' for the ops of this tree")
            if not ops[name].compatible:
                raise ConfigError(f"op {name} cannot be built with this toolchain: {ops[name].reason}",
                                  hint="pick another toolchain profile, or leave the op out")
        return self.with_loaded([ops[name] for name in names])

    def with_loaded(self, chosen: list[OpSpec]) -> list[OpSpec]:
        """``chosen`` and, after them, every op one of them loads first at run time (:attr:`OpSpec.loads`; an op
        whose own load needs one that cannot be built is not compatible itself, see :func:`needing_unbuildable`)."""
        ops, out, seen = self.by_name(), list(chosen), {o.name for o in chosen}
        for op in out:  # grows while it runs: what an added op loads is added too
            for dep in op.loads:
                if dep not in seen and dep in ops:
                    seen.add(dep)
                    out.append(ops[dep])
        return out


def needing_unbuildable(ops: Sequence[OpSpec]) -> tuple[OpSpec, ...]:
    """``ops``, where an op that loads one this toolchain cannot build (directly or through another) is not
    compatible either, with that as its reason: built alone, it would compile the other on the node."""
    by = {o.name: o for o in ops}
    changed = True
    while changed:
        changed = False
        for o in list(by.values()):
            bad = next((d for d in o.loads if d in by and not by[d].compatible), None)
            if o.compatible and bad is not None:
                by[o.name] = replace(o, compatible=False, reason=f"it loads {bad} at run time, which this toolchain "
                                                                   f"cannot build ({by[bad].reason})")
                changed = True
    return tuple(by[o.name] for o in ops)


def source_tops(ops: Sequence[OpSpec]) -> list[str]:
    """The top folders of the tree that the ops' sources and include paths live in (what a build copies)."""
    rels = [p for op in ops for p in (*op.sources, *op.include_paths) if not os.path.isabs(p)]
    return sorted({Path(p).parts[0] for p in rels if Path(p).parts and Path(p).parts[0] != ".."})
