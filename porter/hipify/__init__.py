"""HIPify: torch's own ``torch.utils.hipify`` plus porter's extra map, reports and cache.

Library entry point: :func:`hipify_tree` (the ``porter hipify`` command and the port/patch flow
call it) returns a :class:`HipifyReport`.
"""

from porter.hipify.engine import CACHE_NAME, HipifyReport, hipify_tree
from porter.hipify.scan import Finding

__all__ = ["CACHE_NAME", "Finding", "HipifyReport", "hipify_tree"]
