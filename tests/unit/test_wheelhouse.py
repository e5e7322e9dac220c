"""Wheelhouse scan, matching, tamper / escape checks, and the PEP 503 index (no subprocess)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from porter.archive import DamagedFile

from porter.errors import CheckFailed, ConfigError, NothingToDo
from porter.install.env import Node
from porter.install.wheelhouse import (INDEX_NAME, check_wheel, mismatches, runtime_mismatches, scan, select,
                                       unsafe_entries, write_index)
from porter.artifacts.manifest import manifest_path, read_manifest
from porter.fs import sha256_file
from tests.fixtures.install.wheels import deepspeed_wheel, make_manifest, make_wheel
from tests.fixtures.install.fakes import ROCM_TORCH, target_env

NO_GPU = Node((), "none")
SO = b"\x7fELF not really, hashed only"
ROCM_TORCH_BUILT = {"version": "2.13.0+rocm5.7", "kind": "rocm", "hip": "5.7.31921", "cuda": None}


def rocm_wheel(d: Path, archs: list[str], **kw: object) -> Path:
    return deepspeed_wheel(d, {"fused_adam": SO}, label=f"rocm5.7.{'.'.join(archs)}", kind="rocm",
                           archs={"fused_adam": archs}, rocm_version="5.7", torch=ROCM_TORCH_BUILT, **kw)  # type: ignore[arg-type]


def test_scan_reads_manifest_and_keeps_the_written_version(tmp_path: Path) -> None:
    whl = deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    dep = make_wheel(tmp_path, "hjson", "3.1.0", {"hjson/__init__.py": b""}, tag="py3-none-any")
    wheels = {w.filename: w for w in scan(tmp_path)}
    ds = wheels[whl.name]
    assert ds.manifest is not None and ds.component == "deepspeed" and ds.is_porter
    assert ds.version_text == "0.19.8+cpu.x86.64.v2"
    assert not wheels[dep.name].is_porter  # a dependency: no manifest needed


def test_missing_manifest_is_refused_naming_the_wheel(tmp_path: Path) -> None:
    whl = deepspeed_wheel(tmp_path, {"cpu_adam": SO}, write_manifest=False)
    with pytest.raises(ConfigError) as err:
        select(scan(tmp_path), target_env(tmp_path), NO_GPU)
    assert whl.name in err.value.message and "manifest missing" in err.value.message


def test_corrupt_manifest_is_refused(tmp_path: Path) -> None:
    whl = deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    manifest_path(whl).write_text('{"schema": "porter.manifest/1", "component": ')
    with pytest.raises(ConfigError) as err:
        select(scan(tmp_path), target_env(tmp_path), NO_GPU)
    assert "manifest corrupt" in err.value.message and err.value.exit_code == 2


def test_manifest_of_another_wheel_is_refused(tmp_path: Path) -> None:
    whl = deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    m = read_manifest(manifest_path(whl))
    m["wheel"]["filename"] = "deepspeed-0.19.7+cpu.x86.64.v2-cp311-cp311-linux_x86_64.whl"
    manifest_path(whl).write_text(json.dumps(m))
    [w] = scan(tmp_path)
    assert w.manifest is None and "describes 'deepspeed-0.19.7" in (w.manifest_error or "")


def test_no_match_lists_what_the_wheelhouse_has(tmp_path: Path) -> None:
    deepspeed_wheel(tmp_path, {"cpu_adam": SO}, torch={"version": "2.12.0+cpu", "kind": "cpu"})
    other = make_wheel(tmp_path, "apex", "1.0+cpu.x86.64.v2", {"apex/__init__.py": b""},
                       tag="cp312-cp312-linux_x86_64")
    make_manifest(other, component="apex", version="1.0+cpu.x86.64.v2")
    with pytest.raises(NothingToDo) as err:
        select(scan(tmp_path), target_env(tmp_path), NO_GPU, wheelhouse=str(tmp_path))
    msg = err.value.message
    assert "deepspeed-0.19.8+cpu.x86.64.v2-cp311-cp311-linux_x86_64.whl" in msg
    assert "torch: built for 2.12.0 (cpu), found 2.13.0 (cpu)" in msg
    assert "apex-1.0+cpu.x86.64.v2-cp312-cp312-linux_x86_64.whl" in msg and "cp311" in msg
    assert err.value.exit_code == 4


def test_select_picks_the_fitting_wheel_per_component(tmp_path: Path) -> None:
    deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    rocm_wheel(tmp_path, ["gfx90a"])
    sel = select(scan(tmp_path), target_env(tmp_path), NO_GPU)
    assert [w.version_text for w in sel.chosen] == ["0.19.8+cpu.x86.64.v2"]
    assert [w.version_text for w, _ in sel.rejected] == ["0.19.8+rocm5.7.gfx90a"]
    env = target_env(tmp_path, torch=ROCM_TORCH)
    sel = select(scan(tmp_path), env, Node(("gfx90a",), "--arch"))
    assert [w.version_text for w in sel.chosen] == ["0.19.8+rocm5.7.gfx90a"]


def test_only_names_a_component_with_no_fit(tmp_path: Path) -> None:
    deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    with pytest.raises(NothingToDo, match="for apex"):
        select(scan(tmp_path), target_env(tmp_path), NO_GPU, only=["deepspeed", "apex"])


def test_runtime_mismatches_name_arch_wavefront_and_rocm(tmp_path: Path) -> None:
    rocm_wheel(tmp_path, ["gfx908"])
    [w] = scan(tmp_path)
    assert w.manifest is not None
    env = target_env(tmp_path, torch=ROCM_TORCH)
    assert any("no GPU visible" in r for r in runtime_mismatches(w.manifest, env, NO_GPU))
    why = runtime_mismatches(w.manifest, env, Node(("gfx90a",), "--arch"))
    assert why == ["GPU arch: node has gfx90a, wheel has code for gfx908"]
    why = runtime_mismatches(w.manifest, env, Node(("gfx1030",), "--arch"))
    assert "wavefront: built for wave64, gfx1030 runs wave32" in why
    newer = target_env(tmp_path, torch={**ROCM_TORCH, "hip": "6.2.41133", "version": "2.13.0+rocm6.2"})
    assert any(r.startswith("ROCm: built for ROCm 5.7") for r in mismatches(w, newer, Node(("gfx908",), "x")))
    assert runtime_mismatches(w.manifest, env, Node(("gfx908",), "--arch")) == []
    assert any("not installed" in r for r in runtime_mismatches(w.manifest, target_env(tmp_path, torch=None),
                                                                   Node(("gfx908",), "--arch")))


def test_tampered_wheel_is_refused_with_both_hashes(tmp_path: Path) -> None:
    whl = deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    m = read_manifest(manifest_path(whl))
    with whl.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(DamagedFile) as err:
        check_wheel(whl, m)
    assert m["wheel"]["sha256"] in err.value.message and sha256_file(whl) in err.value.message


def test_wheel_escaping_the_target_is_refused(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path, "deepspeed", "0.19.8+cpu.x86.64.v2",
                     {"deepspeed/__init__.py": b"", "../../evil.py": b"print('owned')"})
    m = make_manifest(whl, component="deepspeed", version="0.19.8+cpu.x86.64.v2")
    with pytest.raises(DamagedFile, match=r"escape the install target: \.\./\.\./evil\.py"):
        check_wheel(whl, m)


def test_extension_whose_bytes_differ_from_the_manifest_is_refused(tmp_path: Path) -> None:
    whl = deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    m = read_manifest(manifest_path(whl))
    m["extensions"][0]["sha256"] = "0" * 64
    with pytest.raises(DamagedFile, match="cpu_adam_op.*expected 0000"):
        check_wheel(whl, m)


@pytest.mark.parametrize("name,bad", [
    ("pkg/mod.py", False), ("pkg-1.0.data/scripts/x", False), ("a/..b/c", False),
    ("../x", True), ("pkg/../../x", True), ("/etc/passwd", True), ("C:/x", True), ("pkg\\..\\..\\x", True),
])
def test_unsafe_entries(name: str, bad: bool) -> None:
    assert bool(unsafe_entries([name])) is bad


def test_index_is_pep503_with_hashes_and_a_combined_manifest(tmp_path: Path) -> None:
    whl = deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    dep = make_wheel(tmp_path, "Py_CPUinfo", "9.0.0", {"cpuinfo/__init__.py": b""}, tag="py3-none-any")
    doc = write_index(tmp_path)
    simple = tmp_path / "simple"
    root = (simple / "index.html").read_text()
    assert 'href="deepspeed/"' in root and 'href="py-cpuinfo/"' in root
    page = (simple / "deepspeed" / "index.html").read_text()
    assert f"../../{whl.name}#sha256={sha256_file(whl)}" in page and 'data-requires-python="&gt;=3.9"' in page
    assert dep.name in (simple / "py-cpuinfo" / "index.html").read_text()
    combined = json.loads((tmp_path / INDEX_NAME).read_text())
    assert combined == json.loads(json.dumps(doc))
    by_name = {e["filename"]: e for e in combined["wheels"]}
    assert by_name[whl.name]["manifest"]["component"] == "deepspeed" and by_name[dep.name]["manifest"] is None
    first = simple.resolve()
    write_index(tmp_path)  # re-index: a new tree swapped in, the old one removed
    assert simple.resolve() != first and not first.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".simple-") and p != simple.resolve()]


def test_index_refuses_a_tampered_wheel_and_writes_nothing(tmp_path: Path) -> None:
    whl = deepspeed_wheel(tmp_path, {"cpu_adam": SO})
    with whl.open("ab") as f:
        f.write(b"x")
    with pytest.raises(DamagedFile, match="sha256 does not match"):
        write_index(tmp_path)
    assert not (tmp_path / "simple").exists() and not (tmp_path / INDEX_NAME).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".simple")]
