"""One view of a python's torch, one way to ask for it, and one compatibility rule.

:class:`TorchInfo` is what every flow knows about a torch: its version and kind (rocm / cuda / cpu)
always; for a build python also the include and library dirs, ABI and tags an extension build
needs. :func:`probe_torch` asks a build python (through an executor); install's environment probe
fills the same class from ``torch/version.py``. :func:`refusal` is the rule every build applies:
a build that needs a ROCm (CUDA) torch is refused with any other kind. A dry run prints the plan and
the refusal and exits 0; a real run is refused before any work (exit 2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from porter.errors import ConfigError
from porter.executor import HOST, Executor
from porter.run import Runner


@dataclass(frozen=True)
class TorchInfo:
    version: str
    hip: str | None = None
    cuda: str | None = None
    root: str = ""
    """torch's package folder, as the python that reported it sees it."""
    include_dirs: tuple[str, ...] = ()
    cuda_include_dirs: tuple[str, ...] = ()
    library_dir: str = ""
    cxx11_abi: bool = True
    python_include: str = ""
    ext_suffix: str = ""
    python_tag: str = ""
    platform_tag: str = ""
    site_packages: str = ""

    @property
    def kind(self) -> str:
        return "rocm" if self.hip else "cuda" if self.cuda else "cpu"

    @property
    def release(self) -> str:
        """``2.13.0`` from ``2.13.0+cpu``."""
        try:
            return ".".join(str(p) for p in Version(self.version).release)
        except InvalidVersion:
            return self.version.split("+")[0]

    @property
    def major_minor(self) -> str:
        return ".".join(self.release.split(".")[:2])

    @property
    def wheel_tag(self) -> str:
        """The tag of a wheel with extension modules for this python (``cp311-cp311-linux_x86_64``): the
        interpreter's own tag for both interpreter and ABI, as packaging spells a CPython extension's."""
        from packaging.tags import Tag

        return str(Tag(self.python_tag, self.python_tag, self.platform_tag))

    def describe(self) -> str:
        extra = f", HIP {self.hip}" if self.hip else f", CUDA {self.cuda}" if self.cuda else ""
        return f"{self.version} ({self.kind}{extra})"

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "kind": self.kind, "hip": self.hip, "cuda": self.cuda}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TorchInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in doc.items() if k in names}
        return cls(**kw)


def probe_torch(python: str, runner: Runner, *, executor: Executor = HOST) -> TorchInfo:
    """The build python's torch. ConfigError (exit 2) when it has none."""
    from porter.probe import run_probe

    doc = run_probe("torch", [], python=python, runner=runner, executor=executor, timeout=300, what="for its torch")
    if "error" in doc:
        where = "" if executor.kind == "host" else f" (in {executor.describe()})"
        raise ConfigError(f"{python}{where} cannot import torch: {doc['error']}",
                          hint="install the torch the build is for into that python (CPU: pip install "
                               "torch==2.13.0), or pass --python with the interpreter that has it")
    return TorchInfo.from_doc(doc)


def refusal(need: str | None, torch: TorchInfo, python: str, *, what: str) -> ConfigError | None:
    """Why a build of ``what`` that needs a ``need`` torch (rocm / cuda / None) cannot run with
    ``torch``; None when it can. The one compatibility rule of every build."""
    if need is None or torch.kind == need:
        return None
    if need == "rocm":
        build = "the ROCm build of torch (ATen/hip headers, libtorch_hip to link against)"
        use = ("run in a python with the ROCm torch of the profile's ROCm version (sites ship it as a module or "
               "container)")
    else:
        build = f"the {need} build of torch"
        use = f"use a python with the {need} build of torch" + (" (make cuda-venv)" if need == "cuda" else "")
    return ConfigError(f"{what} needs {build}, but {python} has torch {torch.describe()}; nothing was built",
                       hint=f"{use} and pass --python; --dry-run prints the full plan with any torch")


def build_torch(python: str, executor: Executor, runner: Runner, *, need: str | None, what: str,
                known: TorchInfo | None = None) -> tuple[TorchInfo, ConfigError | None]:
    """Every build's torch step: the build python's torch (``known``, else probed) and, when it is not the ``need``
    kind, the :func:`refusal`: raised in a real run, returned in a dry run (a recording ``runner``) for its plan."""
    torch = known or probe_torch(python, runner.real(echo=runner.log.verbose), executor=executor)
    refused = refusal(need, torch, python, what=what)
    if refused is not None and not runner.dry:
        raise refused
    return torch, refused


def need_for(kind: str) -> str | None:
    """The torch kind a toolchain kind's extension builds link against (cpu, and the emulated HIP target, whose
    modules link against torch's CPU libraries: any torch)."""
    return None if kind in ("cpu", "emulated") else kind
