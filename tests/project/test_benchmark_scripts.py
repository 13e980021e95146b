"""The benchmarks in benchmarks/ and their shared harness (smoke runs: speed is measured by the benchmarks,
never asserted here)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import torch
from helpers import (
    JOIN_TIMEOUT,
    REPO,
    command_state_kept,
    isolated_leftovers,
    make_corpus,
    windows_text_files,
    write_tone,
)

pytestmark = pytest.mark.timeout(400)

BENCHMARKS = REPO / "benchmarks"


@pytest.fixture
def load_benchmark(monkeypatch):
    """``load_benchmark(name)``: benchmarks/NAME.py as a module, with benchmarks/ on ``sys.path`` (where a
    benchmark run as a script finds the harness) until the test ends."""
    monkeypatch.setattr(sys, "path", [str(BENCHMARKS)] + sys.path)

    def load(name):
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def run_bench(load_benchmark, capsys):
    """``run_bench(NAME, *args)``: benchmarks/NAME's ``main(args)`` in this process (what
    :func:`helpers.command_state_kept` keeps put back after), as ``subprocess.run`` gives it:
    ``returncode``, ``stdout``, ``stderr``. For the scripts whose process is not what a test
    looks at: it saves each a start of Python and torch."""

    def run(name, *args):
        module = load_benchmark(name.removesuffix(".py"))
        capsys.readouterr()
        try:
            with command_state_kept():
                status = module.main([str(arg) for arg in args])
        except SystemExit as exc:  # argparse's errors
            status = exc.code
        out, err = capsys.readouterr()
        if isinstance(status, str):  # sys.exit("message"), as the interpreter shows it
            status, err = 1, f"{err}{status}\n"
        return subprocess.CompletedProcess([name, *args], status or 0, out, err)

    return run


def run_script(name, *args):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(BENCHMARKS / name), *args], capture_output=True, text=True,
                          timeout=360, env=env)


#: The approaches added beside the first ones (peers whose package is missing are left out).
NEW_APPROACHES = ["loop", "loop-libsndfile", "audiobuffer-auto", "isolated-2", "spdl-pipeline-2", "spdl-load_wav"]


#: The approaches the log-mel corpus runs in the smoke test: the transform reaches every other
#: one the same way (``decoding(transform)``), and the helper's import of it by reference is
#: isolated-2's.
MEL_APPROACHES = ["loop", "audiobuffer-auto", "isolated-2"]


@pytest.mark.parametrize("formats, approaches",
                         [("wav", NEW_APPROACHES), ("flac+mel", MEL_APPROACHES)],
                         ids=["wav", "flac+mel"])
def test_decode_bench_quick_fills_every_row_of_the_new_approaches_and_corpora(
        tmp_path, load_benchmark, formats, approaches):
    """WAV, and FLAC + mel, tiny: each approach that is installed and applies has numbers in its
    row."""
    if formats.endswith("+mel"):
        pytest.importorskip("librosa")
    from audiobuffer.cli.bench import gil_enabled

    decode = load_benchmark("bench_decode")
    available = decode.LINEUP.available
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    # --max-minutes: a quick run's 3 minutes can run out on a busy machine, leaving rows out
    status = decode.run(["--quick", "--formats", formats, "--approaches", ",".join(approaches),
                         "--json", str(out), "--markdown", str(md), "--cache-dir", str(tmp_path),
                         "--max-minutes", "60"])
    assert status == 0
    [(name, rows)] = json.loads(out.read_text()).items()
    assert name.startswith("WAV") if formats == "wav" else "log-mel" in name
    installed = [a for a in approaches if available(a)]
    assert [r["approach"] for r in rows] == installed  # FLAC + mel: no load_wav asked
    for r in rows:
        # audio_s counts seconds of audio, also where the transform replaced it with a spectrogram
        assert r["files"] == 40 and r["audio_s"] > 40 and r["peak_rss_mb"] > 50, r
        assert 0 < r["first_batch_s"] <= r["total_s"] and r["vs_loop"] > 0 and r["steady_files_per_s"] > 0, r
        assert r["gil_enabled"] is gil_enabled()
    header = md.read_text().splitlines()[0]
    assert header.startswith("Python ") and ("GIL enabled" if gil_enabled() else "GIL disabled") in header
    tables = markdown_tables(md.read_text())
    assert [len(t) - 1 for t in tables] == [len(rows)]


def test_load_wav_does_not_apply_to_flac_or_a_transform(load_benchmark):
    """spdl-load_wav reads WAV files only, without a transform: the log-mel corpus leaves it out."""
    lineup = load_benchmark("bench_decode").LINEUP
    assert lineup.applies("spdl-load_wav", ["a.wav"], None)
    assert not lineup.applies("spdl-load_wav", ["a.flac"], None)
    assert not lineup.applies("spdl-load_wav", ["a.wav"], "mel")


@pytest.mark.parametrize("subtype,channels", [("PCM_16", 1), ("PCM_16", 2), ("PCM_32", 1), ("PCM_U8", 1)])
def test_spdl_load_wav_sample_equals_audio_decoder(tmp_path, subtype, channels, load_benchmark):
    """The load_wav peer returns what AudioDecoder does (libsndfile's int -> float scaling, mono mean)."""
    pytest.importorskip("spdl.io")
    from audiobuffer import AudioDecoder

    decode = load_benchmark("bench_decode")
    path = str(write_tone(tmp_path / "a.wav", seconds=0.3, channels=channels, subtype=subtype))
    ours, theirs = AudioDecoder()(path), decode.load_wav(path, 0)
    assert theirs["audio"].dtype == ours["audio"].dtype
    assert np.array_equal(theirs["audio"].numpy(), ours["audio"].numpy())
    assert (theirs["sample_rate"], theirs["num_frames"]) == (ours["sample_rate"], ours["num_frames"])


@pytest.mark.timeout(120)
def test_spdl_pipeline_yields_every_file_once_and_stops_its_thread(tmp_path, load_benchmark):
    pytest.importorskip("spdl.pipeline")
    from audiobuffer.cli.bench import BATCH_SIZE

    decode = load_benchmark("bench_decode")
    paths = [str(p) for p in make_corpus(tmp_path, 2 * BATCH_SIZE + 3)]
    before = threading.active_count()
    batches = list(decode.LINEUP.loader("spdl-pipeline-2", paths))
    assert sorted(len(b["path"]) for b in batches) == [3, BATCH_SIZE, BATCH_SIZE]
    assert sorted(p for b in batches for p in b["path"]) == sorted(paths)
    deadline = time.monotonic() + JOIN_TIMEOUT  # SPDL's event-loop thread is joined by auto_stop()
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before, threading.enumerate()


@pytest.mark.parametrize("script", ["bench_overlap.py", "bench_device.py"])
def test_scripts_quick_mode(script, run_bench):
    result = run_bench(script, "--quick")
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


# -- benchmarks/bench_contention.py ---------------------------------------------------------------

CONTENTION_APPROACHES = ["step-alone", "step-copy", "step-beside", "loop", "buffered-1", "isolated-2",
                         "dataloader-2", "dataloader-2-spawn"]


@pytest.fixture
def contention(load_benchmark):
    """benchmarks/bench_contention.py as a module."""
    return load_benchmark("bench_contention")


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


# What the goals compare, in a measuring subprocess each: the other approaches run in-process
# below.
CONTENTION_MEASURED = ["step-alone", "buffered-1", "isolated-2", "dataloader-2-spawn"]


# Both look for --neighbour processes on the whole system: in one worker, they cannot see each other's.
@pytest.mark.xdist_group("contention-neighbours")
def test_contention_bench_quick_fills_every_column(tmp_path, contention):
    """Tiny corpora, one run: every approach the goals compare gives numbers, each table has one
    full row per approach, and every goal is checked."""
    out = tmp_path / "contention.json"
    result = run_script("bench_contention.py", "--quick", "--files", "16", "--corpora", "flac,flac+mel",
                        "--approaches", ",".join(CONTENTION_MEASURED), "--cache-dir", str(tmp_path),
                        "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    corpora = json.loads(out.read_text())
    assert [c["name"] for c in corpora] == ["flac", "flac+mel"]
    with_transform = [a for a in CONTENTION_MEASURED if not a.startswith("dataloader")]
    assert [r["approach"] for r in corpora[0]["rows"]] == CONTENTION_MEASURED
    assert [r["approach"] for r in corpora[1]["rows"]] == with_transform
    for corpus in corpora:
        assert corpus["steps"] == ["light"] and corpus["files"] == 16
        for row in corpus["rows"]:
            m = row["light"]
            assert m["batches"] == 1 and m["files"] == 16, row
            assert m["step_s"] > 0 and m["epoch_s"] > 0 and m["vs_alone"] > 0 and row["peak_rss_mb"] > 50, row
            if row["approach"] == "step-alone":
                assert m["first_batch_s"] is None and m["vs_alone"] == 1.0
            else:
                assert 0 < m["first_batch_s"] <= m["epoch_s"], row

    section, goals = markdown_tables(result.stdout)
    assert goals[0] == ["goal", "where", "measured", "target", "met"]
    # FLAC: step ratio, epoch against in-process and the same after the first batch, first batch;
    # mel: step ratio, epoch against threads, and the same after the first batch.
    assert len(goals) == 1 + 7 and {row[-1] for row in goals[1:]} <= {"yes", "**no**"}
    assert any("flac+mel" in row[1] and "BufferedDataset, 1 producer" in row[0] for row in goals[1:])
    # The section: a row per approach, the light step against the step alone on each corpus of this run
    header, rows = section[0], {row[0]: row for row in section[1:]}
    flac, mel = header.index("CPU: FLAC"), header.index("CPU: FLAC + log-mel")
    for approach in CONTENTION_MEASURED:
        row = rows[contention.LABELS[approach]]
        assert float(row[flac].rstrip("x")) > 0, row
        assert row[mel] == "-" if approach.startswith("dataloader") else float(row[mel].rstrip("x")) > 0, row
    assert rows[contention.LABELS["step-alone"]][flac] == "1.00x"


@pytest.mark.xdist_group("contention-neighbours")
@pytest.mark.parametrize("approach", sorted(set(CONTENTION_APPROACHES) - set(CONTENTION_MEASURED)))
def test_contention_epoch_of_each_other_approach(tmp_path, contention, approach):
    """The epoch a measuring subprocess runs, here in-process: every file once, and a first batch
    only where a loader made it (step-beside's neighbour is ended with the epoch)."""
    paths = [str(p) for p in make_corpus(tmp_path, 2 * contention.BATCH_SIZE)]
    file_list = tmp_path / "files.txt"
    file_list.write_text("\n".join(paths))
    with command_state_kept():
        m = contention._epoch(approach, "light", paths, None, "cpu", file_list)
    assert m["batches"] == 2 and m["files"] == len(paths) and m["step_s"] > 0, m
    assert (m["first_batch_s"] is None) == approach.startswith("step-"), m
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "--neighbour" in (p.info["cmdline"] or [])]


@pytest.mark.xdist_group("contention-neighbours")
def test_contention_neighbour_ends_with_its_parent(tmp_path):
    """The step-beside neighbour decodes until it is stopped, and never outlives the process that
    started it (a measuring subprocess killed by its timeout, say)."""
    corpus = make_corpus(tmp_path, 4)
    file_list = tmp_path / "files.txt"
    file_list.write_text("\n".join(str(p) for p in corpus))
    starter = (f"import os, sys; sys.path.insert(0, {str(BENCHMARKS)!r}); from pathlib import Path; "
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


@pytest.fixture
def photo_paths(load_benchmark, tmp_path):
    """70 JPEGs of the image benchmark's corpus (made from the photographs packages ship)."""
    pytest.importorskip("PIL.Image")
    images = load_benchmark("bench_images")
    if not images.shipped_photos():
        pytest.skip("no shipped photographs: scikit-learn and matplotlib are not installed")
    return sorted(str(p) for p in images.make_photo_corpus(tmp_path, 70, classes=images.CLASSES)
                  .rglob("*.jpg"))


def test_contention_image_case_feeds_the_step_and_checks_steps_per_s(contention, photo_paths):
    """The image case: a loader's epoch of 64-image batches in this process, the goal on steps/s."""
    paths = photo_paths
    epoch = contention._epoch("buffered-2", "light", paths, None, "cpu", images=True)
    assert epoch["batches"] == 2 and epoch["files"] == 70 and epoch["steps_per_s"] > 0
    # and the loader's next epoch, as training iterates it again
    assert epoch["warm_epoch_s"] > 0 and epoch["warm_steps_per_s"] == pytest.approx(
        2 / epoch["warm_epoch_s"])

    def row(approach, steps_per_s, warm=None):
        return {"approach": approach, "peak_rss_mb": 300,
                "heavy": {"step_s": 5e-3, "epoch_s": 2 / steps_per_s, "steps_per_s": steps_per_s,
                          "first_batch_s": 0.5, "vs_alone": 1.0, "warm_steps_per_s": warm}}

    jpeg = {"name": "jpeg", "transform": None, "steps": ["heavy"], "files": 640,
            "rows": [row("isolated-2", 3.0, 4.0), row("dataloader-2", 2.0, 2.5),
                     row("isolated-2-torch", 1.0, 5.0)]}
    checked = {goal: (measured, met) for goal, _, measured, _, met in contention.goals([jpeg])}
    assert checked["steps/s (2) / DataLoader(2) fork"] == ("1.50x", "yes")
    assert checked["next epoch's steps/s (2) / DataLoader(2) fork's"] == ("1.60x", "yes")
    assert checked["steps/s (2-torch) / DataLoader(2) fork"] == ("0.50x", "**no**")
    assert checked["next epoch's steps/s (2-torch) / DataLoader(2) fork's"] == ("2.00x", "yes")


@pytest.mark.subprocess
def test_contention_image_case_isolated_loader_starting_in_the_trainer(
        contention, photo_paths, monkeypatch):
    """``isolated-2-torch-start``: both epochs of an IsolatedLoader that decodes in the trainer
    until its helper is warm, every image once each, nothing left behind."""
    paths = photo_paths
    with isolated_leftovers(monkeypatch), command_state_kept():
        started = contention._epoch("isolated-2-torch-start", "light", paths, None, "cpu",
                                    images=True)
    assert started["batches"] == 2 and started["files"] == 70
    assert started["warm_steps_per_s"] == pytest.approx(2 / started["warm_epoch_s"])


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
    assert "FSDD not found" in captured.err and "no corpus was measured" in captured.out
    assert markdown_tables(captured.out) == []


def test_tuner_bench_runs_every_contestant_for_every_epoch(tmp_path, run_bench):
    out = tmp_path / "tuner.json"
    folder, page = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    result = run_bench("bench_tuner.py", "--utterances", "6", "--files", "16", "--epochs", "2",
                       "--rounds", "1", "--fsdd", str(tmp_path / "absent"), "--cache-dir",
                       str(tmp_path), "--json", str(out), "--write", "--results", str(folder),
                       "--page", str(page))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "FSDD not found" in result.stderr and "load average (1/5/15 min) before" in result.stdout
    data = json.loads(out.read_text(encoding="utf-8"))
    assert [c["case"].split(":")[0] for c in data["cases"]] == ["speech", "FLAC"]
    for case in data["cases"]:
        assert sorted(case["epochs_s"]) == sorted(["loop", "auto", "0", "1", "2", "isolated"])
        assert all(len(t) == 2 and min(t) > 0 for t in case["epochs_s"].values())
        assert len(case["auto_histories"]) == 1 and case["auto_histories"][0][0] == "after isolated"
    (rows,) = markdown_tables(result.stdout)  # the page's section, as --write renders it
    assert rows[0] == ["contestant", "speech: epoch 1 / 2 s", "FLAC: epoch 1 / 2 s"]
    assert [r[0] for r in rows[1:]] == ["plain loop (same decoder and batches)", "`auto` (the default)",
                                        "pinned 0 (decoding in the loop's thread)", "pinned 1 producer",
                                        "pinned 2 producers", "`IsolatedLoader` (2 producers)"]
    assert all(float(s) >= 0 for row in rows[1:] for cell in row[1:] for s in cell.split(" / "))
    saved = json.loads((folder / "epochs.json").read_text(encoding="utf-8"))
    auto = next(r for r in saved["rows"] if r["setting"] == "auto" and r["corpus"].startswith("speech"))
    assert auto["epochs_s"] == data["cases"][0]["epochs_s"]["auto"] and len(auto["vs_best_pinned"]) == 2
    assert "over the best pinned count, epoch by epoch" in page.read_text(encoding="utf-8")


def test_augment_bench_times_every_contestant_and_renders_its_section(tmp_path, run_bench):
    folder, page = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    result = run_bench("bench_augment.py", "--files", "16", "--epochs", "1", "--rounds", "1",
                       "--lhotse-workers", "0", "--cache-dir", str(tmp_path), "--write",
                       "--results", str(folder), "--page", str(page))
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads((folder / "augment.json").read_text(encoding="utf-8"))
    rows = {r["contestant"]: r for r in saved["rows"]}
    assert {"plain", "augmented", "transform", "lhotse 0", "one thread: decode"} <= set(rows)
    assert rows["augmented"]["epoch_s"] > 0 and rows["augmented"]["lhotse_best_over_this"] > 0
    text = page.read_text(encoding="utf-8")
    assert "## Augmentation: speed, noise and reverberation" in text and "Lhotse's best took" in text


# -- benchmarks/bench_free_threaded.py ---------------------------------------------------------------

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
             f"sys.path.insert(0, {str(BENCHMARKS)!r})\n"  # as `python benchmarks/bench_free_threaded.py` has it
             f"sys.argv = ['bench_free_threaded.py', '--child', {approach!r}, '--file-list', {str(file_list)!r}]\n"
             "try:\n"
             f"    runpy.run_path({str(BENCHMARKS / 'bench_free_threaded.py')!r}, run_name='__main__')\n"
             "except SystemExit as exit:\n"
             "    assert not exit.code, exit.code\n"
             "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules), 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", guard], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["seconds"] > 0 and report["gil_enabled"] is True  # this interpreter has a GIL
    assert report["producers"] == {"pool-1": 1, "pool-2": 2}.get(approach, report["producers"])


def test_free_threaded_bench_rows_and_section(load_benchmark):
    module = load_benchmark("bench_free_threaded")
    sections = load_benchmark("render").sections  # the package benchmarks/sections/
    by_key = {f"{gil}/{approach}": {"seconds": seconds, "gil_enabled": [gil == "on"], "producers": [0]}
              for gil, scale in (("on", 1.0), ("off", 0.5))
              for approach, seconds in zip(module.APPROACHES, [scale * s for s in (0.4, 0.1, 0.3, 0.2, 0.1)])}
    rows = module.rows_of({"FSDD, 3000 real recordings (WAV, 8 kHz)": by_key})
    pool2 = next(r for r in rows if r["approach"] == "pool-2")
    assert (pool2["on_vs_soundfile_loop"], pool2["off_vs_soundfile_loop"], pool2["off_vs_on"]) == (2.0, 2.0, 2.0)
    assert pool2["producers"] is None and rows[-1]["producers"] == {"on": [0], "off": [0]}
    results = {"free-threaded": {"rows": rows, "settings": {}}}
    table = markdown_tables(sections.FREE_THREADED.table(results))[0]
    assert table[0] == ["approach", "FSDD: GIL on s", "FSDD: GIL off s"]
    assert ["pool-2", "0.200", "0.100"] in table
    assert "was True with `PYTHON_GIL=1` and False with `PYTHON_GIL=0`" in sections.FREE_THREADED.reading(results)


# -- benchmarks/bench_decode.py: the peers beside audiobuffer bench's approaches -----------------------

def test_decode_bench_peer_rules(load_benchmark):
    """A WAV-only peer runs on WAV corpora without a transform; the header names the peers' versions."""
    from audiobuffer.cli.bench import APPROACHES, gil_line

    decode = load_benchmark("bench_decode")
    applies = decode.LINEUP.applies
    assert applies("spdl-load_wav", ["a.wav", "b.WAV"], None)
    assert not applies("spdl-load_wav", ["a.wav", "b.flac"], None)
    assert not applies("spdl-load_wav", ["a.wav"], "mel") and applies("loop", ["a.flac"], "mel")
    rows = {"c": [{"approach": "loop", "gil_enabled": False}, {"approach": "spdl-load_wav", "gil_enabled": True}]}
    assert "GIL disabled, but enabled by an import in: spdl-load_wav. Peers: " in gil_line(rows, decode.LINEUP)
    # audiobuffer bench's own approaches first, in its order, then the peers; each child runs this script
    assert decode.LINEUP.names[:len(APPROACHES)] == tuple(APPROACHES)
    assert set(decode.LINEUP.names[len(APPROACHES):]) == set(decode.PEERS)
    assert decode.LINEUP.child == (str(BENCHMARKS / "bench_decode.py"),)


def test_a_lineup_names_each_approach_it_measures():
    from audiobuffer.cli.bench import Lineup

    with pytest.raises(ValueError, match="neither audiobuffer's nor a peer: \\['magic'\\]"):
        Lineup(("loop", "magic"), ("loop",))
    with pytest.raises(ValueError, match="not in names: \\['isolated-2'\\]"):
        Lineup(("loop",), ("isolated-2",))


def test_decode_bench_saves_its_results(tmp_path, monkeypatch, capsys, load_benchmark):
    """A full (tiny) run: the results name the command, the machine, the versions and the peers; each row its
    corpus; the section is printed."""
    decode = load_benchmark("bench_decode")
    saved = {}
    monkeypatch.setattr(decode.render, "publish", lambda measured: saved.update(measured))
    args = ["--formats", "wav", "--files", "16", "--runs", "1", "--approaches", "loop,audiobuffer-1",
            "--cache-dir", str(tmp_path)]
    assert decode.main(args) == 0
    assert saved["name"] == "decode" and saved["command"] == [f"python benchmarks/bench_decode.py {' '.join(args)}"]
    assert saved["machine"] and "Peers: " in saved["versions"] and saved["settings"]["runs"] == 1
    assert [(r["corpus"].split(",")[0], r["approach"]) for r in saved["rows"]] == [("WAV", "loop"),
                                                                                  ("WAV", "audiobuffer-1")]
    out = capsys.readouterr().out
    assert "## Decode speed: audiobuffer against its peers" in out and "| audiobuffer-1 | " in out


# -- benchmarks/harness.py ---------------------------------------------------------------------------

@pytest.fixture
def harness(load_benchmark):
    return load_benchmark("harness")


def test_interleaved_takes_turns_and_median_time_times_each_run(harness):
    calls = []
    times = harness.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3)
    assert calls == ["a", "b"] * 3 and [len(t) for t in times.values()] == [3, 3]
    median, runs = harness.median_time(lambda: time.sleep(0.01), 3)
    assert len(runs) == 3 and min(runs) <= median <= max(runs) and median >= 0.009


def test_file_lists_carry_any_name_where_the_locale_is_cp1252(tmp_path, monkeypatch, harness):
    windows_text_files(monkeypatch)
    names = [str(tmp_path / "7_b\u0142\u0105d_\u65e5\u672c.wav"), str(tmp_path / "plain.wav")]
    harness.write_lines(tmp_path / "files.txt", names)
    assert b"\r" not in (tmp_path / "files.txt").read_bytes()
    assert harness.read_lines(tmp_path / "files.txt") == names


def test_fsdd_files_notes_a_missing_folder(tmp_path, capsys, harness):
    assert harness.fsdd_files(tmp_path / "absent") == []
    assert f"FSDD not found at {tmp_path / 'absent'}: that corpus is left out" in capsys.readouterr().err
    write_tone(tmp_path / "b.wav")
    write_tone(tmp_path / "a.wav")
    assert harness.fsdd_files(tmp_path) == [str(tmp_path / "a.wav"), str(tmp_path / "b.wav")]


def test_record_saves_what_audiobuffer_stress_measured(tmp_path, capsys, harness):
    """`audiobuffer stress` into results/stress.json, then the page and its plot rendered; --help and bad
    arguments save nothing."""
    pytest.importorskip("matplotlib")
    folder, page = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    argv = ["stress", "--results", str(folder), "--page", str(page), "--", "stress", "--quick", "--shapes", "1x1x2"]
    assert harness.main(argv) == 0
    saved = json.loads((folder / "stress.json").read_text(encoding="utf-8"))
    assert saved["command"] == ["python benchmarks/harness.py stress -- stress --quick --shapes 1x1x2"]
    assert saved["settings"]["lost"] == saved["settings"]["duplicated"] == 0
    assert saved["settings"]["rounds_per_shape"] == 1 and saved["rows"][0]["capacity"] == 2
    text = page.read_text(encoding="utf-8")
    assert "<!-- stress:start -->\n## Buffer stress test and soak" in text and "| 1 x 1 x 2 | " in text
    assert "0 lost, 0 duplicated" in " ".join(text.split())  # the page's lines wrap anywhere
    assert (tmp_path / "benchmarks" / "stress.png").stat().st_size > 5000
    assert "0 lost, 0 duplicated" in capsys.readouterr().out  # printed as well
    assert harness.main(["stress", "--results", str(folder), "--page", str(page), "--", "stress", "--help"]) == 0
    assert harness.main(["soak", "--results", str(folder), "--page", str(page), "--", "stress", "--shapes", "1x2"]) == 2
    assert sorted(p.name for p in folder.iterdir()) == ["stress.json"] and page.read_text(encoding="utf-8") == text
    with pytest.raises(SystemExit):
        harness.main(["stress", "--page", str(page)])
    assert "name the audiobuffer command after --" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        harness.main(["decode", "--page", str(page), "--", "bench", "--quick"])
    assert "records the audiobuffer commands stress, got 'bench'" in capsys.readouterr().err


def test_results_name_the_machine_the_commit_and_the_command(harness):
    import datetime

    measured = harness.results("x", [{"a": 1}], command="python benchmarks/x.py --write", settings={"runs": 3})
    assert measured["name"] == "x" and measured["rows"] == [{"a": 1}] and measured["settings"] == {"runs": 3}
    assert measured["command"] == ["python benchmarks/x.py --write"]
    assert " cores" in measured["machine"] and measured["versions"].startswith("Python ")
    assert datetime.date.fromisoformat(measured["date"])
    commit, dirty = harness.revision()
    assert measured["commit"] == commit and measured.get("dirty", False) == dirty
    assert harness.command_line("y.py", ["--a", "1"], python="python3.13t") == "python3.13t benchmarks/y.py --a 1"


# -- benchmarks/render.py and BENCHMARKS.md -------------------------------------------------------------

@pytest.fixture
def render(load_benchmark):
    return load_benchmark("render")


def small_results(name, rows, **settings):
    return {"name": name, "machine": "x86_64, 2 cores, no GPU", "versions": "Python 3.11, torch 2",
            "date": "2026-01-02", "commit": "abc1234", "command": [f"python benchmarks/{name}.py --write"],
            "settings": settings, "rows": rows}


STRESS_ROW = {"producers": 2, "consumers": 1, "capacity": 8, "queue_items_per_s": 1000.0,
              "buffer_items_per_s": 1500.4, "ratio": 1.5004, "buffer_many_items_per_s": 2000.0, "ratio_many": 2.0,
              "jittered_buffer_items_per_s": 10.0}
STRESS_CHECKS = {"rounds": 10, "items_moved": 12345, "lost": 0, "duplicated": 0, "bound_violations": 0,
                 "threads_start": 1, "threads_peak": 3, "threads_end": 1, "fds_start": None, "fds_peak": None,
                 "fds_end": None, "rounds_per_shape": 2, "minutes": None}


def test_render_turns_small_results_into_sections(render):
    """Only the sections with results; the table formats the saved figures, ratios as saved; where and
    how it was measured, and the plot's link."""
    results = {"stress": small_results("stress", [STRESS_ROW], **STRESS_CHECKS),
               "overlap": small_results("overlap", [
                   {"work": "real", "t1_ms": 5, "t2_ms": 10, "t1_measured_ms": 5.1, "t2_measured_ms": 9.9,
                    "sequential_s": 1.5, "audiobuffer_s": 1.06, "ideal_s": 1.0, "over_ideal": 1.06, "speedup": 1.4}],
                   steps=100, runs=3)}
    text = render.page(results)
    assert text.startswith("# Benchmarks\n") and text.endswith("<!-- stress:end -->\n")
    assert "## Overlap: loading beside training" in text and "Contents" not in text  # the site lists them
    assert "## Decode speed" not in text and text.index("<!-- overlap:start -->") < text.index("<!-- stress:start")
    tables = markdown_tables(text)
    assert tables[0][1] == ["5", "10", "1.500", "1.060", "1.000", "1.06x", "-"]
    assert tables[1][1] == ["2 x 1 x 8", "1,000", "1,500", "1.50x", "2,000", "2.00x"]
    assert "moved 12,345 items in 10 rounds: 0 lost, 0 duplicated" in " ".join(text.split())
    assert "open files not counted" in text
    assert ("  Measured 2026-01-02, commit abc1234, medians of 2 rounds per shape: "
            "`python benchmarks/stress.py --write`") in text
    assert "![Buffer's items/s over queue.Queue's per shape](benchmarks/stress.png)" in text
    results["stress"]["dirty"] = True
    assert "commit abc1234 with uncommitted changes" in render.page(results)


def test_publish_saves_renders_and_draws(tmp_path, render):
    pytest.importorskip("matplotlib")
    folder, page = tmp_path / "results", tmp_path / "BENCHMARKS.md"
    touched = render.publish(small_results("soak", [STRESS_ROW], **{**STRESS_CHECKS, "minutes": 0.5}), folder=folder,
                             page_path=page)
    assert [section.name for section in touched] == ["stress"]
    assert json.loads((folder / "soak.json").read_text(encoding="utf-8"))["rows"] == [STRESS_ROW]
    assert page.read_text(encoding="utf-8") == render.page(render.load_all(folder))
    assert "0.5-minute soak: get vs Queue" in page.read_text(encoding="utf-8")
    assert (tmp_path / "benchmarks" / "stress.png").stat().st_size > 5000
    (folder / "x.json").write_text('{"name": "y"}', encoding="utf-8")
    with pytest.raises(ValueError, match="x.json: its 'name' is 'y', not 'x'"):
        render.load_all(folder)


def test_render_reproduces_benchmarks_md_from_the_saved_results(render):
    """BENCHMARKS.md is what the saved results give, byte for byte: the page and the results cannot drift
    (after changing either, run python benchmarks/render.py)."""
    saved = render.load_all()
    assert (REPO / "BENCHMARKS.md").read_bytes().decode("utf-8") == render.page(saved)
    shown = {name for section in render.SECTIONS for name in section.sources}
    assert set(saved) <= shown, f"results no section shows: {sorted(set(saved) - shown)}"


def test_benchmarks_md_is_short_current_and_its_images_exist():
    import re

    text = (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 460  # 18 sections of about 25 lines, their tables and plots
    assert not re.search(r"\bissues?\b", text, re.IGNORECASE) and not re.search(r"\bRun \d", text)
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images and all((REPO / image).is_file() for image in images), images


# -- benchmarks/bench_train.py ------------------------------------------------------------------------

def test_train_bench_rows_leave_the_first_epoch_out(load_benchmark):
    bench = load_benchmark("bench_train")

    def run(*seconds, accuracy=0.5):
        return {"epochs": [{"seconds": s, "test_accuracy": accuracy} for s in seconds]}

    rows = {r["pipeline"]: r for r in bench.rows_of({"threads-2": [run(3.0, 1.0, 1.2), run(2.5, 1.1, 0.9)],
                                                     "isolated-2": [run(4.0, 0.5, 0.6, accuracy=1.0)]})}
    threads, isolated = rows["threads-2"], rows["isolated-2"]
    assert threads["epochs_s"] == [[1.0, 1.2], [1.1, 0.9]] and threads["first_epoch_s"] == [3.0, 2.5]
    assert threads["median_s"] == pytest.approx(1.05) and threads["mean_s"] == pytest.approx(1.05)
    assert threads["vs_threads"] == 1.0 and isolated["vs_threads"] == pytest.approx(1.05 / 0.55)
    assert isolated["test_accuracy_range"] == [1.0, 1.0] and isolated["label"] == "`IsolatedLoader`, 2 producers"


@pytest.mark.timeout(600)
def test_train_bench_smoke_run_prints_the_section(few_fsdd, run_bench):
    result = run_bench("bench_train.py", "--epochs", "2", "--max-steps", "2", "--rounds", "1",
                       "--pipelines", "threads-2", "--fsdd", str(few_fsdd))
    assert result.returncode == 0, result.stderr[-3000:]
    (rows,) = markdown_tables(result.stdout)
    assert rows[0][:2] == ["pipeline", "epoch 2 s, each run"] and rows[1][0] == "`BufferedDataset`, 2 producers"
    assert float(rows[1][2]) > 0 and rows[1][4] == "1.00x"
    with_write = run_bench("bench_train.py", "--max-steps", "2", "--write")
    assert with_write.returncode == 2 and "--write takes a full run on a CUDA machine" in with_write.stderr


# -- benchmarks/bench_ranks.py, bench_segments.py and bench_formats.py ------------------------------------

def smoke_write(tmp_path):
    """``--write`` into a results folder and a page under ``tmp_path``: the real page is left alone."""
    return ["--write", "--results", str(tmp_path / "results"), "--page", str(tmp_path / "BENCHMARKS.md")]


def test_ranks_bench_saves_each_loaders_figures_and_renders_its_section(tmp_path, run_bench):
    pytest.importorskip("matplotlib")
    page = (REPO / "BENCHMARKS.md").read_bytes()
    done = run_bench("bench_ranks.py", "--items", "300", "--ranks", "2", "--budgets", "60",
                     "--epochs", "1", *smoke_write(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    saved = json.loads((tmp_path / "results" / "ranks.json").read_text(encoding="utf-8"))
    assert saved["name"] == "ranks" and saved["settings"]["epochs"] == 1 and saved["settings"]["corpus"]["items"] == 300
    ours = {r["sync_buckets"]: r for r in saved["rows"] if r["loader"] == "audiobuffer"}
    assert set(ours) == {False, True} and all(r["every_item"] and r["spread"] == 0 for r in ours.values())
    assert ours[True]["gap"] < ours[False]["gap"]
    assert ours[True]["padding"] == pytest.approx(ours[False]["padding"], abs=0.01)  # the repeats differ
    assert "| audiobuffer | 2 | 60 | yes |" in done.stdout  # every figure printed, the section too
    text = (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")
    (table,) = markdown_tables(text)
    assert table[1][:4] == ["2", "60", f"{100 * ours[False]['gap']:.1f}%", f"{100 * ours[True]['gap']:.1f}%"]
    assert "## Ranks in step: batches by duration across ranks" in done.stdout
    assert "Over 1 epoch of 300 generated durations" in " ".join(text.split())
    assert (tmp_path / "benchmarks" / "ranks.png").stat().st_size > 5000
    assert (REPO / "BENCHMARKS.md").read_bytes() == page


def test_ranks_section_without_lhotse(render):
    rows = [{"loader": "audiobuffer", "ranks": 2, "max_batch_seconds": 60.0, "buckets": 4, "sync_buckets": sync,
             "gap": gap, "padding": 0.05, "batches": 10.0, "spread": 0, "over_budget": 0, "every_item": True,
             "repeated_items": 1.5, "plan_s_per_epoch": 0.001} for sync, gap in ((False, 0.4), (True, 0.02))]
    corpus = {"items": 100, "median_s": 5.0, "min_s": 1.5, "max_s": 20.0}
    results = {"ranks": small_results("ranks", rows, corpus=corpus, epochs=3, buckets=4)}
    section = render.sections.RANKS
    assert markdown_tables(section.table(results))[0][1] == ["2", "60", "40.0%", "2.0%", "-", "-", "5.0% / -", "-"]
    assert section.reading(results) == (
        "Over 3 epochs of 100 generated durations (1.5-20 s, log-normal; nothing decoded), 4 buckets, audiobuffer "
        "gave the ranks equal batch counts, every item each epoch (up to 1.5 repeated to even out the ranks) and no "
        "batch over the budget, in every row.")
    rows[1]["over_budget"] = 1
    assert "audiobuffer left an item out, gave the ranks different batch counts or a batch over the budget" in \
        section.reading(results)


@pytest.mark.timeout(600)
def test_formats_and_segments_benches_save_their_results_into_one_section(tmp_path, run_bench):
    pytest.importorskip("matplotlib")
    pytest.importorskip("pyarrow")
    page = (REPO / "BENCHMARKS.md").read_bytes()
    segments = run_bench("bench_segments.py", "--hours", "0.02", "--runs", "1", "--decodes", "2",
                          *smoke_write(tmp_path))
    assert segments.returncode == 0, segments.stdout + segments.stderr
    saved = json.loads((tmp_path / "results" / "segments.json").read_text(encoding="utf-8"))
    assert [r["format"] for r in saved["rows"]] == ["FLAC", "WAV"] and saved["settings"]["decodes"] == 2
    assert all(r["segment_ms"] > 0 and r["file_ms"] > 0 and len(r["segment_runs_ms"]) == 1 for r in saved["rows"])
    formats = run_bench("bench_formats.py", "--files", "30", "--runs", "1", *smoke_write(tmp_path))
    assert formats.returncode == 0, formats.stdout + formats.stderr
    saved = json.loads((tmp_path / "results" / "formats.json").read_text(encoding="utf-8"))
    assert [r["form"] for r in saved["rows"]] == ["files", "Hugging Face Parquet (`audio` bytes)",
                                                  "tar shards, streamed", "tar shards, by index",
                                                  "Lhotse cuts of 10-minute recordings"]
    assert saved["rows"][0]["vs_files"] == 1.0 and all(r["median_s"] > 0 for r in saved["rows"])
    text = (tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8")
    (table,) = markdown_tables(text)
    assert table[0] == ["form", "epoch s", "vs files"] and [row[0] for row in table[1:]] == [
        r["form"] for r in saved["rows"]]
    sentence = " ".join(text.split())
    assert "Decoding a 10 s segment of a 0.02-hour recording" in sentence and "FLAC " in sentence
    assert " and WAV " in sentence
    assert "`python benchmarks/bench_formats.py --files 30" in text and "`python benchmarks/bench_segments.py" in text
    assert (tmp_path / "benchmarks" / "formats.png").stat().st_size > 5000
    assert (REPO / "BENCHMARKS.md").read_bytes() == page


@pytest.fixture
def few_fsdd(fsdd, tmp_path):
    """A copy of every 25th FSDD recording (120, both splits): the training script's epochs and its
    test in a fraction of a second."""
    few = tmp_path / "fsdd"
    few.mkdir()
    for path in sorted(fsdd.glob("*.wav"))[::25]:
        shutil.copyfile(path, few / path.name)
    return few


def test_train_threads_bench_runs_each_setting_beside_busy_processes_and_stops_them(
        few_fsdd, load_benchmark, capsys):
    """bench_train_threads.py, one step an epoch: a row per (busy processes, setting) with the load
    recorded, and the busy processes gone afterwards."""
    bench = load_benchmark("bench_train_threads")
    assert bench.main(["--rounds", "1", "--epochs", "2", "--steps", "1", "--settings", "1-passive",
                       "--load", "1", "--fsdd", str(few_fsdd)]) == 0
    table = capsys.readouterr().out
    assert "| 1 | 1-passive |" in table and "| 0 |" not in table
    assert psutil.Process().children() == []


# -- benchmarks/bench_images.py ---------------------------------------------------------------

def test_images_bench_runs_and_saves(tmp_path, load_benchmark, run_bench):
    """A tiny corpus from the shipped photographs, an epoch of ``BufferedDataset`` and each
    pipeline's one-thread time an image, the saved rows and the section rendered into a page of its
    own (the real page left alone)."""
    pytest.importorskip("PIL.Image")
    pytest.importorskip("matplotlib")
    images = load_benchmark("bench_images")
    if not images.shipped_photos():
        pytest.skip("no shipped photographs: scikit-learn and matplotlib are not installed")
    page = (REPO / "BENCHMARKS.md").read_bytes()
    result = run_bench("bench_images.py", "--images", "10", "--runs", "1",
                        "--corpus", str(tmp_path / "c"),
                        "--approaches", "audiobuffer,one-thread", *smoke_write(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "| audiobuffer |" in result.stdout and "load average before" in result.stdout
    assert "| one-thread-imagedecoder: " in result.stdout
    data = json.loads((tmp_path / "results" / "images.json").read_text(encoding="utf-8"))
    assert [row["approach"] for row in data["rows"]] == [
        "audiobuffer", "one-thread-imagedecoder", "one-thread-imagedecoder-torch",
        "one-thread-pillow"]
    assert data["rows"][0]["images_per_s"] > 0 and data["rows"][0]["peak_mib"] > 0
    cores = data["settings"]["cores"]
    for row in data["rows"][1:]:  # the ceilings the cores allow at each one-thread time an image
        ms = row["ms_per_image"]
        assert ms > 0 and row["cpu_ms_per_image"] > 0 and len(row["ms_per_image_runs"]) == 1
        assert row["ceiling_images_per_s"] == pytest.approx(cores * 1000 / ms)
        assert row["first_batch_floor_s"] == pytest.approx(64 * ms / 1000 / cores)
    assert data["settings"]["load_before"] and data["settings"]["load_after"]
    (table,) = markdown_tables((tmp_path / "BENCHMARKS.md").read_text(encoding="utf-8"))
    assert [row[0].split(" at ")[0] for row in table[1:]] == [
        "`BufferedDataset`", *[f"ceiling: {cores} cores"] * 3]
    assert (REPO / "BENCHMARKS.md").read_bytes() == page
    from PIL import Image

    jpegs = sorted((tmp_path / "c").rglob("*.jpg"))
    assert len(jpegs) == 10 and len({p.parent.name for p in jpegs}) == 10
    for path in jpegs:
        with Image.open(path) as im:
            assert 300 <= min(im.size) and max(im.size) <= 600, im.size


def test_images_rows_ratios_and_the_approaches_that_did_not_run(load_benchmark, render):
    images = load_benchmark("bench_images")
    assert images.parse("pillow-w2-fork-pin") == images.Approach("pillow", 2, "fork", True, True,
                                                                 "pillow", False)
    assert images.parse("audiobuffer-nodraft") == images.Approach("audiobuffer", 0, None, False,
                                                                  False, "pillow", False)
    assert images.parse("audiobuffer-torch-batches").batches
    assert images.parse("isolated-torch").backend == "torch"

    def run(rate, first, peak):
        return {"images_per_s": rate, "first_batch_s": first, "peak_mib": peak}

    def alone(ours, pillow):
        return {"wall_ms_imagedecoder": ours, "wall_ms_pillow": pillow,
                "cpu_ms_imagedecoder": ours * 0.9, "cpu_ms_pillow": pillow * 0.9}

    runs = {"audiobuffer": [run(300, 0.2, 250), run(200, 0.3, 260)],
            "pillow-w2-fork": [run(100, 1, 500)], "pillow-w2-spawn": [run(80, 5, 700)],
            "one-thread": [alone(4.0, 5.0), alone(6.0, 4.0), alone(5.0, 6.0)]}
    skipped = {"torchvision-w0": "torchvision did not load",
               "torchvision-w2-fork": "torchvision did not load",
               "spdl": "its image decoder did not load", "audiobuffer-pin": "no GPU"}
    rows = images.rows_of(runs, skipped, [*runs, *skipped], cores=2)
    ours = rows[0]
    assert ours["images_per_s"] == 250 and ours["images_per_s_runs"] == [300, 200]
    assert ours["vs_fork"] == 2.5 and ours["memory_vs_fork"] == pytest.approx(0.51)
    assert ours["first_vs_spawn"] == pytest.approx(0.05)
    assert [r.get("skipped") for r in rows[3:-2]] == list(skipped.values())
    # one thread: 5 ms an image (the median), so 2 cores allow 400 images/s (4x the fork's 100)
    # and a first batch of 64 in no less than 0.16 s (0.032x the spawn start's 5 s)
    decoder, pillow = rows[-2:]
    assert decoder["approach"] == "one-thread-imagedecoder" and decoder["ms_per_image"] == 5.0
    assert decoder["ms_per_image_runs"] == [4.0, 6.0, 5.0]
    assert decoder["cpu_ms_per_image"] == pytest.approx(4.5)
    assert decoder["ceiling_images_per_s"] == pytest.approx(400)
    assert decoder["ceiling_vs_fork"] == pytest.approx(4.0)
    assert decoder["first_batch_floor_s"] == pytest.approx(0.16)
    assert decoder["floor_vs_spawn"] == pytest.approx(0.032)
    assert pillow["approach"] == "one-thread-pillow" and pillow["ms_per_image"] == 5.0
    checked = images.goals(rows)
    assert [goal[-1] for goal in checked] == ["yes", "yes", "yes"]
    assert [goal[-2] for goal in checked] == ["one thread: <= 4.000x", "-", "one thread: >= 0.032x"]
    results = {"images": small_results("images", rows, runs=2, load_before="1", load_after="2")}
    section = render.sections.IMAGES
    table = markdown_tables(section.table(results))[0]
    assert [row[0] for row in table[1:]] == [
        "`BufferedDataset`", "Pillow `Dataset`, 2 workers, fork",
        "Pillow `Dataset`, 2 workers, spawn",
        "ceiling: 2 cores at `ImageDecoder`'s 5.00 ms an image (one thread)",
        "ceiling: 2 cores at Pillow `Dataset`'s 5.00 ms an image (one thread)"]
    assert table[1][1:] == ["250", "2.50x", "0.25", "255", "0.51x"]
    assert table[4][1:] == ["400", "4.00x", "0.160", "-", "-"]
    reading = section.reading(results)
    assert ("The `ImageDecoder` ceiling (one thread's time over the cores): 4.00x the fork rate, a "
            "first batch in 0.032x spawn's: both goals are within what 2 cores allow.") in reading
    assert ("Not run here: `ImageFolder` + `transforms.v2` (torchvision did not load); SPDL (its "
            "image decoder did not load); `pin_memory=True` (no GPU).") in reading
    # at 20 ms an image: 100 images/s (1.00x the fork) and 0.64 s (0.128x spawn's): both above
    slow = images.rows_of({**runs, "one-thread": [alone(20.0, 20.0)]}, {}, [*runs], cores=2)
    results = {"images": small_results("images", slow, runs=1, load_before="1", load_after="2")}
    assert ("The `ImageDecoder` ceiling (one thread's time over the cores): 1.00x the fork rate, a "
            "first batch in 0.128x spawn's: the goals 1.3x and 0.05x are above what 2 cores "
            "allow.") in section.reading(results)
    # with backend="torch" measured, the goals are read on it and on its one-thread time
    fast = {**runs, "audiobuffer-torch": [run(150, 0.1, 240)],
            "one-thread": [{**alone(5.0, 5.0), "wall_ms_imagedecoder-torch": 10.0,
                            "cpu_ms_imagedecoder-torch": 9.0}]}
    rows = images.rows_of(fast, {}, [*fast], cores=2)
    assert [r["approach"] for r in rows[-3:]] == [
        "one-thread-imagedecoder", "one-thread-imagedecoder-torch", "one-thread-pillow"]
    checked = images.goals(rows)
    assert [goal[:2] for goal in checked][0] == [
        "audiobuffer-torch: images/s / pillow-w2-fork", "1.500x"]
    assert checked[0][3] == "one thread: <= 2.000x" and checked[-1][1] == "0.020x"
    results = {"images": small_results("images", rows, runs=1, load_before="1", load_after="2")}
    reading = section.reading(results)
    assert reading.startswith('`BufferedDataset`, `backend="torch"`: 1.50x the images/s')
    assert ('The `ImageDecoder(backend="torch")` ceiling (one thread\'s time over the cores): '
            '2.00x the fork rate') in reading
    # batches stacked on arrival are read first, beside the plain loop measured in the same runs
    plain = {**fast, "audiobuffer-torch-batches": [run(160, 0.09, 240)],
             "threads-torch": [run(120, 0.5, 230)]}
    rows = images.rows_of(plain, {}, [*plain], cores=2)
    checked = images.goals(rows)
    assert checked[0][:2] == ["audiobuffer-torch-batches: images/s / pillow-w2-fork", "1.600x"]
    assert checked[0][3] == "one thread: <= 2.000x; plain loop: 1.200x"
    assert checked[-1][1:4] == ["0.018x", "<= 0.05x", "one thread: >= 0.064x; plain loop: 0.100x"]
    results = {"images": small_results("images", rows, runs=1, load_before="1", load_after="2")}
    reading = section.reading(results)
    assert reading.startswith('`BufferedDataset.stacked_batches(64)`, `backend="torch"`: 1.60x the')
    assert "its first batch in 0.0180x spawn's" in reading
    assert ("The plain loop (2 threads, that decoder, no library): 1.20x, first batch "
            "0.1000x.") in reading


def test_images_bench_draft_table(tmp_path, load_benchmark, run_bench):
    pytest.importorskip("PIL.Image")
    if not load_benchmark("bench_images").shipped_photos():
        pytest.skip("neither scikit-learn nor matplotlib (whose photographs it uses) is installed")
    result = run_bench("bench_images.py", "--draft", "--runs", "1", "--corpus", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("| random_resized |") == 2 and result.stdout.count("| center |") == 2


def test_images_bench_on_a_device_says_what_is_missing(tmp_path, run_bench):
    pytest.importorskip("PIL.Image")
    if torch.cuda.is_available():
        pytest.skip("checks the message where CUDA is absent")
    result = run_bench("bench_images.py", "--device", "cuda", "--corpus", str(tmp_path))
    assert result.returncode == 1
    assert "CUDA is not available here" in result.stderr and "Traceback" not in result.stderr


def test_images_bench_on_a_device_runs_with_pillow_in_nvjpegs_place(tmp_path, load_benchmark,
                                                                    run_bench):
    """The ``--device`` mode's whole path on the CPU (Pillow decodes in nvjpeg's place): the rows,
    the decode step alone, and pixels identical to the host path's."""
    pytest.importorskip("PIL.Image")
    if not load_benchmark("bench_images").shipped_photos():
        pytest.skip("neither scikit-learn nor matplotlib (whose photographs it uses) is installed")
    saved = tmp_path / "device.json"
    result = run_bench("bench_images.py", "--device", "cpu", "--decode-with", "pillow",
                        "--images", "6", "--runs", "1", "--corpus", str(tmp_path / "c"),
                        "--save", str(saved))
    assert result.returncode == 0, result.stderr
    assert "mean |diff| 0.000, max 0" in result.stdout
    data = json.loads(saved.read_text(encoding="utf-8"))
    assert [row["approach"] for row in data["rows"]] == ["host-decode", "host-decode-nodraft",
                                                         "device-decode"]
    assert all(row["images_per_s"] > 0 for row in data["rows"])
