"""`gpumemhook._native.write_file`: the package's files follow the one rule of docs/output-files.md."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from gpumemhook import _native


def test_a_new_path_and_a_users_own_link_are_written_as_files(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    _native.write_file(target, b"{}\n")
    assert target.read_bytes() == b"{}\n"
    (tmp_path / "link.json").symlink_to("out.json")
    _native.write_file(str(tmp_path / "link.json"), b"[1]\n")
    assert (tmp_path / "link.json").is_symlink()
    assert target.read_bytes() == b"[1]\n"


def test_a_fifo_is_written_through_and_a_directory_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    # The reader's open blocks until a writer comes; hold one open so write_file finds a reader.
    keep = os.open(fifo, os.O_WRONLY)
    _native.write_file(fifo, b"report\n")
    os.close(keep)
    reader.join(10)
    assert got == [b"report\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(OSError, match="is a directory"):
        _native.write_file(tmp_path, b"x")
