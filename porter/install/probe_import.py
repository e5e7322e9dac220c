"""Run by the *target* interpreter (standard library only) under verify's trapped environment.

argv[1]: JSON list of modules to import; argv[2]: JSON list of DeepSpeed ops to load through
DeepSpeed's own op loader. Prints one ``PORTER-IMPORT {json}`` line.
"""
import os, sys

if sys.path and os.path.abspath(sys.path[0] or '.') == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]   # porter's own folder must not shadow the target's modules

import importlib, json, sys, traceback
modules, ds_ops = json.loads(sys.argv[1]), json.loads(sys.argv[2])
res = {}  # type: dict[str, object]
for m in modules:
    try:
        importlib.import_module(m)
        res[m] = None
    except BaseException as exc:
        res[m] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
loader = {}  # type: dict[str, object]
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
print("PORTER-IMPORT " + json.dumps({"modules": res, "loader": loader}))
