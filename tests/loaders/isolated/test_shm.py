"""The shared-memory segments of the isolated loader: the room check before a segment is made."""

from __future__ import annotations

import os
import shutil
import socket
import sys

import pytest

from audiobuffer import HelperError
from audiobuffer.loaders.isolated import shm as _shm


def test_a_segment_that_does_not_fit_in_dev_shm_is_refused_with_the_way_out(monkeypatch):
    monkeypatch.setattr(_shm, "room", lambda: (10 << 20, 64 << 20))
    with pytest.raises(HelperError, match=r"no room in /dev/shm for a batch slot of 30\.0 MiB \(10\.0 MiB free "
                                          r"of 64\.0 MiB\): .*--shm-size.*num_slots"):
        _shm.check_room(30 << 20, "a batch slot")
    _shm.check_room(10 << 20, "a batch slot")  # fits


def test_no_room_check_where_there_is_no_dev_shm(monkeypatch, tmp_path):
    # macOS and Windows keep shared memory elsewhere, with no folder whose free space tells the room left.
    monkeypatch.setattr(_shm, "SHM_DIR", tmp_path / "missing")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: pytest.fail(f"measured {path}"))
    assert _shm.room() is None
    _shm.check_room(1 << 60, "a batch slot")


@pytest.mark.skipif(not _shm.SHM_DIR.is_dir(), reason="no /dev/shm on this system")
def test_the_room_is_what_dev_shm_has_free():
    free, total = _shm.room()
    assert 0 <= free <= total == shutil.disk_usage(_shm.SHM_DIR).total


@pytest.mark.slow
@pytest.mark.skipif(os.name == "nt", reason="POSIX: segments cross as descriptors")
def test_a_posix_segment_has_no_name_and_crosses_as_a_descriptor():
    ours, theirs = socket.socketpair()
    # 1 s to wait for a descriptor: the last take below waits it out
    inbox, outbox = _shm.TrainerSocket(ours, 1.0), _shm.HelperSocket(os.dup(theirs.fileno()))
    theirs.close()
    made = [_shm.create(4096) for _ in range(3)]
    try:
        assert not any(_shm.leftovers(os.getpid()))
        with pytest.raises(FileNotFoundError):
            _shm.attach(made[0].name)  # by name: there is none
        made[0].buf[:3] = b"abc"
        for slot, segment in ((0, made[0]), (1, made[1]), (1, made[2])):  # slot 1 grew before it was read
            outbox.send(slot, segment)
            assert segment.fd == -1  # sent: the helper keeps only its map
        got = _shm.attach(made[2].name, inbox=inbox, slot=1)  # the outgrown one is passed over
        assert got.name == made[2].name and got.size == 4096
        first = _shm.attach(made[0].name, inbox=inbox, slot=0)
        assert bytes(first.buf[:3]) == b"abc"  # the same pages
        first.buf[3:4] = b"d"
        assert bytes(made[0].buf[:4]) == b"abcd"
        got.close()
        first.close()
        with pytest.raises(FileNotFoundError, match="never came"):
            inbox.take(2, "ab_0_missing")  # nothing more was sent: a timeout, bounded
    finally:
        for segment in made:
            segment.close()
        inbox.close()


def test_on_windows_a_segment_is_opened_by_its_name(monkeypatch):
    # A named section lives as long as a handle to it: the trainer opens the helper's slot by name, and
    # nothing crosses the socket (which does not exist there).
    monkeypatch.setattr(sys, "platform", "win32")
    segment = _shm.create(4096)
    try:
        assert segment.name.startswith(f"ab_{os.getpid()}_")
        other = _shm.attach(segment.name)
        segment.buf[:2] = b"ok"
        assert bytes(other.buf[:2]) == b"ok"
        other.close()
    finally:
        segment.close()
        monkeypatch.setattr(sys, "platform", "linux")
        _shm.unlink(segment.name)  # on Windows the last handle does this; here the name must go
