"""The benchmarks run (smoke only: speed is measured by the scripts, never asserted here)."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import torch
from helpers import JOIN_TIMEOUT, REPO, make_corpus, windows_text_files, write_tone

from audiobuffer.cli.bench import main as bench_main
from audiobuffer.cli.bench import measure_epoch, usable_cores
from audiobuffer.cli.main import main as cli_main

pytestmark = pytest.mark.timeout(400)


def run_script(name, *args):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], capture_output=True, text=True,
                          timeout=360, env=env)


def test_decode_bench_quick_counts_every_file(tmp_path):
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    status = bench_main(["--quick", "--formats", "flac", "--approaches", "loop,audiobuffer-2,dataloader-1",
                         "--json", str(out), "--plot", str(plot), "--cache-dir", str(tmp_path)])
    assert status == 0
    (rows,) = json.loads(out.read_text()).values()
    assert [r["approach"] for r in rows] == ["loop", "audiobuffer-2", "dataloader-1"]
    for r in rows:
        assert r["files"] == 40 and r["audio_s"] > 40 and r["peak_rss_mb"] > 50
        assert 0 < r["first_batch_s"] <= r["total_s"] and r["vs_loop"] > 0
        assert 0 < r["cpu_percent"] <= _max_cpu_percent()
    assert plot.stat().st_size > 10_000


#: The approaches added beside the first ones (peers whose package is missing are left out).
NEW_APPROACHES = ["loop", "loop-libsndfile", "audiobuffer-auto", "isolated-2", "spdl-pipeline-2", "spdl-load_wav"]


def test_decode_bench_quick_fills_every_row_of_the_new_approaches_and_corpora(tmp_path):
    """WAV and FLAC + mel, tiny: each approach that is installed and applies has numbers in its row."""
    pytest.importorskip("librosa")
    from audiobuffer.cli.bench import available, gil_enabled

    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    status = bench_main(["--quick", "--formats", "wav,flac+mel", "--approaches", ",".join(NEW_APPROACHES),
                         "--json", str(out), "--markdown", str(md), "--cache-dir", str(tmp_path)])
    assert status == 0
    wav, mel = json.loads(out.read_text()).items()
    assert wav[0].startswith("WAV") and "log-mel" in mel[0]
    installed = [a for a in NEW_APPROACHES if available(a)]
    assert [r["approach"] for r in wav[1]] == installed
    assert [r["approach"] for r in mel[1]] == [a for a in installed if a != "spdl-load_wav"]  # FLAC: no load_wav
    for r in wav[1] + mel[1]:
        # audio_s counts seconds of audio, also where the transform replaced it with a spectrogram
        assert r["files"] == 40 and r["audio_s"] > 40 and r["peak_rss_mb"] > 50, r
        assert 0 < r["first_batch_s"] <= r["total_s"] and r["vs_loop"] > 0 and r["steady_files_per_s"] > 0, r
        assert r["gil_enabled"] is gil_enabled()
    header = md.read_text().splitlines()[0]
    assert header.startswith("Python ") and ("GIL enabled" if gil_enabled() else "GIL disabled") in header
    tables = markdown_tables(md.read_text())
    assert [len(t) - 1 for t in tables] == [len(wav[1]), len(mel[1])]


def test_mel_transform_keeps_the_audio_duration():
    pytest.importorskip("librosa")
    from audiobuffer.cli.bench import N_MELS, mel_transform

    sample = mel_transform({"audio": np.zeros(16000, dtype=np.float32), "sample_rate": 16000, "num_frames": 16000})
    assert sample["audio"].shape == (N_MELS, sample["num_frames"]) and sample["audio"].dtype == np.float32
    assert sample["seconds"] == 1.0 and sample["num_frames"] == 101


@pytest.mark.parametrize("subtype,channels", [("PCM_16", 1), ("PCM_16", 2), ("PCM_32", 1), ("PCM_U8", 1)])
def test_spdl_load_wav_sample_equals_audio_decoder(tmp_path, subtype, channels):
    """The load_wav peer returns what AudioDecoder does (libsndfile's int -> float scaling, mono mean)."""
    pytest.importorskip("spdl.io")
    from audiobuffer import AudioDecoder
    from audiobuffer.cli._bench_approaches import _load_wav

    path = str(write_tone(tmp_path / "a.wav", seconds=0.3, channels=channels, subtype=subtype))
    ours, theirs = AudioDecoder()(path), _load_wav(path, 0)
    assert theirs["audio"].dtype == ours["audio"].dtype
    assert np.array_equal(theirs["audio"].numpy(), ours["audio"].numpy())
    assert (theirs["sample_rate"], theirs["num_frames"]) == (ours["sample_rate"], ours["num_frames"])


@pytest.mark.timeout(120)
def test_spdl_pipeline_yields_every_file_once_and_stops_its_thread(tmp_path):
    pytest.importorskip("spdl.pipeline")
    from audiobuffer.cli.bench import BATCH_SIZE, loader

    paths = [str(p) for p in make_corpus(tmp_path, 2 * BATCH_SIZE + 3)]
    before = threading.active_count()
    batches = list(loader("spdl-pipeline-2", paths))
    assert sorted(len(b["path"]) for b in batches) == [3, BATCH_SIZE, BATCH_SIZE]
    assert sorted(p for b in batches for p in b["path"]) == sorted(paths)
    deadline = time.monotonic() + JOIN_TIMEOUT  # SPDL's event-loop thread is joined by auto_stop()
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before, threading.enumerate()


def test_bench_corpus_and_approach_rules(capsys):
    from audiobuffer.cli.bench import applies, gil_line

    assert applies("spdl-load_wav", ["a.wav", "b.WAV"], None)
    assert not applies("spdl-load_wav", ["a.wav", "b.flac"], None)
    assert not applies("spdl-load_wav", ["a.wav"], "mel") and applies("loop", ["a.flac"], "mel")
    rows = {"c": [{"approach": "loop", "gil_enabled": False}, {"approach": "spdl-load_wav", "gil_enabled": True}]}
    assert "GIL disabled, but enabled by an import in: spdl-load_wav. Peers: " in gil_line(rows)
    with pytest.raises(SystemExit):
        bench_main(["--formats", "flac+magic"])
    assert "--formats takes FORMAT or FORMAT+TRANSFORM" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # refused up front, not a soundfile traceback while making the corpus
        bench_main(["--formats", "wav,none+mel"])
    err = capsys.readouterr().err
    assert "--formats: 'none' is not a format the corpus can be written in" in err and "flac" in err
    with pytest.raises(SystemExit):
        bench_main(["--formats", "raw,ogg"])  # headerless; Vorbis, not 16-bit PCM
    assert "--formats: 'raw', 'ogg' are not formats the corpus can be written in" in capsys.readouterr().err


def test_decode_bench_approaches_take_turns_within_each_round(monkeypatch, tmp_path):
    """A busy spell of a shared machine must slow every approach alike, not one approach's runs."""
    from audiobuffer.cli import bench

    calls = []

    def fake_measure(approach, file_list, timeout, transform=None):
        calls.append(approach)
        seconds = {"loop": 1.0, "audiobuffer-2": 0.5}[approach] + len(calls) / 100
        return bench.Run(approach, seconds, 0.01, 10, 5.0, 100.0, 200.0, 10.0, 5.0, True)

    monkeypatch.setattr(bench, "_measure", fake_measure)
    results = bench.run_bench({"c": ["a.flac", "b.flac"]}, ["loop", "audiobuffer-2"], 3, workdir=tmp_path,
                              progress=False)
    assert calls == ["loop", "audiobuffer-2"] * 3
    rows = {r["approach"]: r for r in results["c"]}
    assert rows["loop"]["total_s"] == 1.03 and rows["audiobuffer-2"]["total_s"] == 0.54  # medians of each's runs


def test_decode_bench_rejects_unknown_approaches(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--approaches", "magic"])
    assert "unknown approaches" in capsys.readouterr().err


def test_stress_quick_checks_pass(tmp_path):
    from audiobuffer.cli.stress import main as stress_main

    out = tmp_path / "stress.json"
    assert stress_main(["--quick", "--shapes", "2x2x4,1x3x1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["lost"] == report["duplicated"] == report["bound_violations"] == 0
    assert report["items_moved"] > 0 and len(report["summary"]) == 2


@pytest.mark.parametrize("impl", ["buffer", "buffer-many", "queue"])
@pytest.mark.parametrize("jitter", [False, True])
def test_stress_round_moves_each_item_once(impl, jitter):
    from audiobuffer.cli.stress import run_round

    result = run_round(impl, producers=3, consumers=2, capacity=3, items=3000 if not jitter else 300, payload=16,
                       jitter=jitter, seed=1)
    assert (result.lost, result.duplicated, result.bound_ok) == (0, 0, True)


def test_stress_shape_errors():
    from audiobuffer.cli.stress import parse_shapes

    assert parse_shapes("1x2x3, 4x5x6") == [(1, 2, 3), (4, 5, 6)]
    for bad in ("1x2", "0x1x1", "axbxc"):
        with pytest.raises(ValueError, match="--shapes"):
            parse_shapes(bad)


def test_cli_dispatches_bench_and_stress():
    result = subprocess.run([sys.executable, "-m", "audiobuffer", "stress", "--quick", "--shapes", "1x1x2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "0 lost, 0 duplicated" in result.stdout
    help_text = subprocess.run([sys.executable, "-m", "audiobuffer", "bench", "--help"], capture_output=True,
                               text=True, timeout=120).stdout
    assert "--fsdd" in help_text and "--quick" in help_text


@pytest.mark.parametrize("script", ["bench_overlap.py", "bench_device.py", "stress_buffer.py"])
def test_scripts_quick_mode(script):
    result = run_script(script, "--quick")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "|" in result.stdout


def test_windows_spawn_failure_is_shown_and_audiobuffer_runs():
    """A script with no __main__ guard and a lambda collate, under spawn: DataLoader workers fail, threads run."""
    failing = run_script("spawn_dataloader.py")
    assert failing.returncode != 0
    assert "pickle" in failing.stderr.lower() or "bootstrapping" in failing.stderr
    working = run_script("spawn_audiobuffer.py")
    assert working.returncode == 0, working.stderr[-2000:]
    assert working.stdout.strip() == f"sum {4 * sum(range(64))}"


def test_short_soak_checks_threads_and_files_stay_flat(tmp_path):
    """CI's short version of the 10-minute soak in BENCHMARKS.md: several passes, same checks."""
    from audiobuffer.cli.stress import main as stress_main

    out = tmp_path / "soak.json"
    assert stress_main(["--quick", "--minutes", "0.05", "--shapes", "2x2x4,3x1x2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passes"] >= 2
    assert report["lost"] == report["duplicated"] == report["bound_violations"] == 0
    assert report["threads_end"] == report["threads_start"]
    assert report["fds_end"] == report["fds_start"]


# -- scripts/bench_contention.py ------------------------------------------------------------------

CONTENTION_APPROACHES = ["step-alone", "step-copy", "step-beside", "loop", "buffered-1", "isolated-2",
                         "dataloader-2", "dataloader-2-spawn"]


@pytest.fixture
def contention(monkeypatch):
    """scripts/bench_contention.py as a module (its sys.path additions undone afterwards)."""
    import importlib.util

    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("bench_contention", REPO / "scripts" / "bench_contention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def markdown_tables(text):
    """Each Markdown table in ``text`` as a list of rows of cells (the header first, the rule left out)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                current.append([cell.strip() for cell in line.strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


def test_contention_transform_is_the_bench_mel_transform(contention):
    """One log-mel for both benchmarks: the contention script's transform is bench's, not a copy."""
    pytest.importorskip("librosa")
    from audiobuffer.cli.bench import mel_transform

    assert contention._transform("mel") is mel_transform
    assert contention._transform(None) is None


def test_contention_bench_quick_fills_every_column(tmp_path):
    """Tiny corpora, one run: every approach gives numbers and each table has one full row per approach."""
    out = tmp_path / "contention.json"
    result = run_script("bench_contention.py", "--quick", "--files", "16", "--corpora", "flac,flac+mel",
                        "--approaches", ",".join(CONTENTION_APPROACHES), "--cache-dir", str(tmp_path),
                        "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    corpora = json.loads(out.read_text())
    assert [c["name"] for c in corpora] == ["flac", "flac+mel"]
    with_transform = [a for a in CONTENTION_APPROACHES if not a.startswith("dataloader")]
    assert [r["approach"] for r in corpora[0]["rows"]] == CONTENTION_APPROACHES
    assert [r["approach"] for r in corpora[1]["rows"]] == with_transform
    for corpus in corpora:
        assert corpus["steps"] == ["light"] and corpus["files"] == 16
        for row in corpus["rows"]:
            m = row["light"]
            assert m["batches"] == 1 and m["files"] == 16, row
            assert m["step_s"] > 0 and m["epoch_s"] > 0 and m["vs_alone"] > 0 and row["peak_rss_mb"] > 50, row
            if row["approach"] == "step-alone":
                assert m["first_batch_s"] is None and m["vs_alone"] == 1.0
            elif row["approach"] in ("step-copy", "step-beside"):  # no loader: decoded before the clock
                assert m["first_batch_s"] is None
            else:
                assert 0 < m["first_batch_s"] <= m["epoch_s"], row

    assert not [p for p in psutil.process_iter(["cmdline"]) if "--neighbour" in (p.info["cmdline"] or [])]
    goals, flac, mel = markdown_tables(result.stdout)
    assert goals[0] == ["goal", "where", "measured", "target", "met"]
    # FLAC: step ratio, epoch against in-process and the same after the first batch, first batch, RSS;
    # mel: step ratio, epoch against threads, and the same after the first batch.
    assert len(goals) == 1 + 8 and {row[-1] for row in goals[1:]} <= {"yes", "**no**"}
    assert any("flac+mel" in row[1] and "BufferedDataset, 1 producer" in row[0] for row in goals[1:])
    for rows, approaches in ((flac, CONTENTION_APPROACHES), (mel, with_transform)):
        assert rows[0] == ["approach", "light: step ms", "light: vs alone", "light: epoch s", "light: first batch ms",
                           "peak RSS MiB (tree)"]
        assert len(rows) == 1 + len(approaches)
        for row, approach in zip(rows[1:], approaches):
            assert len(row) == len(rows[0])
            numbers = [cell.rstrip("x") for cell in row[1:]]
            if approach in ("step-alone", "step-copy", "step-beside"):
                assert numbers[3] == "-"
                del numbers[3]
            assert all(float(n) >= 0 for n in numbers), row


def test_contention_neighbour_ends_with_its_parent(tmp_path):
    """The step-beside neighbour decodes until it is stopped, and never outlives the process that
    started it (a measuring subprocess killed by its timeout, say)."""
    corpus = make_corpus(tmp_path, 4)
    file_list = tmp_path / "files.txt"
    file_list.write_text("\n".join(str(p) for p in corpus))
    starter = (f"import os, sys; sys.path.insert(0, {str(REPO / 'scripts')!r}); from pathlib import Path; "
               f"import bench_contention as b; p = b._start_neighbour(Path({str(file_list)!r}), None); "
               "print(p.pid, flush=True); os._exit(0)")
    log = tmp_path / "starter.log"
    with log.open("w") as out:  # a file, not a pipe: the neighbour inherits it and may hold it open
        status = subprocess.run([sys.executable, "-c", starter], stdout=out, stderr=subprocess.STDOUT, timeout=120)
    assert status.returncode == 0, log.read_text()[-3000:]
    pid = int(log.read_text().split()[-1])
    deadline = time.monotonic() + JOIN_TIMEOUT
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        psutil.Process(pid).kill()
        pytest.fail(f"the neighbour (pid {pid}) outlived its parent by {JOIN_TIMEOUT} s")


def test_contention_goals_are_checked_against_their_targets(contention):
    def row(approach, step_s, epoch_s, first_s, rss):
        return {"approach": approach, "peak_rss_mb": rss,
                "light": {"step_s": step_s, "epoch_s": epoch_s, "first_batch_s": first_s, "vs_alone": step_s / 1e-3}}

    flac = {"name": "flac", "transform": None, "steps": ["light"], "files": 300,
            "rows": [row("step-alone", 1e-3, 0.3, None, 200), row("loop", 2e-3, 1.0, 0.05, 210),
                     row("buffered-2", 3e-3, 0.6, 0.05, 220), row("isolated-2", 1.04e-3, 0.7, 0.3, 300),
                     row("dataloader-2", 1e-3, 0.8, 0.4, 400), row("dataloader-2-spawn", 1e-3, 3.0, 2.0, 500)]}
    mel = {"name": "flac+mel", "transform": "mel", "steps": ["light"], "files": 300,
           "rows": [row("step-alone", 1e-3, 0.3, None, 200), row("loop", 1e-3, 1.0, 1.0, 210),
                    row("buffered-2", 4e-3, 3.0, 0.5, 220), row("isolated-2", 1.2e-3, 2.0, 0.4, 300)]}
    checked = {(goal, where): (measured, met) for goal, where, measured, _, met in contention.goals([flac, mel])}
    assert checked == {
        ("step with IsolatedLoader (2) / step alone", "flac, light step"): ("1.04x", "yes"),
        ("epoch time (2) / best in-process (BufferedDataset, 2 producers)", "flac, light step"): ("1.17x", "**no**"),
        # The helper's start is in the one-epoch figure: the epoch after the first batch, (0.7 - 0.3) / (0.6 - 0.05).
        ("epoch after its first batch (2) / best in-process (BufferedDataset, 2 producers)",
         "flac, light step"): ("0.73x", "yes"),
        ("first batch (2) / DataLoader(2) spawn", "flac, light step"): ("0.15", "yes"),
        ("peak tree RSS (2) / DataLoader(2) fork", "flac"): ("0.75", "**no**"),
        ("step with IsolatedLoader (2) / step alone", "flac+mel, light step"): ("1.20x", "**no**"),
        # With the transform the rivals are the in-process threads, not the loop (which is faster here).
        ("epoch time (2) / best in-process (BufferedDataset, 2 producers)", "flac+mel, light step"): ("0.67x", "yes"),
        ("epoch after its first batch (2) / best in-process (BufferedDataset, 2 producers)",
         "flac+mel, light step"): ("0.64x", "yes"),
    }
    # IsolatedLoader with its default count: checked the same way, each goal named with its count.
    flac["rows"].append(row("isolated-auto", 1.01e-3, 0.5, 0.2, 250))
    checked = {(goal, where): (measured, met) for goal, where, measured, _, met in contention.goals([flac])}
    assert checked[("step with IsolatedLoader (auto) / step alone", "flac, light step")] == ("1.01x", "yes")
    assert checked[("epoch time (auto) / best in-process (BufferedDataset, 2 producers)", "flac, light step")] \
        == ("0.83x", "yes")
    assert checked[("peak tree RSS (auto) / DataLoader(2) fork", "flac")] == ("0.62", "**no**")
    assert checked[("epoch after its first batch (auto) / best in-process (BufferedDataset, 2 producers)",
                    "flac, light step")] == ("0.55x", "yes")
    assert len(checked) == 10


def test_contention_flags(contention, tmp_path, capsys):
    for argv, message in ((["--quick", "--write"], "--write takes a full run"),
                          (["--approaches", "magic"], "--approaches takes"),
                          (["--corpora", "flac,ogg"], "--corpora takes"),
                          (["--files", "3"], "--files >= 16"),
                          (["--device", "tpu"], "--device must be cpu or cuda, got 'tpu'")):
        with pytest.raises(SystemExit):
            contention.main(argv)
        assert message in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            contention.main(["--device", "cuda"])
        assert "--device cuda: torch sees no CUDA device here" in capsys.readouterr().err
    # No FSDD where it is looked for: that corpus is left out with a note, and nothing runs.
    assert contention.main(["--corpora", "fsdd", "--fsdd", str(tmp_path / "absent")]) == 0
    captured = capsys.readouterr()
    assert "FSDD not found" in captured.err and "## Contention" in captured.out
    assert markdown_tables(captured.out) == []


def _words(text: str) -> str:
    """``text`` with every run of white space (argparse's line wrapping) made one space."""
    return " ".join(text.split())


# -- audiobuffer bench without its extra, and on Windows (no resource module) -----------------------

# Makes `resource` (Unix-only) and `psutil` (the bench extra) unimportable, as on Windows and in a plain
# install, then runs the command line given in argv.
_NO_EXTRA = ("import sys; sys.modules['resource'] = None; sys.modules['psutil'] = None; "
             "import audiobuffer.cli.bench; from audiobuffer.cli.main import main; sys.exit(main(sys.argv[1:]))")


def test_bench_starts_and_prints_help_without_resource_and_psutil():
    result = subprocess.run([sys.executable, "-c", _NO_EXTRA, "bench", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "--quick" in result.stdout and 'pip install "audiobuffer[bench]"' in _words(result.stdout)


def test_bench_without_psutil_names_the_extra_in_one_line():
    result = subprocess.run([sys.executable, "-c", _NO_EXTRA, "bench", "--quick", "--approaches", "loop"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "psutil" in line and 'pip install "audiobuffer[bench]"' in line


def test_bench_plot_without_matplotlib_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert bench_main(["--quick", "--plot", str(tmp_path / "p.png"), "--cache-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and 'pip install "audiobuffer[bench]"' in err
    assert not list(tmp_path.iterdir())  # it stopped before making a corpus


# -- CPU % over one window --------------------------------------------------------------------------

_BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass"


def _max_cpu_percent() -> float:
    # CPU time cannot pass cores x wall time over one window; the slack is for the kernel's
    # CPU-time accounting granularity (a few ms per process), not for timing.
    return 100.0 * usable_cores() * 1.05 + 10.0


def _burn(processes: int, seconds: float) -> None:
    """Run ``processes`` child processes that each burn ``seconds`` of CPU, and reap them."""
    procs = [subprocess.Popen([sys.executable, "-c", _BURN.format(seconds=seconds)]) for _ in range(processes)]
    for proc in procs:
        proc.wait(timeout=120)


class _WorkersJoinedOnRelease:
    """A loader whose one batch comes at once and whose worker processes do their work when it is
    released, as DataLoader's workers are joined when its iterator goes away."""

    def __init__(self) -> None:
        self.done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.done:
            raise StopIteration
        self.done = True
        return {"path": ["a.wav"], "lengths": torch.tensor([8000]), "sample_rate": torch.tensor([8000])}

    def __del__(self):
        _burn(usable_cores() + 1, 0.3)


@pytest.mark.skipif(sys.platform == "win32", reason="worker CPU time is counted through resource (Unix)")
def test_cpu_percent_covers_the_same_window_as_wall_time():
    """Workers' CPU time spent while they are joined is inside the wall window too: CPU % stays
    within 100 per usable core (it read several hundred per cent when the wall clock stopped at the
    last batch and the CPU clock after the join)."""
    measured = measure_epoch(_WorkersJoinedOnRelease)
    assert measured["files"] == 1
    assert measured["cpu_s"] >= 0.9 * (usable_cores() + 1) * 0.3  # the workers' CPU time is counted
    assert measured["window_s"] >= measured["total_s"]
    assert 100.0 * measured["cpu_s"] / measured["window_s"] <= _max_cpu_percent()


@pytest.mark.skipif(sys.platform == "win32", reason="worker CPU time is counted through resource (Unix)")
def test_cpu_percent_of_an_oversubscribed_window_is_bounded_by_the_cores():
    def busy_epoch():
        _burn(usable_cores() + 1, 0.3)  # more busy processes than cores, inside the epoch
        yield {"path": ["a.wav"], "lengths": torch.tensor([8000]), "sample_rate": torch.tensor([8000])}

    measured = measure_epoch(busy_epoch)
    assert measured["cpu_s"] >= 0.9 * (usable_cores() + 1) * 0.3
    assert 100.0 * measured["cpu_s"] / measured["window_s"] <= _max_cpu_percent()


# -- help texts ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["bench", "stress"])
def test_help_has_no_rest_markup(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--json" in text
    for markup in ("``", ":class:", ":func:", ":meth:", ":mod:"):
        assert markup not in text


def test_stress_says_its_units_and_what_jittered_means(capsys):
    with pytest.raises(SystemExit):
        cli_main(["stress", "--help"])
    help_text = _words(capsys.readouterr().out)
    assert "items per second" in help_text and "Jittered rounds make each producer and consumer pause" in help_text
    from audiobuffer.cli.stress import main as stress_main

    assert stress_main(["--quick", "--shapes", "1x1x2", "--items", "200"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0]
    assert header.count("items/s") == 4
    assert "Jittered rounds make each producer and consumer pause" in out


def test_loop_libsndfile_reads_wav_through_libsndfile(tmp_path, monkeypatch):
    """The baseline of the issue's targets: the loop as it was before AudioDecoder's own WAV reader."""
    from audiobuffer.cli.bench import loader
    from audiobuffer.decoders import audio as audio_module

    monkeypatch.setattr(audio_module, "_NATIVE_WAV", True)  # restored after the test
    path = write_tone(tmp_path / "a.wav")
    native = next(loader("loop", [str(path)]))
    assert audio_module._NATIVE_WAV is True
    plain = next(loader("loop-libsndfile", [str(path)]))
    assert audio_module._NATIVE_WAV is False
    assert np.array_equal(native["audio"].numpy(), plain["audio"].numpy())


def test_epochs_bench_runs_every_setting_for_every_epoch(tmp_path):
    result = run_script("bench_epochs.py", "--files", "16", "--epochs", "2", "--rounds", "1",
                        "--fsdd", str(tmp_path / "absent"), "--cache-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FSDD not found" in result.stderr
    tables = markdown_tables(result.stdout)
    assert len(tables) == 2  # FLAC and WAV
    loops = ["plain loop (same decoder, one thread)", "soundfile loop (WAV through libsndfile too)"]
    spdl = ["`spdl.io.load_wav` loop"] if importlib.util.find_spec("spdl") is not None else []
    for rows, wav in zip(tables, (False, True)):  # FLAC, then WAV (SPDL's loop reads WAV only)
        assert rows[0] == ["setting", "epoch 1 s", "epoch 2 s", "epoch 2 vs best fixed",
                           "epoch 2: soundfile loop / this"]
        assert [r[0] for r in rows[1:]] == ["`auto` (the default)", "1 producer", "2 producers"] + loops + (
            spdl if wav else [])
        for row in rows[1:]:
            assert float(row[1]) > 0 and float(row[2]) > 0 and float(row[4].rstrip("x")) > 0
            assert row[3] == "-" if "loop" in row[0] else float(row[3].rstrip("x")) > 0
        assert rows[5][4] == "1.00x"  # the soundfile loop against itself


# -- scripts/bench_free_threaded.py ------------------------------------------------------------------

@pytest.mark.skipif(bool(__import__("sysconfig").get_config_var("Py_GIL_DISABLED")),
                    reason="this interpreter is a free-threaded build")
def test_free_threaded_bench_refuses_an_interpreter_that_cannot_turn_the_gil_off():
    result = run_script("bench_free_threaded.py", "--quick")
    assert result.returncode == 2
    assert "cannot turn the GIL off: run this script with a free-threaded build" in result.stderr


@pytest.mark.parametrize("approach", ["soundfile-loop", "loop", "pool-1", "pool-2", "pool-auto"])
def test_free_threaded_bench_child_decodes_every_file_once_without_torch(tmp_path, approach):
    paths = make_corpus(tmp_path / "corpus", 40)
    file_list = tmp_path / "files.txt"
    file_list.write_text("\n".join(map(str, paths)), encoding="utf-8")
    # The child as the script runs it, in a fresh process that must not import torch (a free-threaded
    # interpreter has none): a finder that refuses it makes any import of torch fail the child.
    guard = ("import sys, runpy\n"
             "class NoTorch:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name == 'torch' or name.startswith('torch.'):\n"
             "            raise ImportError('torch imported')\n"
             "sys.meta_path.insert(0, NoTorch())\n"
             f"sys.argv = ['bench_free_threaded.py', '--child', {approach!r}, '--file-list', {str(file_list)!r}]\n"
             "try:\n"
             f"    runpy.run_path({str(REPO / 'scripts' / 'bench_free_threaded.py')!r}, run_name='__main__')\n"
             "except SystemExit as exit:\n"
             "    assert not exit.code, exit.code\n"
             "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules), 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", guard], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["seconds"] > 0 and report["gil_enabled"] is True  # this interpreter has a GIL
    assert report["producers"] == {"pool-1": 1, "pool-2": 2}.get(approach, report["producers"])


def test_free_threaded_bench_tables(monkeypatch):
    import importlib.util

    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("bench_free_threaded", REPO / "scripts" / "bench_free_threaded.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = {f"{gil}/{approach}": {"seconds": seconds, "gil_enabled": [gil == "on"], "producers": [0]}
            for gil, scale in (("on", 1.0), ("off", 0.5))
            for approach, seconds in zip(module.APPROACHES, [scale * s for s in (0.4, 0.1, 0.3, 0.2, 0.1)])}
    text = module.markdown({"FSDD, 3000 real recordings (WAV, 8 kHz)": rows}, runs=5)
    assert "### FSDD, 3000 real recordings (WAV, 8 kHz)" in text
    assert "GIL as reported: on [True], off [False]." in text
    assert "| pool-2 | 0.200 | 2.00x | 0.100 | 2.00x | 2.00x |  |" in text
    assert "| pool-auto | 0.100 | 4.00x | 0.050 | 4.00x | 2.00x | on [0], off [0] |" in text


def test_bench_file_lists_are_utf8_where_the_locale_is_cp1252(monkeypatch, tmp_path):
    """The corpus's file list and the child's result go through files: written and read as UTF-8 with
    \\n, they carry any file name on Windows (cp1252 locale, \\r\\n text files) too."""
    from audiobuffer.cli import bench

    windows_text_files(monkeypatch)
    paths = [str(tmp_path / "7_b\u0142\u0105d_\u65e5\u672c.wav"), str(tmp_path / "plain.wav")]
    seen = []

    def fake_child(approach, child_paths, transform_name=None):
        seen.append(child_paths)
        return {"total_s": 1.0, "first_batch_s": 0.1, "files": len(child_paths), "first_files": 1, "audio_s": 2.0,
                "cpu_s": 0.5, "window_s": 1.0, "gil_enabled": True}

    def in_process(cmd, timeout):  # the child's command line, run here
        assert cmd[1:3] == ["-m", "audiobuffer.cli.bench"]
        return bench.main(cmd[3:]), "", 2**20

    monkeypatch.setattr(bench, "_child", fake_child)
    monkeypatch.setattr(bench, "run_with_peak_rss", in_process)
    results = bench.run_bench({"names": paths}, ["loop"], 1, workdir=tmp_path, progress=False)
    assert seen == [paths] and results["names"][0]["files"] == 2
    assert all(b"\r" not in f.read_bytes() for f in tmp_path.iterdir() if f.is_file())


def test_stress_says_open_files_are_not_measured_where_it_cannot_count_them(monkeypatch, tmp_path, capsys):
    """Without /proc/self/fd (Windows, macOS) the report says so instead of printing -1 / -1 / -1."""
    from audiobuffer.cli.stress import main as stress_main

    real_listdir = os.listdir

    def no_proc(path="."):
        if str(path).startswith("/proc"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", no_proc)
    out = tmp_path / "stress.json"
    assert stress_main(["--quick", "--shapes", "1x1x2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "open files not measured here" in printed and "-1" not in printed
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["fds_start"] is report["fds_peak"] is report["fds_end"] is None


@pytest.mark.parametrize("quick, files", [(True, 40), (False, 45)])
def test_bench_names_the_fsdd_corpus_by_the_files_it_measures(monkeypatch, tmp_path, quick, files):
    from audiobuffer.cli import bench

    fsdd = tmp_path / "fsdd"
    for i in range(45):
        write_tone(fsdd / f"{i % 10}_speaker_{i}.wav", seconds=0.01, sample_rate=8000)
    measured = {}
    monkeypatch.setattr(bench, "run_bench", lambda corpora, *args, **kwargs: measured.update(corpora) or {})
    monkeypatch.setattr(bench, "markdown", lambda results: "")
    args = ["--formats", "wav", "--files", "2", "--fsdd", str(fsdd), "--cache-dir", str(tmp_path / "cache")]
    assert bench.main(args + (["--quick"] if quick else [])) == 0
    (name,) = [n for n in measured if n.startswith("FSDD")]
    assert name.startswith(f"FSDD, {files} real recordings") and len(measured[name]) == files
