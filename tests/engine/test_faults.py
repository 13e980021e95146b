"""Fault injection: stalls, interrupts, aborts, many epochs, hostile files. Nothing hangs, nothing is lost."""

import gc
import os
import threading

import pytest
from helpers import (
    JOIN_TIMEOUT,
    IndexDecoder,
    fake_paths,
    wait_no_threads,
    wait_until_blocked,
    write_tone,
)

from audiobuffer import AudioDecoder, BufferedDataset, DecodeError, SampleError, StallError


class Stalling:
    """A decoder that blocks on ``gate`` for the chosen items (a file on a dead network share, say),
    ``hold`` seconds at most."""

    def __init__(self, stall, hold=JOIN_TIMEOUT):
        self.stall, self.hold = set(stall), hold
        self.gate = threading.Event()

    def __call__(self, item):
        if item.index in self.stall:
            self.gate.wait(self.hold)
        return {"index": item.index}


@pytest.mark.slow
def test_a_stalled_producer_becomes_a_clear_error():
    # held 10 times the timeout: the error comes first, and close() waits no longer than the hold
    decoder = Stalling({3}, hold=3.0)
    ds = BufferedDataset(fake_paths(10), decoder, num_producers=1, ordered=True, timeout=0.3)
    got = []
    try:
        with pytest.raises(StallError,
                           match=r"no sample for 0\.3 s .*audiobuffer-producer-0 on '.*item_00003\.wav' for"):
            for sample in ds:
                got.append(sample["index"])
    finally:
        decoder.gate.set()  # the stuck call returns; the producer then sees the stop and ends
    assert got == [0, 1, 2]
    assert not wait_no_threads()


class Exiting:
    """A decoder that raises a ``BaseException`` on one item (a library calling ``sys.exit``, say)."""

    def __init__(self, index, exc_type):
        self.index, self.exc_type = index, exc_type

    def __call__(self, item):
        if item.index == self.index:
            raise self.exc_type("decoder gave up")
        return {"index": item.index}


@pytest.mark.parametrize("on_error", ["raise", "skip"])
@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_base_exception_in_a_decoder_names_the_file_and_item(exc_type, on_error):
    ds = BufferedDataset(fake_paths(10), Exiting(4, exc_type), num_producers=2, on_error=on_error)
    with pytest.raises(SampleError, match=rf"producer audiobuffer-producer-\d crashed on item 4 "
                                          rf"\('/nonexistent/item_00004\.wav'\): {exc_type.__name__}: "
                                          rf"decoder gave up") as info:
        list(ds)
    assert (info.value.index, info.value.path) == (4, "/nonexistent/item_00004.wav")
    assert isinstance(info.value.__cause__, exc_type)
    assert not wait_no_threads()


def test_timeout_is_not_hit_by_a_steady_stream():
    ds = BufferedDataset(fake_paths(30), IndexDecoder(delays={i: 0.01 for i in range(30)}), timeout=0.5,
                         num_producers=2)
    assert len(list(ds)) == 30


def test_keyboard_interrupt_in_the_consumer_stops_producers():
    ds = BufferedDataset(fake_paths(500), IndexDecoder(), buffer_size=4, num_producers=4)
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(ds):
            if i == 5:
                raise KeyboardInterrupt
    assert not wait_no_threads()


def test_exception_thrown_into_the_generator_stops_producers():
    ds = BufferedDataset(fake_paths(500), IndexDecoder(), buffer_size=4, num_producers=4)
    it = iter(ds)
    next(it)
    with pytest.raises(ValueError, match="thrown in"):
        it.throw(ValueError("thrown in"))
    assert not wait_no_threads()


def test_close_while_producers_are_blocked_on_a_full_buffer():
    ds = BufferedDataset(fake_paths(500), IndexDecoder(), buffer_size=2, num_producers=4)
    it = iter(ds)
    next(it)
    (epoch,) = ds._epochs.running
    assert wait_until_blocked(epoch.buffer._has_pos, 4)  # the producers fill the buffer and block
    ds.close()
    assert not wait_no_threads()
    assert list(it) == []


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count file descriptors")
def test_500_short_epochs_leak_no_threads_or_files(tmp_path):
    path = write_tone(tmp_path / "a.wav", seconds=0.05)
    ds = BufferedDataset([str(path)] * 4, AudioDecoder(), num_producers=2, buffer_size=2)
    list(ds)
    gc.collect()
    threads, fds = threading.active_count(), _open_fds()
    for epoch in range(500):
        ds.set_epoch(epoch)
        if epoch % 3 == 0:
            it = iter(ds)
            next(it)
            it.close()  # and some epochs end early
        else:
            assert len(list(ds)) == 4
    gc.collect()
    assert not wait_no_threads()
    assert threading.active_count() == threads and _open_fds() == fds


# -- hostile inputs ----------------------------------------------------------------------------------

def hostile_files(root):
    """Files a real corpus ends up with; each must decode or be reported by name."""
    good = write_tone(root / "good.wav", seconds=0.1)
    cases = {"good.wav": good}
    (root / "zero.wav").write_bytes(b"")
    cases["zero.wav"] = root / "zero.wav"
    (root / "header.wav").write_bytes(good.read_bytes()[:30])
    cases["header.wav"] = root / "header.wav"
    flac = write_tone(root / "tmp.flac", seconds=0.1)
    os.replace(flac, root / "really-flac.wav")
    cases["really-flac.wav"] = root / "really-flac.wav"
    (root / "folder.wav").mkdir()
    cases["folder.wav"] = root / "folder.wav"
    os.symlink(root / "missing.wav", root / "dangling.wav")
    cases["dangling.wav"] = root / "dangling.wav"
    os.symlink(root / "loop-b.wav", root / "loop-a.wav")
    os.symlink(root / "loop-a.wav", root / "loop-b.wav")
    cases["loop-a.wav"] = root / "loop-a.wav"
    unicode = write_tone(root / "ünïcødé 音声 🎵.wav", seconds=0.1)
    cases[unicode.name] = unicode
    return cases


EXPECTED_OK = {"good.wav", "really-flac.wav", "ünïcødé 音声 🎵.wav"}


def test_hostile_files_decode_or_are_reported_by_name(tmp_path):
    cases = hostile_files(tmp_path)
    paths = [str(p) for p in cases.values()]
    ds = BufferedDataset(paths, AudioDecoder(fallback=None), on_error="skip", num_producers=4)
    decoded = {os.path.basename(s["path"]) for s in ds}
    failures = {os.path.basename(path): message for _, path, message in ds.stats().failures}
    assert decoded == EXPECTED_OK
    assert set(failures) == set(cases) - EXPECTED_OK
    for name, message in failures.items():
        assert name in message, f"the error for {name} does not name it: {message}"
    assert not wait_no_threads()


@pytest.mark.parametrize("name", ["zero.wav", "header.wav", "folder.wav", "dangling.wav", "loop-a.wav"])
def test_each_hostile_file_raises_a_decode_error_naming_it(tmp_path, name):
    path = hostile_files(tmp_path)[name]
    with pytest.raises(DecodeError, match=name.replace(".", r"\.")):
        list(BufferedDataset([str(path)], AudioDecoder(), num_producers=1))


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_reported(tmp_path):
    path = write_tone(tmp_path / "locked.wav", seconds=0.1)
    path.chmod(0)
    with pytest.raises(DecodeError, match=r"locked\.wav"):
        AudioDecoder(fallback=None)(path)


def test_directory_named_like_a_file_is_not_listed(tmp_path):
    hostile_files(tmp_path)
    ds = BufferedDataset(tmp_path, AudioDecoder(), on_error="skip")
    assert "folder.wav" not in {os.path.basename(p) for p in ds.source.paths}
