"""The helper process warms its decoder and transform up before the first epoch, changing nothing
of it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers import JOIN_TIMEOUT, fake_paths
from plain_decoders import Logged, LoggedTransform

from audiobuffer import BufferedDataset, IsolatedLoader, SampleError

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_helper_left_behind")]

#: Seconds a helper may take to start and warm up on a loaded machine.
START = 60.0


def calls(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def wait_for_calls(log: Path, wanted: list[str], timeout: float = START) -> list[str]:
    """The log's lines once ``wanted`` are all in it, or at ``timeout`` (the helper writes it)."""
    deadline = time.monotonic() + timeout
    while not set(wanted) <= set(calls(log)) and time.monotonic() < deadline:
        time.sleep(0.02)  # another process writes the file: nothing to wait on but its content
    return calls(log)


def test_the_helper_decodes_and_transforms_the_first_item_before_the_first_iter(tmp_path):
    log = tmp_path / "calls.log"
    with IsolatedLoader(fake_paths(10), Logged(str(log), length=2),
                        transform=LoggedTransform(str(log)), batch_size=3, shuffle=True, seed=7,
                        ordered=True, num_producers=2) as loader:
        assert wait_for_calls(log, ["decode 0", "transform 0"]) == ["decode 0", "transform 0"]
        batches = list(loader)
        stats = loader.stats()
    order = [int(i) for batch in batches for i in batch["index"]]
    other = Logged(str(tmp_path / "other.log"), length=2)
    with BufferedDataset(fake_paths(10), other, shuffle=True, seed=7, ordered=True,
                         num_producers=2) as dataset:
        assert order == [s["index"] for s in dataset]  # the same order as without the warm-up
    assert stats is not None and (stats.yielded, stats.failed) == (10, 0)
    epoch = calls(log)[2:]  # after the warm-up: each item once
    each = [f"decode {i}" for i in range(10)] + [f"transform {i}" for i in range(10)]
    assert sorted(epoch) == sorted(each)


def test_a_failure_in_the_warm_up_is_reported_by_the_epoch_only(tmp_path):
    log = tmp_path / "calls.log"
    with IsolatedLoader(fake_paths(6), Logged(str(log), length=2, fail=(0,)), batch_size=2,
                        on_error="skip", num_producers=1) as loader:
        assert wait_for_calls(log, ["decode 0"]) == ["decode 0"]
        indices = sorted(int(i) for batch in loader for i in batch["index"])
        stats = loader.stats()
    assert indices == [1, 2, 3, 4, 5]
    assert stats is not None and stats.failed == 1 and [f[0] for f in stats.failures] == [0]


def test_a_failure_in_the_warm_up_raises_in_the_epoch_not_before(tmp_path):
    log = tmp_path / "calls.log"
    with IsolatedLoader(fake_paths(6), Logged(str(log), length=2, fail=(0,)), batch_size=2,
                        num_producers=1, ordered=True) as loader:
        assert wait_for_calls(log, ["decode 0"]) == ["decode 0"]
        epoch = iter(loader)  # the helper is ready: the warm-up's failure is not raised here
        with pytest.raises(SampleError, match="item 0"):
            next(epoch)


def test_a_loader_closed_before_its_first_iter_stops_its_helper_quietly(tmp_path, capfd):
    log = tmp_path / "calls.log"
    loader = IsolatedLoader(fake_paths(4), Logged(str(log), length=2), batch_size=2)
    wait_for_calls(log, ["decode 0"])
    proc = loader._channel.proc
    loader.close()
    assert proc is not None and proc.wait(JOIN_TIMEOUT) == 0
    assert "Traceback" not in capfd.readouterr().err
