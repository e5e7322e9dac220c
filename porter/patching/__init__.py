"""Patch sets: data in ``patches/<project>/``, applied atomically with a journal, idempotent and reversible.

``model`` holds the frozen models and the TOML loader, ``text`` the line model and anchored edits,
``udiff`` plain unified diffs, ``engine`` plan / apply / revert / status (layered sets understood).
Each patch names its problem (``needed_if``); where the problem is absent it is "not needed", not a failure.
"""

from porter.patching.engine import (Applied, Plan, PatchFailed, PatchResult, Reverted, SetState, apply, checked,
                                    failure_message, journal_status, plan, plan_revert, read_journal, revert)
from porter.patching.model import (Edit, Need, Patch, PatchSet, load_project, load_shipped, project_names,
                                   resolve_sets)

__all__ = ["Applied", "Edit", "Need", "Patch", "PatchFailed", "PatchResult", "PatchSet", "Plan", "Reverted",
           "SetState", "apply", "checked", "failure_message", "journal_status", "load_project", "load_shipped",
           "plan", "plan_revert", "project_names", "read_journal", "resolve_sets", "revert"]
