"""porter.install.abi's pure parts: the node's library folders (ld.so.conf and its includes, under a root) and
which shared objects it reads."""

from __future__ import annotations

from pathlib import Path

from porter.install.abi import ElfNeeds, Userspace, _max_version, check_shared_object, read_needs


def test_library_folders_come_from_ld_so_conf_under_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("etc/ld.so.conf.d", "usr/lib/x86_64-linux-gnu", "opt/rocm-7.0.2/lib", "opt/site/lib"):
        (root / d).mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n/opt/site/lib  # the site's\n")
    (root / "etc/ld.so.conf.d/10-rocm.conf").write_text("/opt/rocm-7.0.2/lib\n")
    (root / "opt/rocm-7.0.2/lib/libamdhip64.so.7").write_bytes(b"")
    node = Userspace.of(root)
    assert node.describe() == str(root)
    assert node.dirs == [root / "usr/lib/x86_64-linux-gnu", root / "usr/lib", root / "opt/rocm-7.0.2/lib",
                         root / "opt/site/lib"]
    assert node.find("libamdhip64.so.7") == root / "opt/rocm-7.0.2/lib/libamdhip64.so.7"
    needs = ElfNeeds(("libamdhip64.so.7", "libamdhip64.so.6", "libmine.so"), (), {}, ())
    why = check_shared_object("pkg/op.so", needs, node, {"pkg/op.so", "pkg/libmine.so"})
    assert len(why) == 1 and "pkg/op.so needs libamdhip64.so.6, which " in why[0]  # the wheel brings libmine.so


def test_newest_version_of_a_kind() -> None:
    names = {"GLIBCXX_3.4", "GLIBCXX_3.4.9", "GLIBCXX_3.4.30", "CXXABI_1.3.13", "CXXABI_FLOAT128", "CXXABI_1.3.2"}
    assert _max_version(names, "CXXABI_") == "CXXABI_1.3.13" and _max_version(names, "GLIBCXX_") == "GLIBCXX_3.4.30"
    assert _max_version(names, "GLIBC_") == "none"


def test_what_is_not_an_elf_file_is_not_read() -> None:
    assert read_needs(b"#!/bin/sh\n") is None


def test_a_damaged_shared_object_is_a_reason_not_a_crash(tmp_path: Path) -> None:
    import zipfile

    from porter.install.abi import check_wheel_abi

    whl = tmp_path / "x-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("x/op.so", b"\x7fELF truncated")
        zf.writestr("x/data.so.txt", b"not a library")
    (why,) = check_wheel_abi(whl, Userspace.of(tmp_path))
    assert why.startswith("x/op.so: unreadable ELF file")
