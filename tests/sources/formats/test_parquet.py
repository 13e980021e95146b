"""Hugging Face audio datasets in Parquet as a source, streamed by row group: files written by the ``datasets``
library itself, every row once, the audio of the bytes, fields and ClassLabel names, ranks, resume at
row-group boundaries, object storage; audiobuffer/sources/formats/parquet.py and ParquetStream in stream.py."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from helpers import wait_no_threads

from audiobuffer import AudioDecoder, BufferedDataset, DecodeError, SourceError
from audiobuffer.sources.stream import ParquetStream

N = 60  # rows: 2 files of 30, row groups of 8
CLASSES = ["down", "go", "up"]


def _flac(i: int) -> bytes:
    out = io.BytesIO()
    rng = np.random.default_rng(i)
    sf.write(out, (0.2 * rng.standard_normal(800 + 7 * i)).astype(np.float32), 8000, format="FLAC", subtype="PCM_16")
    return out.getvalue()


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """Two Parquet files written by datasets (an Audio column of bytes and path, a ClassLabel, a text column)."""
    datasets = pytest.importorskip("datasets", reason="the datasets library writes these files (pip install datasets)")
    root = tmp_path_factory.mktemp("hf")
    for part in range(2):
        rows = range(part * N // 2, (part + 1) * N // 2)
        table = datasets.Dataset.from_dict({
            "audio": [{"bytes": _flac(i), "path": f"clips/{CLASSES[i % 3]}_{i:03d}.flac"} for i in rows],
            "label": [i % 3 for i in rows],
            "sentence": [f"say {CLASSES[i % 3]} {i}" for i in rows],
        })
        # decode=False: the bytes as they are (encoding with datasets.Audio() needs torchcodec)
        table = table.cast_column("audio", datasets.Audio(decode=False))
        table = table.cast_column("label", datasets.ClassLabel(names=CLASSES))
        table.to_parquet(str(root / f"train-{part:05d}-of-00002.parquet"), batch_size=8)
    return root


def _index(sample) -> int:
    return int(sample["path"].rpartition("_")[2].split(".")[0])


def _drain(ds) -> list[dict]:
    samples = list(ds)
    ds.close()
    assert wait_no_threads() == []
    return samples


def test_every_row_once_with_the_audio_of_its_bytes_and_its_fields(hf):
    ds = BufferedDataset(str(hf / "train-*.parquet"), AudioDecoder(), labels="label", shuffle=True, seed=0,
                         num_producers=2)
    assert isinstance(ds.pipeline.source, ParquetStream) and len(ds) == N and ds.classes == sorted(CLASSES)
    for epoch in range(2):
        ds.set_epoch(epoch)
        samples = list(ds)
        assert sorted(_index(s) for s in samples) == list(range(N))
    ds.close()
    for s in samples:
        i = _index(s)
        expected, rate = sf.read(io.BytesIO(_flac(i)), dtype="float32")
        assert rate == 8000 and np.allclose(s["audio"].numpy(), expected, atol=1e-6)
        assert s["label_name"] == CLASSES[i % 3] and s["sentence"] == f"say {CLASSES[i % 3]} {i}"
        assert s["path"].endswith(f"/{i % (N // 2)}/{CLASSES[i % 3]}_{i:03d}.flac")


def test_ranks_split_the_row_groups(hf):
    seen = []
    for rank in range(2):
        ds = BufferedDataset(str(hf / "train-{00000..00001}-of-00002.parquet"), AudioDecoder(), rank=rank,
                             world_size=2, even_shards=None, num_producers=2, shuffle=True)
        seen.append({_index(s) for s in _drain(ds)})
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(range(N))


def test_labels_from_the_original_names_and_resume_at_row_groups(hf):
    spec = sorted(str(p) for p in hf.glob("*.parquet"))
    ds = BufferedDataset(spec, AudioDecoder(), labels=r"^([a-z]+)_", shuffle=True, seed=4, num_producers=1,
                         buffer_size=1)
    assert ds.classes == sorted(CLASSES)
    it = iter(ds)
    first = [next(it) for _ in range(20)]
    state = ds.state_dict()
    it.close()
    ds.close()
    resumed = BufferedDataset(spec, AudioDecoder(), labels=r"^([a-z]+)_", shuffle=True, seed=4, num_producers=2)
    resumed.load_state_dict(state)
    rest = _drain(resumed)
    assert {_index(s) for s in first} | {_index(s) for s in rest} == set(range(N))
    assert len(rest) < N  # whole row groups handed on before the state are not read again
    assert all(s["label_name"] == CLASSES[_index(s) % 3] for s in first + rest)


def test_a_file_without_audio_and_a_file_that_is_not_parquet(tmp_path, hf):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": ["a.wav"], "speaker": ["s1"]}), tmp_path / "manifest.parquet")
    with pytest.raises(SourceError, match=r"no audio or image column.*\['path', 'speaker'\]"):
        ParquetStream(tmp_path / "manifest.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(SourceError, match="not a Parquet file"):
        ParquetStream(str(tmp_path / "bad.parquet"))
    with pytest.raises(SourceError, match="no audio or image column 'sound'"):
        ParquetStream(str(next(hf.glob("*.parquet"))), audio_column="sound")


def test_a_row_without_bytes_fails_under_on_error(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    audio = pa.array([{"bytes": _flac(0), "path": "a.flac"}, {"bytes": None, "path": "/elsewhere/b.flac"}],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    pq.write_table(pa.table({"audio": audio}), tmp_path / "x.parquet")
    ds = BufferedDataset(str(tmp_path / "x.parquet"), AudioDecoder(), on_error="skip", num_producers=1)
    samples = _drain(ds)
    assert len(samples) == 1 and ds.stats().failed == 1
    message = "row 1 of Parquet file .* names '/elsewhere/b.flac', which cannot be read"
    with pytest.raises(DecodeError, match=message):
        _drain(BufferedDataset(str(tmp_path / "x.parquet"), AudioDecoder(), num_producers=1))


def _hf_audio(datasets, rows: list) -> object:
    """A datasets table of an Audio column as given (bytes and path), not decoded."""
    table = datasets.Dataset.from_dict({"audio": rows})
    return table.cast_column("audio", datasets.Audio(decode=False))


@pytest.mark.parametrize("on_error", ["skip", "warn"])
def test_a_row_that_cannot_be_read_fails_alone(tmp_path, on_error):
    datasets = pytest.importorskip("datasets")
    rows = [{"bytes": _flac(i), "path": f"clips/{CLASSES[i % 3]}_{i:03d}.flac"} for i in range(12)]
    gone = tmp_path / "gone" / "go_003.flac"
    gone.parent.mkdir()
    gone.write_bytes(_flac(3))
    rows[3] = {"bytes": None, "path": str(gone)}  # path-only; the file goes once it is written
    _hf_audio(datasets, rows).to_parquet(str(tmp_path / "x.parquet"))  # one row group of 12
    gone.unlink()
    ds = BufferedDataset(str(tmp_path / "x.parquet"), AudioDecoder(), on_error=on_error,
                         num_producers=1)
    samples = _drain(ds)
    assert sorted(_index(s) for s in samples) == [i for i in range(12) if i != 3]
    stats = ds.stats()
    assert stats.failed == 1 and len(stats.failures) == 1 and "go_003.flac" in stats.failures[0][1]
    assert "/3/" in stats.failures[0][1]


def _audio_of(sample) -> np.ndarray:
    return sample["audio"].numpy().reshape(-1)


def _same_audio(sample, i: int) -> bool:
    expected, _ = sf.read(io.BytesIO(_flac(i)), dtype="float32")
    got = _audio_of(sample)
    return got.shape == expected.shape and bool(np.allclose(got, expected, atol=1e-6))


@pytest.fixture()
def path_only(tmp_path, monkeypatch):
    """A Parquet file datasets writes for an Audio column cast from paths: rows 0-2 absolute, 3-5
    relative to the file's folder; written from that folder, read from elsewhere."""
    datasets = pytest.importorskip("datasets")
    data = tmp_path / "data"
    (data / "clips").mkdir(parents=True)
    names = [f"clips/{CLASSES[i % 3]}_{i:03d}.flac" for i in range(6)]
    for i, name in enumerate(names):
        (data / name).write_bytes(_flac(i))
    monkeypatch.chdir(data)  # datasets looks for the files where it runs
    paths = [str(data / name) for name in names[:3]] + names[3:]
    table = datasets.Dataset.from_dict({"audio": paths}).cast_column("audio", datasets.Audio())
    table.to_parquet(str(data / "train.parquet"))
    monkeypatch.chdir(tmp_path)
    return data / "train.parquet"


def test_a_path_only_audio_column_reads_the_files_it_names(path_only):
    import pyarrow.parquet as pq

    rows = pq.read_table(path_only).column("audio").to_pylist()
    assert all(r["bytes"] is None for r in rows) and rows[3]["path"] == "clips/down_003.flac"
    for path_column in ("path", "audio.path"):
        ds = BufferedDataset(str(path_only), AudioDecoder(), labels=r"^([a-z]+)_",
                             path_column=path_column, num_producers=2, shuffle=True)
        samples = _drain(ds)
        assert sorted(_index(s) for s in samples) == list(range(6)) and ds.stats().failed == 0
        assert all(_same_audio(s, _index(s)) for s in samples)
        assert all(s["label_name"] == CLASSES[_index(s) % 3] for s in samples)


def test_path_column_reads_the_files_or_is_refused_by_name(tmp_path, path_only):
    datasets = pytest.importorskip("datasets")
    for i in range(3):
        (tmp_path / f"file_{i:03d}.flac").write_bytes(_flac(100 + i))
    rows = [{"bytes": _flac(i), "path": str(tmp_path / f"file_{i:03d}.flac")} for i in range(3)]
    both = str(tmp_path / "both.parquet")
    _hf_audio(datasets, rows).to_parquet(both)
    by_bytes = _drain(BufferedDataset(both, AudioDecoder(), num_producers=1))
    assert all(_same_audio(s, _index(s)) for s in by_bytes)
    by_path = _drain(BufferedDataset(both, AudioDecoder(), path_column="audio.path",
                                     num_producers=1))
    assert sorted(_index(s) for s in by_path) == [0, 1, 2]
    assert all(_same_audio(s, 100 + _index(s)) for s in by_path)
    for wrong in ("file", "audio.bytes", "sound.path"):
        with pytest.raises(ValueError, match=rf"path_column={wrong!r} .*'audio.path'"):
            BufferedDataset(str(path_only), AudioDecoder(), path_column=wrong)


def _path_only_table(paths: list) -> object:
    import pyarrow as pa

    audio = pa.array([{"bytes": None, "path": p} for p in paths],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    return pa.table({"audio": audio})


def test_a_path_only_row_outside_its_storage_fails_alone_and_names_it(tmp_path):
    import pyarrow.parquet as pq

    (tmp_path / "a.flac").write_bytes(_flac(0))
    table = _path_only_table(["a.flac", "s3://elsewhere/b.flac", "/dev/zero", None])
    pq.write_table(table, tmp_path / "x.parquet")
    ds = BufferedDataset(str(tmp_path / "x.parquet"), AudioDecoder(), on_error="skip",
                         num_producers=1)
    samples = _drain(ds)
    assert len(samples) == 1 and _same_audio(samples[0], 0)
    failures = sorted(ds.stats().failures)
    assert [f[0] for f in failures] == [1, 2, 3]
    url, device, nothing = (f[2] for f in failures)
    assert "row 1" in url and "'s3://elsewhere/b.flac'" in url and "URL" in url
    assert "row 2" in device and ("not a regular file" in device or os.name == "nt")  # no /dev there
    assert "row 3" in nothing and "neither audio bytes nor a path" in nothing


def test_a_path_only_dataset_in_object_storage_reads_inside_its_bucket(s3, path_only):
    import pyarrow.parquet as pq
    from storage_helpers import BUCKET

    data = path_only.parent
    names = [f"{CLASSES[i % 3]}_{i:03d}.flac" for i in range(6)]
    for name in names:
        s3.put(BUCKET, f"hf/clips/{name}", (data / "clips" / name).read_bytes())
    out = io.BytesIO()
    outside = ["s3://other/x.flac", "../../x.flac"]
    pq.write_table(_path_only_table([f"clips/{n}" for n in names] + outside), out)
    s3.put(BUCKET, "hf/train.parquet", out.getvalue())
    ds = BufferedDataset(f"s3://{BUCKET}/hf/train.parquet", AudioDecoder(),
                         storage_options=s3.options(), on_error="skip", num_producers=2)
    samples = _drain(ds)
    assert sorted(_index(s) for s in samples) == list(range(6))
    assert all(_same_audio(s, _index(s)) for s in samples)
    failures = sorted(ds.stats().failures)
    assert [f[0] for f in failures] == [6, 7] and all("bucket or host" in f[2] for f in failures)


DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _digits(tmp_path, names: list[str], rows: range, file: str) -> Path:
    datasets = pytest.importorskip("datasets")
    audio = [{"bytes": _flac(i), "path": f"{i:03d}.flac"} for i in rows]
    table = datasets.Dataset.from_dict({"audio": audio, "digit": [i % 10 for i in rows]})
    table = table.cast_column("audio", datasets.Audio(decode=False))
    table = table.cast_column("digit", datasets.ClassLabel(names=names))
    table.to_parquet(str(tmp_path / file), batch_size=8)
    return tmp_path / file


def test_a_class_label_column_keeps_its_names_in_order_and_its_numbers(tmp_path):
    first = _digits(tmp_path, DIGITS, range(20), "a.parquet")
    second = _digits(tmp_path, DIGITS, range(20, 30), "b.parquet")
    ds = BufferedDataset([str(first), str(second)], AudioDecoder(), labels="digit", num_producers=2,
                         shuffle=True)
    assert ds.classes == DIGITS and ds.pipeline.source.class_to_idx["eight"] == 8
    samples = _drain(ds)
    assert len(samples) == 30
    for s in samples:
        number = int(s["path"].rpartition("/")[2][:3]) % 10
        assert s["label"] == number and s["label_name"] == DIGITS[number] and s["digit"] == number
    reordered = _digits(tmp_path, DIGITS[::-1], range(20, 30), "c.parquet")
    with pytest.raises(SourceError, match=r"'digit' is a ClassLabel of \['zero'.* in .*c.parquet'"):
        BufferedDataset([str(first), str(reordered)], AudioDecoder(), labels="digit")
    datasets = pytest.importorskip("datasets")
    table = _hf_audio(datasets, [{"bytes": _flac(0), "path": "0.flac"}]).add_column("digit", [-1])
    unlabelled = str(tmp_path / "unlabelled.parquet")
    table.cast_column("digit", datasets.ClassLabel(names=DIGITS)).to_parquet(unlabelled)
    with pytest.raises(SourceError, match=r"'digit' .* ClassLabel of 10 names but holds \['-1'\]"):
        BufferedDataset([str(first), unlabelled], AudioDecoder(), labels="digit")


def test_parquet_in_object_storage(s3, hf):
    from storage_helpers import BUCKET

    for path in sorted(Path(hf).glob("*.parquet")):
        s3.put(BUCKET, f"hf/{path.name}", path.read_bytes())
    ds = BufferedDataset(f"s3://{BUCKET}/hf/train-*.parquet", AudioDecoder(), labels="label", num_producers=4,
                         storage_options=s3.options(), shuffle=True)
    assert len(ds) == N and ds.classes == sorted(CLASSES)
    assert sorted(_index(s) for s in _drain(ds)) == list(range(N))


def test_yaml_source_root_names_the_parquet_files(hf, tmp_path):
    from audiobuffer.config import build_dataset, load_config

    config = tmp_path / "hf.yaml"
    config.write_text(f"source: {{root: '{(hf / 'train-*.parquet').as_posix()}', labels: label}}\n"
                      "decode: {kind: audio, sample_rate: 8000}\nloader: {batch_size: 8}\n",
                      encoding="utf-8", newline="\n")
    ds = build_dataset(load_config(config))
    assert isinstance(ds.pipeline.source, ParquetStream) and ds.classes == sorted(CLASSES)
    assert sorted(_index(s) for s in _drain(ds)) == list(range(N))


def test_what_a_parquet_dataset_cannot_do_is_said_with_what_to_do(hf, tmp_path, no_helper_left_behind):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from audiobuffer import IsolatedLoader

    with pytest.raises(ValueError, match=r"not 1 Parquet file, 4 row groups .*streamed: read the dataset with "
                                         r"BufferedDataset"):
        IsolatedLoader(str(next(hf.glob("*.parquet"))), AudioDecoder(), batch_size=4)
    message = (r"ordered=True needs random access to the samples, and Parquet row groups are "
               r"streamed.*shuffle=False and num_producers=1")
    with pytest.raises(ValueError, match=message) as refused:
        BufferedDataset(str(next(hf.glob("*.parquet"))), AudioDecoder(), ordered=True)
    assert "BufferedDataset" not in str(refused.value)  # said to a user who reads with it
    files = sorted(str(p) for p in hf.glob("*.parquet"))
    in_order = BufferedDataset(files, AudioDecoder(), shuffle=False, num_producers=1)
    assert [_index(s) for s in _drain(in_order)] == list(range(N))  # what the message offers
    pq.write_table(pa.table({"audio": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(SourceError, match=r"column 'audio' of Parquet file .*ints.parquet' holds int64, not encoded"):
        BufferedDataset(str(tmp_path / "ints.parquet"), AudioDecoder())
