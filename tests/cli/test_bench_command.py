"""``audiobuffer bench`` and ``audiobuffer stress`` (audiobuffer/cli/bench.py, stress.py): smoke runs and their
rules; speed is measured by the benchmarks, never asserted here."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import windows_text_files, write_tone

from audiobuffer.cli.bench import main as bench_main
from audiobuffer.cli.bench import measure_epoch, usable_cores
from audiobuffer.cli.main import main as cli_main

pytestmark = pytest.mark.timeout(400)


def test_decode_bench_quick_counts_every_file(tmp_path):
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    # --max-minutes: a quick run's 3 minutes can run out on a busy machine, leaving rows out
    status = bench_main(["--quick", "--formats", "flac", "--approaches", "loop,audiobuffer-2,dataloader-1",
                         "--json", str(out), "--plot", str(plot), "--cache-dir", str(tmp_path),
                         "--max-minutes", "60"])
    assert status == 0
    (rows,) = json.loads(out.read_text()).values()
    assert [r["approach"] for r in rows] == ["loop", "audiobuffer-2", "dataloader-1"]
    for r in rows:
        assert r["files"] == 40 and r["audio_s"] > 40 and r["peak_rss_mb"] > 50
        assert 0 < r["first_batch_s"] <= r["total_s"] and r["vs_loop"] > 0
        assert 0 < r["cpu_percent"] <= _max_cpu_percent()
    assert plot.stat().st_size > 10_000


def test_mel_transform_keeps_the_audio_duration():
    pytest.importorskip("librosa")
    from audiobuffer.cli.bench import N_MELS, mel_transform

    sample = mel_transform({"audio": np.zeros(16000, dtype=np.float32), "sample_rate": 16000, "num_frames": 16000})
    assert sample["audio"].shape == (N_MELS, sample["num_frames"]) and sample["audio"].dtype == np.float32
    assert sample["seconds"] == 1.0 and sample["num_frames"] == 101


def test_bench_corpus_rules(capsys):
    """The peers' rules (a WAV-only peer, their versions in the header): in
    project/test_benchmark_scripts.py."""
    from audiobuffer.cli.bench import LINEUP, gil_line

    assert LINEUP.applies("loop", ["a.flac"], "mel") and LINEUP.applies("isolated-2", ["a.wav"], None)
    rows = {"c": [{"approach": "loop", "gil_enabled": False}, {"approach": "isolated-2", "gil_enabled": True}]}
    line = gil_line(rows)
    assert "GIL disabled, but enabled by an import in: isolated-2. Packages: " in line and "Peers" not in line
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

    def fake_measure(approach, file_list, timeout, transform=None, lineup=None):
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


def test_bench_points_to_the_benchmark_that_compares_peers(capsys):
    """The peers left the wheel: asking the command for one names the benchmark that measures it."""
    with pytest.raises(SystemExit):
        bench_main(["--approaches", "loop,torchdata-2"])
    err = _words(capsys.readouterr().err)
    assert "unknown approaches ['torchdata-2']" in err and "benchmarks/bench_decode.py" in err
    with pytest.raises(SystemExit):
        bench_main(["--help"])
    assert "benchmarks/bench_decode.py" in _words(capsys.readouterr().out)


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


@pytest.mark.timeout(120)
def test_cli_dispatches_bench_and_stress(cli):
    result = cli("stress", "--quick", "--shapes", "1x1x2")
    assert result.returncode == 0 and "0 lost, 0 duplicated" in result.stdout
    help_text = cli("bench", "--help").stdout
    assert "--fsdd" in help_text and "--quick" in help_text


def test_short_soak_checks_threads_and_files_stay_flat(tmp_path):
    """CI's short version of the 10-minute soak in BENCHMARKS.md: several passes, same checks."""
    from audiobuffer.cli.stress import main as stress_main

    out = tmp_path / "soak.json"
    # A pass of 500 items takes about 0.1 s: 1.2 s holds several, also on a busy machine.
    assert stress_main(["--items", "500", "--rounds", "1", "--minutes", "0.02", "--shapes", "2x2x4,3x1x2",
                        "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passes"] >= 2
    assert report["lost"] == report["duplicated"] == report["bound_violations"] == 0
    assert report["threads_end"] == report["threads_start"]
    assert report["fds_end"] == report["fds_start"]


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
    """The baseline of the targets: the loop as it was before AudioDecoder's own WAV reader."""
    from audiobuffer.cli.bench import loader
    from audiobuffer.decoders import _wav

    native_reads = []
    read_wav = _wav.read_wav
    monkeypatch.setattr(_wav, "read_wav", lambda *a, **k: native_reads.append(1) or read_wav(*a, **k))
    path = write_tone(tmp_path / "a.wav")
    native = next(loader("loop", [str(path)]))
    assert len(native_reads) == 1
    plain = next(loader("loop-libsndfile", [str(path)]))
    assert len(native_reads) == 1  # libsndfile read it
    assert np.array_equal(native["audio"].numpy(), plain["audio"].numpy())
    assert len(native_reads) == 1 and next(loader("loop", [str(path)])) is not None
    assert len(native_reads) == 2  # the choice was the decoder's: the next loop reads natively again


def test_bench_file_lists_are_utf8_where_the_locale_is_cp1252(monkeypatch, tmp_path):
    """The corpus's file list and the child's result go through files: written and read as UTF-8 with
    \\n, they carry any file name on Windows (cp1252 locale, \\r\\n text files) too."""
    from audiobuffer.cli import bench

    windows_text_files(monkeypatch)
    paths = [str(tmp_path / "7_b\u0142\u0105d_\u65e5\u672c.wav"), str(tmp_path / "plain.wav")]
    seen = []

    def fake_child(approach, child_paths, transform_name=None, lineup=None):
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
    monkeypatch.setattr(bench, "markdown", lambda results, lineup=None: "")
    args = ["--formats", "wav", "--files", "2", "--fsdd", str(fsdd), "--cache-dir", str(tmp_path / "cache")]
    assert bench.main(args + (["--quick"] if quick else [])) == 0
    (name,) = [n for n in measured if n.startswith("FSDD")]
    assert name.startswith(f"FSDD, {files} real recordings") and len(measured[name]) == files


def test_the_package_imports_no_peer():
    """Other libraries' loaders are compared by benchmarks/bench_decode.py, out of the wheel."""
    import re

    from helpers import REPO

    peers = re.compile(r"^\s*(?:import|from)\s+(torchdata|prefetch_generator|spdl)\b", re.M)
    found = [str(path.relative_to(REPO)) for path in sorted((REPO / "audiobuffer").rglob("*.py"))
             if peers.search(path.read_text(encoding="utf-8"))]
    assert found == []


def _fake_bench(monkeypatch, seconds_per_run=1.0):
    """bench.main with every measurement faked (``seconds_per_run`` on a fake clock) and corpora unwritten:
    the formats asked for and the approaches measured are recorded."""
    from types import SimpleNamespace

    from audiobuffer.cli import bench

    clock, seen = [0.0], {"formats": None, "measured": []}

    def fake_measure(approach, file_list, timeout, transform=None, lineup=None):
        clock[0] += seconds_per_run
        seen["measured"].append(approach)
        return bench.Run(approach, 1.0, 0.01, 10, 5.0, 100.0, 200.0, 10.0, 5.0, True)

    def fake_corpora(formats, files, folder):
        seen["formats"] = formats
        return {f"{fmt} corpus": [f"{i}.{fmt}" for i in range(files)] for fmt, _ in formats}, {}

    monkeypatch.setattr(bench, "_measure", fake_measure)
    monkeypatch.setattr(bench, "generated_corpora", fake_corpora)
    monkeypatch.setattr(bench, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    return bench, seen


@pytest.mark.parametrize("load, verdict", [(8.0, "machine busy: times and ratios are noisy"),
                                           (0.3, "machine quiet")])
def test_bench_says_how_busy_the_machine_was_and_how_far_to_trust_the_figures(monkeypatch, capsys, tmp_path,
                                                                              load, verdict):
    bench, _ = _fake_bench(monkeypatch)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load), raising=False)
    monkeypatch.setattr("audiobuffer.options.usable_cores", lambda: 2)
    assert bench.main(["--approaches", "loop", "--runs", "1", "--files", "2", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"Machine: load average {load:.2f} on 2 usable cores before" in out and verdict in out
    assert "smoke run" not in out
    assert bench.main(["--quick", "--approaches", "loop", "--cache-dir", str(tmp_path)]) == 0
    assert "a --quick smoke run checks that everything runs, its ratios are not measurements" in capsys.readouterr().out


def test_machine_load_without_a_load_average(monkeypatch):
    """Windows has no os.getloadavg: psutil's busy share where it is installed, else 'unknown'."""
    from audiobuffer.cli._measure import machine_load, trust_line

    monkeypatch.delattr(os, "getloadavg", raising=False)
    load, words = machine_load()
    assert 0 <= load <= 1 and words.startswith("CPU ") and words.endswith("% busy")
    monkeypatch.setitem(sys.modules, "psutil", None)
    assert machine_load() == (None, "load unknown (no load average here, and psutil is not installed)")
    assert "how far to trust the figures is unknown" in trust_line(machine_load(), machine_load())
    trust_line(machine_load(), machine_load()).encode("cp1252")  # a Windows console prints it


def test_bench_quick_measures_one_corpus_and_stops_at_its_time_budget(monkeypatch, capsys, tmp_path):
    bench, seen = _fake_bench(monkeypatch, seconds_per_run=50.0)
    assert bench.main(["--quick", "--cache-dir", str(tmp_path)]) == 0
    assert seen["formats"] == [("flac", None)]  # FLAC only, no mel transform
    # 3 minutes of 50 s measurements: four start (the last at 150 s), the others are named, not run.
    assert seen["measured"] == list(bench.QUICK_APPROACHES[:4])
    out = capsys.readouterr().out
    left = ", ".join(f"flac corpus: {a}" for a in bench.QUICK_APPROACHES[4:])
    assert f"Not measured: the 3 minutes of --max-minutes were spent before {left}." in out


def test_stress_says_how_busy_the_machine_was(tmp_path, capsys):
    from audiobuffer.cli.stress import main as stress_main

    out = tmp_path / "stress.json"
    assert stress_main(["--quick", "--shapes", "1x1x2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["load"].startswith("Machine: ") and report["load"] in printed
    assert "its ratios are not measurements" in report["load"]
