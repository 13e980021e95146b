import numpy as np
import soundfile as sf

from audiobuffer.cli.demo import make_demo_corpus


def test_demo_corpus_is_deterministic_labelled_and_reused(tmp_path):
    a = make_demo_corpus(tmp_path / "a", per_class=3, seed=1)
    b = make_demo_corpus(tmp_path / "b", per_class=3, seed=1)
    files = sorted(p.name for p in a.glob("*.flac"))
    assert len(files) == 30 and files == sorted(p.name for p in b.glob("*.flac"))
    assert {f.split("_")[0] for f in files} == {str(d) for d in range(10)}
    for name in files[:5]:
        x, sr = sf.read(a / name)
        y, _ = sf.read(b / name)
        assert sr == 8000 and np.array_equal(x, y) and 0.3 < len(x) / sr < 1.0
    stamp = (a / files[0]).stat().st_mtime_ns
    assert make_demo_corpus(tmp_path / "a", per_class=3, seed=1) == a
    assert (a / files[0]).stat().st_mtime_ns == stamp  # made once, then reused


def test_classes_differ(tmp_path):
    root = make_demo_corpus(tmp_path, per_class=1, seed=0)
    spectra = [np.abs(np.fft.rfft(sf.read(root / f"{d}_synth_0.flac")[0], 8000)) for d in range(10)]
    peaks = {int(np.argmax(s[200:]) + 200) for s in spectra}
    assert len(peaks) > 5
