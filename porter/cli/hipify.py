"""porter hipify SRC [-o OUT | --in-place] [--check] [--json] [--map FILE] [--fail-on-unsupported]."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import click

from porter.cli import emit_json
from porter.cli.options import json_option, options
from porter.errors import CheckFailed
from porter.hipify import Finding, HipifyReport, hipify_tree
from porter.hipify.engine import ALREADY_HIPIFIED, COPIED, UNCHANGED, FindingGroup
from porter.log import Logger
from porter.optspec import arg, in_place_option, no_cache_option, opt, output_option


@dataclass(frozen=True, kw_only=True)
class HipifyOptions:
    """``porter hipify``'s options: each field declares its own (``--help`` says what each is)."""

    src: Path = arg(type=click.Path(path_type=Path))
    out: Path | None = output_option.field(help="Output directory (default: SRC-hip next to SRC). SRC is never "
                                                "touched.")
    in_place: bool = in_place_option.field(help="Rewrite SRC itself instead of writing a copy.")
    check: bool = opt("--check", is_flag=True,
                      help="Write nothing; exit 1 when any file would change (for CI). Without -o it checks SRC "
                           "itself (0 on a tree porter already hipified); with -o, whether OUT is up to date.")
    maps: tuple[Path, ...] = opt("--map", multiple=True, type=click.Path(path_type=Path),
                                 help="TOML file with extra mappings (repeatable); added on top of porter's built-in "
                                      "map.")
    fail_on_unsupported: bool = opt("--fail-on-unsupported", is_flag=True,
                                    help="Exit 1 when CUDA APIs without a HIP equivalent remain.")
    no_cache: bool = no_cache_option.field(help="Translate every file again, ignoring OUT/.porter-hipify.json.")


@click.command()
@options(HipifyOptions)
@json_option
@click.pass_obj
def hipify(log: Logger, /, req: HipifyOptions, as_json: bool) -> None:
    """Translate the CUDA sources under SRC to HIP with torch's own hipify plus porter's extra map.

    \b
    Reports CUDA APIs left without a HIP equivalent and warp-size-32 assumptions (flagged,
    never rewritten), grouped per op folder or file with counts and a one-line verdict; --json
    has every location and hint. Files are kept at the same relative paths; non-source and
    non-UTF-8 files are copied byte-identical; symlinks are not followed. A re-run on an
    unchanged tree reuses OUT/.porter-hipify.json and translates nothing.
    """
    report = hipify_tree(req.src, req.out, in_place=req.in_place, check=req.check, extra_maps=req.maps, log=log,
                         use_cache=not req.no_cache)
    if as_json:
        emit_json(report.to_dict())
    else:
        _print_text(report)
    if req.check and report.written:
        listed = ", ".join(f.path for f in report.written[:5]) + (" ..." if len(report.written) > 5 else "")
        if report.in_place:
            raise CheckFailed(f"{len(report.written)} file(s) would change: {listed}",
                              hint="run porter hipify --in-place to change them, or porter hipify SRC -o OUT "
                                   "for a hipified copy")
        raise CheckFailed(f"{len(report.written)} file(s) of {report.out} would be written (missing or out of "
                          f"date): {listed}", hint="run porter hipify without --check to write them")
    if req.fail_on_unsupported and report.unsupported:
        names = Counter(f.identifier for f in report.unsupported)
        raise CheckFailed(f"{len(report.unsupported)} use(s) of {len(names)} CUDA API(s) without a HIP "
                          f"equivalent remain: " + ", ".join(n for n, _ in names.most_common(5)),
                          hint="port them by hand, guard them, or add mappings with --map FILE")


_TOP_NAMES = 6
_TOP_FILES = 4
_SHOW_LINES = 4


def _counts(counter: Counter[str], top: int, what: str, strip: str = "", lines: tuple[Finding, ...] = ()) -> str:
    """The ``top`` most common, each with its count (and, given findings, their lines), and how many more."""
    items = counter.most_common()
    text = ", ".join(f"{k.removeprefix(strip)} {v}{_lines_of(lines, k) if lines else ''}" for k, v in items[:top])
    return text + (f" (+{len(items) - top} more {what})" if len(items) > top else "")


def _lines_of(findings: tuple[Finding, ...], ident: str) -> str:
    lines = list(dict.fromkeys(str(f.line) for f in findings if f.identifier == ident))
    shown = ", ".join(lines[:_SHOW_LINES]) + (", ..." if len(lines) > _SHOW_LINES else "")
    return f" (line{'s' if len(lines) > 1 else ''} {shown})"


def _group_lines(g: FindingGroup) -> list[str]:
    """A group's head (counts), its verdict, and what it holds: names and files by count; for a
    group of one file, the lines of each name."""
    files = g.files
    parts = [f"{len(g.unsupported)} CUDA API use(s)" if g.unsupported else "",
             f"{len(g.warp32)} warp-32 flag(s)" if g.warp32 else ""]
    head = (f"{len(files)} file(s): " if g.is_dir else "") + ", ".join(p for p in parts if p)
    out = [f"{g.name}  {head}", f"  verdict: {g.verdict}"]
    one = len(files) == 1
    if g.is_dir and one:
        out.append(f"  file: {next(iter(files)).removeprefix(g.folder)}")
    if g.unsupported:
        out.append(f"  CUDA API: {_counts(g.names, _TOP_NAMES, 'names', lines=g.unsupported if one else ())}")
    if g.warp32:
        top = len(g.rules) if one else _TOP_NAMES  # every rule of one file
        out.append(f"  warp-32: {_counts(g.rules, top, 'rules', lines=g.warp32 if one else ())}")
    if not one:
        out.append(f"  files: {_counts(files, _TOP_FILES, 'files', g.folder)}")
    return out


def _print_text(report: HipifyReport) -> None:
    echo = click.echo
    already = sum(f.reason == ALREADY_HIPIFIED for f in report.skipped)
    for f in report.skipped:
        if f.reason != ALREADY_HIPIFIED:
            echo(f"skipped {f.path}: {f.reason}")
    groups = report.groups()
    if groups:
        counts = [f"{len(report.unsupported)} use(s) of CUDA APIs without a HIP equivalent" if report.unsupported
                  else "", f"{len(report.warp32)} warp-size-32 assumption(s) (flagged, not rewritten)"
                  if report.warp32 else ""]
        echo(f"findings: {', '.join(c for c in counts if c)} in {len(groups)} group(s); "
             "every location and hint: --json")
        for g in groups:
            for line in _group_lines(g):
                echo(line)
        hints: dict[str, dict[str, None]] = {}  # hint -> its names, in order
        for u in report.unsupported:
            hints.setdefault(u.message, {})[u.identifier] = None
        if hints:
            echo("what to do:")
            for hint, names in hints.items():
                echo(f"  {', '.join(list(names)[:3])}{', ...' if len(names) > 3 else ''}: {hint}")
    reps = report.replacements
    if reps:
        top = ", ".join(f"{k} {v}" for k, v in reps.most_common(10))
        echo(f"replacements ({sum(reps.values())}): {top}" + (" ..." if len(reps) > 10 else ""))
    verb = "would write" if report.check else "wrote"
    skipped = f"{len(report.skipped)} skipped" + (f" ({already} already hipified)" if already else "")
    target = f"{report.out} (checked in place)" if report.check and report.in_place else str(report.out)
    echo(f"{len(report.files)} files scanned: {len(report.changed)} changed, {len(report.of(UNCHANGED))} unchanged, "
         f"{len(report.of(COPIED))} copied, {skipped}; {verb} {len(report.written)}"
         f" ({report.cached} from cache) in {report.seconds:.2f}s -> {target}")
