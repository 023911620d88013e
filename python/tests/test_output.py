"""`gpumemhook._native.write_file`: the package's files follow the one rule of docs/output-files.md."""

from __future__ import annotations

import os
import socket
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


def test_a_file_already_there_keeps_its_mode(tmp_path: Path) -> None:
    private = tmp_path / "private.json"
    private.write_bytes(b"old")
    private.chmod(0o600)
    _native.write_file(private, b"{}\n")
    assert private.read_bytes() == b"{}\n"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_a_socket_with_a_full_backlog_is_an_error_not_a_wait(tmp_path: Path) -> None:
    path = str(tmp_path / "collector.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(0)
        queued = []
        # Connections nobody accepts, until the listener's queue takes no more.
        for _ in range(16):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            queued.append(client)
            try:
                client.connect(path)
            except BlockingIOError:
                break
        else:
            pytest.fail("the backlog never filled")
        with pytest.raises(OSError, match="backlog is full"):
            _native.write_file(path, b"report\n")
        for client in queued:
            client.close()
