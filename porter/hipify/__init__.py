"""HIPify: torch's own ``torch.utils.hipify`` plus porter's extra map, reports and cache.

Library entry point: :func:`hipify_tree` (the ``porter hipify`` command and the port/patch flow
call it) returns a :class:`HipifyReport`.
"""

from porter.hipify.engine import CACHE_NAME, FileResult, HipifyReport, hipify_tree
from porter.hipify.maps import ExtraMap, builtin_map, combined_map, load_map
from porter.hipify.scan import Finding

__all__ = ["CACHE_NAME", "ExtraMap", "FileResult", "Finding", "HipifyReport", "builtin_map", "combined_map",
           "hipify_tree", "load_map"]
