"""The isolated loader's helper process: its start, its descriptors, and its end when the trainer goes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import psutil
import pytest
from helpers import JOIN_TIMEOUT, REPO, fake_paths, segment_exists, wait_gone
from plain_decoders import ChildWrites

from audiobuffer import IsolatedLoader
from audiobuffer.loaders.isolated import shm as _shm

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_helper_left_behind")]


def indices(batches):
    return [int(i) for batch in batches for i in batch["index"]]


# Runs the helper as ``python -m audiobuffer.loaders.isolated.helper`` does, with an import hook that reports SIGINT's
# handler as numpy starts to import: the slow part of the helper's start, during which Ctrl-C in a
# terminal (sent to the whole process group) printed a KeyboardInterrupt traceback from the helper.
SPY = textwrap.dedent("""
    import runpy, signal, sys

    class Spy:
        def find_spec(self, name, path=None, target=None):
            if name == "numpy":
                sys.meta_path.remove(self)
                ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
                print("SIGINT ignored:", ignored, file=sys.stderr, flush=True)
            return None

    sys.meta_path.insert(0, Spy())
    runpy.run_module("audiobuffer.loaders.isolated.helper", run_name="__main__", alter_sys=True)
""")


def test_the_helper_ignores_sigint_before_its_slow_imports():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", SPY], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr  # stdin at its end: the helper leaves at once
    assert "SIGINT ignored: True" in out.stderr, out.stderr


def test_a_decoders_child_process_writing_to_stdout_leaves_the_channel_alone():
    # The channel is not the helper's descriptor 1 (now its stderr), nor its stdin descriptor 0, which a
    # child process inherits: what the child writes goes to stderr, and it cannot read the trainer's frames.
    with IsolatedLoader(fake_paths(12), ChildWrites(index=5), batch_size=4, ordered=True) as loader:
        batches = list(loader)
    assert indices(batches) == list(range(12))
    assert all(int(batch["stdin_pipe"].sum()) == 0 for batch in batches)
    assert all(bool(batch["stdout_is_stderr"].all()) for batch in batches)


FORKING_TRAINER = textwrap.dedent("""
    import multiprocessing, sys, time
    sys.path.insert(0, {tests!r})
    from audiobuffer import IsolatedLoader
    from plain_decoders import IndexDecoder

    if __name__ == "__main__":
        loader = IsolatedLoader([f"/x/{{i}}.wav" for i in range(10_000)], IndexDecoder(delay=0.01), batch_size=4)
        it = iter(loader)
        next(it)
        # A child forked now (a persistent DataLoader worker, a multiprocessing pool) holds a copy of
        # every descriptor of the trainer, its end of the helper's pipe among them.
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,), daemon=True)
        child.start()
        print(loader.helper_info["pid"], child.pid, *loader.helper_info["segments"], flush=True)
        time.sleep(60)
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork: a child never holds the trainer's pipe")
def test_a_killed_trainer_takes_its_helper_along_while_a_forked_child_lives(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(FORKING_TRAINER.format(tests=str(REPO / "tests")), encoding="utf-8", newline="\n")
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        helper, child, *names = trainer.stdout.readline().split()
        trainer.kill()
        trainer.wait(JOIN_TIMEOUT)
        assert psutil.pid_exists(int(child))
        assert wait_gone(int(helper), 5.0), "the helper outlived its trainer by more than 5 s"
        assert not any(segment_exists(name) for name in names) and _shm.leftovers(int(helper)) == []
    finally:
        trainer.kill()
        trainer.wait(JOIN_TIMEOUT)
        trainer.stdout.close()
        if child is not None:  # no longer our descendant: the trainer is gone
            try:
                psutil.Process(int(child)).kill()
            except psutil.NoSuchProcess:
                pass
            assert wait_gone(int(child), JOIN_TIMEOUT)


class Left(Exception):
    """Raised by the test's ``leave``, which, like the helper's, never returns."""


@pytest.mark.parametrize("parents, trainer_alive, looks", [
    ([100, 100, 100, 1], True, 4),  # the trainer is the parent until it dies
    ([7, 7, 7, 1], True, 4),  # a launcher runs between the trainer and the helper: its end is the trainer's
    ([1], False, 1),  # the trainer died before the watch began
])
def test_the_helper_leaves_once_its_trainer_is_gone(monkeypatch, parents, trainer_alive, looks):
    from audiobuffer.loaders.isolated import helper as _helper

    seen = iter(parents)
    calls = []

    def getppid():
        calls.append(1)
        return next(seen)

    def kill(pid, signum):
        assert (pid, signum) == (100, 0)
        if not trainer_alive:
            raise ProcessLookupError(pid)

    def leave(code):
        raise Left(code)

    monkeypatch.setattr(os, "getppid", getppid)
    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(_helper, "TRAINER_CHECK", 0.0)
    with pytest.raises(Left):
        _helper._watch_trainer(100, leave)
    assert len(calls) == looks
