"""Mixtures of sources (audiobuffer/sources/mixture.py): each source's share of the draws, exactly once per epoch's
draws, exact resume, per-source counts, batches by duration, the isolated loader and the YAML form."""

import numpy as np
import pytest
import yaml
from helpers import IndexDecoder, duration_manifest, wait_no_threads
from plain_decoders import IndexDecoder as PlainIndexDecoder

from audiobuffer import BufferedDataset, IsolatedLoader, Source, mix
from audiobuffer.config import build_dataset, load_config
from audiobuffer.prepare.durations import CACHE_ENV
from audiobuffer.sources.mixture import Mixture


@pytest.fixture(autouse=True)
def duration_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


def corpora(folder, sizes, seed=0):
    """One duration manifest per size, in its own folder; their durations."""
    rng = np.random.default_rng(seed)
    out = []
    for k, n in enumerate(sizes):
        (folder / f"c{k}").mkdir()
        durations = rng.uniform(0.5, 6.0, n).round(2)
        out.append((Source(duration_manifest(folder / f"c{k}", durations)), durations))
    return out


def sources_of(mixture, indices):
    return np.bincount(mixture.source_of(np.asarray(indices)), minlength=len(mixture.sources))


def test_each_sources_share_over_twenty_epochs_is_its_weight(tmp_path):
    (a, _), (b, _), (c, _) = corpora(tmp_path, [300, 40, 1000])
    weights = [0.5, 0.3, 0.2]
    mixture = mix(a, b, c, weights=weights, size=337)
    drawn = np.zeros(3)
    for epoch in range(20):
        table = mixture.draw(seed=7, epoch=epoch)
        assert len(table) == len(mixture) == 337
        counts = sources_of(mixture, table)
        assert np.all(np.abs(counts - 337 * np.array(weights)) < 1)  # each epoch: the quota, rounded
        drawn += counts
        # Within an epoch a source's items come once each while it has enough, in whole passes when not.
        small = table[mixture.source_of(table) == 1]
        assert np.bincount(small - 300, minlength=40).max() - np.bincount(small - 300, minlength=40).min() <= 1
        big = table[mixture.source_of(table) == 2]
        assert len(set(big.tolist())) == len(big)
    assert np.all(np.abs(drawn / drawn.sum() - weights) <= 0.02)
    assert np.array_equal(mixture.draw(seed=7, epoch=3), mix(a, b, c, weights=weights, size=337).draw(seed=7, epoch=3))
    assert not np.array_equal(mixture.draw(seed=7, epoch=3), mixture.draw(seed=8, epoch=3))


def test_a_dataset_of_a_mixture_yields_each_draw_once_and_counts_each_source(tmp_path):
    (a, _), (b, _) = corpora(tmp_path, [50, 30])
    mixture = mix(a, b, weights=[1, 3], size=60)
    ds = BufferedDataset(mixture, IndexDecoder(), shuffle=True, seed=2, num_producers=3)
    ds.set_epoch(4)
    got = sorted(int(s["index"]) for s in ds)
    assert got == sorted(mixture.draw(seed=2, epoch=4).tolist())
    stats = ds.stats()
    assert stats.sources == mixture.counts(2, 4) and sum(stats.sources.values()) == stats.yielded == 60
    assert list(stats.sources.values()) == [15, 45]
    assert not wait_no_threads()


def test_ranks_split_a_mixtures_draws(tmp_path):
    (a, _), (b, _) = corpora(tmp_path, [40, 25])
    mixture = mix(a, b, weights=[0.5, 0.5], size=51)
    per_rank = []
    for rank in range(3):
        ds = BufferedDataset(mixture, IndexDecoder(), shuffle=True, seed=1, rank=rank, world_size=3, even_shards=None)
        per_rank.append([int(s["index"]) for s in ds])
        assert sum(ds.stats().sources.values()) == len(per_rank[-1]) == 17
    assert sorted(i for r in per_rank for i in r) == sorted(mixture.draw(seed=1, epoch=0).tolist())


@pytest.mark.parametrize("by_duration", [False, True])
def test_a_resumed_mixture_epoch_yields_exactly_the_rest(tmp_path, by_duration):
    (a, _), (b, _) = corpora(tmp_path, [40, 70])
    options = dict(shuffle=True, seed=3, ordered=True, num_producers=2)
    if by_duration:
        options.update(max_batch_seconds=12.0, buckets=3, duration_column="seconds")

    def flat(element):
        return [int(s["index"]) for s in element] if by_duration else [int(element["index"])]

    def dataset():
        ds = BufferedDataset(mix(a, b, weights=[0.25, 0.75], size=80), IndexDecoder(), **options)
        ds.set_epoch(2)
        return ds

    full = [i for element in dataset() for i in flat(element)]
    ds = dataset()
    seen = []
    it = iter(ds)
    for _ in range(5):
        seen.extend(flat(next(it)))
    state = ds.state_dict()
    it.close()
    resumed = dataset()
    resumed.load_state_dict(state)
    rest = [i for element in resumed for i in flat(element)]
    assert seen + rest == full  # ordered: the epoch's order, the rest where it stopped
    other = BufferedDataset(mix(a, b, weights=[0.5, 0.5], size=80), IndexDecoder(), **options)
    with pytest.raises(Exception, match="source_fingerprint"):
        other.load_state_dict(state)


def test_batches_by_duration_over_a_mixture_use_the_drawn_items_durations(tmp_path):
    (a, da), (b, db) = corpora(tmp_path, [60, 20])
    durations = np.concatenate((da, db))
    mixture = mix(a, b, weights=[0.5, 0.5], size=100)
    ds = BufferedDataset(mixture, IndexDecoder(), max_batch_seconds=10.0, buckets=3, duration_column="seconds",
                         shuffle=True, seed=5)
    ds.set_epoch(1)
    batches = [[int(s["index"]) for s in batch] for batch in ds]
    assert sorted(i for batch in batches for i in batch) == sorted(mixture.draw(seed=5, epoch=1).tolist())
    assert all(len(b) == 1 or len(b) * durations[b].max() <= 10.0 for b in batches)
    assert len(batches) == len(ds) and ds.stats().padding < 0.5
    assert sum(ds.stats().sources.values()) == 100


@pytest.mark.subprocess
def test_the_isolated_loader_draws_the_same_epoch(tmp_path):
    (a, _), (b, _) = corpora(tmp_path, [30, 30])
    mixture = mix(a, b, weights=[0.2, 0.8], size=40)
    with IsolatedLoader(mixture, PlainIndexDecoder(), batch_size=8, shuffle=True, seed=9) as loader:
        loader.set_epoch(2)
        got = sorted(i for batch in loader for i in batch["index"].tolist())
        assert loader.stats().sources == mixture.counts(9, 2)
    assert got == sorted(mixture.draw(seed=9, epoch=2).tolist())


def test_a_mixtures_labels_are_the_union_of_its_sources_classes(tmp_path):
    for name, classes in (("x", ["cat", "dog"]), ("y", ["dog", "emu"])):
        (tmp_path / name).mkdir()
        rows = "".join(f"/nonexistent/{name}{i}.wav,{c}\n" for i, c in enumerate(classes * 3))
        (tmp_path / name / "m.csv").write_text("path,label\n" + rows, encoding="utf-8")
    mixture = mix(Source(tmp_path / "x" / "m.csv", labels="label"), Source(tmp_path / "y" / "m.csv", labels="label"))
    assert mixture.classes == ["cat", "dog", "emu"] and len(mixture) == 12
    items = [mixture.item(i, epoch=0, seed=0) for i in range(12)]
    assert all(mixture.classes[item.label] == item.label_name for item in items)


@pytest.mark.parametrize("args, kwargs, error, match", [
    (1, {}, TypeError, "two or more sources"),
    (2, {"weights": [1.0]}, ValueError, "one number per source: 2 sources, 1 weights"),
    (2, {"weights": [1.0, -1.0]}, ValueError, "weights must be finite numbers > 0, got -1.0"),
    (2, {"weights": "ab"}, TypeError, "weights must be a sequence of numbers"),
    (2, {"size": 0}, ValueError, "size must be an integer >= 1"),
    (2, {"size": 10**12}, ValueError, r"size=1000000000000 .*7.3 TiB.* at most 4294967296"),
])
def test_mix_refuses_what_it_cannot_draw(tmp_path, args, kwargs, error, match):
    sources = [source for source, _ in corpora(tmp_path, [5] * args)]
    with pytest.raises(error, match=match):
        mix(*sources, **kwargs)


def test_mix_takes_weights_whose_sum_overflows(tmp_path):
    (a, _), (b, _) = corpora(tmp_path, [5, 5])
    mixture = mix(a, b, weights=[1e308, 1e308], size=10)
    assert mixture.weights.tolist() == [0.5, 0.5]
    assert mixture.counts(seed=0, epoch=0) == dict(zip(mixture.names, [5, 5]))


def test_yaml_source_mix(tmp_path):
    (a, _), (b, _) = corpora(tmp_path, [20, 10])
    config = {"source": {"mix": [{"manifest": "c0/manifest.csv"}, {"manifest": "c1/manifest.csv"}],
                         "weights": [1, 1], "size": 30}, "decode": {"sample_rate": 8000}}
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    ds = build_dataset(load_config(path))
    assert isinstance(ds.source, Mixture) and len(ds) == 30
    assert ds.source.counts(0, 0) == dict(zip(ds.source.names, [15, 15]))


def test_a_mixture_of_folder_trees_numbers_its_classes_as_each_tree_does(tmp_path):
    """Folder labels in ImageFolder's order ('10' before '2') in a mixture too; class numbers from a
    column keep their numeric order."""
    for tree, folders in (("x", ["2", "10"]), ("y", ["10", "3"])):
        for folder in folders:
            (tmp_path / tree / folder).mkdir(parents=True)
            (tmp_path / tree / folder / "a.wav").write_bytes(b"")
    trees = [Source(tmp_path / tree, labels="parent") for tree in ("x", "y")]
    assert trees[0].classes == ["10", "2"]
    mixture = mix(*trees)
    assert mixture.classes == ["10", "2", "3"]
    items = [mixture.item(i, epoch=0, seed=0) for i in range(len(mixture))]
    assert all(mixture.classes[item.label] == item.label_name for item in items)
    rows = "".join(f"/nonexistent/{i}.wav,{c}\n" for i, c in enumerate(["2", "10", "3"]))
    (tmp_path / "m.csv").write_text("path,label\n" + rows, encoding="utf-8")
    assert mix(trees[0], Source(tmp_path / "m.csv", labels="label")).classes == ["2", "3", "10"]
