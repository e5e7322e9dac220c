"""Patch sets: data in ``patches/<project>/``, applied atomically with a journal, idempotent and reversible.

``model`` holds the frozen models and the TOML loader, ``text`` the line model and anchored edits,
``udiff`` plain unified diffs, ``engine`` plan / apply / revert / status (layered sets understood).
Each patch names its problem (``needed_if``); where the problem is absent it is "not needed", not a failure.
"""

from porter.patching.engine import (Applied, PatchFailed, apply, checked, failure_message, plan, plan_revert,
                                    read_journal, revert)
from porter.patching.model import PatchSet, load_project, load_shipped, resolve_sets

__all__ = ["Applied", "PatchFailed", "PatchSet", "apply", "checked", "failure_message", "load_project", "load_shipped",
           "plan", "plan_revert", "read_journal", "resolve_sets", "revert"]
