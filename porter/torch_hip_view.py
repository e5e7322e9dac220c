"""A HIP view of a CPU or CUDA torch's headers: a stand-in for compile checks only.

A ROCm build of a torch extension includes ``ATen/hip/HIPContext.h``, ``c10/hip/HIPGuard.h`` and
friends, which only ROCm builds of torch ship, and torch's own ``torch/csrc/cuda/*.h`` (and c10d's) as a ROCm torch ships
them (hipified in place). torch's own hipify, run in pytorch mode on a CPU/CUDA wheel's ``ATen/cuda``,
``ATen/native/cuda``, ``c10/cuda`` and ``torch/csrc/cuda`` headers, generates them the way ROCm torch's build does; the
few headers ROCm torch's CMake writes are added here (:data:`EXTRA`, as small as possible). With
that view first on the include path, a hipified extension *compiles* for gfx targets; it never
*links*: there is no libtorch_hip here. The view is never used when the build python has a real
ROCm torch (:func:`needed`). Made once per torch version, in porter's work folder.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from porter.errors import ConfigError
from porter.executor import HOST, Executor
from porter.fs import atomic_write_text, owned_temp, publish_dir
from porter.locks import hold
from porter.probe import run_probe
from porter.run import Runner
from porter.torch_facts import TorchInfo

DONE = ".porter-view"
LAYOUT = 4
"""What a view holds (2: ``torch/csrc/cuda`` hipified in place too; 3: and ``torch/csrc/distributed/c10d``; 4: and
``ATen/native/cuda`` as ``ATen/native/hip``); part of its folder's key."""

# Headers ROCm torch's CMake generates (no CUDA counterpart to hipify): what they define here is
# what a ROCm build of torch defines for an extension that includes them.
EXTRA: dict[str, str] = {
    "c10/hip/impl/hip_cmake_macros.h": (
        "// written by porter: stands in for the file ROCm torch's CMake generates\n"
        "#pragma once\n"
        "#ifndef C10_HIP_BUILD_SHARED_LIBS\n#define C10_HIP_BUILD_SHARED_LIBS\n#endif\n"),
}


def needed(torch: TorchInfo) -> bool:
    """Only a torch that is not a ROCm build needs the view (a ROCm torch ships the real headers)."""
    return torch.kind != "rocm"


def view_dir(torch: TorchInfo, work: Path) -> Path:
    key = hashlib.sha256(f"{torch.version}|{torch.root}|{LAYOUT}".encode()).hexdigest()[:12]
    return work / "torch-hip-view" / f"torch-{torch.version.replace('+', '-')}-{key}"


def make_view(torch: TorchInfo, work: Path, *, python: str, runner: Runner, executor: Executor = HOST) -> Path:
    """The view's folder, made once per torch (:func:`view_dir` names it without making it)."""
    if not needed(torch):
        raise ConfigError(f"torch {torch.version} is a ROCm build: it has the real HIP headers, no view is made")
    dest = view_dir(torch, work)
    if (dest / DONE).is_file():
        return dest
    include = next((d for d in torch.include_dirs if (Path(d) / "ATen").is_dir()), "")
    if not include or not (Path(include) / "ATen" / "cuda").is_dir() or not (Path(include) / "c10" / "cuda").is_dir():
        raise ConfigError(f"torch {torch.version} at {torch.root} ships no ATen/cuda and c10/cuda headers, so no "
                          "HIP view of it can be made",
                          hint="use a build python whose torch wheel has them (the CPU and CUDA wheels from PyPI do)")
    with hold(dest, f"a HIP view of torch {torch.version}", say=runner.log.info):
        if (dest / DONE).is_file():  # another build made it while this one waited
            return dest
        with owned_temp(dest.parent, f".{dest.name}.") as tmp:
            paths = [executor.inside(p) if executor.kind != "host" else str(p) for p in (include, tmp)]
            doc = run_probe("torch_hip_view", paths, python=python, runner=runner, executor=executor,
                            what="to make a HIP view of its torch headers")
            if "error" in doc:
                raise ConfigError(f"no HIP view of torch {torch.version}: {doc['error']}")
            for rel, text in EXTRA.items():
                atomic_write_text(tmp / rel, text)
            atomic_write_text(tmp / DONE, f"torch {torch.version}: {doc['files']} hipified headers + "
                                          f"{len(EXTRA)} written by porter\n")
            publish_dir(tmp, dest)  # over an unfinished view (no DONE): only its maker, under the lock
    return dest
