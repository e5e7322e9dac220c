"""Entry: torch's own hipify (extension mode) on a copy of the ops' sources, in the build python.

argv[1]: the copy's root; argv[2]: JSON list of include dirs; argv[3]: JSON list of files.
Emits {original path: hipified path}.
"""

from __future__ import annotations

import json
import sys

from porter.probes.protocol import emit  # porter: concatenated

PARTS: tuple[str, ...] = ()

from torch.utils.hipify import hipify_python  # noqa: E402  (after the protocol part drops sys.path[0])

root, incs, files = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
res = hipify_python.hipify(project_directory=root, output_directory=root, header_include_dirs=incs,
                           includes=[root + "/*"], extra_files=files, show_detailed=False,
                           is_pytorch_extension=True, hipify_extra_files_only=True, show_progress=False)
emit({f: (res[f].hipified_path if f in res and res[f].hipified_path else f) for f in files})
