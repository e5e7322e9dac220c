"""Entry: a HIP view of this python's torch headers, made with torch's own hipify (pytorch mode).

argv[1]: torch's include folder; argv[2]: the (new, empty) folder to fill. Copies ``ATen/cuda``, ``c10/cuda``,
``ATen/native/cuda``, ``torch/csrc/cuda`` and ``torch/csrc/distributed/c10d`` into a work folder inside it and
hipifies them as ROCm torch's own build does: ATen and c10 out of place (``ATen/hip/HIPContext.h``,
``c10/hip/HIPGuard.h``, ``ATen/native/hip/Resize.h``, ...),
torch's own headers in place (a ROCm torch ships ``torch/csrc/cuda/*.h`` and c10d's NCCL headers with HIP in
them); keeps the generated ``*/hip`` trees and the in-place ones.
Emits {"files": N} or {"error": why}.
"""

from __future__ import annotations

import os
import shutil
import sys

from porter.probes.protocol import emit  # porter: concatenated

include, dest = sys.argv[1], sys.argv[2]
INPLACE = ("torch/csrc/cuda", "torch/csrc/distributed/c10d")
OUT_OF_PLACE = ("ATen/cuda", "c10/cuda", "ATen/native/cuda")  # -> ATen/hip, c10/hip, ATen/native/hip
subdirs = [d for d in (*OUT_OF_PLACE, *INPLACE) if os.path.isdir(os.path.join(include, d))]
if "ATen/cuda" not in subdirs or "c10/cuda" not in subdirs:
    emit({"error": f"{include} has no ATen/cuda and c10/cuda headers to hipify"})
    sys.exit(0)
work = os.path.join(dest, ".work")
for d in subdirs:
    shutil.copytree(os.path.join(include, d), os.path.join(work, d))
from torch.utils.hipify import hipify_python  # noqa: E402

hipify_python.hipify(project_directory=work, output_directory=work,
                     includes=[os.path.join(work, d, "*") for d in subdirs], show_detailed=False,
                     is_pytorch_extension=False, show_progress=False)
count = 0
for d in (*(d.replace("/cuda", "/hip") for d in OUT_OF_PLACE), *INPLACE):
    if os.path.isdir(os.path.join(work, d)):
        os.makedirs(os.path.dirname(os.path.join(dest, d)), exist_ok=True)
        shutil.move(os.path.join(work, d), os.path.join(dest, d))
        count += sum(len(files) for _, _, files in os.walk(os.path.join(dest, d)))
shutil.rmtree(work)
emit({"files": count})
