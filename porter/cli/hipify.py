"""porter hipify SRC [-o OUT | --in-place] [--check] [--json] [--map FILE] [--fail-on-unsupported]."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import click

from porter.cli import emit_json
from porter.cli.options import json_option
from porter.errors import CheckFailed
from porter.hipify import Finding, HipifyReport, hipify_tree
from porter.log import Logger

_SHOW_LOCATIONS = 3


@click.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Output directory (default: SRC-hip next to SRC). SRC is never touched.")
@click.option("--in-place", is_flag=True, help="Rewrite SRC itself instead of writing a copy.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when any file would change (for CI).")
@click.option("--map", "maps", multiple=True, type=click.Path(path_type=Path),
              help="TOML file with extra mappings (repeatable); added on top of porter's built-in map.")
@click.option("--fail-on-unsupported", is_flag=True, help="Exit 1 when CUDA APIs without a HIP equivalent remain.")
@click.option("--no-cache", is_flag=True, help="Translate every file again, ignoring OUT/.porter-hipify.json.")
@json_option
@click.pass_obj
def hipify(log: Logger, src: Path, out: Path | None, in_place: bool, check: bool, maps: tuple[Path, ...],
           fail_on_unsupported: bool, no_cache: bool, as_json: bool) -> None:
    """Translate the CUDA sources under SRC to HIP with torch's own hipify plus porter's extra map.

    \b
    Reports CUDA APIs left without a HIP equivalent (file:line:column, name, hint) and
    warp-size-32 assumptions (flagged, never rewritten). Files are kept at the same relative
    paths; non-source and non-UTF-8 files are copied byte-identical; symlinks are not followed.
    A re-run on an unchanged tree reuses OUT/.porter-hipify.json and translates nothing.
    """
    report = hipify_tree(src, out, in_place=in_place, check=check, extra_maps=maps, log=log,
                         use_cache=not no_cache)
    if as_json:
        emit_json(report.to_dict())
    else:
        _print_text(report)
    if check and report.written:
        raise CheckFailed(f"{len(report.written)} file(s) would change: "
                          + ", ".join(f.path for f in report.written[:5])
                          + (" ..." if len(report.written) > 5 else ""),
                          hint="run porter hipify without --check to write them")
    if fail_on_unsupported and report.unsupported:
        names = Counter(f.identifier for f in report.unsupported)
        raise CheckFailed(f"{len(report.unsupported)} use(s) of {len(names)} CUDA API(s) without a HIP "
                          f"equivalent remain: " + ", ".join(n for n, _ in names.most_common(5)),
                          hint="port them by hand, guard them, or add mappings with --map FILE")


def _print_text(report: HipifyReport) -> None:
    echo = click.echo
    for f in report.skipped:
        echo(f"skipped {f.path}: {f.reason}")
    if report.unsupported:
        by_name: dict[str, list[Finding]] = {}
        for u in report.unsupported:
            by_name.setdefault(u.identifier, []).append(u)
        echo(f"unsupported CUDA APIs ({len(report.unsupported)} uses of {len(by_name)} names):")
        for name, uses in sorted(by_name.items(), key=lambda kv: -len(kv[1])):
            first = uses[0]
            echo(f"  {name} ({len(uses)}x): {first.message}")
            for u in uses[:_SHOW_LOCATIONS]:
                echo(f"    {u.path}:{u.line}:{u.column}")
            if len(uses) > _SHOW_LOCATIONS:
                echo(f"    ... {len(uses) - _SHOW_LOCATIONS} more (see --json)")
    if report.warp32:
        echo(f"warp-size-32 assumptions ({len(report.warp32)}, flagged, not rewritten):")
        for w in report.warp32:
            echo(f"  {w.format()}")
            echo(f"      {w.text}")
    reps = report.replacements
    if reps:
        top = ", ".join(f"{k} {v}" for k, v in reps.most_common(10))
        echo(f"replacements ({sum(reps.values())}): {top}" + (" ..." if len(reps) > 10 else ""))
    verb = "would write" if report.check else "wrote"
    echo(f"{len(report.files)} files scanned: {len(report.changed)} changed, {len(report.unchanged)} unchanged, "
         f"{len(report.copied)} copied, {len(report.skipped)} skipped; {verb} {len(report.written)}"
         f" ({report.cached} from cache) in {report.seconds:.2f}s -> {report.out}")
