"""Patch sets: data in ``patches/<project>/``, applied atomically with a journal, idempotent and reversible.

``model`` holds the frozen models and the TOML loader, ``text`` the line model and anchored edits,
``udiff`` plain unified diffs, ``engine`` plan / apply / revert.
"""

from porter.patching.engine import Applied, Plan, PatchFailed, PatchResult, Reverted, apply, plan, read_journal, revert
from porter.patching.model import Edit, Patch, PatchSet, load_project, project_names, resolve_sets

__all__ = ["Applied", "Edit", "Patch", "PatchFailed", "PatchResult", "PatchSet", "Plan", "Reverted", "apply",
           "load_project", "plan", "project_names", "read_journal", "resolve_sets", "revert"]
