"""Entry, run under verify's trapped environment: load DeepSpeed ops, import each module.

argv[1]: JSON list of modules to import; argv[2]: JSON list of DeepSpeed ops to load through
DeepSpeed's own op loader.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import traceback

from porter.probes.protocol import emit  # porter: concatenated

modules, ds_ops = json.loads(sys.argv[1]), json.loads(sys.argv[2])
res: dict[str, object] = {}
# torch first, as every user of a prebuilt module imports it: a torch extension names libc10.so and libtorch*.so
# without a path of their own (no rpath) and finds the ones the imported torch loaded
with contextlib.suppress(ImportError):
    import torch  # noqa: F401
# DeepSpeed's own loader first, as a DeepSpeed user's process does: an op may need another loaded before it (0.19.8:
# async_io's module resolves pin_memory's symbols, which PinMemoryBuilder.load() makes global), so a bare import of
# its module alone fails where DeepSpeed's load does not
loader: dict[str, object] = {}
if ds_ops:
    try:
        from deepspeed.ops.op_builder.all_ops import ALL_OPS
    except BaseException as exc:
        loader["*"] = "skipped: DeepSpeed op loader not importable: " + repr(exc)[:300]
    else:
        for op in ds_ops:
            try:
                b = ALL_OPS.get(op)
                if b is None:
                    loader[op] = "no builder named %r in this DeepSpeed" % op
                else:
                    b.load(verbose=False)
                    loader[op] = None
            except BaseException as exc:
                loader[op] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-600:]
for m in modules:
    try:
        importlib.import_module(m)
        res[m] = None
    except BaseException as exc:
        res[m] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
emit({"modules": res, "loader": loader})
