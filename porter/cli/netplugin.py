"""porter net-plugin build | verify: the RCCL network plugin (aws-ofi-nccl --with-rocm, aws-ofi-rccl)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import click

from porter.cli import emit
from porter.cli.options import ToolchainChoice, json_option, options
from porter.errors import CheckFailed, refusal_line
from porter.components.netplugin.projects import PROBE_PYTHON, BuildSettings
from porter.log import Logger
from porter.optspec import arg, dry_run_option, out_option, site_option, source_option

SITE = site_option.but(help="The site the plugin must serve: built with ROCm for an AMD site, the site's RCCL major (a "
                            "build that cannot is refused before building).")


@click.group("net-plugin")
def net_plugin() -> None:
    """The RCCL network plugin (libfabric): build it with a toolchain, verify it where it will be used.

    \b
    porter net-plugin build --source TREE -t debian-rocm7 -o OUTDIR [--site NAME] [--dry-run] [--json]
    porter net-plugin verify PACKAGE|LIBRARY [-t TOOLCHAIN] [--site NAME] [--json]
    """


@dataclass(frozen=True, kw_only=True)
class NetPluginBuildOptions(BuildSettings, ToolchainChoice):
    """``porter net-plugin build``'s options: each field declares its own (``--help`` says what each is); how the
    plugin is built: :class:`~porter.components.netplugin.build.BuildSettings`."""

    source: Path = source_option.field(type=click.Path(exists=True, file_okay=False, path_type=Path), metavar=None,
                                       help="An aws-ofi-nccl or aws-ofi-rccl tree: a clone (autogen.sh) or a release "
                                            "tarball (configure).")
    out_dir: Path = out_option.field(default=Path("net-plugin"), show_default=True,
                                     help="Folder for the package (.tar.gz) and its .porter.json manifest.")
    site_ref: str | None = SITE.field()
    dry_run: bool = dry_run_option.field()


@net_plugin.command("build")
@options(NetPluginBuildOptions)
@json_option
@click.pass_obj
def build_cmd(log: Logger, /, req: NetPluginBuildOptions, as_json: bool) -> None:
    """Configure, compile, link and package a network plugin with a toolchain (through its executor)."""
    from porter.cluster.site.profiles import load_site
    from porter.components.netplugin.build import BuildRequest, dry_run as plan_only, plan_build, run_build
    from porter.run import Runner

    tc = req.toolchain()
    site = load_site(req.site_ref) if req.site_ref else None
    plan = plan_build(BuildRequest(source=req.source.resolve(), tc=tc, out_dir=req.out_dir.resolve(), site=site,
                                   settings=req))  # (the options are the settings, and more)
    if req.dry_run:
        result = plan_only(plan, Logger(quiet=as_json) if as_json else log)
        emit(as_json, result.to_dict() | {"dry_run": True},
             lambda: [f"# {plan.tree.project.name} {plan.tree.version} with {tc.name} ({plan.device}) in "
                      f"{tc.executor.describe()} -> {req.out_dir / plan.package}",
                      *(shlex.join(step.argv) for step in plan.steps),
                      *([refusal_line(plan.refusal.message)] if plan.refusal is not None else [])])
        return
    doc = run_build(plan, Runner(log, echo=log.verbose), log).to_dict()
    facts = doc["net_plugin"] or {}
    emit(as_json, doc, lambda: [
        f"{doc['package']}",
        f"  {facts.get('project')} {facts.get('version')}: net API v{', v'.join(map(str, facts.get('net_api', [])))}"
        + (f", collnet v{', v'.join(map(str, facts['collnet_api']))}" if facts.get("collnet_api") else "")
        + f"; built {'with' if facts.get('built_with_rocm') else 'without'} ROCm; RCCL "
        f"{(facts.get('rccl') or {}).get('version') or 'unknown'}; libfabric "
        f"{(facts.get('libfabric') or {}).get('version') or 'unknown'}"])


@dataclass(frozen=True, kw_only=True)
class NetPluginVerifyOptions(ToolchainChoice):
    """``porter net-plugin verify``'s options: each field declares its own (``--help`` says what each is)."""

    target: Path = arg(type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="PACKAGE|LIBRARY")
    site_ref: str | None = SITE.field()
    python: str | None = PROBE_PYTHON.field()


@net_plugin.command("verify")
@options(NetPluginVerifyOptions)
@json_option
@click.pass_obj
def verify_cmd(log: Logger, /, req: NetPluginVerifyOptions, as_json: bool) -> None:
    """Load a plugin in the target environment (the toolchain's, else this host) and list its plugin symbols.

    Exit 1 when it does not load, exports no ncclNetPlugin_vN, shares no net API version with the RCCL
    there, or does not fit --site; exit 2 for bad input (an unknown site, a file that is no plugin package).
    """
    from porter.cluster.site.profiles import load_site
    from porter.components.netplugin.verify import verify_plugin
    from porter.run import Runner

    site = load_site(req.site_ref) if req.site_ref else None
    tc = req.toolchain() if req.toolchain_ref else None
    rep = verify_plugin(req.target.resolve(), tc=tc, site=site, python=req.python, runner=Runner(log, echo=log.verbose),
                        log=log)
    emit(as_json, rep.to_dict(), rep.lines)
    if not rep.ok:
        more = f" (and {len(rep.problems) - 1} more problem(s), listed above)" if len(rep.problems) > 1 else ""
        raise CheckFailed(f"verify of {req.target.name} failed: {rep.problems[0]}{more}",
                          hint="rebuild it with 'porter net-plugin build' and the site's toolchain")
