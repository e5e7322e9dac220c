"""Entry: torch's own hipify (extension mode) on a copy of the ops' sources, in the build python.

argv[1]: the copy's root; argv[2]: JSON list of groups, each [include dirs, files] (one per op).
Emits {original path: hipified path}.

Each op is hipified with its own include dirs, as its builder's JIT build would: an ``#include "x.h"`` resolves
in the dirs of the op that includes it, never in another op's (DeepSpeed has two ``memory_access_utils.h``).
torch keeps what it has hipified for the whole process, so a header two ops share is written once.
"""

from __future__ import annotations

import json
import sys

from porter.probes.protocol import emit  # porter: concatenated

from torch.utils.hipify import hipify_python  # noqa: E402  (after the protocol part drops sys.path[0])

root, groups = sys.argv[1], json.loads(sys.argv[2])
out: dict[str, str] = {}
for incs, files in groups:
    res = hipify_python.hipify(project_directory=root, output_directory=root, header_include_dirs=incs,
                               includes=[root + "/*"], extra_files=files, show_detailed=False,
                               is_pytorch_extension=True, hipify_extra_files_only=True, show_progress=False)
    out.update({f: (res[f].hipified_path if f in res and res[f].hipified_path else f) for f in files})
emit(out)
