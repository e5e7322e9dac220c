"""ROCm builds compile hipified sources: torch's own hipify (extension mode) run on a copy of csrc/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from porter.errors import ToolError
from porter.run import Runner, make_env
from ops_prebuild.catalogue import OpSpec

_SCRIPT = r"""
import json, sys
from torch.utils.hipify import hipify_python
root, incs, files = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
res = hipify_python.hipify(project_directory=root, output_directory=root, header_include_dirs=incs,
                           includes=[root + "/*"], extra_files=files, show_detailed=False,
                           is_pytorch_extension=True, hipify_extra_files_only=True, show_progress=False)
out = {f: (res[f].hipified_path if f in res and res[f].hipified_path else f) for f in files}
print("@@hipified@@" + json.dumps(out))
"""


def hipify_sources(tree: Path, ops: list[OpSpec], dest: Path, *, python: str, runner: Runner) -> dict[str, dict[str, str]]:
    """op -> {relative source: hipified absolute path}. The copy is refreshed on every call."""
    if not ops:
        return {}
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(tree / "csrc", dest / "csrc")
    files = sorted({str(dest / s) for o in ops for s in o.sources})
    incs = sorted({str(dest / p) for o in ops for p in o.include_paths})
    res = runner.run([python, "-c", _SCRIPT, str(dest), json.dumps(incs), json.dumps(files)],
                     env=make_env(), timeout=900, check=False)
    if "@@hipified@@" not in res.output:
        raise ToolError("torch's hipify failed on the ops' sources",
                        hint="its last lines:\n" + "\n".join(res.output.splitlines()[-10:]))
    mapping: dict[str, str] = json.loads(res.output.split("@@hipified@@", 1)[1].splitlines()[0])
    return {o.name: {s: mapping.get(str(dest / s), str(dest / s)) for s in o.sources} for o in ops}
