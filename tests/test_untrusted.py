"""reconcile/safety/untrusted.py on real files: what is refused (by name, never opened), the bounds,
the reduced modes, and copies that keep holes, within a filesystem and across two."""

from __future__ import annotations

import hashlib
import os
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconcile.safety.untrusted import (
    NotRegular,
    TooLarge,
    copy_fd,
    open_regular,
    read_regular,
    reduced_mode,
    sha256_fd,
)


def test_a_fifo_is_refused_by_name_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def read() -> None:
        try:
            read_regular(str(fifo), 64)
        except BaseException as exc:
            done.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    assert done, "read_regular waited on a FIFO"
    assert isinstance(done[0], NotRegular) and done[0].filename == str(fifo)
    assert done[0].strerror == "a FIFO, not a regular file"


def test_a_directory_a_socket_and_a_symlink_are_refused_by_what_they_are(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    os.symlink(tmp_path / "f", tmp_path / "link")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        for name, what in [("d", "a directory"), ("sock", "a socket"), ("link", "a symlink")]:
            with pytest.raises(NotRegular, match=f"{what}, not a regular file"):
                open_regular(str(tmp_path / name))
    assert read_regular(str(tmp_path / "link"), 64, follow=True) == b"x"  # a link the caller judged


def test_a_character_device_is_refused_and_never_read() -> None:
    with pytest.raises(NotRegular, match="a character device, not a regular file"):
        read_regular("/dev/zero", 64)


def test_a_file_past_its_bound_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(1 << 30)
    with pytest.raises(TooLarge, match="larger than 65536 bytes"):
        read_regular(str(big), 65536)
    (tmp_path / "ok").write_bytes(b"k" * 65536)
    assert len(read_regular(str(tmp_path / "ok"), 65536)) == 65536


@pytest.mark.parametrize(
    "mode, reduced",
    [
        (0o4755, 0o755),
        (0o2755, 0o755),
        (0o1644, 0o644),
        (0o777, 0o755),
        (0o666, 0o644),
        (0o104, 0o755),
        (0o005, 0o755),
        (0o604, 0o644),
        (0o444, 0o644),
        (0o600, 0o600),  # not readable by others: it stays so
        (0o640, 0o600),
        (0o610, 0o700),
        (0o000, 0o600),
    ],
)
def test_modes_are_reduced_to_0644_or_0755_never_wider_for_others(mode: int, reduced: int) -> None:
    assert reduced_mode(stat.S_IFREG | mode) == reduced


@pytest.fixture
def other_fs() -> Iterator[Path]:
    """A directory on another filesystem than tmp_path (tmpfs), where copy_file_range says EXDEV."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        yield Path(d)


def sparse_source(path: Path) -> bytes:
    data = os.urandom(4096)
    with open(path, "wb") as f:
        f.truncate(256 << 20)
        f.seek(64 << 20)
        f.write(data)
        f.seek((256 << 20) - 4096)
        f.write(data)
    return data


@pytest.mark.parametrize("across", [False, True])
def test_a_sparse_file_is_copied_sparse_and_hashed_as_its_bytes(
    tmp_path: Path, other_fs: Path, across: bool
) -> None:
    src = (other_fs if across else tmp_path) / "src"
    sparse_source(src)
    dst = tmp_path / "dst"
    fd, st = open_regular(str(src))
    out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        copy_fd(fd, out, st.st_size)
        digest = sha256_fd(fd, st.st_size)
    finally:
        os.close(out)
        os.close(fd)
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_blocks * 512 < 4 << 20  # 256 MiB apparent, a few blocks allocated
    assert digest == hashlib.sha256(src.read_bytes()).hexdigest()


def test_a_copy_stops_at_the_size_fstat_saw(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.write_bytes(b"a" * 10_000)
    fd, st = open_regular(str(src))
    with open(src, "ab") as f:
        f.write(b"b" * 10_000)  # grows after the open
    out = os.open(tmp_path / "dst", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        copy_fd(fd, out, st.st_size)
        assert sha256_fd(fd, st.st_size) == hashlib.sha256(b"a" * 10_000).hexdigest()
    finally:
        os.close(out)
        os.close(fd)
    assert (tmp_path / "dst").read_bytes() == b"a" * 10_000
