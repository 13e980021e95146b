"""Mid-epoch resume: BufferedDataset.state_dict() / load_state_dict()."""

import base64
import json
import pickle

import pytest
from helpers import IndexDecoder, fake_paths, wait_no_threads
from torch.utils.data import DataLoader

from audiobuffer import BufferedDataset, ResumeError, pad_collate
from audiobuffer.engine.plan import epoch_order


def dataset(n=60, **kwargs):
    kwargs.setdefault("decoder", IndexDecoder(delays={i: 0.002 for i in range(0, 60, 7)}))
    return BufferedDataset(fake_paths(n), kwargs.pop("decoder"), shuffle=True, seed=3, num_producers=4,
                           buffer_size=8, **kwargs)


def take(iterator, k):
    return [next(iterator)["index"] for _ in range(k)]


def saved_after(ds, k):
    """The state of ``ds`` after ``k`` samples of an epoch, the epoch then left early."""
    it = iter(ds)
    take(it, k)
    state = ds.state_dict()
    it.close()
    return state


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("k", [0, 1, 17, 59, 60])
def test_resumed_epoch_yields_exactly_the_rest(ordered, k):
    ds = dataset(ordered=ordered)
    ds.set_epoch(2)
    it = iter(ds)
    first = take(it, k)
    state = pickle.loads(pickle.dumps(ds.state_dict()))  # plain builtins
    it.close()  # items still in the buffer or in producers are dropped here
    again = dataset(ordered=ordered)
    again.load_state_dict(state)
    rest = [s["index"] for s in again]
    assert sorted(first + rest) == list(range(60)) and not set(first) & set(rest)
    if ordered:
        assert first + rest == epoch_order(60, shuffle=True, seed=3, epoch=2).tolist()
    stats = again.stats()
    assert (stats.epoch, stats.resumed, stats.items, stats.yielded) == (2, k, 60 - k, 60 - k)
    assert not wait_no_threads()


def test_resume_through_a_dataloader_between_batches():
    ds = dataset()
    seen = []
    for i, batch in enumerate(DataLoader(ds, batch_size=4, collate_fn=pad_collate)):
        seen.extend(batch["index"].tolist())
        if i == 4:
            state = ds.state_dict()
            break
    again = dataset()
    again.load_state_dict(state)
    for batch in DataLoader(again, batch_size=4, collate_fn=pad_collate):
        seen.extend(batch["index"].tolist())
    assert sorted(seen) == list(range(60))


def test_failed_items_count_as_consumed():
    ds = dataset(decoder=IndexDecoder(fail={1, 2, 3, 4, 5, 6}), on_error="skip", ordered=True)
    it = iter(ds)
    first = take(it, 30)
    state = ds.state_dict()
    it.close()
    again = dataset(decoder=IndexDecoder(fail={1, 2, 3, 4, 5, 6}), on_error="skip", ordered=True)
    again.load_state_dict(state)
    rest = [s["index"] for s in again]
    order = [i for i in epoch_order(60, shuffle=True, seed=3, epoch=0).tolist() if i not in range(1, 7)]
    assert first + rest == order


def test_state_before_any_epoch_and_after_a_finished_one():
    ds = dataset()
    fresh = ds.state_dict()
    assert fresh[BufferedDataset.STATE_EPOCH] == 0 and fresh[BufferedDataset.STATE_ITEMS] is None
    again = dataset()
    again.load_state_dict(fresh)
    assert len(list(again)) == 60
    done = again.state_dict()
    last = dataset()
    last.load_state_dict(done)
    assert list(last) == []  # the epoch was complete
    last.set_epoch(1)  # moving on drops the loaded progress
    assert len(list(last)) == 60


def test_resume_per_rank():
    seen = []
    for rank in range(2):
        ds = dataset(rank=rank, world_size=2)
        it = iter(ds)
        first = take(it, 10)
        state = ds.state_dict()
        it.close()
        again = dataset(rank=rank, world_size=2)
        again.load_state_dict(state)
        seen += first + [s["index"] for s in again]
    assert sorted(seen) == list(range(60))


@pytest.mark.parametrize("change, message", [
    ({"seed": 4}, "saved with seed=3, this dataset has seed=4"),
    ({"shuffle": False}, "shuffle"),
    ({"rank": 1, "world_size": 2}, "rank=0"),
    ({"even_shards": "drop", "rank": 0, "world_size": 1}, "even_shards"),
])
def test_another_setup_is_refused(change, message):
    state = saved_after(dataset(), 5)
    kwargs = {"seed": 3, "shuffle": True}
    kwargs.update(change)
    other = BufferedDataset(fake_paths(60), IndexDecoder(), num_producers=2, **kwargs)
    with pytest.raises(ResumeError, match=message):
        other.load_state_dict(state)


def test_another_source_is_refused():
    state = dataset().state_dict()
    with pytest.raises(ResumeError, match="source_fingerprint"):
        dataset(n=61).load_state_dict(state)


@pytest.mark.parametrize("mangle, message", [
    (lambda s: "not a dict", "is a dict"),
    (lambda s: {k: v for k, v in s.items() if k != "consumed"}, "lacks"),
    (lambda s: {**s, "version": 99}, "format"),
    (lambda s: {**s, "consumed": b"\x00"}, "consumed must hold"),
])
def test_malformed_state_is_refused(mangle, message):
    state = saved_after(dataset(), 3)
    with pytest.raises(ResumeError, match=message):
        dataset().load_state_dict(mangle(state))


# -- a state for a JSON sidecar --------------------------------------------------------------------

@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("k", [0, 17, 60])
def test_state_goes_through_json(ordered, k):
    ds = dataset(ordered=ordered)
    ds.set_epoch(1)
    it = iter(ds)
    first = take(it, k)
    state = json.loads(json.dumps(ds.state_dict()))  # no bytes: plain JSON types only
    it.close()
    assert isinstance(state[BufferedDataset.STATE_CONSUMED], str)
    again = dataset(ordered=ordered)
    again.load_state_dict(state)
    rest = [s["index"] for s in again]
    assert sorted(first + rest) == list(range(60)) and not set(first) & set(rest)
    if ordered:
        assert first + rest == epoch_order(60, shuffle=True, seed=3, epoch=1).tolist()


def test_state_before_any_epoch_goes_through_json():
    state = json.loads(json.dumps(dataset().state_dict()))
    again = dataset()
    again.load_state_dict(state)
    assert len(list(again)) == 60


def test_format_1_state_with_bytes_still_loads():
    # As saved by earlier versions: version 1, the consumed bitmap as bytes.
    ds = BufferedDataset(fake_paths(10), IndexDecoder(), num_producers=2)
    old = {"version": 1, "epoch": 4, "seed": 0, "shuffle": False, "rank": 0, "world_size": 1, "even_shards": "pad",
           "source_fingerprint": ds.source.fingerprint(), "items": 10, "consumed": b"\xe1\x00"}  # 0, 1, 2 and 7
    ds.load_state_dict(old)
    assert ds.epoch == 4
    assert sorted(s["index"] for s in ds) == [3, 4, 5, 6, 8, 9]
    # Converted by a JSON round trip of the new form, the same state loads too.
    fresh = BufferedDataset(fake_paths(10), IndexDecoder(), num_producers=2)
    fresh.load_state_dict({**old, "version": 2, "consumed": base64.b64encode(b"\xe1\x00").decode()})
    assert sorted(s["index"] for s in fresh) == [3, 4, 5, 6, 8, 9]


@pytest.mark.parametrize("mangle, message", [
    (lambda s: {**s, "consumed": "not base64!"}, "consumed must be a base64 string"),
    (lambda s: {**s, "consumed": 7}, "consumed must be a base64 string"),
    (lambda s: {**s, "consumed": "AAAA"}, "consumed must hold 8 bytes for 60 items, got 3"),
    (lambda s: {**s, "items": "60"}, "the state's items must be an integer >= 0, got '60'"),
])
def test_malformed_json_state_is_refused(mangle, message):
    state = saved_after(dataset(), 3)
    with pytest.raises(ResumeError, match=message):
        dataset().load_state_dict(mangle(state))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_million_items_each_once_and_resumed_exactly_from_a_few_bits_each():
    import numpy as np

    n = 1_000_000
    paths = fake_paths(n)

    def million() -> BufferedDataset:
        return BufferedDataset(paths, IndexDecoder(), shuffle=True, seed=3, num_producers=2, buffer_size=256)

    ds = million()
    ds.set_epoch(1)
    it = iter(ds)
    first = take(it, 400_000)
    state = ds.state_dict()
    it.close()
    assert len(json.dumps({k: base64.b64encode(v).decode() if isinstance(v, bytes) else v
                           for k, v in state.items()}, default=str)) * 8 < 2 * n  # under 2 bits an item
    again = million()
    again.load_state_dict(state)
    rest = [s["index"] for s in again]
    seen = np.bincount(np.array(first + rest), minlength=n)
    assert len(first) + len(rest) == n and (seen == 1).all()
    del ds, again
    assert not wait_no_threads()
