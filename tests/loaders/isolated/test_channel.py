"""The trainer's end of the helper's channel: how a death is told, waits Ctrl-C can break, slots, a cut start."""

from __future__ import annotations

import _thread
import io
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import JOIN_TIMEOUT, fake_paths, mapped_segments
from plain_decoders import IndexDecoder

from audiobuffer import BufferClosed, HelperError, IsolatedLoader
from audiobuffer.buffer import WAIT_SLICE
from audiobuffer.loaders.isolated import channel as _channel
from audiobuffer.loaders.isolated import shm as _shm
from audiobuffer.loaders.isolated.channel import HelperChannel, death_message
from audiobuffer.loaders.isolated.protocol import Batch, Free

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_helper_left_behind")]


def indices(batches):
    return [int(i) for batch in batches for i in batch["index"]]


class Ended:
    """What death_message reads of a subprocess.Popen: a process that ended with ``code``."""

    pid = 42

    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code

    def wait(self, timeout=None):
        return self.code


def test_a_posix_death_is_told_by_its_exit_code_or_signal(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert death_message(Ended(1)) == ("the helper process (pid 42) exited with code 1: it failed, and its "
                                       "traceback is on stderr, above")
    assert "exited with code 3; a crash in native decoder code" in death_message(Ended(3))
    assert "was killed by SIGTERM" in death_message(Ended(-int(signal.SIGTERM)))
    assert "closed its channel" in death_message(Ended(None))


def test_a_windows_crash_is_told_by_its_status_in_hex_with_its_name(monkeypatch):
    # Windows has no signals: a crash ends the process with an NTSTATUS code, which reads as a name.
    monkeypatch.setattr(sys, "platform", "win32")
    message = death_message(Ended(3221225477))
    assert message.startswith("the helper process (pid 42) ended with status 0xC0000005 (access violation); "
                              "a crash in native decoder code")
    assert "3221225477" not in message and "killed" not in message
    assert "0xC00000FD (stack overflow)" in death_message(Ended(0xC00000FD))
    assert "ended with status 0xC0001234;" in death_message(Ended(0xC0001234))  # a status with no name here
    assert "exited with code 3;" in death_message(Ended(3))


def test_exit_code_1_on_windows_is_a_failure_or_an_end_from_outside_never_a_signal(monkeypatch):
    # TerminateProcess (Popen.kill, the Task Manager, taskkill /F) ends a process with code 1, the same
    # code as the helper's own failure: the message gives both and calls it neither killed nor signalled.
    monkeypatch.setattr(sys, "platform", "win32")
    message = death_message(Ended(1))
    assert message.startswith("the helper process (pid 42) exited with code 1: it failed")
    assert "TerminateProcess" in message
    assert "killed" not in message and "signal" not in message


class Interrupted(Exception):
    """Raised by the test's SIGINT handler, as Ctrl-C raises KeyboardInterrupt."""


@pytest.fixture
def interrupt_main():
    """``interrupt_main(after)``: in ``after`` seconds, run the main thread's SIGINT handler, which raises
    :class:`Interrupted`. Like Ctrl-C on Windows before Python 3.14, it only runs once the main thread's
    wait returns: a simulated signal does not wake a blocked lock acquire."""
    def handler(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGINT, handler)
    timers = []

    def schedule(after):
        timer = threading.Timer(after, _thread.interrupt_main, args=(signal.SIGINT,))
        timer.start()
        timers.append(timer)

    yield schedule
    for timer in timers:
        timer.cancel()
        timer.join(JOIN_TIMEOUT)
    signal.signal(signal.SIGINT, previous)


class Running:
    """What HelperChannel.send reads of a subprocess.Popen: a live process whose stdin is ``stdin``."""

    pid = 42

    def __init__(self, stdin):
        self.stdin = stdin

    def poll(self):
        return None


def test_ctrl_c_breaks_a_send_waiting_for_another_threads_send(interrupt_main):
    # Another thread's send holds the channel's lock (blocked on a full pipe): the trainer's send waits
    # for it in slices, so that the interrupt is raised before the other send ends.
    channel = HelperChannel(4)
    channel.proc = Running(io.BytesIO())
    held, release, released = threading.Event(), threading.Event(), threading.Event()

    def hold():
        with channel._send_lock:
            held.set()
            release.wait(JOIN_TIMEOUT)
        released.set()

    holder = threading.Thread(target=hold, name="test-holder", daemon=True)
    holder.start()
    try:
        assert held.wait(JOIN_TIMEOUT)
        interrupt_main(0.1)
        with pytest.raises(Interrupted):
            channel.send(Free(1, 0))
        assert not released.is_set(), "the interrupt came only after the other send ended"
    finally:
        release.set()
        holder.join(JOIN_TIMEOUT)
    assert not holder.is_alive()


def test_ctrl_c_breaks_a_receive_from_a_stalled_helper(interrupt_main):
    channel = HelperChannel(4)  # no helper: nothing ever comes, as from a helper stuck in a decode
    interrupt_main(0.1)
    with pytest.raises(Interrupted):
        channel.receive(None)


def test_closing_waits_for_the_helper_and_its_reader_in_slices():
    # NOTE [ Interruptible waits ]: every wait of the trainer's thread as it closes the loader is at
    # most WAIT_SLICE long, whatever it waits for in all.
    waits = []
    main = threading.main_thread()

    def recording(name, wait):
        def record(timeout=None):
            if threading.current_thread() is main:
                waits.append((name, timeout))
            return wait(timeout)
        return record

    with IsolatedLoader(fake_paths(8), IndexDecoder(), batch_size=4) as loader:
        assert len(list(loader)) == 2
        proc = loader._channel.proc
        proc.wait = recording("proc.wait", proc.wait)
        for thread in threading.enumerate():
            if thread.name == "audiobuffer-helper-reader":
                thread.join = recording("reader.join", thread.join)
    assert proc.returncode == 0
    assert "proc.wait" in {name for name, _ in waits}  # the reader may have ended before its join
    assert all(timeout is not None and timeout <= WAIT_SLICE for _, timeout in waits), waits


def test_every_slot_is_attached_when_the_helper_is_ready():
    # On Windows a segment lives only as long as a handle to it: the trainer holds one of every slot
    # from the start, so that a batch the helper sent just before it died can still be read.
    with IsolatedLoader(fake_paths(8), IndexDecoder(), batch_size=4, num_slots=3) as loader:
        batches = iter(loader)
        channel = loader._channel
        assert len(channel.info["segments"]) == 3
        assert all(channel._segments[name] is not None for name in channel.info["segments"])
        assert len(list(batches)) == 2


def test_a_slot_gone_with_its_dead_helper_is_a_helper_error():
    # A slot the helper grew, then died before the trainer attached it: on Windows the segment went
    # with the helper's last handle.
    channel = HelperChannel(4)
    channel.proc = Ended(3)
    with pytest.raises(HelperError, match=r"slot 1 .*ab_0_gone.* is gone: the helper process \(pid 42\) "
                                          r"exited with code 3") as info:
        channel.attach(1, "ab_0_gone")
    assert isinstance(info.value.__cause__, FileNotFoundError)


@pytest.mark.skipif(os.name == "nt", reason="select() takes no pipes on Windows")
def test_batches_sent_by_a_helper_that_died_are_read_then_its_death_raised():
    # The helper fills its slots, sends them and dies; its segments go with it (unlinked here, as
    # Windows frees them with the helper's last handle). What it sent is read from the trainer's own
    # mapping of each slot, then the death is raised: never FileNotFoundError.
    with IsolatedLoader(fake_paths(40), IndexDecoder(), batch_size=4, num_slots=3, num_producers=1) as loader:
        batches = iter(loader)
        proc = loader._channel.proc
        ready, _, _ = select.select([proc.stdout], [], [], JOIN_TIMEOUT)  # a batch waits in the pipe
        assert ready
        proc.kill()
        proc.wait(JOIN_TIMEOUT)
        for name in loader._channel.info["segments"]:
            _shm.unlink(name)
        with pytest.raises(HelperError, match="was killed by SIGKILL"):
            for batch in batches:
                assert len(batch["index"]) == 4


class CutWriter:
    """A helper's stdin whose first frame is cut halfway by Ctrl-C: a large setup frame waits on a full
    pipe while the helper imports, and the interrupt ends the write with half of it sent."""

    def __init__(self, stream):
        self.stream = stream
        self.cut = False

    def write(self, data):
        if not self.cut:
            self.cut = True
            self.stream.write(data[:len(data) // 2])
            self.stream.flush()
            raise KeyboardInterrupt
        return self.stream.write(data)

    def flush(self):
        self.stream.flush()

    def close(self):
        self.stream.close()


@pytest.mark.timeout(60)
def test_ctrl_c_that_cut_the_setup_frame_leaves_nothing_and_the_next_loader_runs(monkeypatch):
    # A notebook's "interrupt, run the cell again": the setup goes as the loader is built, so the
    # interrupt ends the constructor; its helper, waiting for the rest of a frame that never comes,
    # leaves quietly, and the next loader runs its epoch in a new helper.
    started = []

    class FirstFrameCut(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not started:
                self.stdin = CutWriter(self.stdin)
            started.append(self)

    monkeypatch.setattr(_channel.subprocess, "Popen", FirstFrameCut)
    with pytest.raises(KeyboardInterrupt):
        IsolatedLoader(fake_paths(12), IndexDecoder(), batch_size=4)
    assert started[0].wait(JOIN_TIMEOUT) == 0  # the first one left quietly, as when its trainer goes
    with IsolatedLoader(fake_paths(12), IndexDecoder(), batch_size=4) as loader:
        assert sorted(indices(loader)) == list(range(12))
        assert len(started) == 2 and loader.helper_info["pid"] == started[1].pid


@pytest.mark.timeout(60)
def test_iter_after_ctrl_c_stopped_the_wait_for_the_helper_runs_in_a_new_helper(monkeypatch):
    receive = HelperChannel.receive
    interrupted = []

    def interrupted_once(self, timeout):
        if not interrupted:
            interrupted.append(self.proc)
            raise KeyboardInterrupt
        return receive(self, timeout)

    monkeypatch.setattr(HelperChannel, "receive", interrupted_once)
    with IsolatedLoader(fake_paths(12), IndexDecoder(), batch_size=4) as loader:
        with pytest.raises(KeyboardInterrupt):
            iter(loader)
        assert sorted(indices(loader)) == list(range(12))
        assert loader.helper_info["pid"] != interrupted[0].pid and interrupted[0].wait(JOIN_TIMEOUT) == 0


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads a process's maps (Linux)")
def test_slots_a_helper_grew_have_no_name_either():
    # The trainer knows a slot's segment from the batch sent in it; one grown for a batch still in the
    # pipe is nameless all the same, so a helper killed then leaves nothing.
    with IsolatedLoader(fake_paths(40), IndexDecoder(length=50_000), batch_size=4, num_slots=2, slot_bytes=1024,
                        num_producers=1) as loader:
        batches = iter(loader)
        next(batches)  # slot 0 grew, and the trainer read of it
        first = set(loader.helper_info["segments"])
        proc = loader._channel.proc
        deadline = time.monotonic() + JOIN_TIMEOUT
        while first & set(mapped_segments(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)  # until slot 1 grew too; another process's doing: nothing to wait on
        grown = set(mapped_segments(proc.pid))
        assert len(grown) == 2 and not grown & first
        assert _shm.leftovers(proc.pid) == []
        proc.kill()
        proc.wait(JOIN_TIMEOUT)
    assert _shm.leftovers(proc.pid) == []


@pytest.mark.parametrize("platform, flags", [("win32", 0x00000200), ("linux", 0)])  # CREATE_NEW_PROCESS_GROUP
def test_the_helper_runs_in_a_process_group_of_its_own_on_windows(monkeypatch, platform, flags):
    # The console sends Ctrl-C to every process attached to it; a new group has Ctrl-C disabled, so the
    # helper prints no KeyboardInterrupt traceback while it starts. POSIX takes no creation flags.
    class NotStarted(Exception):
        pass

    seen = {}

    def popen(args, **kwargs):
        seen.update(kwargs, args=args)
        raise NotStarted

    monkeypatch.setattr(_channel.subprocess, "Popen", popen)
    monkeypatch.setattr(sys, "platform", platform)
    with pytest.raises(NotStarted):
        HelperChannel(4).start(b"")
    assert seen["creationflags"] == flags
    # the helper module, the trainer it watches, and on POSIX the socket its slots cross on
    assert seen["args"][2:4] == ["audiobuffer.loaders.isolated.helper", str(os.getpid())]
    assert len(seen["args"]) == (4 if platform == "win32" else 5)


def test_a_closing_channel_is_buffer_closed_where_a_dead_helper_is_a_helper_error():
    # The same failures as the helper's death (a segment gone, a shut pipe), met once the channel is
    # being closed on purpose (from another thread, maybe): BufferClosed, as the inbox says too.
    channel = HelperChannel(4)
    channel.proc = Running(io.BytesIO())
    channel.proc.stdin.close()
    with pytest.raises(HelperError, match="closed its channel"):
        channel.send(Free(1, 0))
    channel._closing.set()
    with pytest.raises(BufferClosed, match="the IsolatedLoader was closed"):
        channel.send(Free(1, 0))
    with pytest.raises(BufferClosed, match="the IsolatedLoader was closed"):
        channel.attach(1, "ab_0_gone")
    with pytest.raises(BufferClosed, match="the IsolatedLoader was closed"):
        channel.copy_out(Batch(1, 1, "ab_0_gone", {}, [0], 4, 0.0, None), pin_memory=False)


#: A helper from before the protocol was versioned: it answers a tuple, without reading the setup.
PRE_PROTOCOL_HELPER = """
import os, pickle, sys
out = os.fdopen(os.dup(1), "wb")
out.write(pickle.dumps(("ready", {"pid": os.getpid()})))
out.flush()
sys.stdin.buffer.read()  # until the trainer closes
"""


def stale_copy(where, kind):
    """An audiobuffer in ``where`` that the helper imports instead of this one (``python -m`` puts the current
    directory first on its path): this one at the next protocol version, the same without its own check, or
    one from before the protocol (``PRE_PROTOCOL_HELPER``)."""
    import re
    import shutil

    from helpers import REPO

    from audiobuffer.loaders.isolated.protocol import PROTOCOL_VERSION

    package = where / "audiobuffer"
    if kind == "pre-protocol":
        (package / "loaders" / "isolated").mkdir(parents=True)
        for folder in (package, package / "loaders", package / "loaders" / "isolated"):
            (folder / "__init__.py").write_text("", encoding="utf-8")
        (package / "loaders" / "isolated" / "helper.py").write_text(PRE_PROTOCOL_HELPER, encoding="utf-8")
        return
    shutil.copytree(REPO / "audiobuffer", package, ignore=shutil.ignore_patterns("__pycache__"))
    protocol = package / "loaders" / "isolated" / "protocol.py"
    text, n = re.subn(r"(?m)^PROTOCOL_VERSION = \d+$", f"PROTOCOL_VERSION = {PROTOCOL_VERSION + 1}",
                      protocol.read_text(encoding="utf-8"))
    assert n == 1
    protocol.write_text(text, encoding="utf-8")
    if kind == "unchecked":  # answers Ready at its own version: the trainer's check alone refuses it
        helper = package / "loaders" / "isolated" / "helper.py"
        text = helper.read_text(encoding="utf-8")
        assert text.count("if setup.version != PROTOCOL_VERSION:") == 1
        helper.write_text(text.replace("if setup.version != PROTOCOL_VERSION:", "if False:"), encoding="utf-8")


@pytest.mark.skipif(bool(os.environ.get("PYTHONSAFEPATH")), reason="python -m puts no directory first on its path")
@pytest.mark.parametrize("kind, says", [
    ("refusing", r"speaks protocol version 4 and this trainer version 3: the helper imported "
                 r"another audiobuffer than the trainer's \(audiobuffer \S+ in .*\).*\(it says: "
                 r"the helper runs audiobuffer \S+ in .*stale.audiobuffer\)$"),
    ("unchecked", r"speaks protocol version 4 and this trainer version 3: the helper imported "
                  r"another audiobuffer than the trainer's \(audiobuffer \S+ in .*\), one earlier "
                  r"on its path .*other copy$"),
    ("pre-protocol", r"answered tuple \"\('ready'.*, not a protocol version and this trainer "
                     r"version 3: the helper imported another audiobuffer"),
])
def test_a_helper_of_another_audiobuffer_is_a_helper_error_naming_both_versions(monkeypatch, tmp_path, kind, says):
    # A stale audiobuffer where the trainer runs shadows this one in the helper; whatever it speaks, the
    # start says so, never an unpacking error or a death.
    from audiobuffer.loaders.isolated.protocol import PROTOCOL_VERSION

    assert PROTOCOL_VERSION == 3  # the messages below name it
    stale = tmp_path / "stale"
    stale.mkdir()
    stale_copy(stale, kind)
    monkeypatch.chdir(stale)
    loader = IsolatedLoader(fake_paths(4), IndexDecoder(), batch_size=2)  # owns the item table the spec names
    channel = HelperChannel(4)
    with pytest.raises(HelperError, match=says):
        channel.start(loader._spec, descriptors=loader._region.pass_fds)
    assert not channel.running
    assert channel.proc.wait(JOIN_TIMEOUT) == 0  # it left as told, not killed
    loader.close()
