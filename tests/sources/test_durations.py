"""Item durations for batches by duration (audiobuffer/prepare/durations.py): manifest column,
headers, cache."""

import json
import logging
import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pytest
import soundfile as sf
from helpers import drop_flac_length, write_tone

from audiobuffer import DecodeError, SourceError
from audiobuffer.cli.demo import default_cache_dir as default_demo_dir
from audiobuffer.engine.plan import plan_batches
from audiobuffer.prepare.durations import (
    CACHE_ENV,
    default_cache_dir,
    header_seconds,
    read_durations,
)
from audiobuffer.sources import Source

# (name, seconds, sample rate): WAV and FLAC, several lengths and rates.
FILES = [("a.wav", 0.25, 8000), ("b.flac", 1.3, 16000), ("c.wav", 0.7, 22050), ("d.flac", 2.0, 8000),
         ("e.wav", 0.05, 44100)]


def frames_of(seconds, rate):
    return round(seconds * rate)


@pytest.fixture
def corpus(tmp_path):
    """A folder of WAV and FLAC files of different lengths; returns (folder, expected durations by name)."""
    root = tmp_path / "corpus"
    expected = {}
    for name, seconds, rate in FILES:
        write_tone(root / name, seconds=seconds, sample_rate=rate)
        expected[name] = frames_of(seconds, rate) / rate
    return root, expected


@pytest.fixture
def opens(monkeypatch):
    """Counts the files soundfile opens (thread-safe), by path."""
    opened = []
    lock = threading.Lock()
    real = sf.SoundFile

    def counting(path, *args, **kwargs):
        with lock:
            opened.append(os.path.basename(os.fsdecode(path)))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(sf, "SoundFile", counting)
    return opened


def by_name(source, durations):
    return {os.path.basename(p): d for p, d in zip(source.paths, durations)}


def forbid_opening(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a file was opened: {args}")

    monkeypatch.setattr(sf, "SoundFile", refuse)
    monkeypatch.setattr(sf, "info", refuse)


def test_headers_give_each_files_duration(corpus, tmp_path):
    root, expected = corpus
    source = Source(root)
    durations, failures = read_durations(source, cache_dir=tmp_path / "cache", num_threads=3)
    assert durations.dtype == np.float64 and failures == []
    assert by_name(source, durations) == expected  # frames / rate, exactly


def test_the_trainer_waits_for_header_reads_in_slices(tmp_path, monkeypatch):
    # NOTE [ Interruptible waits ]: the trainer's thread collects the reader threads' results; an untimed
    # wait there could not be broken by Ctrl-C on Windows.
    from concurrent.futures import Future

    from audiobuffer.buffer import WAIT_SLICE

    timeouts = []
    real = Future.result

    def result(self, timeout=None):
        timeouts.append(timeout)
        return real(self, timeout)

    monkeypatch.setattr(Future, "result", result)
    paths = [write_tone(tmp_path / f"f{i:03d}.wav", seconds=0.1, sample_rate=8000) for i in range(130)]
    durations, _ = read_durations(Source(paths), cache_dir=tmp_path / "cache", num_threads=2)
    assert len(durations) == 130 and len(timeouts) >= 3  # one wait at least for each of the three chunks
    assert all(t is not None and t <= WAIT_SLICE for t in timeouts), timeouts


def test_many_files_keep_their_order_across_threads(tmp_path):
    lengths = [(i % 17 + 1) * 100 for i in range(150)]  # more files than one task's chunk
    paths = [write_tone(tmp_path / f"f{i:03d}.wav", seconds=n / 8000, sample_rate=8000) for i, n in enumerate(lengths)]
    durations, _ = read_durations(Source(paths), cache_dir=tmp_path / "cache", num_threads=4)
    assert durations.tolist() == [n / 8000 for n in lengths]


def test_flac_without_a_length_is_counted(tmp_path):
    path = drop_flac_length(write_tone(tmp_path / "stream.flac", seconds=1.0, sample_rate=16000))
    with sf.SoundFile(path) as f:
        assert f.frames >= 2**62  # libsndfile's "unknown"
    assert header_seconds(str(path)) == 1.0
    durations, failures = read_durations(Source([path]), cache_dir=False)
    assert durations.tolist() == [1.0] and failures == []


def test_a_second_run_opens_no_file(corpus, tmp_path, monkeypatch, opens):
    root, expected = corpus
    cache = tmp_path / "cache"
    first, _ = read_durations(Source(root), cache_dir=cache)
    assert sorted(opens) == sorted(expected)
    assert len(list(cache.glob("*.arrow"))) == 1
    forbid_opening(monkeypatch)
    again, failures = read_durations(Source(root), cache_dir=cache)
    assert again.tolist() == first.tolist() and failures == []


def test_a_subset_shares_the_corpus_cache(corpus, tmp_path, monkeypatch):
    root, _ = corpus
    cache = tmp_path / "cache"
    source = Source(root)
    read_durations(source, cache_dir=cache)
    forbid_opening(monkeypatch)
    part = source.subset([1, 3])
    durations, _ = read_durations(part, cache_dir=cache)
    assert durations.tolist() == read_durations(source, cache_dir=cache)[0][[1, 3]].tolist()


def test_a_changed_file_is_read_again(corpus, tmp_path, opens):
    root, expected = corpus
    cache = tmp_path / "cache"
    read_durations(Source(root), cache_dir=cache)
    write_tone(root / "c.wav", seconds=1.5, sample_rate=22050)  # a new size
    opens.clear()
    durations, _ = read_durations(Source(root), cache_dir=cache)
    assert opens == ["c.wav"]
    assert by_name(Source(root), durations) == {**expected, "c.wav": frames_of(1.5, 22050) / 22050}
    opens.clear()
    stat = os.stat(root / "a.wav")
    os.utime(root / "a.wav", ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))  # same size, touched
    read_durations(Source(root), cache_dir=cache)
    assert opens == ["a.wav"]
    opens.clear()
    read_durations(Source(root), cache_dir=cache)
    assert opens == []


def cache_table(file: Path) -> pa.Table:
    with pa.OSFile(str(file), "rb") as f:
        return pa.ipc.open_file(f).read_all()


def write_cache_table(file: Path, table: pa.Table) -> None:
    with pa.OSFile(str(file), "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
        writer.write_table(table)


def test_the_cache_is_one_file_of_columns(corpus, tmp_path):
    root, expected = corpus
    cache = tmp_path / "cache"
    read_durations(Source(root), cache_dir=cache)
    (file,) = cache.glob("*.arrow")
    table = cache_table(file)
    assert table.column_names == ["path", "size", "mtime_ns", "seconds"]
    by_path = {os.path.basename(p.decode()): s for p, s in zip(table.column("path").to_pylist(),
                                                              table.column("seconds").to_pylist())}
    assert by_path == expected
    assert table.schema.metadata[b"root"] == os.path.abspath(root).encode()


def test_a_file_listed_twice_is_one_cache_entry(corpus, tmp_path, monkeypatch):
    root, expected = corpus
    cache = tmp_path / "cache"
    files = sorted(str(p) for p in root.iterdir())
    twice = [files[1], files[0], files[1], files[2], files[0]]
    durations, _ = read_durations(Source(twice), cache_dir=cache)
    assert durations.tolist() == [expected[os.path.basename(f)] for f in twice]
    (file,) = cache.glob("*.arrow")
    assert [os.path.basename(p.decode()) for p in cache_table(file).column("path").to_pylist()] == \
        [os.path.basename(f) for f in files[1::-1] + files[2:3]]  # the files in order of first listing
    forbid_opening(monkeypatch)
    assert read_durations(Source(twice), cache_dir=cache)[0].tolist() == durations.tolist()


WRONG_COLUMNS = pa.table({"path": pa.array([b"x"], pa.large_binary()), "seconds": pa.array([1.0])})


def corrupt_path_offsets(file: Path, how: str) -> None:
    """Overwrite, in the bytes of the cache ``file``, where its path column says each path ends: out of
    order, or past the end of the paths' bytes (a file damaged on disk: its framing still reads)."""
    offsets = np.frombuffer(cache_table(file).column("path").chunk(0).buffers()[1], dtype=np.int64)
    bad = offsets.copy()
    if how == "out of order":
        bad[1], bad[2] = bad[2], bad[1]
    else:
        bad[-1] += 1 << 40
    data = file.read_bytes()
    assert data.count(offsets.tobytes()) == 1
    file.write_bytes(data.replace(offsets.tobytes(), bad.tobytes()))


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"", "wrong columns", "path offsets out of order",
                                     "path offsets past the end", "a column name not UTF-8"])
def test_a_corrupt_cache_is_ignored_and_rewritten(corpus, tmp_path, opens, monkeypatch, content, caplog):
    root, expected = corpus
    cache = tmp_path / "cache"
    read_durations(Source(root), cache_dir=cache)
    (file,) = cache.glob("*.arrow")
    if content == "wrong columns":
        write_cache_table(file, WRONG_COLUMNS)
    elif content == "a column name not UTF-8":
        file.write_bytes(file.read_bytes().replace(b"mtime_ns", b"mtime\xe8ns"))
    elif isinstance(content, str):  # pyarrow reads the file, whose arrays do not hold together
        corrupt_path_offsets(file, content.removeprefix("path offsets "))
    else:
        file.write_bytes(content)
    opens.clear()
    with caplog.at_level(logging.WARNING, logger="audiobuffer"):
        durations, _ = read_durations(Source(root), cache_dir=cache)
    assert by_name(Source(root), durations) == expected
    assert "ignoring the duration cache" in caplog.text
    assert sorted(opens) == sorted(expected)  # read again
    assert cache_table(file).column_names == ["path", "size", "mtime_ns", "seconds"]
    forbid_opening(monkeypatch)
    assert read_durations(Source(root), cache_dir=cache)[0].tolist() == durations.tolist()


def test_bad_cache_entries_are_read_again(corpus, tmp_path, opens):
    root, expected = corpus
    cache = tmp_path / "cache"
    read_durations(Source(root), cache_dir=cache)
    (file,) = cache.glob("*.arrow")
    table = cache_table(file)
    key = os.path.abspath(root / "b.flac").encode()
    seconds = [-1.0 if p == key else s for p, s in zip(table.column("path").to_pylist(),
                                                       table.column("seconds").to_pylist())]
    write_cache_table(file, table.set_column(3, "seconds", pa.array(seconds)))
    opens.clear()
    durations, _ = read_durations(Source(root), cache_dir=cache)
    assert opens == ["b.flac"] and by_name(Source(root), durations) == expected


def test_a_million_cache_entries_load_and_match_in_bulk(tmp_path):
    # A cache of a million files, matched against a source's paths without an object per entry.
    from audiobuffer.prepare.durations import _Entries

    n = 1_000_000
    paths = [f"/corpus/speaker{i % 997}/utt{i:07d}.flac" for i in range(n)]
    entries = _Entries(paths, np.arange(n, dtype=np.int64), np.full(n, 7, np.int64), np.arange(n) / 1000.0)
    entries.save(tmp_path / "c.arrow", "/corpus")
    loaded = _Entries.load(tmp_path / "c.arrow")
    wanted = [paths[5], paths[n - 1], "/corpus/elsewhere.flac"]
    assert loaded.rows_of(wanted).tolist() == [5, n - 1, -1]
    assert loaded.seconds[loaded.rows_of(paths[::1000])].tolist() == (np.arange(0, n, 1000) / 1000.0).tolist()


def test_cache_folder_from_the_environment_or_none(corpus, tmp_path, monkeypatch, opens):
    root, expected = corpus
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "audiobuffer" / "durations"
    assert default_demo_dir() == tmp_path / "xdg" / "audiobuffer"  # one cache folder for the demo too
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert default_cache_dir() == tmp_path / "env" / "durations" and default_demo_dir() == tmp_path / "env"
    read_durations(Source(root))
    assert len(list((tmp_path / "env" / "durations").glob("*.arrow"))) == 1
    opens.clear()
    for _ in range(2):
        read_durations(Source(root), cache_dir=False)
    assert sorted(opens) == sorted(list(expected) * 2)  # no cache: every header read each time
    assert len(list((tmp_path / "env" / "durations").glob("*.arrow"))) == 1


def test_an_unwritable_cache_is_a_warning_not_an_error(corpus, tmp_path, caplog):
    root, expected = corpus
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="audiobuffer"):
        durations, _ = read_durations(Source(root), cache_dir=blocker / "cache")
    assert by_name(Source(root), durations) == expected
    assert "cannot write the duration cache" in caplog.text


@pytest.fixture
def broken(corpus):
    """The corpus plus a file whose header libsndfile cannot read."""
    root, expected = corpus
    (root / "bad.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunkjunkjunk")
    return root, expected


def test_a_broken_header_raises_naming_the_file(broken, tmp_path):
    root, _ = broken
    source = Source(root)
    bad = [i for i, p in enumerate(source.paths) if p.endswith("bad.wav")][0]
    with pytest.raises(DecodeError, match=rf"item {bad}: cannot read the header of .*bad\.wav") as info:
        read_durations(source, cache_dir=tmp_path / "cache", num_threads=2)
    assert info.value.path.endswith("bad.wav") and info.value.index == bad
    assert info.value.__cause__ is not None


@pytest.mark.parametrize("on_error", ["warn", "skip"])
def test_a_broken_header_is_listed_and_left_out(broken, tmp_path, on_error, caplog):
    root, expected = broken
    source = Source(root)
    with caplog.at_level(logging.WARNING, logger="audiobuffer"):
        durations, failures = read_durations(source, cache_dir=tmp_path / "cache", on_error=on_error)
    bad = [i for i, p in enumerate(source.paths) if p.endswith("bad.wav")][0]
    assert [(i, os.path.basename(p)) for i, p, _ in failures] == [(bad, "bad.wav")]
    assert "cannot read the header of" in failures[0][2]
    named = by_name(source, durations)
    assert np.isnan(named.pop("bad.wav")) and named == expected
    assert ("1 of 6 headers could not be read" in caplog.text) == (on_error == "warn")
    plan = plan_batches(durations, max_batch_seconds=10, buckets=2, shuffle=True, seed=0, epoch=0)
    assert sorted(i for b in plan.batches for i in b) == sorted(set(range(6)) - {bad})


def test_a_missing_file_is_a_failure(tmp_path):
    good = write_tone(tmp_path / "good.wav", seconds=0.5, sample_rate=8000)
    durations, failures = read_durations(Source([good, tmp_path / "gone.wav"]), cache_dir=False, on_error="skip")
    assert durations[0] == 0.5 and np.isnan(durations[1])
    assert failures == [(1, str(tmp_path / "gone.wav"), f"cannot read the header of {str(tmp_path / 'gone.wav')!r}: "
                         f"no such file")]


def test_crop_caps_each_duration(corpus, tmp_path):
    root, expected = corpus
    durations, _ = read_durations(Source(root), crop_seconds=1.0, cache_dir=tmp_path / "cache")
    assert by_name(Source(root), durations) == {k: min(v, 1.0) for k, v in expected.items()}


def write_manifest(tmp_path, rows, name="train.csv"):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        columns = list(rows[0])
        path.write_text(",".join(columns) + "\n" + "".join(",".join(str(r[c]) for c in columns) + "\n" for r in rows))
    return path


def test_manifest_column_gives_durations_without_opening_a_file(tmp_path, monkeypatch):
    forbid_opening(monkeypatch)
    manifest = write_manifest(tmp_path, [{"path": "a.wav", "duration": "1.5"}, {"path": "b.wav", "duration": "12"},
                                         {"path": "c.wav", "duration": "0"}])
    durations, failures = read_durations(Source(manifest), duration_column="duration", cache_dir=tmp_path / "c")
    assert durations.tolist() == [1.5, 12.0, 0.0] and failures == []
    capped, _ = read_durations(Source(manifest), duration_column="duration", crop_seconds=4)
    assert capped.tolist() == [1.5, 4.0, 0.0]
    assert not (tmp_path / "c").exists()
    jsonl = write_manifest(tmp_path, [{"path": "a.wav", "seconds": 2.5}, {"path": "b.wav", "seconds": 3}],
                           "train.jsonl")
    assert read_durations(Source(jsonl), duration_column="seconds")[0].tolist() == [2.5, 3.0]


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", ""])
def test_manifest_value_that_is_not_a_duration_names_row_and_value(tmp_path, value):
    manifest = write_manifest(tmp_path, [{"path": "a.wav", "duration": "1.5"}, {"path": "b.wav", "duration": value}])
    with pytest.raises(SourceError, match=rf"row 2: column 'duration' holds {value!r}, not a duration"):
        read_durations(Source(manifest), duration_column="duration")


def test_manifest_without_the_column(tmp_path):
    manifest = write_manifest(tmp_path, [{"path": "a.wav", "speaker": "x"}])
    with pytest.raises(SourceError, match=r"no duration column 'duration'; its columns are \['speaker'\]"):
        read_durations(Source(manifest), duration_column="duration")
    jsonl = write_manifest(tmp_path, [{"path": "a.wav", "duration": 1}, {"path": "b.wav"},
                                      {"path": "c.wav", "duration": True}], "m.jsonl")
    with pytest.raises(SourceError, match="row 2 has no value in column 'duration'"):
        read_durations(Source(jsonl), duration_column="duration")
    jsonl.write_text('{"path": "a.wav", "duration": true}\n')
    with pytest.raises(SourceError, match="row 1: column 'duration' holds True"):
        read_durations(Source(jsonl), duration_column="duration")


def test_duration_column_needs_a_manifest(corpus):
    root, _ = corpus
    with pytest.raises(ValueError, match="duration_column='duration' needs a manifest source"):
        read_durations(Source(root), duration_column="duration")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_threads": 0}, ValueError, "num_threads must be an integer >= 1, got 0"),
    ({"num_threads": 2.0}, TypeError, "num_threads must be an integer"),
    ({"on_error": "ignore"}, ValueError, "on_error must be one of"),
    ({"crop_seconds": -1}, ValueError, "crop_seconds must be a finite number of seconds > 0 or None, got -1"),
    ({"crop_seconds": "1"}, TypeError, "crop_seconds must be a number"),
    ({"cache_dir": 3}, TypeError, "cache_dir must be a folder, None .* or False"),
    ({"duration_column": 1}, TypeError, "duration_column must be a manifest column name or None"),
])
def test_bad_options_are_named(corpus, kwargs, error, match):
    with pytest.raises(error, match=match):
        read_durations(Source(corpus[0]), **kwargs)


def test_fsdd_durations_match_soundfile_and_are_cached(fsdd, tmp_path, monkeypatch):
    source = Source(fsdd)
    durations, failures = read_durations(source, cache_dir=tmp_path / "cache")
    assert failures == [] and len(durations) == 3000 and np.all(durations > 0)
    for i in (0, 1234, 2999):
        info = sf.info(source.paths[i])
        assert durations[i] == info.frames / info.samplerate
    forbid_opening(monkeypatch)
    assert read_durations(source, cache_dir=tmp_path / "cache")[0].tolist() == durations.tolist()


def test_a_cache_another_rank_wrote_meanwhile_is_read_not_rewritten(corpus, tmp_path, monkeypatch):
    """Two ranks start with no cache; rank 0 writes it while rank 1 is still reading headers. Rank 1
    finds every header it read in rank 0's file and leaves the file as it is."""
    import audiobuffer.prepare.durations as durations_module

    root, expected = corpus
    read_durations(Source(root), cache_dir=tmp_path / "rank0")
    (written,) = (tmp_path / "rank0").glob("*.arrow")
    cache = tmp_path / "shared"
    real_header_seconds = durations_module.header_seconds

    def rank0_finishes_first(path):
        if not cache.exists():
            cache.mkdir()
            (cache / written.name).write_bytes(written.read_bytes())
        return real_header_seconds(path)

    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(durations_module, "header_seconds", rank0_finishes_first)
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append(dst), real_replace(src, dst)))
    durations, _ = read_durations(Source(root), cache_dir=cache)
    assert by_name(Source(root), durations) == expected
    assert replaced == [] and (cache / written.name).read_bytes() == written.read_bytes()
    assert [p.name for p in cache.iterdir()] == [written.name]  # no temporary file left


def test_a_cache_held_open_by_another_process_stays_and_the_run_goes_on(corpus, tmp_path, monkeypatch, caplog):
    """Windows refuses to replace a file another process (a rank reading it) holds open: PermissionError.
    The run goes on with the headers it read, the other copy stays, no temporary file is left."""
    root, expected = corpus
    cache = tmp_path / "cache"
    read_durations(Source(root), cache_dir=cache)
    (file,) = cache.glob("*.arrow")
    write_cache_table(file, cache_table(file).slice(0, 0))  # another rank's file, without these entries
    other = file.read_bytes()

    def refuse(src, dst):
        raise PermissionError(13, "Access is denied", str(dst))

    monkeypatch.setattr(os, "replace", refuse)
    with caplog.at_level(logging.INFO, logger="audiobuffer"):
        durations, failures = read_durations(Source(root), cache_dir=cache)
    assert by_name(Source(root), durations) == expected and failures == []
    assert [p.name for p in cache.iterdir()] == [file.name]
    assert file.read_bytes() == other
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "open in another process" in caplog.text


def test_a_cache_an_earlier_version_wrote_is_replaced(corpus, tmp_path):
    root, expected = corpus
    cache = tmp_path / "cache"
    read_durations(Source(root), cache_dir=cache)
    (file,) = cache.glob("*.arrow")
    old = file.with_suffix(".json")
    old.write_text('{"format": 1, "root": "", "entries": {}}', encoding="utf-8", newline="\n")
    file.unlink()
    durations, _ = read_durations(Source(root), cache_dir=cache)
    assert by_name(Source(root), durations) == expected
    assert sorted(p.name for p in cache.iterdir()) == [file.name]


@pytest.mark.skipif(os.name == "nt", reason="POSIX keeps file names as bytes; Windows names are UTF-16")
def test_a_file_name_that_is_not_utf8_is_read(tmp_path):
    from audiobuffer import AudioDecoder

    raw = os.fsencode(tmp_path) + b"/caf\xe9.flac"  # Latin-1, not UTF-8
    try:
        sf.write(raw, np.zeros(8000, dtype=np.float32), 8000, format="FLAC")
    except OSError:
        pytest.skip("this file system refuses names that are not UTF-8")
    (path,) = [p for p in Source(str(tmp_path)).paths]
    assert os.fsencode(path) == raw  # kept with a surrogate escape
    assert header_seconds(path) == 1.0
    assert read_durations(Source(str(tmp_path)), cache_dir=tmp_path / "cache")[0].tolist() == [1.0]
    assert AudioDecoder(8000)(Source(str(tmp_path)).item(0))["audio"].shape[-1] == 8000
