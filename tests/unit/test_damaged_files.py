"""#40: files a user hands porter that went wrong on the way (an interrupted download, a copy cut short) or come
from an untrusted fork: each kind of damage gets one error (a DamagedFile, exit 2) that names the file and, where it
can, the member, with a tip; nothing is written outside the destination. The generated part (hypothesis) builds
archives from a real source tree and wheels the way porter lays them out, truncates them at random offsets and
fills them with random member names and types; every one is accepted or refused, never anything else."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter import archive
from porter.archive import DamagedFile
from porter.artifacts.sbom import read_sbom
from porter.install.wheelhouse import check_intact
from tests.conftest import ROOT
from tests.fixtures.install.wheels import deepspeed_wheel

GEN = settings(deadline=None, database=None, max_examples=int(os.environ.get("PORTER_FUZZ", 150)),
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
TOY = ROOT / "tests" / "fixtures" / "toy-src"


def tar_of(tree: Path, mode: str = "w:gz") -> bytes:
    """A source tarball of ``tree`` the way an sdist is packed (one top folder)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:  # type: ignore[call-overload]
        t.add(tree, arcname="toy-0.1")
    return buf.getvalue()


def tar_with(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def files_under(top: Path) -> set[Path]:
    return {p for p in top.rglob("*")}


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Path]:
    """The test's inputs go under ``sandbox/in``; the only other new content allowed is under ``sandbox/dest``."""
    (tmp_path / "dest").mkdir()
    (tmp_path / "in").mkdir()
    before = files_under(tmp_path)
    yield tmp_path / "in"
    outside = {p for p in files_under(tmp_path) - before
               if tmp_path / "dest" not in p.parents and tmp_path / "in" not in p.parents}
    assert not outside, f"written outside the destination: {sorted(map(str, outside))}"


def refused(path: Path, *, what: str) -> DamagedFile:
    """``path`` (under a sandbox's ``in``) is refused by the check and by the unpack into the sandbox's ``dest``."""
    with pytest.raises(DamagedFile) as err:
        archive.members(path)
    assert str(path) in err.value.message and what in err.value.message, err.value.message
    with pytest.raises(DamagedFile):
        archive.unpack(path, path.parent.parent / "dest")
    assert str(path) in err.value.message and what in err.value.message, err.value.message
    assert err.value.hint and err.value.exit_code == 2
    return err.value


# -- each kind of damage, by hand ---------------------------------------------------------------

def test_an_empty_file_a_page_and_a_zip_are_named_for_what_they_are(sandbox: Path) -> None:
    (sandbox / "empty.tar.gz").write_bytes(b"")
    refused(sandbox / "empty.tar.gz", what="is empty (0 bytes)")
    (sandbox / "page.tar.gz").write_text("<!DOCTYPE html><title>404</title>")
    refused(sandbox / "page.tar.gz", what="text (an HTML page?)")
    import zipfile

    with zipfile.ZipFile(sandbox / "zip.tar.gz", "w") as z:
        z.writestr("setup.py", "")
    assert "unpack the zip" in (refused(sandbox / "zip.tar.gz", what="a zip archive").hint or "")
    import lzma

    (sandbox / "xz.tar.gz").write_bytes(lzma.compress(b"no tar inside" * 50))
    refused(sandbox / "xz.tar.gz", what="xz data that does not unpack to a tar archive")


@pytest.mark.parametrize("cut", [1, 5, 10, 100, 1000, -100, -1])
def test_a_truncated_tarball_is_truncated_never_an_interrupt(sandbox: Path, cut: int) -> None:
    data = tar_of(TOY)
    (sandbox / "cut.tar.gz").write_bytes(data[:cut])
    with pytest.raises(DamagedFile) as err:
        archive.members(sandbox / "cut.tar.gz")
    assert "cut.tar.gz" in err.value.message and err.value.exit_code == 2 and "sha256" in (err.value.hint or "")


@pytest.mark.parametrize(("members", "what"), [
    ([("t/setup.py", tarfile.REGTYPE, ""), ("t/../../evil.py", tarfile.REGTYPE, "")],
     "'t/../../evil.py' is refused: it has '..' in its path"),
    ([("/etc/evil.conf", tarfile.REGTYPE, "")], "'/etc/evil.conf' is refused: it has an absolute path"),
    ([("t/out", tarfile.SYMTYPE, "/etc"), ("t/out/passwd", tarfile.REGTYPE, "")],
     "'t/out' is refused: it is a link to an absolute path"),
    ([("t/up", tarfile.SYMTYPE, "../../.."), ("t/up/x", tarfile.REGTYPE, "")],
     "'t/up' is refused: it is a link that points outside"),
    ([("t/hard", tarfile.LNKTYPE, "../../../etc/passwd")], "'t/hard' is refused"),
    ([("t/null", tarfile.CHRTYPE, "")], "'t/null' is refused: it is a device file"),
    ([("t/fifo", tarfile.FIFOTYPE, "")], "'t/fifo' is refused: it is a device file, FIFO"),
    ([("t/setup.py", tarfile.REGTYPE, ""), ("t/setup.py", tarfile.REGTYPE, "")], "'t/setup.py' appears twice"),
    # found by the generated tests below, each once a traceback (or a link out of the tree):
    ([(".", tarfile.REGTYPE, "")], "'.' is refused: it is not a folder, but names the unpacked tree itself"),
    ([("t/../x", tarfile.REGTYPE, "")], "'t/../x' is refused: it has '..' in its path"),
    ([("t/a", tarfile.LNKTYPE, "t/b")], "'t/a' is refused: it is a hard link to a member that is not before it"),
    ([("t/a", tarfile.SYMTYPE, "")], "'t/a' is refused: it is a link to nothing"),
    ([("t/dir/", tarfile.SYMTYPE, "../../etc")], "'t/dir/' is refused: its name ends in '/', but it is not a folder"),
    ([("t/f", tarfile.REGTYPE, ""), ("t/f/g", tarfile.REGTYPE, "")],
     "'t/f' is refused: it is not a folder, but other members are inside it"),
])
def test_hostile_members_are_named_and_nothing_is_written(sandbox: Path, members: list[tuple[str, bytes, str]],
                                                          what: str) -> None:
    path = tar_with(sandbox / "in.tgz", [(member(n, k, ln), b"x" if k == tarfile.REGTYPE else None)
                                         for n, k, ln in members])
    err = refused(path, what=what)
    assert "release" in (err.hint or "") and not any((sandbox.parent / "dest").iterdir())


def test_a_good_tarball_unpacks_whole(sandbox: Path) -> None:
    (sandbox / "in.tgz").write_bytes(tar_of(TOY))
    assert archive.members(sandbox / "in.tgz")
    archive.unpack(sandbox / "in.tgz", sandbox.parent / "dest")
    assert (sandbox.parent / "dest" / "toy-0.1" / "setup.py").read_bytes() == (TOY / "setup.py").read_bytes()


def test_a_truncated_or_foreign_wheel_is_named_before_anything_reads_it(tmp_path: Path) -> None:
    wheel = deepspeed_wheel(tmp_path / "wh", {"cpu_adam": b"\x7fELF"})
    manifest = json.loads(Path(f"{wheel}.porter.json").read_text())
    check_intact(wheel, manifest)  # as built
    data = wheel.read_bytes()
    wheel.write_bytes(data[: len(data) // 2])
    with pytest.raises(DamagedFile, match="is truncated or damaged: not a readable zip"):
        check_intact(wheel, manifest)
    with pytest.raises(DamagedFile, match="a zip archive whose end .* is missing"):
        archive.zip_members(wheel)
    with pytest.raises(DamagedFile, match="is truncated or damaged"):
        read_sbom(wheel)
    wheel.write_bytes(b"")
    with pytest.raises(DamagedFile, match="is empty"):
        archive.zip_members(wheel)


# -- generated ----------------------------------------------------------------------------------

REAL_TAR = tar_of(TOY)


@GEN
@given(cut=st.integers(0, len(REAL_TAR)))
def test_generated_truncated_tarballs_are_refused_or_whole(tmp_path_factory: pytest.TempPathFactory,
                                                           cut: int) -> None:
    top = tmp_path_factory.mktemp("cut")
    (top / "dest").mkdir()
    (top / "in.tgz").write_bytes(REAL_TAR[:cut])
    try:
        archive.members(top / "in.tgz")
        archive.unpack(top / "in.tgz", top / "dest")
    except DamagedFile as exc:
        assert "in.tgz" in exc.message and exc.hint
        return
    assert cut == len(REAL_TAR) or cut > len(REAL_TAR) - 20  # (gzip's last bytes: its size and CRC)


NAMES = st.one_of(
    st.sampled_from(["a", "t/setup.py", "t/../x", "../x", "/abs", "t/./y", "t//z", ".", "t/a/../../../q", "t/dir/",
                     "C:/w", "\\\\srv\\x", "t/ü", "t/" + "n" * 200]),
    st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1, max_size=30))
KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE,
                         tarfile.BLKTYPE, tarfile.FIFOTYPE])
LINKS = st.sampled_from(["", "a", "t/setup.py", "../../etc/passwd", "/etc/passwd", "..", "t", "t/../../.."])


@GEN
@given(items=st.lists(st.tuples(NAMES, KINDS, LINKS), min_size=1, max_size=6))
def test_generated_members_stay_inside_or_are_refused(tmp_path_factory: pytest.TempPathFactory,
                                                      items: list[tuple[str, bytes, str]]) -> None:
    top = tmp_path_factory.mktemp("members")
    (top / "dest").mkdir()
    try:
        path = tar_with(top / "in.tgz", [(member(n, k, ln), b"data" if k == tarfile.REGTYPE else None)
                                         for n, k, ln in items])
    except (ValueError, UnicodeError, OSError):
        return  # not a member tarfile can write: nothing to try
    before = files_under(top)
    try:
        archive.members(path)
        archive.unpack(path, top / "dest")
    except DamagedFile as exc:
        assert "in.tgz" in exc.message and exc.hint
    new = files_under(top) - before
    assert all(top / "dest" in p.parents for p in new), sorted(map(str, new))
    for p in (top / "dest").rglob("*"):
        if p.is_symlink():
            assert (top / "dest").resolve() in Path(os.path.realpath(p)).parents or \
                Path(os.path.realpath(p)) == (top / "dest").resolve()


def _real_wheel() -> tuple[str, dict[str, object], bytes]:
    """A real porter wheel's name, manifest and bytes (its folder removed again: nothing is left in the temp folder
    by importing this module)."""
    with tempfile.TemporaryDirectory(prefix="porter-damaged-wheel-") as tmp:
        wheel = deepspeed_wheel(Path(tmp), {"cpu_adam": b"\x7fELF" + bytes(range(256)) * 40})
        return wheel.name, json.loads(Path(f"{wheel}.porter.json").read_text()), wheel.read_bytes()


WHEEL_NAME, REAL_MANIFEST, WHEEL_BYTES = _real_wheel()


@GEN
@given(cut=st.integers(0, len(WHEEL_BYTES) - 1), flip=st.none() | st.integers(0, len(WHEEL_BYTES) - 1))
def test_generated_damaged_wheels_are_refused(tmp_path_factory: pytest.TempPathFactory, cut: int,
                                              flip: int | None) -> None:
    top = tmp_path_factory.mktemp("wheel")
    data = bytearray(WHEEL_BYTES)
    if flip is not None:
        data[flip] ^= 0xFF
    else:
        data = data[:cut]
    wheel = top / WHEEL_NAME
    wheel.write_bytes(bytes(data))
    with pytest.raises(DamagedFile) as err:
        check_intact(wheel, REAL_MANIFEST)
    assert WHEEL_NAME in err.value.message and err.value.hint
    try:
        archive.zip_members(wheel)
    except DamagedFile as exc:
        assert WHEEL_NAME in exc.message



# -- through the command line: ERROR + TIP, exit 2, never a traceback or 130 ----------------------

def porter(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    from porter.cli import main

    with pytest.raises(SystemExit) as done:
        main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return int(done.value.code or 0), err


@pytest.mark.parametrize("cut", [0, 30, -200])
def test_ops_build_dry_run_names_a_damaged_source(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, cut: int) -> None:
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "ds.tar.gz").write_bytes(REAL_TAR[:cut])
    code, err = porter(capsys, "ops", "build", "--source", str(tmp_path / "ds.tar.gz"), "-t", "cpu", "--ops",
                       "cpu_adam", "-o", str(tmp_path / "wh"), "--dry-run")
    assert code == 2 and "ERROR: " + str(tmp_path / "ds.tar.gz") in err and "TIP: download it again" in err
    assert not (tmp_path / "cache" / "sources").exists()


def test_a_file_that_ends_early_is_exit_2_and_an_interrupt_130(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """click turns EOFError and Ctrl-C alike into Abort: porter tells them apart."""
    def ends_early(path: object) -> None:
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")

    monkeypatch.setattr("porter.artifacts.sbom.read_sbom", ends_early)
    code, err = porter(capsys, "sbom", str(tmp_path / "x.whl"))
    assert code == 2 and "ERROR: a file ended early" in err and "TIP:" in err

    def interrupted(path: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("porter.artifacts.sbom.read_sbom", interrupted)
    assert porter(capsys, "sbom", str(tmp_path / "x.whl"))[0] == 130


def test_sbom_of_a_truncated_wheel_and_audit_of_no_code(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "w.whl").write_bytes(WHEEL_BYTES[:-100])
    code, err = porter(capsys, "sbom", str(tmp_path / "w.whl"))
    assert code == 2 and "w.whl is truncated or damaged" in err and "TIP:" in err
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("no code here\n")
    code, err = porter(capsys, "audit", str(tmp_path / "docs"), "--no-python")
    assert code == 4 and "holds no Python file" in err and "TIP:" in err


def test_archive_imports_in_a_python_whose_tarfile_has_no_filters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian bookworm's python (3.11.2, an image base) predates tar filters (3.11.4), and porter's install and
    verify run there: porter.archive must import without them (a table of tarfile's filter errors read at import
    stopped 'porter net-plugin verify' inside such an image)."""
    import importlib.util
    import sys
    import tarfile
    import types

    filters = {"FilterError", "AbsolutePathError", "OutsideDestinationError", "AbsoluteLinkError",
               "LinkOutsideDestinationError", "SpecialFileError", "data_filter", "tar_filter", "fully_trusted_filter"}
    old = types.ModuleType("tarfile")
    old.__dict__.update({k: v for k, v in vars(tarfile).items() if k not in filters})
    monkeypatch.setitem(sys.modules, "tarfile", old)
    spec = importlib.util.find_spec("porter.archive")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)  # a fresh copy: porter.archive itself is left as it is
    spec.loader.exec_module(module)
    assert module.tarfile is old and not hasattr(module.tarfile, "FilterError")
