"""The hipified copy of an op's sources is synced, not rewritten: what did not change keeps its time, so ninja keeps
what it compiled from it (a compile-only rerun has no compiler cache to fall back on)."""

from __future__ import annotations

import os
from pathlib import Path

from ops_prebuild.hipify_step import sync_tree


def test_sync_keeps_unchanged_files_as_they_were_and_mirrors_the_rest(tmp_path: Path) -> None:
    dest, src = tmp_path / "hip", tmp_path / "new"
    for root, files in ((dest, {"csrc/a.hip": "same", "csrc/b.hip": "old", "csrc/gone.h": "x", "old/z.h": "z"}),
                        (src, {"csrc/a.hip": "same", "csrc/b.hip": "new", "csrc/inc/c.h": "c"})):
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    os.utime(dest / "csrc" / "a.hip", ns=(1_000_000_000, 1_000_000_000))
    sync_tree(src, dest)
    found = {str(p.relative_to(dest)): p.read_text() for p in dest.rglob("*") if p.is_file()}
    assert found == {"csrc/a.hip": "same", "csrc/b.hip": "new", "csrc/inc/c.h": "c"}
    assert (dest / "csrc" / "a.hip").stat().st_mtime_ns == 1_000_000_000  # untouched
    assert not (dest / "old").exists()
