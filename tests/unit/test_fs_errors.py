"""Issue 22: an OSError that reaches the CLI is an ERROR naming its cause and its path, with a TIP for that cause."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from porter.errors import from_os_error
from porter.fs import atomic_path


def test_no_space_names_the_path_the_space_left_and_what_to_do(tmp_path: Path) -> None:
    err = from_os_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "wh" / "x.whl")))
    assert err.message.startswith(f"no space left on device while writing ({tmp_path / 'wh' / 'x.whl'})")
    assert "MiB free there now" in err.message  # measured on the nearest folder that exists
    assert err.hint is not None and f"holds {tmp_path}" in err.hint and "PORTER_CACHE_DIR" in err.hint
    assert err.exit_code == 1


@pytest.mark.parametrize("code,words", [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied"),
                                        (errno.EPERM, "permission denied"), (errno.EDQUOT, "disk quota exceeded")])
def test_each_cause_in_its_own_words(code: int, words: str) -> None:
    err = from_os_error(OSError(code, "x", "/some/cache/entry"))
    assert err.message.startswith(words) and "/some/cache/entry" in err.message and err.hint


def test_an_unnamed_write_error_is_named_by_the_atomic_writer(tmp_path: Path) -> None:
    dest = tmp_path / "out.whl"
    with pytest.raises(OSError) as info:
        with atomic_path(dest):
            raise OSError(errno.ENOSPC, "No space left on device")  # as zipfile's write() raises it
    assert info.value.filename == str(dest)
    assert str(dest) in from_os_error(info.value).message
    assert not list(tmp_path.iterdir())  # the temp file beside it is gone


def test_one_reader_of_command_output_for_every_caller() -> None:
    """Issue 19: first_error was written three times (toolchain check, Slurm jobs, the op build)."""
    from porter.errors import first_error

    chain = ("In file included from /w/hip/ops/k.hip:3:\n/w/hip/includes/u.h:9:1: error: unknown type name 'x'\n"
             "1 error generated.\n")
    assert first_error(chain) == "/w/hip/includes/u.h:9:1: error: unknown type name 'x' (included from /w/hip/ops/k.hip:3)"
    assert first_error("pip stuff\nERROR: first\nmore\nERROR: No matching distribution\n") == "No matching distribution"
    assert first_error("warning: a\nlink failed with an Error here\nlast\n") == "link failed with an Error here"
    assert first_error("one\ntwo\n") == "two" and first_error("") == "failed with no output"
    assert first_error("FAILED: x.o\nx.cu:1:2: fatal error: 'y.h' file not found\n") == \
        "x.cu:1:2: fatal error: 'y.h' file not found"


def test_a_compiler_diagnostic_comes_before_pips_wrapper_lines() -> None:
    from porter.errors import first_error

    pip = ("  /t/src/flatten_sum.cpp:4:2: error: #error deliberately broken cell\n"
           "  error: command '/usr/bin/g++' failed with exit code 1\n"
           "error: subprocess-exited-with-error\nERROR: Failed building wheel for apex\n")
    assert first_error(pip) == "/t/src/flatten_sum.cpp:4:2: error: #error deliberately broken cell"
    assert first_error("clang: error: unknown argument: '-foo'\n") == "clang: error: unknown argument: '-foo'"
    assert first_error("error: subprocess-exited-with-error\nERROR: Failed building wheel\n") == \
        "Failed building wheel"


def test_a_killed_writers_temp_is_removed_by_the_next_writer_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    """Issue 22: a SIGKILL during a write leaves the temp file beside the destination (no handler runs). Its
    name carries the writer's pid and host, so the next write of the same file removes it once that pid is gone."""
    import socket

    from porter.fs import atomic_write_text

    dest = tmp_path / "x.whl"
    dead = 4194305  # above Linux's largest pid_max (2**22): no process has it
    host = socket.gethostname()
    killed = tmp_path / f".x.whl.porter-{dead}@{host}.abc123.tmp"
    live = tmp_path / f".x.whl.porter-{os.getpid()}@{host}.def456.tmp"
    elsewhere = tmp_path / f".x.whl.porter-{dead}@another.host.ghi789.tmp"
    other_file = tmp_path / f".y.whl.porter-{dead}@{host}.jkl012.tmp"
    for p in (killed, live, elsewhere, other_file):
        p.write_bytes(b"half")
    atomic_write_text(dest, "whole")
    assert dest.read_text() == "whole" and not killed.exists()
    assert live.exists() and elsewhere.exists() and other_file.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([dest.name, live.name, elsewhere.name, other_file.name])


def test_a_killed_writers_temp_folder_is_removed_by_the_next_one(tmp_path: Path) -> None:
    import socket

    from porter.fs import owned_temp_dir

    host = socket.gethostname()
    killed = tmp_path / f".unpack-4194305@{host}.abc123"
    (killed / "deepspeed").mkdir(parents=True)
    live = tmp_path / f".unpack-{os.getpid()}@{host}.def456"
    live.mkdir()
    fresh = owned_temp_dir(tmp_path, ".unpack-")
    assert fresh.is_dir() and fresh.name.startswith(f".unpack-{os.getpid()}@{host}.")
    assert not killed.exists() and live.is_dir()


def test_publish_dir_swaps_a_folder_in_without_a_moment_it_is_missing(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22, a re-port: the earlier ported tree and the new one swap in one step (renameat2 RENAME_EXCHANGE);
    a reader that looks at the destination all along always finds a whole tree, the old or the new."""
    import threading

    from porter import fs

    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    if not fs._exchange(tmp_path / "x", tmp_path / "y"):
        pytest.skip("the file system under the temp folder cannot swap two folders (renameat2 RENAME_EXCHANGE)")
    (tmp_path / "x").rmdir()
    (tmp_path / "y").rmdir()
    dest = tmp_path / "ported"
    dest.mkdir()
    (dest / "v").write_text("0")
    missing: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                (dest / "v").read_text()
            except FileNotFoundError:
                missing.append(1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(1, 200):
            new = tmp_path / f"new{i}"
            new.mkdir()
            (new / "v").write_text(str(i))
            fs.publish_dir(new, dest)
            assert (new / "v").read_text() == str(i - 1)  # the earlier tree, left for the caller to remove
            shutil.rmtree(new)
    finally:
        stop.set()
        watcher.join()
    assert (dest / "v").read_text() == "199" and missing == []
    # where the swap is refused (an older kernel, NFS): the folder is still published, through two renames
    monkeypatch.setattr(fs, "_exchange", lambda a, b: False)
    new = tmp_path / "late"
    new.mkdir()
    (new / "v").write_text("late")
    fs.publish_dir(new, dest)
    assert (dest / "v").read_text() == "late" and (new / "v").read_text() == "199"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late", "ported"]
    # the first publish has nothing to swap with
    first = tmp_path / "first"
    first.mkdir()
    fs.publish_dir(first, tmp_path / "fresh")
    assert (tmp_path / "fresh").is_dir() and not first.exists()


def test_stale_private_outputs_of_killed_compiles_are_removed(tmp_path: Path) -> None:
    """What ops_prebuild.publish leaves when its compile is killed: removed on this host once its pid is gone; a
    running compile's (this process stands in) and another host's stay, and so do the published files."""
    import socket

    from porter.fs import remove_stale_outputs

    host, dead = socket.gethostname(), 2**22 + 4321  # above Linux's largest pid
    (tmp_path / "op" / "pch").mkdir(parents=True)
    names = {"dead": tmp_path / "op" / f"a.cpp.{dead}@{host}.tmp.o",
             "dead_pch": tmp_path / "op" / "pch" / f"t.h.{dead}@{host}.tmp.gch",
             "dead_dep": tmp_path / "op" / f"a.cpp.o.d.{dead}@{host}.tmp",
             "live": tmp_path / "op" / f"b.cpp.{os.getpid()}@{host}.tmp.o",
             "other_host": tmp_path / "op" / f"c.cpp.{dead}@elsewhere.tmp.o",
             "published": tmp_path / "op" / "a.cpp.o"}
    for p in names.values():
        p.write_text("x")
    removed = remove_stale_outputs(tmp_path)
    assert sorted(removed) == sorted([names["dead"], names["dead_pch"], names["dead_dep"]])
    assert all(names[k].exists() for k in ("live", "other_host", "published"))


def test_a_reference_that_is_no_file_name_is_not_found(tmp_path: Path) -> None:
    from importlib import resources

    from porter.fs import exists

    (tmp_path / "f.toml").write_text("")
    assert exists(tmp_path) and not exists(tmp_path, file=True) and exists(tmp_path / "f.toml", file=True)
    assert not exists(tmp_path / "a\0b") and not exists(tmp_path / ("x" * 5000), file=True)
    presets = resources.files("porter.toolchain").joinpath("presets")
    assert exists(presets) and not exists(presets, file=True) and exists(presets.joinpath("cpu.toml"), file=True)
