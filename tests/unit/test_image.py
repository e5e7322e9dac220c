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
            build_image(ImageRequest(base, tmp_path / "wh", tmp_path / out, "cpu", compression=how), runner,
                        quiet_logger())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.img", "wh"]  # nothing written
