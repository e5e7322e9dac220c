"""porter patch list | check | apply | revert | status."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from porter.cli import emit_json
from porter.cli.options import json_option
from porter.errors import NothingToDo
from porter.log import Logger
from porter.optspec import dry_run_option, force_option, set_option, target_version_option

tree_arg = click.argument("tree", type=click.Path(file_okay=False, path_type=Path))
set_opt = set_option.but(help="Shipped set (deepspeed/no-jit), all sets of a project (deepspeed), or a set TOML / "
                              "unified-diff .patch file. Repeat for several; applied in order.").option("set_refs")
version_opt = target_version_option.option("target_version")


@click.group()
def patch() -> None:
    """Patch sets: anchored edits applied atomically, idempotent, reversible (journal in TREE/.porter)."""


def _sets(set_refs: tuple[str, ...]) -> list[Any]:
    from porter.patching import resolve_sets

    if not set_refs:
        raise click.UsageError("name at least one set with --set (see 'porter patch list')")
    return [s for ref in set_refs for s in resolve_sets(ref)]


@patch.command("list")
@click.argument("project", required=False)
@json_option
def list_cmd(project: str | None, as_json: bool) -> None:
    """List the shipped patch sets (of one PROJECT, or all)."""
    from porter.patching.model import load_project, load_shipped, project_names

    rows: list[dict[str, Any]] = []
    for name in [project] if project else project_names():
        proj = load_project(name)
        for set_name in proj.all_sets:
            s = load_shipped(name, set_name)
            rows.append({"set": s.ref, "description": s.description, "versions": s.versions or "any",
                         "decides_need": s.decides_need,
                         "patches": [{"id": p.id, "why": p.why, "files": list(p.files) or [p.diff_name],
                                      "needed_if": asdict(p.needed_if) if p.needed_if else None,
                                      "versions": p.versions}
                                     for p in s.patches],
                         "verified": [asdict(v) for v in s.verified]})
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['set']:<30} {r['versions']:<16} {len(r['patches'])} patch(es)  {r['description']}")
        for v in r["verified"]:
            click.echo(f"{'':<30} verified: {v['ref']} {v['commit'][:12]} {v['date']}".rstrip())


def _warn_notes(log: Logger, sets: Any) -> None:
    for s in sets:
        for note in s.notes:
            log.warn(f"{s.ref}: {note}")


@patch.command("check")
@tree_arg
@set_opt
@version_opt
@json_option
@click.pass_obj
def check_cmd(log: Logger, tree: Path, set_refs: tuple[str, ...], target_version: str | None,
              as_json: bool) -> None:
    """Report, edit by edit, whether the sets would apply to TREE, are applied, or are not needed there
    (changes nothing). Exit 1 if a needed patch cannot be applied."""
    from porter.patching import PatchFailed, failure_message, plan

    p = plan(tree, _sets(set_refs), target_version=target_version)
    if as_json:
        emit_json({**p.to_dict(), "ok": not p.failed})
    else:
        for s in p.sets:
            click.echo(f"{s.ref} (version {s.version or 'unknown'}): {s.state}")
            for r in s.results:
                click.echo("  " + r.describe().split(": ", 1)[1].replace("\n", "\n  "))
    _warn_notes(log, p.sets)
    if p.failed:
        raise PatchFailed(failure_message(p.failed), p.failed,
                          hint="update the anchor in the set, or check the tree is the project and version "
                               "the set is for")
    log.info("; ".join(f"{s.ref}: {s.state}" for s in p.sets))


@patch.command("apply")
@tree_arg
@set_opt
@version_opt
@dry_run_option.but(help="Print the unified diff that would be applied; write nothing.")
@json_option
@click.pass_obj
def apply_cmd(log: Logger, tree: Path, set_refs: tuple[str, ...], target_version: str | None, dry_run: bool,
              as_json: bool) -> None:
    """Apply the needed patches of the sets to TREE, all or none; a patch whose problem is absent is
    reported as not needed. Exit 4 when there is nothing to do (already applied, or not needed)."""
    from porter.patching import Applied, apply, checked

    done = Applied(checked(tree, _sets(set_refs), target_version=target_version), ()) if dry_run \
        else apply(tree, _sets(set_refs), target_version=target_version)
    changes = done.plan.changes
    if as_json:
        emit_json({**done.plan.to_dict(), "dry_run": dry_run, "written": list(done.changed),
                   **({"diff": done.plan.diff()} if dry_run else {})})
    elif dry_run:
        click.echo(done.plan.diff(), nl=False)
    else:
        for path in done.changed:
            click.echo(f"patched {path}")
    _warn_notes(log, done.plan.sets)
    for s in done.plan.sets:
        for r in s.results:
            if r.status == "not-needed" and r.file:
                log.info(f"{s.ref}: {r.patch} not needed in {r.file} ({r.reason})")
    refs = ", ".join(s.ref for s in done.plan.sets)
    if not changes:
        states = "; ".join(f"{s.ref}: {s.state}" for s in done.plan.sets)
        raise NothingToDo(f"nothing to do in {tree} ({states}); nothing changed",
                          hint=f"'porter patch status {tree}' shows what is applied")
    if dry_run:
        log.info(f"{refs}: would change {len(changes)} file(s) (dry run, nothing written)")
    else:
        log.info(f"{refs}: changed {len(changes)} file(s); revert with 'porter patch revert {tree}'")


@patch.command("revert")
@tree_arg
@set_option.but(metavar="PROJECT/NAME", help="Revert only these applied sets (default: all, newest first). Sets "
                                              "applied on top of one on the same file are re-applied after it.").option(
    "set_refs")
@force_option.but(help="Restore originals even over files changed since the patch.").option("force")
@dry_run_option.but(help="Print the diff that reverting would apply; write nothing.")
@json_option
@click.pass_obj
def revert_cmd(log: Logger, tree: Path, set_refs: tuple[str, ...], force: bool, dry_run: bool,
               as_json: bool) -> None:
    """Restore the bytes from before the applied sets on every file they changed (journal in TREE/.porter)."""
    from porter.patching import plan_revert, resolve_sets, revert

    refs: list[str] = []
    for r in set_refs:  # a set file names its journal entry by its own ref; others are matched by name
        is_file = Path(r).suffix in (".toml", ".patch", ".diff") and Path(r).is_file()
        refs.extend(s.ref for s in resolve_sets(r)) if is_file else refs.append(r)
    done = plan_revert(tree, refs or None, force=force) if dry_run else revert(tree, refs or None, force=force)
    if as_json:
        emit_json({"tree": str(tree), "reverted": list(done.sets), "restored": list(done.restored),
                   "reapplied": list(done.reapplied), "forced": list(done.forced), "dry_run": dry_run,
                   **({"diff": done.diff()} if dry_run else {})})
    elif dry_run:
        click.echo(done.diff(), nl=False)
    else:
        for path in done.restored:
            click.echo(f"restored {path}")
    for path in done.forced:
        log.warn(f"--force: {path} had changed since it was patched; its later edits were discarded")
    for ref in done.reapplied:
        log.info(f"{'would re-apply' if dry_run else 're-applied'} {ref}, which was applied on top of it")
    log.info(f"{'would revert' if dry_run else 'reverted'} {', '.join(done.sets)}")


@patch.command("status")
@tree_arg
@json_option
def status_cmd(tree: Path, as_json: bool) -> None:
    """Show the sets applied to TREE (from its journal), oldest first, and whether each file is as porter
    left it. A set applied later on the same file is porter's own layer, not a change."""
    from porter.patching.engine import journal_status, tree_root

    root = tree_root(tree)
    rows = journal_status(root)
    if as_json:
        emit_json({"tree": str(root), "sets": [r.to_dict() for r in rows]})
        return
    if not rows:
        raise NothingToDo(f"no patch sets are applied to {root}")
    for r in rows:
        click.echo(f"{r.set} (version {r.version or '-'}, applied {r.applied_at}): {r.state}")
        if r.not_needed:
            click.echo(f"  not needed here: {', '.join(r.not_needed)}")
        for f in r.files:
            layers = f"  (then {', '.join(f.above)})" if f.above else ""
            word = {"ok": "ok     ", "changed": "CHANGED", "missing": "MISSING"}[f.state]
            click.echo(f"  {word} {f.path}{layers}" + (f": {f.detail}" if f.detail else ""))
