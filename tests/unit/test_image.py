"""porter image's definition file: both renderings of one recipe (a site's apptainer build; porter's own, from the
root folder it installed into), and the bad bases refused before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from porter.errors import ConfigError
from porter.image.definition import Recipe, base_kind


def _recipe(base: Path) -> Recipe:
    return Recipe(base, "/opt/venv/bin/python", ("gfx90a", "gfx942"),
                  {"org.porter.toolchain": "rocm7.2.gfx90a.gfx942", "org.porter.wheel.deepspeed": "x.whl sha256:ab"},
                  {"NCCL_SOCKET_IFNAME": "hsn", "MIOPEN_CUSTOM_CACHE_DIR": "${MIOPEN_USER_DB_PATH}",
                   "NOTE": 'a "quoted" value'})


def test_a_site_definition_installs_and_verifies_with_porter(tmp_path: Path) -> None:
    (tmp_path / "base.sif").write_bytes(b"")
    text = _recipe(tmp_path / "base.sif").for_site(tmp_path / "wh", tmp_path / "tools")
    head, _, rest = text.partition("%files")
    assert head.startswith(f"Bootstrap: localimage\nFrom: {tmp_path / 'base.sif'}\n")
    post = rest.split("%post", 1)[1].split("%environment", 1)[0]
    lines = [ln.strip() for ln in post.strip().splitlines()]
    assert lines[0] == "set -e"
    assert "--no-index --find-links /opt/porter/tools --target /opt/porter/lib" in lines[1]
    assert lines[2] == ("env PYTHONPATH=/opt/porter/lib /opt/venv/bin/python -m porter install /opt/porter/wheelhouse "
                        "--python /opt/venv/bin/python --arch gfx90a --arch gfx942")
    assert "-m porter verify --python /opt/venv/bin/python --arch gfx90a --arch gfx942" in lines[3]
    test = text.split("%test", 1)[1].split("%labels", 1)[0]
    assert lines[3] in test  # the image's own test is the verify its build ran
    assert "export NCCL_SOCKET_IFNAME=hsn" in text and 'export MIOPEN_CUSTOM_CACHE_DIR="${MIOPEN_USER_DB_PATH}"' in text
    assert 'export NOTE="a \\"quoted\\" value"' in text
    assert "    org.porter.wheel.deepspeed x.whl sha256:ab" in text


def test_porters_own_definition_packs_the_installed_root_only(tmp_path: Path) -> None:
    text = _recipe(tmp_path).for_root("/var/cache/porter/images/x/root")
    assert text.startswith("Bootstrap: localimage\nFrom: /var/cache/porter/images/x/root\n")
    assert "%post" not in text and "%files" not in text and "%test" in text and "%labels" in text


def test_base_kinds(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    assert [base_kind(tmp_path / n) for n in ("r", "a.sif", "b.tar", "c.oci", "d.img")] == \
        ["root", "sif", "oci-archive", "oci-archive", ""]


def test_a_bad_base_or_output_is_refused_before_work(tmp_path: Path) -> None:
    from porter.image.build import ImageRequest, build_image
    from porter.log import quiet_logger
    from porter.run import RecordingRunner

    (tmp_path / "wh").mkdir()
    (tmp_path / "d.img").write_bytes(b"")
    runner = RecordingRunner(quiet_logger())
    for base, out, words, how in ((tmp_path / "none", "x.sif", "does not exist", "gzip"),
                                  (tmp_path / "d.img", "x.sif", "is not a .sif, a Docker/OCI archive", "gzip"),
                                  (tmp_path / "wh", "x.img", "should end in .sif", "gzip"),
                                  (tmp_path / "wh", "x.sif", "compression 'xz' is not one of gzip, zstd", "xz")):
        with pytest.raises(ConfigError, match=words):
            build_image(ImageRequest(base=base, wheelhouse=tmp_path / "wh", output=tmp_path / out, toolchain="cpu",
                                     compression=how), runner, quiet_logger())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.img", "wh"]  # nothing written


def test_a_plugin_only_image_unpacks_and_loads_the_plugin_where_its_environment_points(tmp_path: Path) -> None:
    package = tmp_path / "aws-ofi-nccl-1.0-rocm7.2.tar.gz"
    recipe = Recipe(tmp_path, "/opt/venv/bin/python", ("gfx90a",), {},
                    {"NCCL_NET_PLUGIN": "/opt/porter/net-plugin/aws-ofi-nccl-1.0-rocm7.2/lib/librccl-net.so"},
                    wheels=False, net_plugin=package.name,
                    net_plugin_library="aws-ofi-nccl-1.0-rocm7.2/lib/librccl-net.so", site="lumi-g")
    text = recipe.for_site(None, tmp_path / "tools", package)
    files = text.split("%files", 1)[1].split("%post", 1)[0]
    assert f"{package} /opt/porter/net-plugin/{package.name}" in files and "wheelhouse" not in files
    post = [ln.strip() for ln in text.split("%post", 1)[1].split("%environment", 1)[0].strip().splitlines()]
    assert "porter install" not in "\n".join(post) and "porter verify" not in "\n".join(post)  # no wheels
    assert post[2] == f"tar -xzf /opt/porter/net-plugin/{package.name} -C /opt/porter/net-plugin"
    verify = ("env PYTHONPATH=/opt/porter/lib /opt/venv/bin/python -m porter net-plugin verify "
              "/opt/porter/net-plugin/aws-ofi-nccl-1.0-rocm7.2/lib/librccl-net.so --site lumi-g")
    assert post[3] == verify  # loaded from where NCCL_NET_PLUGIN points, after it was unpacked there
    assert text.split("%test", 1)[1].split("%labels", 1)[0].split() == ["set", "-e", *verify.split()]
    assert "export NCCL_NET_PLUGIN=/opt/porter/net-plugin/aws-ofi-nccl-1.0-rocm7.2/lib/librccl-net.so" in text


def test_nothing_to_put_in_or_a_plugin_that_is_no_package_is_bad_input(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from porter.cli import cli

    base = tmp_path / "base"
    (base / "usr").mkdir(parents=True)
    args = ["image", "build", "--base", str(base), "-o", str(tmp_path / "out" / "node.sif"), "-t", "cpu"]
    res = CliRunner().invoke(cli, args)
    assert isinstance(res.exception, ConfigError) and res.exception.exit_code == 2  # main's exit code for it
    assert res.exception.message == "nothing to put into the image"
    assert res.exception.hint == "pass --wheelhouse DIR, --net-plugin PACKAGE or both"
    not_one = tmp_path / "librccl-net.so"
    not_one.write_bytes(b"\x7fELF")
    res = CliRunner().invoke(cli, [*args, "--net-plugin", str(not_one)])
    assert isinstance(res.exception, ConfigError) and "is not a network plugin package" in res.exception.message
    assert not (tmp_path / "out").exists()  # refused before anything was written
