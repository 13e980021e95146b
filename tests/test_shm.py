"""The shared-memory segments of the isolated loader: the room check before a segment is made."""

from __future__ import annotations

import shutil

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
