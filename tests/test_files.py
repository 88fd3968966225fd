"""hdmm.files: every file hdmm writes appears whole or not at all, and refusals name the problem."""

from __future__ import annotations

import os

import numpy as np
import pytest

from hdmm.files import check_new_directory, check_new_file, write_atomically, write_new


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old")

    def fail(temporary: str) -> None:
        with open(temporary, "wb") as file:
            file.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, fail)
    assert path.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["a.bin"]


def test_a_new_file_never_replaces_one_that_appeared(tmp_path):
    path = tmp_path / "a.txt"
    write_new(path, b"first")
    with pytest.raises(FileExistsError, match="appeared while it was being written"):
        write_new(path, b"second")
    assert write_atomically(path, lambda t: open(t, "w").write("x"), replace=False) is False
    assert path.read_bytes() == b"first" and sorted(os.listdir(tmp_path)) == ["a.txt"]


def test_a_file_keeps_its_permissions_when_replaced(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("old")
    os.chmod(path, 0o600)
    write_atomically(path, lambda t: open(t, "w").write("new"))
    assert path.read_text() == "new" and os.stat(path).st_mode & 0o777 == 0o600


def test_archives_are_written_atomically(tmp_path, monkeypatch):
    import hdmm.io as io

    path = tmp_path / "s.npz"
    io.write_archive(path, {"a": 1}, {"x": np.arange(3)})
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(io.np, "savez_compressed", broken)
    with pytest.raises(RuntimeError, match="interrupted"):
        io.write_archive(path, {"a": 2}, {"x": np.arange(4)})
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["s.npz"]


def test_output_checks_name_the_problem(tmp_path):
    assert check_new_file(tmp_path / "ok.csv") is None
    assert check_new_file(tmp_path).endswith("is a directory; give a file name")
    (tmp_path / "there.csv").write_text("x")
    assert check_new_file(tmp_path / "there.csv", overwrite=False).endswith("there.csv exists")
    assert check_new_file(tmp_path / "there.csv") is None
    assert "does not exist; create it first" in check_new_file(tmp_path / "no" / "a.csv")
    assert check_new_directory(tmp_path / "there.csv").endswith("exists")
    assert check_new_directory(tmp_path / "new") is None
