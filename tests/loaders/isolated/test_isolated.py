"""IsolatedLoader: the same epochs as BufferedDataset, from a helper process, with nothing left behind."""

from __future__ import annotations

import gc
import io
import json
import logging
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    JOIN_TIMEOUT,
    REPO,
    duration_manifest,
    fake_paths,
    make_corpus,
    mapped_segments,
    segment_exists,
    table_descriptors,
    wait_gone,
    write_tone,
)
from plain_decoders import Exit, ExitOnce, Flood, IndexDecoder, Misfit, TightShm, add_one

from audiobuffer import (
    AudioDecoder,
    BufferClosed,
    BufferedDataset,
    DecodeError,
    DevicePrefetcher,
    HelperError,
    IsolatedLoader,
    ResumeError,
    SampleError,
    StallError,
    pad_collate,
)
from audiobuffer.engine.plan import plan_batches
from audiobuffer.engine.state import unpack_consumed
from audiobuffer.loaders.isolated import shm as _shm

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_helper_left_behind")]


def indices(batches):
    return [int(i) for batch in batches for i in batch["index"]]


@pytest.mark.parametrize("num_producers", [1, 2, 4])
@pytest.mark.parametrize("ordered", [False, True])
def test_every_item_once_per_epoch(num_producers, ordered):
    with IsolatedLoader(fake_paths(103), IndexDecoder(), batch_size=8, num_producers=num_producers,
                        ordered=ordered, shuffle=True, seed=3) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = list(loader)
            got = indices(batches)
            assert sorted(got) == list(range(103))
            assert len(batches) == len(loader) == 13
            if ordered:
                expected = [int(i) for i in np.random.default_rng(3 + epoch).permutation(103)]
                assert got == expected
            stats = loader.stats()
            assert stats.done and stats.yielded == 103 and stats.failed == 0
        assert loader.helper_info["torch"] is False  # the helper runs without torch


def test_the_helper_starts_with_the_constructor_and_gets_the_pipeline_at_the_first_iter():
    # Its interpreter and imports overlap the listing of the source in the trainer.
    with IsolatedLoader(fake_paths(20), IndexDecoder(), batch_size=8, ordered=True) as loader:
        channel = loader._channel
        assert channel.launched and channel.running and not channel.ready and loader.helper_info == {}
        assert indices(loader) == list(range(20))
        assert loader._channel is channel and channel.ready and loader.helper_info["pid"] == channel.proc.pid


def test_batches_match_pad_collate():
    paths = fake_paths(10)
    decoder = IndexDecoder()
    with IsolatedLoader(paths, decoder, batch_size=4, ordered=True) as loader:
        batches = list(loader)
    ds = BufferedDataset(paths, decoder, ordered=True)
    samples = list(ds)
    for n, batch in enumerate(batches):
        expected = pad_collate(samples[4 * n:4 * n + 4])
        assert batch.keys() == expected.keys()
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), key
            else:
                assert batch[key] == value, key


def test_rank_shards_are_disjoint_and_even():
    seen = []
    for rank in range(3):
        with IsolatedLoader(fake_paths(20), IndexDecoder(), batch_size=4, rank=rank, world_size=3,
                            shuffle=True) as loader:
            got = indices(loader)
            assert len(got) == 7  # padded to 21
            seen += got
    assert set(seen) == set(range(20))


def test_drop_last_and_a_batch_larger_than_its_slot():
    with IsolatedLoader(fake_paths(10), IndexDecoder(length=50_000), batch_size=4, drop_last=True,
                        slot_bytes=1024) as loader:
        batches = list(loader)
    assert [b["audio"].shape for b in batches] == [(4, 50_000)] * 2
    for batch in batches:
        for row, index in zip(batch["audio"], batch["index"]):
            assert torch.all(row == index)


def test_the_helpers_decoder_hands_numpy_arrays_over_and_torch_stays_out(tmp_path):
    from plain_decoders import where_audio_came_from

    make_corpus(tmp_path, 6, seconds=0.2)
    decoder = AudioDecoder(8000, crop_seconds=0.1)
    with IsolatedLoader(tmp_path, decoder, batch_size=3, transform=where_audio_came_from) as loader:
        batches = list(loader)
    assert [bool(v) for b in batches for v in b["audio_is_numpy"]] == [True] * 6
    assert [bool(v) for b in batches for v in b["torch_loaded"]] == [False] * 6
    assert decoder.tensors is True  # the helper's copy was set, not the trainer's decoder


def test_real_audio_with_a_transform(tmp_path):
    make_corpus(tmp_path, 12, seconds=0.2)
    decoder = AudioDecoder(8000, crop_seconds=0.1, crop="start")
    with IsolatedLoader(tmp_path, decoder, batch_size=5, labels="parent", transform=add_one,
                        ordered=True) as loader:
        batches = list(loader)
    ds = BufferedDataset(tmp_path, decoder, labels="parent", ordered=True)
    samples = list(ds)
    audio = torch.cat([b["audio"] for b in batches])
    assert torch.equal(audio, torch.stack([s["audio"] + 1 for s in samples]))
    assert [n for b in batches for n in b["label_name"]] == [s["label_name"] for s in samples]
    assert loader.classes == ["class0", "class1", "class2"]


def test_labels_from_a_local_function_stay_in_the_trainer():
    # The source is listed here: the helper gets its labels, not the function, which would not pickle.
    with IsolatedLoader(fake_paths(6), IndexDecoder(), batch_size=3, ordered=True,
                        labels=lambda path: "odd" if int(path[-5]) % 2 else "even") as loader:
        batches = list(loader)
    assert loader.classes == ["even", "odd"] and indices(batches) == list(range(6))


@pytest.mark.parametrize("policy", ["skip", "warn"])
def test_failures_are_counted_and_named(policy, caplog):
    paths = fake_paths(30)
    with caplog.at_level(logging.WARNING, logger="audiobuffer"):
        with IsolatedLoader(paths, IndexDecoder(fail=(4, 17)), batch_size=8, on_error=policy) as loader:
            got = indices(loader)
            stats = loader.stats()
    assert sorted(got) == [i for i in range(30) if i not in (4, 17)]
    assert stats.failed == 2 and stats.yielded == 28
    assert sorted(f[0] for f in stats.failures) == [4, 17]
    assert all("injected failure" in f[2] for f in stats.failures)
    warned = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(warned) == (2 if policy == "warn" else 0)
    if warned:
        assert paths[4] in " ".join(warned) and "ValueError" in warned[0]


def test_a_failure_raises_in_the_trainer_chained_to_the_original():
    paths = fake_paths(30)
    with IsolatedLoader(paths, IndexDecoder(fail=(9,)), batch_size=4, ordered=True) as loader:
        with pytest.raises(SampleError, match=r"item 9 .*item_00009\.wav.*ValueError: injected failure") as info:
            list(loader)
        assert info.value.path == paths[9] and info.value.index == 9
        assert isinstance(info.value.__cause__, ValueError)
        assert "plain_decoders.py" in str(info.value.__cause__.__cause__)  # the helper's traceback


def test_a_decode_error_stays_a_decode_error(tmp_path):
    (tmp_path / "bad.wav").write_bytes(b"not audio at all")
    with IsolatedLoader([tmp_path / "bad.wav"], AudioDecoder(fallback=None), batch_size=2) as loader:
        with pytest.raises(DecodeError, match="bad.wav"):
            list(loader)


def test_the_loader_keeps_working_after_a_failed_epoch():
    with IsolatedLoader(fake_paths(12), IndexDecoder(fail=(5,)), batch_size=4) as loader:
        with pytest.raises(SampleError):
            list(loader)
        loader.set_epoch(1)
        with pytest.raises(SampleError):
            list(loader)


def test_resume_mid_epoch_yields_exactly_the_rest():
    paths = fake_paths(50)
    options = dict(batch_size=4, shuffle=True, seed=7)
    with IsolatedLoader(paths, IndexDecoder(), **options) as loader:
        loader.set_epoch(2)
        it = iter(loader)
        first = [next(it) for _ in range(5)]
        state = json.loads(json.dumps(loader.state_dict()))  # JSON-ready
        it.close()
    with IsolatedLoader(paths, IndexDecoder(), **options) as loader:
        loader.load_state_dict(state)
        assert loader.epoch == 2
        rest = list(loader)
    assert sorted(indices(first) + indices(rest)) == list(range(50))
    assert loader.stats().resumed == 20


def test_resume_refuses_another_setup():
    with IsolatedLoader(fake_paths(10), IndexDecoder(), batch_size=4, seed=1) as loader:
        state = loader.state_dict()
    with IsolatedLoader(fake_paths(10), IndexDecoder(), batch_size=4, seed=2) as other:
        with pytest.raises(ResumeError, match="seed=1"):
            other.load_state_dict(state)


def test_state_is_shared_with_buffered_dataset():
    paths = fake_paths(20)
    ds = BufferedDataset(paths, IndexDecoder(), seed=4, shuffle=True)
    it = iter(ds)
    taken = [next(it)["index"] for _ in range(6)]
    state = ds.state_dict()
    it.close()
    with IsolatedLoader(paths, IndexDecoder(), batch_size=4, seed=4, shuffle=True) as loader:
        loader.load_state_dict(state)
        rest = indices(loader)
    assert sorted(taken + rest) == list(range(20))


@pytest.mark.parametrize("how", ["break", "exception", "gc", "close"])
def test_leaving_early_stops_everything(how):
    loader = IsolatedLoader(fake_paths(400), IndexDecoder(delay=0.005), batch_size=4, num_slots=2)
    it = iter(loader)
    next(it)
    pid = loader.helper_info["pid"]
    if how == "break":
        it.close()
        loader.set_epoch(1)
        assert len(indices(loader)) == 400  # the next epoch runs whole after an abandoned one
        loader.close()
    elif how == "exception":
        with pytest.raises(RuntimeError):
            with loader:
                for _ in it:
                    raise RuntimeError("a bug in the training loop")
    elif how == "gc":
        del it, loader
    else:
        loader.close()
        with pytest.raises(BufferClosed, match="IsolatedLoader was closed"):
            next(it)
        loader.close()  # idempotent
    assert wait_gone(pid, JOIN_TIMEOUT)


def test_the_helper_dies_with_a_clear_error():
    with IsolatedLoader(fake_paths(40), Exit(index=13), batch_size=4, ordered=True) as loader:
        with pytest.raises(HelperError, match=r"helper process \(pid \d+\) exited with code 3"):
            list(loader)
        with pytest.raises(HelperError):
            list(loader)


def test_the_helper_killed_is_a_clear_error():
    with IsolatedLoader(fake_paths(200), IndexDecoder(delay=0.01), batch_size=4) as loader:
        it = iter(loader)
        next(it)
        loader._channel.proc.kill()  # SIGKILL; TerminateProcess on Windows, which exits with code 1
        with pytest.raises(HelperError, match="exited with code 1" if os.name == "nt" else "SIGKILL"):
            for _ in it:
                pass


TRAINER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from audiobuffer import IsolatedLoader
    from plain_decoders import IndexDecoder
    loader = IsolatedLoader([f"/x/{{i}}.wav" for i in range(10_000)], IndexDecoder(delay=0.01), batch_size=4)
    it = iter(loader)
    next(it)
    print(loader.helper_info["pid"], *loader.helper_info["segments"], flush=True)
    time.sleep(60)
""")


def test_a_killed_trainer_takes_its_helper_and_segments_along(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(tests=str(REPO / "tests")), encoding="utf-8", newline="\n")
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        helper, *names = trainer.stdout.readline().split()
        assert names and not any(segment_exists(name) for name in names)  # no name, even while it runs
        trainer.kill()  # SIGKILL; TerminateProcess on Windows
        trainer.wait(JOIN_TIMEOUT)
        assert wait_gone(int(helper), 2.0), "the helper outlived its trainer by more than 2 s"
        assert not any(segment_exists(name) for name in names) and _shm.leftovers(int(helper)) == []
    finally:
        trainer.kill()
        trainer.wait(JOIN_TIMEOUT)
        trainer.stdout.close()


GROUP_TRAINER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from audiobuffer import IsolatedLoader
    from plain_decoders import IndexDecoder
    # Slots of 1 KiB: each grows at its first batch, into a segment the trainer has not read yet.
    loader = IsolatedLoader([f"/x/{{i}}.wav" for i in range(10_000)], IndexDecoder(length=5000), batch_size=4,
                            slot_bytes=1024, num_slots=3)
    it = iter(loader)
    next(it)
    time.sleep(1.0)  # the helper fills and grows the other slots meanwhile
    print(loader.helper_info["pid"], flush=True)
    time.sleep(60)
""")


def table_files(folder: Path) -> set[Path]:
    return set(folder.glob("audiobuffer-table-*"))


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_signal_to_the_whole_process_group_leaves_no_shared_memory(tmp_path, signame):
    # What `timeout`, Slurm, a closed terminal or a scheduler's last word send: every process of the
    # group ends at once, none of them cleaning up; nothing may be left in /dev/shm or the temp folder.
    script = tmp_path / "trainer.py"
    script.write_text(GROUP_TRAINER.format(tests=str(REPO / "tests")), encoding="utf-8", newline="\n")
    # The trainer's own temp folder: another process's tables (a parallel test's) come and go elsewhere.
    temp = tmp_path / "temp"
    temp.mkdir()
    tables = table_files(temp)
    env = {**os.environ, "TMPDIR": str(temp), "TEMP": str(temp), "TMP": str(temp)}
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                               start_new_session=True, env=env)
    try:
        helper = int(trainer.stdout.readline())
        os.killpg(trainer.pid, getattr(signal, signame))
        trainer.wait(JOIN_TIMEOUT)
        assert wait_gone(helper, JOIN_TIMEOUT)
        assert _shm.leftovers(helper) == [] and _shm.leftovers(trainer.pid) == []
        assert table_files(temp) == tables
    finally:
        trainer.kill()
        trainer.wait(JOIN_TIMEOUT)
        trainer.stdout.close()
        for name in _shm.leftovers(helper):  # a failed run cleans up after itself
            _shm.unlink(name)


def _in_forked_child(loader, epoch, out):
    """What a child forked from the trainer does with its copy of an open loader: each call's outcome,
    written to ``out`` as a line as soon as it is known (a hang shows as the lines missing)."""
    def say(text):
        os.write(out, (text.replace("\n", " ") + "\n").encode())

    for name, call in (("next", lambda: next(epoch)), ("iter", lambda: iter(loader)), ("close", loader.close)):
        try:
            call()
            say(f"{name}: no error")
        except HelperError as exc:
            say(f"{name}: HelperError: {exc}")
        except BaseException as exc:  # noqa: BLE001 - any other outcome is reported to the parent
            say(f"{name}: {type(exc).__name__}: {exc}")
    import atexit

    atexit._run_exitfuncs()  # what a child's exit runs: finalizers, epochs left open
    gc.collect()
    say("exited")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this system")
def test_a_forked_child_gets_a_helper_error_and_leaves_the_parents_helper_alone():
    with IsolatedLoader(fake_paths(120), IndexDecoder(), batch_size=4, num_slots=2, ordered=True) as loader:
        epoch = iter(loader)
        first = next(epoch)
        helper = loader.helper_info["pid"]
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # the child never returns into pytest
            try:
                os.close(read)
                _in_forked_child(loader, epoch, write)
            finally:
                os._exit(0)
        os.close(write)
        lines = b""
        try:
            deadline = time.monotonic() + 20.0
            while b"exited" not in lines and time.monotonic() < deadline:
                ready, _, _ = select.select([read], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                chunk = os.read(read, 4096)
                if not chunk:
                    break
                lines += chunk
        finally:
            os.close(read)
            try:
                os.kill(child, signal.SIGKILL)  # a child stuck in a hang
            except ProcessLookupError:
                pass
            os.waitpid(child, 0)
        said = lines.decode().splitlines()
        owner = rf"HelperError: .*belongs to process {os.getpid()}.*this is process {child}"
        assert len(said) == 4, said
        assert re.match(f"next: {owner}", said[0]) and re.match(f"iter: {owner}", said[1]), said
        assert said[2:] == ["close: no error", "exited"]
        # The parent's epoch and helper carry on: nothing was stopped, closed or unlinked.
        assert loader._channel.running and loader.helper_info["pid"] == helper
        rest = [int(i) for batch in epoch for i in batch["index"]]
        assert [int(i) for i in first["index"]] + rest == list(range(120))


NO_GUARD = textwrap.dedent("""
    import multiprocessing
    import sys
    sys.path.insert(0, {tests!r})
    multiprocessing.set_start_method("spawn")  # as on Windows and macOS
    from audiobuffer import IsolatedLoader
    from plain_decoders import IndexDecoder
    print("imported", flush=True)  # a re-import of this script would print this twice
    with IsolatedLoader([f"/x/{{i}}.wav" for i in range(50)], IndexDecoder(), batch_size=8) as loader:
        print(sum(len(b["index"]) for b in loader))
""")


def test_a_script_without_a_main_guard_works(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text(NO_GUARD.format(tests=str(REPO / "tests")), encoding="utf-8", newline="\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["imported", "50"]


def local_decoder_factory():
    def decode(item):
        return {"audio": np.zeros(1, dtype=np.float32)}
    return decode


class MainLike:
    def __call__(self, item):
        return {"audio": np.zeros(1, dtype=np.float32)}


@pytest.mark.parametrize("decoder, why", [
    (lambda item: item, "lambda"),
    (local_decoder_factory(), "inside another function"),
])
def test_unimportable_decoders_are_refused(decoder, why):
    with pytest.raises(TypeError, match=f"decoder.*{why}.*move it to a module"):
        IsolatedLoader(fake_paths(4), decoder, batch_size=2)


def test_a_decoder_from_main_is_refused(monkeypatch):
    monkeypatch.setattr(MainLike, "__module__", "__main__")
    with pytest.raises(TypeError, match=r"'MainLike'.*__main__.*move it to a module"):
        IsolatedLoader(fake_paths(4), MainLike(), batch_size=2)
    with pytest.raises(TypeError, match="transform.*lambda"):
        IsolatedLoader(fake_paths(4), IndexDecoder(), batch_size=2, transform=lambda s: s)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(batch_size=0), ValueError, r"^batch_size .*, got 0$"),
    (dict(batch_size="8"), TypeError, r"^batch_size .*, got '8'$"),
    (dict(batch_size=2, num_slots=1), ValueError, r"^num_slots .*, got 1$"),
    (dict(batch_size=2, pin_memory="yes"), ValueError, r"^pin_memory .*, got 'yes'$"),
    (dict(batch_size=2, on_error="ignore"), ValueError, r"^on_error .*, got 'ignore'$"),
])
def test_bad_options_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        IsolatedLoader(fake_paths(4), IndexDecoder(), **kwargs)


def test_under_a_device_prefetcher():
    with IsolatedLoader(fake_paths(21), IndexDecoder(), batch_size=4) as loader:
        prefetcher = DevicePrefetcher(loader, "cpu")
        assert len(prefetcher) == 6
        got = [int(i) for batch in prefetcher for i in batch["index"]]
    assert sorted(got) == list(range(21))


def test_stats_carry_the_transfer_counters():
    # Two pinned producers: every item goes through the helper's buffer (auto may decode inline).
    with IsolatedLoader(fake_paths(16), IndexDecoder(), batch_size=4, num_producers=2) as loader:
        assert loader.stats() is None
        list(loader)
        stats = loader.stats()
    assert set(stats.transfer) == {"trainer_wait_s", "trainer_copy_s", "helper_slot_wait_s",
                                   "trainer_batches"}
    assert stats.buffer is not None and stats.buffer.puts == 16
    assert (stats.num_producers, stats.producer_history) == (2, [(0.0, 2, "pinned")])
    assert "helper=closed" in repr(loader)


def test_the_trainer_reads_from_the_helper_only_when_it_waits():
    # NOTE [ Reading the helper on demand ]: while the training step runs, no thread of the trainer
    # reads (and unpickles) what the helper sends meanwhile; it waits in the pipe until asked for.
    with IsolatedLoader(fake_paths(64), IndexDecoder(), batch_size=4, num_producers=1, num_slots=4) as loader:
        batches = iter(loader)
        first = next(batches)
        # Time for the helper to fill its slots and send them; what is checked is that none
        # of them was read, so a slow helper cannot make this fail, only a trainer that reads ahead.
        time.sleep(0.5)
        assert len(loader._channel.inbox) == 0
        rest = list(batches)
    assert sorted(indices([first] + rest)) == list(range(64))


def test_closing_with_a_full_pipe_and_a_stuck_decode_lets_the_helper_exit_by_itself(tmp_path):
    # The trainer reads on demand, so at close the helper may have far more to send than the pipe holds,
    # and a producer stuck in a decode makes it log a warning as it stops. Its writer thread alone waits
    # on the pipe, which the closing trainer reads to its end: the helper exits on its own, not killed.
    stuck = tmp_path / "stuck"
    loader = IsolatedLoader(fake_paths(300), Flood(first_failure=4, stuck=100, stuck_s=3.0, marker=str(stuck)),
                            batch_size=4, num_producers=2, on_error="skip")
    batches = iter(loader)
    try:
        assert sorted(indices([next(batches)])) == [0, 1, 2, 3]
        proc = loader._channel.proc
        # By the time item 100 is stuck, about 70 failures of 12 KiB each (message, traceback, pickled
        # exception) wait in the pipe and the helper's queue (its bound: 64 queued, the epoch thread then
        # waits), over 10 times what a pipe holds; the producers reach item 100 whatever the epoch thread
        # took last. Another process's file: nothing to wait on.
        deadline = time.monotonic() + JOIN_TIMEOUT
        while not stuck.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stuck.exists()
    finally:
        loader.close()
        batches.close()
    assert proc.returncode == 0  # exited by itself: a helper that hung would have been killed after JOIN_TIMEOUT


#: When another thread closes the loader, in seconds after the epoch began: the first batches' waits,
#: copies out of a slot (each slot grows at its first batch: a new segment to attach) and hand-backs.
CLOSE_AT = [i * 0.001 for i in range(30)]


@pytest.mark.parametrize("when", CLOSE_AT)
def test_closing_from_another_thread_as_batches_are_unpacked_is_buffer_closed(when):
    # Whatever the consumer does as the close lands (waits, attaches a segment the shutdown unlinks,
    # copies out of a slot, hands it back on a pipe the shutdown shut), it raises BufferClosed: a
    # HelperError would say the helper died, and it was told to leave.
    with IsolatedLoader(fake_paths(10_000), IndexDecoder(length=20_000), batch_size=4, num_producers=2, ordered=True,
                        slot_bytes=1024) as loader:
        batches = iter(loader)
        closer = threading.Timer(when, loader.close)
        closer.start()
        got = []
        with pytest.raises(BufferClosed, match="the IsolatedLoader was closed"):
            for batch in batches:
                got.append(batch)
        closer.join(JOIN_TIMEOUT)
        assert not closer.is_alive()
    assert sorted(indices(got)) == list(range(4 * len(got)))
    assert all(bool((batch["audio"][:, 0] == batch["index"]).all()) for batch in got)  # copied whole


def test_a_close_during_a_copy_out_of_a_slot_waits_for_it_and_ends_in_buffer_closed(monkeypatch):
    # The close lands in the middle of the consumer's copy: it sets the channel's closing flag at once
    # and frees the segments only once the copy is done, so the batch is read whole and what follows
    # (its hand-back, the next wait) is BufferClosed.
    from audiobuffer.loaders.isolated import channel as _channel

    dtype, closers = _channel.torch_dtype, []

    def closing_midway(name):
        if not closers:
            closer = threading.Thread(target=loader.close, name="test-closer", daemon=True)
            closers.append(closer)
            closer.start()
            assert loader._channel._closing.wait(JOIN_TIMEOUT)
        return dtype(name)

    monkeypatch.setattr(_channel, "torch_dtype", closing_midway)
    with IsolatedLoader(fake_paths(40), IndexDecoder(), batch_size=4, num_producers=1, ordered=True) as loader:
        got = []
        with pytest.raises(BufferClosed, match="the IsolatedLoader was closed"):
            for batch in loader:
                got.append(batch)
        closers[0].join(JOIN_TIMEOUT)
        assert not closers[0].is_alive()
    assert len(got) <= 1 and indices(got) == list(range(4 * len(got)))


def test_the_helpers_channel_holds_back_data_frames_but_never_control_frames():
    from audiobuffer.loaders.isolated.helper import Channel
    from audiobuffer.loaders.isolated.protocol import SampleFailed, Stopped

    read_fd, write_fd = os.pipe()
    with open(read_fd, "rb") as incoming, open(write_fd, "wb") as outgoing:
        channel = Channel(io.BytesIO(), outgoing)
        big = "x" * 70_000  # a frame larger than a pipe holds: the writer waits on the first one
        flooded = threading.Event()

        def flood():
            for i in range(Channel.DATA_FRAMES + 2):
                channel.send(SampleFailed(i, False, i, "x", None, "ValueError", big, None, ""), data=True)
            flooded.set()

        thread = threading.Thread(target=flood, name="test-flood", daemon=True)
        thread.start()
        channel.send(Stopped(1))  # a control frame is queued at once, whatever is waiting
        # Time for an unbounded sender to queue them all; what is checked is that it did not.
        assert not flooded.wait(0.5)
        kinds = [type(pickle.load(incoming)).__name__ for _ in range(Channel.DATA_FRAMES + 3)]
        assert flooded.wait(JOIN_TIMEOUT)
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive()
        channel.close(JOIN_TIMEOUT)
    assert kinds.count("SampleFailed") == Channel.DATA_FRAMES + 2 and kinds.count("Stopped") == 1


def test_an_old_epochs_iterator_closed_late_leaves_the_new_epoch_alone():
    with IsolatedLoader(fake_paths(40), IndexDecoder(), batch_size=4, num_producers=1) as loader:
        old = iter(loader)
        next(old)
        new = iter(loader)  # the helper stops the old epoch as it starts this one
        got = [next(new)]
        old.close()  # the old epoch's end runs now, in the middle of the new one (a late garbage collection)
        got += list(new)
        assert sorted(indices(got)) == list(range(40))
        assert loader.stats().done


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
def test_pinned_batches_copy_to_the_gpu():
    with IsolatedLoader(fake_paths(16), IndexDecoder(length=1000), batch_size=4, pin_memory=True) as loader:
        for batch in DevicePrefetcher(loader, "cuda"):
            assert batch["audio"].is_cuda
            for row, index in zip(batch["audio"].cpu(), batch["index"].cpu()):
                assert torch.all(row == index)


def test_leaving_a_prefetcher_loop_stops_the_epoch_at_once():
    # The second batch needs item 32, whose decode takes 60 s: the prefetch thread waits for it. Leaving
    # the loop must end that wait at once, not when the batch arrives, with the loader still open.
    with IsolatedLoader(fake_paths(64), IndexDecoder(slow_from=32, slow=60.0), batch_size=32, num_producers=1,
                        ordered=True) as loader:
        for batch in DevicePrefetcher(loader, "cpu"):
            assert batch["index"].tolist() == list(range(32))
            break
        prefetch = [t for t in threading.enumerate() if t.name == "audiobuffer-prefetch"]
        for thread in prefetch:
            thread.join(JOIN_TIMEOUT)
        assert not any(t.is_alive() for t in prefetch), "the prefetch thread still waits for the slow batch"


# -- batches by duration: planned in the trainer, decoded and collated whole in the helper -------------

def by_duration(tmp_path, durations, **kwargs):
    kwargs.setdefault("decoder", IndexDecoder())
    return IsolatedLoader(duration_manifest(tmp_path, durations), kwargs.pop("decoder"), duration_column="seconds",
                          **kwargs)


def batch_keys(batches):
    return [tuple(int(i) for i in batch["index"]) for batch in batches]


@pytest.mark.parametrize("ordered", [False, True])
def test_batches_by_duration_each_item_once_within_the_budget(tmp_path, ordered):
    durations = np.random.default_rng(2).uniform(0.2, 5.0, 60).round(2)
    options = dict(max_batch_seconds=8.0, buckets=4, shuffle=True, seed=5, ordered=ordered, num_producers=3)
    with by_duration(tmp_path, durations, **options) as loader:
        loader.set_epoch(1)
        got = batch_keys(loader)
        stats = loader.stats()
        assert len(loader) == len(got) == stats.batches
    planned = [tuple(int(i) for i in b) for b in plan_batches(durations, max_batch_seconds=8.0, buckets=4,
                                                                 shuffle=True, seed=5, epoch=1).batches]
    assert (got if ordered else sorted(got)) == (planned if ordered else sorted(planned))
    assert all(len(b) == 1 or len(b) * durations[list(b)].max() <= 8.0 for b in got)
    assert stats.padding == pytest.approx(plan_batches(durations, max_batch_seconds=8.0, buckets=4, shuffle=True,
                                                       seed=5, epoch=1).padding_fraction(durations))
    assert stats.yielded == 60 and stats.done


def test_batches_by_duration_resume_and_share_their_state_with_buffered_dataset(tmp_path):
    durations = np.random.default_rng(4).uniform(0.2, 5.0, 50).round(2)
    options = dict(max_batch_seconds=6.0, buckets=3, shuffle=True, seed=2)
    ds = BufferedDataset(duration_manifest(tmp_path, durations), IndexDecoder(), duration_column="seconds", **options)
    it = iter(ds)
    first = [tuple(s["index"] for s in next(it)) for _ in range(3)]
    state = ds.state_dict()
    it.close()
    with by_duration(tmp_path, durations, **options) as loader:
        loader.load_state_dict(state)
        it = iter(loader)
        second = batch_keys([next(it), next(it)])
        state = json.loads(json.dumps(loader.state_dict()))
        it.close()
    with by_duration(tmp_path, durations, **options) as loader:
        loader.load_state_dict(state)
        rest = batch_keys(loader)
        assert loader.stats().resumed == sum(len(b) for b in first + second)
    together = first + second + rest
    assert sorted(i for b in together for i in b) == list(range(50)) and len(set(together)) == len(together)


def test_batches_by_duration_lose_failed_samples_and_skip_all_failed_batches(tmp_path):
    unit = [1.0] * 12  # unshuffled, one bucket, 3 s: [0 1 2] [3 4 5] [6 7 8] [9 10 11]
    with by_duration(tmp_path, unit, max_batch_seconds=3.0, buckets=1, decoder=IndexDecoder(fail=(1, 6, 7, 8)),
                     on_error="skip") as loader:
        assert sorted(batch_keys(loader)) == [(0, 2), (3, 4, 5), (9, 10, 11)]
        stats = loader.stats()
        assert (stats.failed, stats.empty_batches, stats.batches, stats.yielded) == (4, 1, 3, 8)
        state = loader.state_dict()
        assert unpack_consumed(state["consumed"], state["items"]) == b"\x01" * 4  # the skipped batch too
    with by_duration(tmp_path, unit, max_batch_seconds=3.0, decoder=IndexDecoder(fail=(4,))) as loader:
        with pytest.raises(SampleError, match="item 4"):
            list(loader)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(max_batch_seconds=2.0, batch_size=4), ValueError, "by duration: leave out batch_size=4$"),
    (dict(max_batch_seconds=2.0, drop_last=True), ValueError, "by duration: leave out drop_last=True$"),
    (dict(max_batch_seconds=2.0, batch_size=0), ValueError, "by duration: leave out batch_size=0$"),
    (dict(max_batch_seconds=2.0, num_producer=2), TypeError, "unexpected keyword argument 'num_producer'.*did you "
                                                             "mean 'num_producers'"),
    (dict(), TypeError, "needs batch_size .* or max_batch_seconds"),
])
def test_batches_by_duration_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        IsolatedLoader(fake_paths(4), IndexDecoder(), **kwargs)


# -- samples that cannot go into a batch slot, stalls, a small /dev/shm, a helper that died -----------

@pytest.mark.parametrize("kind", ["none", "str", "rank", "unpicklable"])
def test_a_sample_that_cannot_be_collated_fails_as_its_item(kind):
    # Item 5 cannot go into a batch with item 4, its batch's first sample: it fails alone, under on_error,
    # and its batch fills up from the next samples, as after a failed decode.
    paths = fake_paths(12)
    with IsolatedLoader(paths, Misfit(kind, at=(5,)), batch_size=4, ordered=True, num_producers=1,
                        on_error="skip") as loader:
        batches = list(loader)
        stats = loader.stats()
        loader.set_epoch(1)
        assert len(indices(loader)) == 11  # the same helper runs the next epoch
    assert indices(batches) == [i for i in range(12) if i != 5]
    assert [len(b["index"]) for b in batches] == [4, 4, 3]
    assert (stats.failed, stats.yielded, stats.done) == (1, 11, True)
    assert stats.failures[0][:2] == (5, paths[5]) and "batch" in stats.failures[0][2]


def test_a_sample_that_cannot_be_collated_raises_as_its_item():
    paths = fake_paths(12)
    with IsolatedLoader(paths, Misfit("rank", at=(5,)), batch_size=4, ordered=True, num_producers=1) as loader:
        with pytest.raises(SampleError, match=r"item 5 .*item_00005\.wav.*only in their last axis") as info:
            list(loader)
        assert info.value.index == 5 and info.value.path == paths[5]


def test_an_object_array_fails_as_its_item_and_never_grows_a_slot():
    # An object array cannot live in shared memory: collating it into a slot used to overflow it, and
    # the slot grew on every batch without end.
    with IsolatedLoader(fake_paths(40), Misfit("object", at=None), batch_size=4, on_error="skip",
                        slot_bytes=4096) as loader:
        assert list(loader) == []
        stats = loader.stats()
        sizes = set(mapped_segments(loader.helper_info["pid"]).values())
    assert (stats.failed, stats.yielded) == (40, 0) and "dtype object" in stats.failures[0][2]
    assert sizes == ({4096} if Path("/proc/self/maps").exists() else set())  # the size asked for, each slot


def test_a_stall_names_the_stuck_file_within_the_trainers_wait():
    # The helper reports a stall before it stops its producers: the one stuck in the decode outlives
    # the join, and reporting after it came later than the trainer waits, whose own error names no file.
    with IsolatedLoader(fake_paths(20), IndexDecoder(slow_from=6, slow=60.0), batch_size=2, num_producers=1,
                        ordered=True, timeout=1.0) as loader:
        with pytest.raises(StallError, match=r"stuck in the decoder: .* on '/nonexistent/item_00006\.wav'.*"
                                             r"\(in the helper process\)"):
            list(loader)


def test_a_batch_slot_that_would_not_fit_in_dev_shm_is_a_clear_error():
    # Growing a slot past what /dev/shm has left would end the helper with SIGBUS as the batch is written.
    decoder = TightShm(free=512 << 10, total=64 << 20, length=50_000)
    with IsolatedLoader(fake_paths(8), decoder, batch_size=4, slot_bytes=1024) as loader:
        with pytest.raises(HelperError, match=r"no room in /dev/shm for a batch slot of .* \(0\.5 MiB free of "
                                              r"64\.0 MiB\): .*--shm-size.*num_slots"):
            list(loader)


def test_a_new_helper_starts_after_one_died(tmp_path):
    with IsolatedLoader(fake_paths(12), ExitOnce(5, str(tmp_path / "died")), batch_size=4, ordered=True) as loader:
        with pytest.raises(HelperError, match="exited with code 3"):
            list(loader)
        first = loader.helper_info["pid"]
        loader.set_epoch(1)
        assert sorted(indices(loader)) == list(range(12))
        assert loader.helper_info["pid"] != first


def test_batches_by_duration_lose_samples_that_cannot_be_collated(tmp_path):
    unit = [1.0] * 12  # unshuffled, one bucket, 3 s: [0 1 2] [3 4 5] [6 7 8] [9 10 11]
    with by_duration(tmp_path, unit, max_batch_seconds=3.0, buckets=1, decoder=Misfit("none", at=(1, 3, 4, 5)),
                     on_error="skip") as loader:
        assert sorted(batch_keys(loader)) == [(0, 2), (6, 7, 8), (9, 10, 11)]
        stats = loader.stats()
        assert (stats.failed, stats.empty_batches, stats.batches, stats.yielded) == (4, 1, 3, 8)
        state = loader.state_dict()
        assert unpack_consumed(state["consumed"], state["items"]) == b"\x01" * 4


def region_inodes(pid: int | str) -> set[str]:
    """The inodes of the item-table regions process ``pid`` maps (Linux)."""
    lines = Path(f"/proc/{pid}/maps").read_text(encoding="utf-8").splitlines()
    return {line.split()[4] for line in lines if "audiobuffer-table-" in line}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc (Linux)")
def test_trainer_and_helper_map_one_table_and_nothing_is_left_after_close():
    with IsolatedLoader(fake_paths(5000), IndexDecoder(), batch_size=100, shuffle=True) as loader:
        table = loader.source.table
        assert not table.names.data.flags.writeable  # the trainer reads the region, its own copy given up
        assert sorted(indices(loader)) == list(range(5000))
        helper = loader.helper_info["pid"]
        mapped = region_inodes("self")
        assert len(mapped) == 1 and region_inodes(helper) == mapped  # the same pages, in memory once
        kept = 0 if sys.version_info >= (3, 13) else 1  # the copy of the descriptor a map keeps before 3.13
        assert len(table_descriptors("self")) == 1 + kept  # the loader's, and its map's
    assert len(table_descriptors("self")) == kept
    assert loader.source.paths[4999] == "/nonexistent/item_04999.wav"  # the trainer's map outlives the close
    del loader, table
    gc.collect()
    assert not table_descriptors("self")  # the region goes with its last map: no file, nothing to sweep


OPEN_AT_EXIT = textwrap.dedent("""
    from pathlib import Path
    import audiobuffer as ab
    files = sorted(str(p) for p in Path({folder!r}).glob("*.wav"))
    ds = ab.BufferedDataset(files, ab.AudioDecoder(8000))
    it = iter(ds)  # globals of the script, as a script holds them
    next(it)
    isolated = iter(ab.IsolatedLoader(files, ab.AudioDecoder(8000), batch_size=4))
    next(isolated)
    slots = iter(ab.BatchSlotLoader(files, ab.AudioDecoder(8000, crop_seconds=0.05), batch_size=4))
    next(slots)
    print("left open", flush=True)
""")


def test_a_script_that_ends_mid_epoch_exits_quietly(tmp_path):
    # An epoch left open is closed before the interpreter empties its modules, not finalized after.
    script = tmp_path / "open_at_exit.py"
    for i in range(60):
        write_tone(tmp_path / "audio" / f"{i}.wav", seconds=0.1, sample_rate=8000)
    script.write_text(OPEN_AT_EXIT.format(folder=str(tmp_path / "audio")), encoding="utf-8", newline="\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "left open", done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_no_room_for_the_item_table_is_a_clear_error(monkeypatch):
    import errno

    from audiobuffer.loaders.isolated import tables

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tables.os, "pwrite", full)
    with pytest.raises(HelperError, match=r"cannot write the .* MiB item table to the temp folder '.*' \(.*No space "
                                          r"left on device\): free room there, or point TMPDIR at a folder with room"):
        IsolatedLoader(fake_paths(3000), IndexDecoder(), batch_size=10)

    def refused(*args):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tables.os, "pwrite", refused)
    with pytest.raises(HelperError, match=r"\(.*Permission denied\): point TMPDIR at a folder this process can write"):
        IsolatedLoader(fake_paths(3000), IndexDecoder(), batch_size=10)
    gc.collect()
    assert not table_descriptors("self")
