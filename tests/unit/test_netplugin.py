"""The RCCL network plugin component: tree recognition, configure options, plans, refusals, packages, header
facts. No subprocess: the build's runner is a fake here (tests/integration/test_netplugin.py builds for real)."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from porter.cli import cli
from porter.cluster.site.profiles import Site, load_site
from porter.errors import ConfigError, ToolError
from porter.components.netplugin.build import BuildRequest, _installed, dry_run, plan_build, run_build
from porter.components.netplugin.projects import BuildSettings
from porter.components.netplugin.checks import is_rocm_site, site_refusals
from porter.components.netplugin.projects import AWS_OFI_NCCL, AWS_OFI_RCCL, recognise
from porter.components.netplugin.verify import plugin_facts, rccl_picks, read_package
from porter.probes.netplugin_lib import header_facts
from porter.probes.protocol import MARKER
from porter.run import Result, Runner
from porter.log import quiet_logger
from porter.toolchain.profile import Toolchain, load_toolchain

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "aws-ofi-nccl-mini"


def rocm7() -> Toolchain:
    return load_toolchain("debian-rocm7", environ={})


def cpu() -> Toolchain:
    return load_toolchain("cpu", environ={})


def with_rccl_major(site: Site, major: int) -> Site:
    assert site.plugin is not None
    return dataclasses.replace(site, plugin=dataclasses.replace(site.plugin, rccl_major=major))


def clone(tmp: Path, name: str, version: str, *, rocm: bool = True, release: str = "") -> Path:
    """A tree as a user clones it: autogen.sh and configure.ac, no configure."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "autogen.sh").write_text("#!/bin/sh\nautoreconf -ivf\n")
    (tmp / "configure.ac").write_text(f"AC_INIT([{name}],\n  [{version}], [x@example.org])\n"
                                      + ("CHECK_PKG_ROCM([], [])\n" if rocm else ""))
    if release:
        (tmp / ".release_version").write_text(release + "\n")
    return tmp


# -- recognising trees -------------------------------------------------------------------------------------

def test_recognises_the_fixture_as_an_aws_ofi_nccl_release_tree() -> None:
    tree = recognise(FIXTURE)
    assert (tree.project, tree.version) == (AWS_OFI_NCCL, "0.3.0")
    assert tree.has_configure and tree.supports_rocm and not tree.has_autogen


def test_a_clone_takes_its_version_from_release_version_when_ac_init_is_computed(tmp_path: Path) -> None:
    tree = recognise(clone(tmp_path, "aws-ofi-nccl", "m4_normalize(fatal_esyscmd([m4/get_version.sh]))",
                           release="1.19.2"))
    assert (tree.project.name, tree.version, tree.has_configure, tree.has_autogen) == \
        ("aws-ofi-nccl", "1.19.2", False, True)
    assert recognise(clone(tmp_path / "b", "aws-ofi-nccl", "m4_normalize(x)")).version == "unknown"


def test_aws_ofi_rccl_tree_is_rocm_only(tmp_path: Path) -> None:
    tree = recognise(clone(tmp_path, "aws-ofi-rccl", "1.4.0", rocm=False))
    assert (tree.project, tree.version, tree.supports_rocm) == (AWS_OFI_RCCL, "1.4.0", True)
    assert tree.project.library_names("rocm") == ("librccl-net.so",)


def test_old_aws_ofi_nccl_without_with_rocm_is_seen(tmp_path: Path) -> None:
    assert recognise(clone(tmp_path, "aws-ofi-nccl", "1.17.3", rocm=False)).supports_rocm is False


def test_a_tree_of_another_project_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "configure").write_text("PACKAGE_NAME='libfabric'\nPACKAGE_VERSION='2.1.0'\n")
    with pytest.raises(ConfigError, match="not an aws-ofi-nccl or aws-ofi-rccl tree.*'libfabric'") as exc:
        recognise(tmp_path)
    assert exc.value.exit_code == 2
    with pytest.raises(ConfigError, match="no configure or configure.ac"):
        recognise(tmp_path / "..")


# -- configure options --------------------------------------------------------------------------------------

def test_aws_ofi_nccl_configure_args_for_rocm_cpu_and_libfabric() -> None:
    args = AWS_OFI_NCCL.configure_args(rocm7(), prefix="/w/stage", libfabric="/opt/cray/libfabric/2.1",
                                       extra=("--with-hwloc=/opt/hwloc",))
    assert args == ["--prefix=/w/stage", "--disable-tests", "--with-rocm=/usr",
                    "--with-libfabric=/opt/cray/libfabric/2.1", "CXX=g++", "--with-hwloc=/opt/hwloc"]
    plain = AWS_OFI_NCCL.configure_args(cpu(), prefix="/s")
    assert not any(a.startswith(("--with-rocm", "--with-cuda", "--with-libfabric")) for a in plain)
    cuda = load_toolchain("cuda-h100", environ={})
    assert f"--with-cuda={cuda.root}" in AWS_OFI_NCCL.configure_args(cuda, prefix="/s")


def test_aws_ofi_rccl_configure_args_and_its_rocm_only_refusal() -> None:
    # --disable-tests: aws-ofi-rccl 1.4.0's configure stops without mpi.h otherwise (seen with the clone fixture)
    assert AWS_OFI_RCCL.configure_args(rocm7(), prefix="/s") == ["--prefix=/s", "--disable-tests", "--with-hip=/usr",
                                                                 "--with-rccl=/usr"]
    with pytest.raises(ConfigError, match="aws-ofi-rccl builds for ROCm only"):
        AWS_OFI_RCCL.configure_args(cpu(), prefix="/s")


def test_a_libtool_install_is_packaged_under_the_name_rccl_dlopens(tmp_path: Path) -> None:
    """aws-ofi-rccl links librccl-net.la without -avoid-version: 'make install' writes librccl-net.so.0.0.0 and
    the links librccl-net.so.0, librccl-net.so. RCCL dlopens librccl-net.so, so that name is what is kept."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "librccl-net.so.0.0.0").write_bytes(b"ELF")
    (lib / "librccl-net.so.0").symlink_to("librccl-net.so.0.0.0")
    (lib / "librccl-net.so").symlink_to("librccl-net.so.0.0.0")
    (lib / "librccl-net.la").write_text("# libtool\n")
    assert [p.name for p in _installed(lib, AWS_OFI_RCCL.library_names("rocm"))] == ["librccl-net.so"]
    # aws-ofi-nccl's -module -avoid-version libraries: plain files, the one RCCL looks for first, first
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("librccl-net-ofi.so", "librccl-net.so", "librccl-net.la"):
        (plain / name).write_bytes(b"ELF")
    assert [p.name for p in _installed(plain, AWS_OFI_NCCL.library_names("rocm"))] == ["librccl-net.so",
                                                                                        "librccl-net-ofi.so"]


# -- plans ------------------------------------------------------------------------------------------------

def test_plan_runs_configure_make_install_in_the_chroot_and_writes_nothing(tmp_path: Path) -> None:
    tc = rocm7()
    plan = plan_build(BuildRequest(source=FIXTURE, tc=tc, out_dir=tmp_path / "out"))
    assert [s.what for s in plan.steps] == ["configure", "make", "install"]
    root = tc.launcher[1]
    for step in plan.steps:
        assert step.argv[:2] == ["chroot", root]
    configure = plan.steps[0].argv
    assert "./configure" in configure and "--with-rocm=/usr" in configure
    assert tc.executor.work_root is not None
    w = tc.executor.inside(tc.executor.work_root)
    assert any(a.startswith(f"--prefix={w}/netplugin/") for a in configure)  # as the chroot sees it
    assert plan.package == "aws-ofi-nccl-0.3.0-rocm7.2.gfx90a.gfx942.gfx950.tar.gz"
    assert plan.refusal is None and plan.env["HIP_PLATFORM"] == "amd"
    res = dry_run(plan, quiet_logger())
    assert res.package is None and not (tmp_path / "out").exists()
    assert res.to_dict()["steps"][0]["argv"] == configure


def test_plan_of_a_clone_runs_autogen_first_and_aws_ofi_rccl_makes_src_only(tmp_path: Path) -> None:
    plan = plan_build(BuildRequest(source=clone(tmp_path, "aws-ofi-rccl", "1.4.0", rocm=False), tc=rocm7(),
                                   out_dir=tmp_path / "o"))
    assert [s.what for s in plan.steps] == ["autogen", "configure", "make", "install"]
    assert plan.steps[0].argv[-2:] == ["sh", "./autogen.sh"]
    assert plan.steps[2].argv[-2].endswith("/src/src")


def test_plan_refuses_rocm_for_a_tree_without_with_rocm(tmp_path: Path) -> None:
    plan = plan_build(BuildRequest(source=clone(tmp_path, "aws-ofi-nccl", "1.17.3", rocm=False), tc=rocm7(),
                                   out_dir=tmp_path / "o"))
    assert plan.refusal is not None and "has no --with-rocm" in plan.refusal.message
    with pytest.raises(ConfigError, match="has no --with-rocm"):
        run_build(plan, Runner(quiet_logger()), quiet_logger())


def test_plan_refuses_a_non_rocm_toolchain_for_a_rocm_site_before_any_work(tmp_path: Path) -> None:
    plan = plan_build(BuildRequest(source=FIXTURE, tc=cpu(), out_dir=tmp_path / "o", site=load_site("frontier")))
    assert plan.refusal is not None
    assert "no ROCm" in plan.refusal.message and "frontier" in plan.refusal.message
    assert "gfx90a" in plan.refusal.message and plan.refusal.exit_code == 2


class FakeRunner(Runner):
    """Answers the probe with ``doc`` and 'command -v autoreconf' with ``autoreconf_rc``."""

    def __init__(self, doc: Mapping[str, object], autoreconf_rc: int) -> None:
        super().__init__(quiet_logger(), echo=False)
        self.doc, self.autoreconf_rc, self.calls = doc, autoreconf_rc, []  # type: ignore[var-annotated]

    def run(self, argv: Sequence[object], **kw: object) -> Result:
        args = [str(a) for a in argv]
        self.calls.append(args)
        if "command -v autoreconf" in args:
            return Result(args, self.autoreconf_rc, "", 0.0)
        if "-" in args:  # the probe: python - ARGS
            return Result(args, 0, MARKER + json.dumps(self.doc) + "\n", 0.0)
        raise AssertionError(f"unexpected command {args}")


def test_a_clone_without_autoreconf_where_it_builds_is_a_clear_error(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    plan = plan_build(BuildRequest(source=clone(tmp_path / "src", "aws-ofi-nccl", "1.19.2"), tc=cpu(),
                                   out_dir=tmp_path / "out"))
    runner = FakeRunner({"headers": {"libfabric": {"version": "2.1.0"}}, "libraries": []}, autoreconf_rc=1)
    with pytest.raises(ToolError, match="only autogen.sh, and autoreconf is not installed") as exc:
        run_build(plan, runner, quiet_logger())
    assert "autoconf, automake and libtool" in (exc.value.hint or "")
    assert list((tmp_path / "out").iterdir()) == []  # nothing written


def test_a_site_with_another_rccl_major_is_refused_before_building(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    site = with_rccl_major(load_site("frontier"), 3)
    tc = dataclasses.replace(rocm7(), launcher=(), launcher_root="")  # run "here" (the fake runner)
    plan = plan_build(BuildRequest(source=FIXTURE, tc=tc, out_dir=tmp_path / "out", site=site))
    runner = FakeRunner({"headers": {"rccl": {"version": "2.27.7", "major": 2}}}, autoreconf_rc=0)
    with pytest.raises(ConfigError, match=r"built against RCCL 2\.27\.7 \(major 2\), but site frontier runs RCCL major 3"):
        run_build(plan, runner, quiet_logger())
    assert len(runner.calls) == 1  # only the probe ran: no configure, no make
    assert not (tmp_path / "cache" / "netplugin").exists() or not any((tmp_path / "cache" / "netplugin").iterdir())


# -- site refusals ----------------------------------------------------------------------------------------

def test_site_refusals() -> None:
    frontier = load_site("frontier")
    assert is_rocm_site(frontier)
    assert site_refusals(frontier, what="p", built_with_rocm=True, rccl_version="2.27.7") == []
    why = site_refusals(frontier, what="libnccl-net.so", built_with_rocm=False, rccl_version=None)
    assert len(why) == 1 and "no ROCm" in why[0] and "gfx90a" in why[0] and "libnccl-net.so" in why[0]
    assert site_refusals(frontier, what="p", built_with_rocm=None, rccl_version=None) == []  # unknown: not refused
    two = with_rccl_major(frontier, 2)
    assert site_refusals(two, what="p", built_with_rocm=True, rccl_version="2.27.7") == []
    why = site_refusals(with_rccl_major(frontier, 3), what="p", built_with_rocm=True, rccl_version="2.27.7")
    assert why and "RCCL 2.27.7 (major 2)" in why[0] and "RCCL major 3" in why[0]
    # a site that wrote the ROCm release where RCCL's own major belongs is told so
    seven = site_refusals(with_rccl_major(frontier, 7), what="p", built_with_rocm=True, rccl_version="2.27.7",
                          rocm_version="7.2")
    assert "RCCL's own major version, 2 for the RCCL of ROCm 7.2" in seven[0]
    # a plugin with no manifest (a site module's) is not refused for what nobody can tell
    assert site_refusals(two, what="p", built_with_rocm=True, rccl_version=None) == []


def test_unknown_site_exits_2(tmp_path: Path) -> None:
    lib = tmp_path / "librccl-net.so"
    lib.write_bytes(b"\x7fELF")
    res = CliRunner().invoke(cli, ["net-plugin", "verify", str(lib), "--site", "frontiers"], standalone_mode=False)
    assert isinstance(res.exception, ConfigError) and res.exception.exit_code == 2
    assert "unknown site 'frontiers'" in res.exception.message and "frontier" in res.exception.message


# -- packages and facts -----------------------------------------------------------------------------------

def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_read_package_takes_the_sidecar_over_the_copy_inside(tmp_path: Path) -> None:
    inside = {"schema": "porter.manifest/1", "target": {"net_plugin": {"built_with_rocm": True, "from": "inside"}}}
    pkg = _tarball(tmp_path / "p.tar.gz", {"top/lib/librccl-net.so": b"ELF", "top/porter.json": json.dumps(inside).encode(),
                                           "top/lib/README": b"x"})
    manifest, libs = read_package(pkg)
    assert [n for n, _ in libs] == ["librccl-net.so"]
    assert plugin_facts(manifest) == {"built_with_rocm": True, "from": "inside"}
    side = dict(inside, target={"net_plugin": {"from": "sidecar"}})
    (tmp_path / "p.tar.gz.porter.json").write_text(json.dumps(side))
    assert plugin_facts(read_package(pkg)[0]) == {"from": "sidecar"}


def test_read_package_refusals(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no lib/"):
        read_package(_tarball(tmp_path / "e.tar.gz", {"top/porter.json": b'{"schema": "porter.manifest/1"}'}))
    with pytest.raises(ConfigError, match="not a porter.manifest/1"):
        read_package(_tarball(tmp_path / "s.tar.gz", {"top/lib/a.so": b"", "top/porter.json": b'{"schema": "x"}'}))
    (tmp_path / "bad.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(ConfigError, match="bad.tar.gz is not a tar archive"):
        read_package(tmp_path / "bad.tar.gz")


def test_rccl_takes_the_newest_net_api_both_know() -> None:
    assert rccl_picks((8, 9), [6, 7, 8, 9, 10]) == 9
    assert rccl_picks((11,), [6, 7, 8, 9, 10]) is None


def test_header_facts_read_rccl_libfabric_and_hip_versions(tmp_path: Path) -> None:
    inc = tmp_path / "include"
    (inc / "rccl").mkdir(parents=True)
    (inc / "rdma").mkdir()
    (inc / "hip").mkdir()
    (inc / "rccl" / "rccl.h").write_text("#define NCCL_MAJOR 2\n#define NCCL_MINOR 27\n#define NCCL_PATCH 7\n"
                                         "#define NCCL_VERSION_CODE 22707\n")
    (inc / "rccl" / "nccl_net.h").write_text('#include "net/net_v10.h"\n#include "net/net_v9.h"\n#include "net/net_v6.h"\n'
                                             "#define NCCL_NET_PLUGIN_SYMBOL ncclNetPlugin_v10\n")
    (inc / "rdma" / "fabric.h").write_text("#define FI_MAJOR_VERSION 2\n#define FI_MINOR_VERSION 1\n"
                                           "#define FI_REVISION_VERSION 0\n")
    (inc / "hip" / "hip_version.h").write_text("#define HIP_VERSION_MAJOR 7\n#define HIP_VERSION_MINOR 2\n"
                                               "#define HIP_VERSION_PATCH 53211\n")
    facts = header_facts([str(tmp_path / "missing"), str(inc)])
    rccl = facts["rccl"]
    assert isinstance(rccl, dict)
    assert (rccl["version"], rccl["major"], rccl["version_code"]) == ("2.27.7", 2, 22707)
    assert (rccl["net_api"], rccl["net_api_newest"]) == ([6, 9, 10], 10)
    assert facts["libfabric"] == {"header": str(inc / "rdma" / "fabric.h"), "version": "2.1.0"}
    assert facts["hip"]["version"] == "7.2.53211"  # type: ignore[index]
    assert header_facts([str(tmp_path / "missing")]) == {}


def test_the_preflight_applies_the_same_site_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import porter.components.netplugin.node as cn
    from porter.cluster.site.preflight import check_plugin

    lib = tmp_path / "pkg" / "lib" / "librccl-net.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    seen = {"hip": False}
    monkeypatch.setattr(cn, "inspect_library", lambda p: cn.LibraryInfo(str(p), (8, 9), (), seen["hip"]))
    frontier = load_site("frontier")
    env = {"NCCL_NET_PLUGIN": str(lib)}
    c = check_plugin(frontier, env, nodes=2)
    assert c.status == "failed" and "no ROCm" in c.detail  # read from what the load mapped
    seen["hip"] = True
    assert check_plugin(frontier, env, nodes=2).status == "ok"
    # porter's manifest one level up (an unpacked package) names the RCCL it was built against
    (tmp_path / "pkg" / "porter.json").write_text(json.dumps(
        {"target": {"net_plugin": {"built_with_rocm": True, "rccl": {"version": "2.27.7"}}}}))
    c = check_plugin(with_rccl_major(frontier, 3), env, nodes=2)
    assert c.status == "failed" and "RCCL 2.27.7 (major 2)" in c.detail
    assert check_plugin(with_rccl_major(frontier, 2), env, nodes=2).status == "ok"


def test_a_clone_whose_version_comes_from_git_needs_release_version(tmp_path: Path) -> None:
    """Real aws-ofi-nccl clones (v1.19.2, v1.21.1) compute AC_INIT's version with m4/get_version.sh, from
    .release_version or the git tag; git does not run in the chroot, so autogen failed with 'No version found'
    (issue 18's gauntlet). porter refuses before work, naming --release-version, and writes the file it reads."""
    tree = clone(tmp_path / "t", "aws-ofi-nccl", "m4_normalize(fatal_esyscmd([m4/get_version.sh]))")
    (tree / "m4").mkdir()
    (tree / "m4" / "get_version.sh").write_text("#!/bin/bash\ncat .release_version\n")
    assert recognise(tree).version_script
    with pytest.raises(ConfigError, match="m4/get_version.sh") as exc:
        plan_build(BuildRequest(source=tree, tc=rocm7(), out_dir=tmp_path / "o"))
    assert "--release-version" in (exc.value.hint or "")
    plan = plan_build(BuildRequest(source=tree, tc=rocm7(), out_dir=tmp_path / "o",
                                   settings=BuildSettings(release_version="v1.19.2")))
    assert plan.tree.version == "1.19.2" and plan.package.startswith("aws-ofi-nccl-1.19.2-")
    assert not recognise(clone(tmp_path / "r", "aws-ofi-nccl", "m4_normalize(x)", release="1.19.2")).version_script
