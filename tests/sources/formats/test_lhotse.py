"""Lhotse manifests as sources, read without importing Lhotse in the library: cuts of long recordings (each a
segment AudioDecoder reads alone), recordings with supervisions, recordings alone; the manifests are written
by lhotse itself, and the audio compared with ``cut.load_audio()``. audiobuffer/sources/formats/lhotse.py and the
segments of audiobuffer/decoders/audio.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from helpers import wait_no_threads

from audiobuffer import AudioDecoder, BufferedDataset, DecodeError, Source, SourceError, WorkItem

lhotse = pytest.importorskip("lhotse", reason="lhotse writes these manifests (pip install lhotse)")

RATE = 16000
CUTS = 24  # 2 recordings of 30 s, 12 utterances each


@pytest.fixture(scope="module", params=["flac", "wav"])
def corpus(request, tmp_path_factory):
    """Two 30 s recordings, their supervisions, and the cuts trimmed to them, all written by lhotse."""
    root = tmp_path_factory.mktemp(f"lhotse-{request.param}")
    rng = np.random.default_rng(0)
    recordings = []
    for r in range(2):
        path = root / "audio" / f"long{r}.{request.param}"
        path.parent.mkdir(exist_ok=True)
        sf.write(path, (0.1 * rng.standard_normal(RATE * 30)).astype(np.float32), RATE, subtype="PCM_16")
        recordings.append(lhotse.Recording.from_file(path))
    supervisions = lhotse.SupervisionSet.from_segments([
        lhotse.SupervisionSegment(id=f"u{r}-{k:02d}", recording_id=recordings[r].id, start=k * 2.4 + 0.137,
                                  duration=1.3 + 0.07 * k, text=f"word {k}", speaker=f"spk{(r + k) % 3}",
                                  language="en")
        for r in range(2) for k in range(CUTS // 2)])
    recording_set = lhotse.RecordingSet.from_recordings(recordings)
    cuts = lhotse.CutSet.from_manifests(recordings=recording_set, supervisions=supervisions)
    cuts = cuts.trim_to_supervisions().to_eager()
    cuts.to_file(root / "cuts.jsonl.gz")
    recording_set.to_file(root / "recordings.jsonl.gz")
    supervisions.to_file(root / "supervisions.jsonl.gz")
    return root, cuts


def _drain(ds) -> list[dict]:
    samples = list(ds)
    ds.close()
    assert wait_no_threads() == []
    return samples


def test_every_cut_once_with_the_audio_lhotse_loads(corpus):
    root, cuts = corpus
    ds = BufferedDataset(root / "cuts.jsonl.gz", AudioDecoder(), labels="speaker", shuffle=True, seed=0,
                         num_producers=2)
    assert len(ds) == CUTS and ds.classes == ["spk0", "spk1", "spk2"]
    samples = {s["id"]: s for s in _drain(ds)}
    assert len(samples) == CUTS
    for cut in cuts:
        sample = samples[cut.id]
        expected = cut.load_audio()[0]
        assert sample["audio"].shape == expected.shape and sample["num_frames"] == len(expected)
        np.testing.assert_allclose(sample["audio"].numpy(), expected, atol=1e-6)
        supervision = cut.supervisions[0]
        assert (sample["text"], sample["speaker"], sample["language"]) == (supervision.text, supervision.speaker, "en")
        assert sample["duration"] == pytest.approx(cut.duration) and sample["recording_id"] == cut.recording_id
        assert sample["label_name"] == supervision.speaker


@pytest.mark.parametrize("order", [("recordings", "supervisions"), ("supervisions", "recordings")])
def test_recordings_with_their_supervisions(corpus, order):
    root, cuts = corpus
    ds = BufferedDataset([root / f"{name}.jsonl.gz" for name in order], AudioDecoder(), num_producers=2)
    samples = {s["id"]: s for s in _drain(ds)}
    assert len(samples) == CUTS
    for cut in cuts:
        np.testing.assert_allclose(samples[cut.supervisions[0].id]["audio"].numpy(), cut.load_audio()[0], atol=1e-6)


def test_recordings_alone_are_whole_files(corpus):
    root, _ = corpus
    samples = _drain(BufferedDataset(root / "recordings.jsonl.gz", AudioDecoder(), num_producers=1))
    assert sorted(s["num_frames"] for s in samples) == [RATE * 30] * 2


def test_a_random_crop_stays_inside_its_segment(corpus):
    root, cuts = corpus
    ds = BufferedDataset(root / "cuts.jsonl.gz", AudioDecoder(crop_seconds=0.5), num_producers=2, seed=3)
    by_id = {c.id: c for c in cuts}
    starts = set()
    for sample in _drain(ds):
        whole = by_id[sample["id"]].load_audio()[0]
        crop = sample["audio"].numpy()
        assert len(crop) == RATE // 2
        hits = [i for i in range(len(whole) - len(crop) + 1) if np.array_equal(whole[i:i + len(crop)], crop)]
        assert len(hits) == 1
        starts.add(hits[0])
    assert len(starts) > 1  # random, not always the segment's start


def test_resume_ranks_and_duration_batches_over_segments(corpus):
    root, cuts = corpus
    spec = root / "cuts.jsonl.gz"
    ds = BufferedDataset(spec, AudioDecoder(), shuffle=True, seed=5, num_producers=2)
    it = iter(ds)
    first = [next(it)["id"] for _ in range(9)]
    state = ds.state_dict()
    it.close()
    ds.close()
    resumed = BufferedDataset(spec, AudioDecoder(), shuffle=True, seed=5, num_producers=2)
    resumed.load_state_dict(state)
    rest = [s["id"] for s in _drain(resumed)]
    assert sorted(first + rest) == sorted(c.id for c in cuts)
    shares = [{s["id"] for s in _drain(BufferedDataset(spec, AudioDecoder(), rank=r, world_size=2, num_producers=2))}
              for r in range(2)]
    assert not shares[0] & shares[1] and len(shares[0] | shares[1]) == CUTS
    batches = _drain(BufferedDataset(spec, AudioDecoder(), max_batch_seconds=6.0, num_producers=2))
    assert sorted(s["id"] for b in batches for s in b) == sorted(c.id for c in cuts)
    assert all(len(b) * max(s["num_frames"] for s in b) <= 6.0 * RATE + 1 for b in batches)


def test_segments_in_the_isolated_loader(corpus, no_helper_left_behind):
    from audiobuffer import IsolatedLoader

    root, cuts = corpus
    with IsolatedLoader(root / "cuts.jsonl.gz", AudioDecoder(crop_seconds=2.0), batch_size=5, labels="speaker",
                        num_producers=2) as loader:
        batches = list(loader)
    lengths = sorted(int(n) for b in batches for n in b["lengths"])
    assert lengths == sorted(round(min(c.duration, 2.0) * RATE) for c in cuts)


def _write_jsonl_gz(path: Path, records: list[dict]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path


def test_what_cannot_be_read_is_refused_by_name(corpus, tmp_path):
    root, _ = corpus
    first = json.loads(gzip.open(root / "cuts.jsonl.gz", "rt").readline())
    command = json.loads(json.dumps(first))
    command["recording"]["sources"] = [{"type": "command", "channels": [0], "source": "rm -rf /"}]
    with pytest.raises(SourceError, match=r"line 1: recording .* type 'command'"):
        Source(_write_jsonl_gz(tmp_path / "command.jsonl.gz", [command]))
    mixed = {"id": "m", "type": "MixedCut", "tracks": [], "start": 0, "duration": 1, "recording": {}}
    with pytest.raises(SourceError, match="MixedCut"):
        Source(_write_jsonl_gz(tmp_path / "mixed.jsonl.gz", [mixed]))
    stereo = json.loads(json.dumps(first))
    stereo["recording"]["channel_ids"] = [0, 1]
    with pytest.raises(SourceError, match=r"takes channels \[0\]"):
        Source(_write_jsonl_gz(tmp_path / "stereo.jsonl.gz", [stereo]))
    with pytest.raises(SourceError, match="need the recordings manifest"):
        Source(root / "supervisions.jsonl.gz")


def test_a_segment_past_the_end_of_its_file(tmp_path):
    path = tmp_path / "short.wav"
    sf.write(path, np.zeros(RATE, dtype=np.float32), RATE)
    decode = AudioDecoder()
    padded = decode(WorkItem(0, str(path), segment=(0.5, 0.9)))
    assert padded["num_frames"] == round(0.9 * RATE)
    with pytest.raises(DecodeError, match=r"segment 0.5 s \+ 2 s .* runs 1.5 s past the end of"):
        decode(WorkItem(0, str(path), segment=(0.5, 2.0)))
    with pytest.raises(DecodeError, match="starts at 1.5 s, at or after the end of the file"):
        decode(WorkItem(0, str(path), segment=(1.5, 0.2)))
    with pytest.raises(DecodeError, match=r"segment 0.2 s \+ 0 s .* is empty"):
        decode(WorkItem(0, str(path), segment=(0.2, 0.0)))


@pytest.fixture()
def past_the_end(tmp_path):
    """A 3 s recording and cuts of it, written by lhotse: inside, 0.5 s and 0.8 s past its end."""
    path = tmp_path / "three.wav"
    noise = 0.1 * np.random.default_rng(1).standard_normal(3 * RATE)
    sf.write(path, noise.astype(np.float32), RATE, subtype="PCM_16")
    recording = lhotse.Recording.from_file(path)
    cuts = lhotse.CutSet.from_cuts([
        lhotse.MonoCut(id="inside", start=1.0, duration=0.5, channel=0, recording=recording),
        lhotse.MonoCut(id="half-past", start=2.5, duration=1.0, channel=0, recording=recording),
        lhotse.MonoCut(id="far-past", start=2.2, duration=1.6, channel=0, recording=recording)])
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    return tmp_path / "cuts.jsonl.gz", {c.id: c for c in cuts}


def test_a_cut_past_the_end_of_its_recording_is_padded_as_lhotse_pads_it(past_the_end):
    from lhotse.audio.utils import DurationMismatchError

    manifest, cuts = past_the_end
    ds = BufferedDataset(manifest, AudioDecoder(), on_error="skip", num_producers=1)
    samples = {s["id"]: s for s in _drain(ds)}
    assert sorted(samples) == ["half-past", "inside"]
    for name, sample in samples.items():
        expected = cuts[name].load_audio()[0]  # lhotse pads up to 0.5 s missing, by reflection
        assert sample["num_frames"] == len(expected) == round(cuts[name].duration * RATE)
        np.testing.assert_allclose(sample["audio"].numpy(), expected, atol=1e-6)
    with pytest.raises(DurationMismatchError):
        cuts["far-past"].load_audio()  # further, lhotse refuses it: so do we, naming the cut
    assert ds.stats().failed == 1 and "'far-past'" in ds.stats().failures[0][2]
    with pytest.raises(DecodeError, match=r"'far-past'.*runs 0.8 s past the end of the file \(3 s"):
        _drain(BufferedDataset(manifest, AudioDecoder(), num_producers=1))
    whole = cuts["half-past"].load_audio()[0]
    for crop in ("start", "center", "random"):  # a crop of the padded cut: a window of lhotse's
        decode = AudioDecoder(crop_seconds=0.75, crop=crop)
        cropped = _drain(BufferedDataset(manifest, decode, on_error="skip", num_producers=1,
                                         seed=7))
        part = {s["id"]: s["audio"].numpy() for s in cropped}["half-past"]
        assert len(part) == round(0.75 * RATE)
        starts = range(len(whole) - len(part) + 1)
        assert any(np.array_equal(whole[i:i + len(part)], part) for i in starts)


def test_a_cut_of_no_duration_is_refused_by_name(past_the_end, tmp_path):
    manifest, cuts = past_the_end
    recording = cuts["inside"].recording
    nothing = lhotse.MonoCut(id="empty", start=1.0, duration=0.0, channel=0, recording=recording)
    empty = lhotse.CutSet.from_cuts([cuts["inside"], nothing])
    empty.to_file(tmp_path / "empty.jsonl.gz")
    with pytest.raises(SourceError, match=r"line 2: cut 'empty' has duration 0"):
        Source(tmp_path / "empty.jsonl.gz")


def test_a_manifest_with_start_and_duration_columns(corpus, tmp_path):
    """The same segments as a CSV of start and duration columns, in Python and in YAML."""
    from audiobuffer.config import build_dataset, load_config

    root, cuts = corpus
    lines = ["path,start,seconds,speaker"]
    lines += [f"{root / 'audio' / Path(c.recording.sources[0].source).name},{c.start},{c.duration},"
              f"{c.supervisions[0].speaker}" for c in cuts]
    manifest = tmp_path / "segments.csv"
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="\n")
    by_start = {(Path(c.recording.sources[0].source).name, round(c.start, 3)): c for c in cuts}
    ds = BufferedDataset(manifest, AudioDecoder(), start_column="start", duration_column="seconds", num_producers=2)
    samples = _drain(ds)
    assert len(samples) == CUTS
    for s in samples:
        cut = by_start[(Path(s["path"]).name, round(float(s["start"]), 3))]
        np.testing.assert_allclose(s["audio"].numpy(), cut.load_audio()[0], atol=1e-6)
    config = tmp_path / "segments.yaml"
    config.write_text("source: {manifest: segments.csv, start_column: start, duration_column: seconds, "
                      "labels: speaker}\ndecode: {kind: audio}\n", encoding="utf-8", newline="\n")
    ds = build_dataset(load_config(config))
    assert sorted(s["num_frames"] for s in _drain(ds)) == sorted(round(c.duration * RATE) for c in cuts)
    with pytest.raises(SourceError, match=r"row 1: start 'soon' is not a number of seconds"):
        bad = tmp_path / "bad.csv"
        bad.write_text("path,start\na.wav,soon\n", encoding="utf-8", newline="\n")
        Source(bad, start_column="start")
    with pytest.raises(SourceError, match="no column 'begin'"):
        Source(manifest, start_column="begin")


def test_yaml_source_root_names_the_cuts(corpus, tmp_path):
    from audiobuffer.config import build_dataset, load_config

    root, cuts = corpus
    config = tmp_path / "cuts.yaml"
    config.write_text(f"source: {{root: '{(root / 'cuts.jsonl.gz').as_posix()}', labels: speaker}}\n"
                      "decode: {kind: audio}\n", encoding="utf-8", newline="\n")
    ds = build_dataset(load_config(config))
    assert sorted(s["id"] for s in _drain(ds)) == sorted(c.id for c in cuts)


def test_pack_refuses_segments_rather_than_copy_whole_recordings(corpus, tmp_path):
    from audiobuffer.sources import pack

    root, _ = corpus
    with pytest.raises(SourceError, match="names segments of its files .* pack copies whole files"):
        pack(root / "cuts.jsonl.gz", tmp_path / "out", shard_size=10**6, progress=False)
    assert not (tmp_path / "out" / "index.json").exists()
