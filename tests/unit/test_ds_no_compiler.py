"""A DeepSpeed wheel porter writes starts no compiler at import by default (issue 18), without a subprocess.

``tests/fixtures/deepspeed-probe-at-import`` is a DeepSpeed-like package whose ``import deepspeed`` asks a feature
probe that runs the C compiler (as DeepSpeed 0.18 does). It is packed as the base wheel DeepSpeed's setup.py would
give; ``prebuilt_files`` (the one flow's step, with DeepSpeed's driver) and the wheel writer write the final wheel;
the wheel is unpacked and imported in this process. A compiler call here is a subprocess, which the unit tier
refuses (tests/conftest.py), so before the fix the import itself fails the test.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from wheel.wheelfile import WheelFile

from porter.components.deepspeed.build import DRIVER
from porter.components.deepspeed.wheel import guarded
from porter.errors import ToolError
from porter.patching import apply, resolve_sets

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "deepspeed-probe-at-import"
BUILDER = "deepspeed/ops/op_builder/builder.py"
INFO = "deepspeed/git_version_info_installed.py"


def base_wheel(dest: Path, tree: Path = FIXTURE) -> Path:
    """The pure-Python wheel of ``tree``'s ``deepspeed`` package, as DeepSpeed's setup.py packs it."""
    whl = dest / "deepspeed-0.18.8-py3-none-any.whl"
    with WheelFile(whl, "w") as wf:
        for path in sorted((tree / "deepspeed").rglob("*.py")):
            wf.writestr(path.relative_to(tree).as_posix(), path.read_bytes())
        wf.writestr("deepspeed-0.18.8.dist-info/METADATA", b"Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.18.8\n")
        wf.writestr("deepspeed-0.18.8.dist-info/WHEEL",
                    b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return whl


def porter_wheel(tmp_path: Path, base: Path, probes: dict[str, bool]) -> Path:
    """``base`` with a stand-in cpu_adam module, as the one build flow writes it for DeepSpeed (:func:`prebuilt_files`
    with its driver): the module marked prebuilt, the probes recorded, the op builder guarded."""
    from ops_prebuild.build import OpResult
    from ops_prebuild.catalogue import Catalogue, OpSpec
    from ops_prebuild.source import Source
    from porter.artifacts.wheelfile import rewrite_wheel
    from porter.torch_facts import TorchInfo
    from porter.wheels.engine import prebuilt_files

    so = tmp_path / "cpu_adam_op.so"
    so.write_bytes(b"\x7fELF stand-in")
    torch = TorchInfo("2.13.0+cpu", ext_suffix=".cpython-311-x86_64-linux-gnu.so", python_tag="cp311",
                      platform_tag="linux_x86_64")
    cat = Catalogue(Source("deepspeed", "0.18.8", FIXTURE), torch, "cpu",
                    (OpSpec("cpu_adam", "deepspeed.ops.adam.cpu_adam_op"), OpSpec("async_io", "deepspeed.ops.aio")),
                    tuple(probes.items()))
    add, _ = prebuilt_files(base, cat, [OpResult("cpu_adam", "built", so=str(so))], DRIVER)
    (tmp_path / "out").mkdir(exist_ok=True)
    return rewrite_wheel(base, tmp_path / "out", version="0.18.8+cpu.x86.64.v2", tag=torch.wheel_tag, purelib=False,
                         add=add)


class Compiler:
    """Stands in for the C compiler: records each call and answers like a host with (``links``) or without
    libaio; the unit tier's own guard refuses any real subprocess."""

    def __init__(self, links: bool) -> None:
        self.calls: list[list[str]] = []
        self.links = links

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        self.calls.append([str(a) for a in argv])
        if not self.links:
            raise subprocess.CalledProcessError(1, argv)
        return subprocess.CompletedProcess(argv, 0, b"", b"")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path for an unpacked wheel; every ``deepspeed`` module imported from it is dropped after."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    for name in ("PORTER_NO_JIT", "PORTER_FEATURE_PROBES"):
        monkeypatch.delenv(name, raising=False)
    yield root
    for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
        del sys.modules[name]


def install(whl: Path, site: Path) -> None:
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)


def import_deepspeed() -> ModuleType:
    for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
        del sys.modules[name]
    return importlib.import_module("deepspeed")


def test_the_wheel_answers_the_import_time_probe_from_its_record(tmp_path: Path, site: Path) -> None:
    before = {p: p.read_bytes() for p in FIXTURE.rglob("*") if p.is_file()}
    whl = porter_wheel(tmp_path, base_wheel(tmp_path), {"io_submit:aio": True})
    with zipfile.ZipFile(whl) as z:
        builder = z.read(BUILDER).decode()
        info = z.read(INFO).decode()
    assert "_porter_recorded_probe(funcname, libraries)" in builder and "_porter_refuse_jit(self.name)" in builder
    assert "porter_feature_probes={'io_submit:aio': True}" in info
    install(whl, site)
    ds = import_deepspeed()  # before the fix: has_function starts cc, which the unit tier refuses (AssertionError)
    assert ds.compatible_ops == {"async_io": True, "cpu_adam": True}  # the build host's answer, recorded
    assert ds.installed_ops["cpu_adam"] is True
    assert {p: p.read_bytes() for p in FIXTURE.rglob("*") if p.is_file()} == before  # the source is untouched


def test_the_guard_is_what_stops_the_compiler(tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(porter_wheel(tmp_path, base_wheel(tmp_path), {"io_submit:aio": True}), site)
    cc = Compiler(links=False)
    monkeypatch.setattr(subprocess, "run", cc)
    assert import_deepspeed().compatible_ops["async_io"] is True and cc.calls == []
    # the escape hatch: ask the compiler, as upstream does (here: a node without libaio)
    monkeypatch.setenv("PORTER_FEATURE_PROBES", "compile")
    assert import_deepspeed().compatible_ops["async_io"] is False
    assert len(cc.calls) == 1 and cc.calls[0][0] == "cc" and cc.calls[0][1].endswith("test.c") and "-laio" in cc.calls[0]


def test_an_unrecorded_probe_answers_false_without_a_compiler(tmp_path: Path, site: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    install(porter_wheel(tmp_path, base_wheel(tmp_path), {}), site)
    cc = Compiler(links=True)
    monkeypatch.setattr(subprocess, "run", cc)
    assert import_deepspeed().compatible_ops["async_io"] is False and cc.calls == []


def test_an_installation_porter_did_not_write_keeps_upstreams_probe(tmp_path: Path, site: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The base wheel (DeepSpeed's own setup.py, no record) with porter's set applied: upstream's behaviour, unless
    PORTER_NO_JIT=1 says no compiler (an unrecorded probe then answers False)."""
    tree = tmp_path / "tree"
    (tree / "deepspeed").mkdir(parents=True)
    for path in FIXTURE.rglob("*"):
        if path.is_file():
            dest = tree / path.relative_to(FIXTURE)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(path.read_bytes())
    apply(tree, resolve_sets("deepspeed/no-jit"))
    install(base_wheel(tmp_path, tree), site)
    cc = Compiler(links=True)
    monkeypatch.setattr(subprocess, "run", cc)
    assert import_deepspeed().compatible_ops["async_io"] is True and len(cc.calls) == 1
    monkeypatch.setenv("PORTER_NO_JIT", "1")
    assert import_deepspeed().compatible_ops["async_io"] is False and len(cc.calls) == 1


def test_a_tree_already_patched_is_left_as_it_is(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    builder = tree / BUILDER
    builder.parent.mkdir(parents=True)
    builder.write_bytes((FIXTURE / BUILDER).read_bytes())
    apply(tree, resolve_sets("deepspeed/no-jit"))
    assert guarded({BUILDER: builder.read_bytes()})[0] == {}
    assert guarded({"deepspeed/__init__.py": b""})[0] == {}  # no op builder in the wheel: nothing to guard


def test_a_moved_anchor_refuses_the_wheel_naming_it(tmp_path: Path) -> None:
    moved = (FIXTURE / BUILDER).read_text().replace("class OpBuilder(ABC):", "class OpBuilder(object):")
    with pytest.raises(ToolError) as err:
        guarded({BUILDER: moved.encode()})
    assert "deepspeed/no-jit" in err.value.message and "class OpBuilder(ABC):" in err.value.message
    assert BUILDER in err.value.message and "porter patch check" in (err.value.hint or "")
