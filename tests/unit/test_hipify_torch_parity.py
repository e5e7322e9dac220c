"""porter's per-file use of torch.utils.hipify produces exactly what torch's own hipify() writes."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path

import pytest

from porter.hipify import hipify_tree
from porter.hipify.maps import builtin_map
from porter.hipify.torch_engine import (BREADCRUMB_EXTENSIONS, SOURCE_EXTENSIONS, torch_hipify,
                                        torch_hipify_version, transform_text)

# porter hipify is torch's own hipify plus porter's map: without torch these cannot run (they skip, saying so)
pytest.importorskip("torch.utils.hipify", reason="porter's hipify engine runs torch's hipify; torch is not installed")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hipify"


def test_extensions_are_torchs_defaults() -> None:
    params = inspect.signature(torch_hipify().hipify).parameters
    assert tuple(params["extensions"].default) == SOURCE_EXTENSIONS
    assert set(BREADCRUMB_EXTENSIONS) <= set(SOURCE_EXTENSIONS)
    assert torch_hipify_version() not in ("", "unknown")


def torch_output(src: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    hp = torch_hipify()
    hp.HIPIFY_FINAL_RESULT.clear()
    hp.hipify(project_directory=str(src), output_directory=str(out), is_pytorch_extension=False,
              show_progress=False)
    capsys.readouterr()
    result: dict[str, str] = {}
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src).as_posix()
        if p.is_file() and rel.endswith(SOURCE_EXTENSIONS):
            text = (out / hp.get_hip_file_path(rel, False)).read_text()
            result[rel] = text.removeprefix(hp.HIPIFY_C_BREADCRUMB)
    return result


@pytest.mark.parametrize("fixture", ["tree", "kernel"])
def test_transform_equals_torch_hipify(fixture: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / fixture, src)
    theirs = torch_output(src, tmp_path / "torch-out", capsys)
    assert theirs
    for rel, text in theirs.items():
        assert transform_text((src / rel).read_text(), rel) == text, rel


def test_tree_output_is_torch_plus_the_extra_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "tree", src)
    theirs = torch_output(src, tmp_path / "torch-out", capsys)
    hipify_tree(src, tmp_path / "porter-out")
    extras = builtin_map().compiled
    differ = 0
    for rel, text in theirs.items():
        mine = (tmp_path / "porter-out" / rel).read_text().removeprefix(torch_hipify().HIPIFY_C_BREADCRUMB)
        assert mine == extras.apply(text), rel
        differ += mine != text
    assert differ == 2  # reduce.cuh (warp intrinsics) and scale.cu (__HIP_PLATFORM_HCC__)
