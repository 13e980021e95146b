import dataclasses
import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO, make_corpus, windows_text_files

from audiobuffer.buffer import BufferStats
from audiobuffer.cli.report import RunSummary, write_json
from audiobuffer.loaders.dataset import DatasetStats

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def pipeline(tmp_path):
    make_corpus(tmp_path / "audio", 12, seconds=0.2)
    config = {"source": {"root": "audio", "labels": r"^(\d+)_"}, "decode": {"sample_rate": 16000},
              "buffer": {"num_producers": 2, "on_error": "skip"}, "loader": {"batch_size": 5}, "epochs": 2,
              "device": "cpu"}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return tmp_path, path


def test_run_end_to_end_with_json_summary(pipeline, cli_process):
    """``python -m audiobuffer run`` in a process of its own: the entry point the other tests skip."""
    root, config = pipeline
    out = root / "summary.json"
    result = cli_process("run", config, "--json", out, "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert (summary["samples"], summary["epochs"], summary["batches"], summary["failed"]) == (24, 2, 6, 0)
    assert summary["audio_s"] == pytest.approx(24 * 0.2)
    assert summary["verdict"] in ("input-bound", "compute-bound") and summary["advice"]
    assert "samples       24 in 2 epoch(s)" in result.stdout and "verdict" in result.stdout


def run_with_a_bad_file(pipeline, cli, *sets):
    """``audiobuffer run`` of one epoch of ``pipeline`` with a broken WAV file added, ``--set``
    each of ``sets``; the result, its exit status checked, and its JSON summary."""
    root, config = pipeline
    (root / "audio" / "class0" / "0_9999.wav").write_bytes(b"RIFF not really a wav file")
    options = [arg for value in ("epochs=1", *sets) for arg in ("--set", value)]
    result = cli("run", config, *options, "--json", "-", "--no-progress")
    assert result.returncode == 0, result.stderr
    return result, json.loads(result.stdout)


def test_run_counts_skipped_files_and_overrides(pipeline, cli):
    result, summary = run_with_a_bad_file(pipeline, cli, "buffer.num_producers=3")
    assert (summary["samples"], summary["failed"], summary["producers"]) == (12, 1, 3)
    assert summary["failures"][0]["path"].endswith("0_9999.wav")
    assert "skipped files 1" in result.stderr and "0_9999.wav" in result.stderr
    assert "producers 3," in result.stderr and "producers     3 (pinned); GIL " in result.stderr
    assert summary["auto"] is False and isinstance(summary["gil_enabled"], bool)


def test_run_with_producers_auto_says_what_it_settled_on(pipeline, cli):
    root, config = pipeline
    result = cli("run", config, "--set", "epochs=1", "--set", "buffer.num_producers=auto", "--json", "-",
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["auto"] is True and summary["samples"] == 12 and summary["producers"] in (0, 1, 2, 3, 4)
    assert "producers auto," in result.stderr
    assert f"producers     auto, settled on {summary['producers']}" in result.stderr


def test_summary_of_a_tuned_epoch():
    stats = DatasetStats(epoch=0, rank=0, world_size=1, worker=0, num_workers=1, items=10, num_producers=0,
                         producer_history=[(0.0, 0, "start"), (0.1, 1, "trying"), (0.2, 1, "kept"), (0.3, 0, "back")],
                         gil_enabled=False)
    summary = RunSummary(wall_s=1.0, consumer_wait_s=0.5, samples=10)
    summary.add_epoch(stats)
    summary.judge()
    assert (summary.auto, summary.changes, summary.producers, summary.gil_enabled) == (True, 2, 0, False)
    line = next(x for x in summary.lines() if x.startswith("producers"))
    assert line == ("producers     auto, settled on 0 (decoding in the loop's thread) after 2 change(s) in the "
                    "last epoch; GIL disabled (free-threaded)")
    assert "auto, which settled on 0" in summary.advice and "raise" not in summary.advice
    assert "buffer.num_producers: auto" in summary.advice  # the YAML key as it is spelled now


def test_decoding_in_the_loops_own_thread_counts_as_waiting_for_data():
    """auto at 0: the loop never waits for the buffer, it decodes; that time is the input's, not the step's."""
    stats = DatasetStats(epoch=0, rank=0, world_size=1, worker=0, num_workers=1, items=10, num_producers=0,
                         decode_s=9.65, inline_s=9.65, producer_history=[(0.0, 0, "start")])
    summary = RunSummary(wall_s=12.91, consumer_wait_s=0.02, samples=10)
    summary.add_epoch(stats)
    summary.judge()
    assert summary.verdict == "input-bound" and summary.inline_s == 9.65
    assert "decoded in its own thread 75% of the time" in summary.advice
    assert "(summed over producers; 9.65 s of them in the loop's thread)" in "\n".join(summary.lines())
    # Through an IsolatedLoader the helper's inline decoding is not the trainer's time.
    isolated = RunSummary(wall_s=12.91, samples=10)
    isolated.add_epoch(dataclasses.replace(stats, transfer={"trainer_wait_s": 0.02}))
    isolated.judge()
    assert isolated.inline_s == 0.0 and isolated.verdict == "compute-bound"


def test_summary_of_an_isolated_loader_counts_the_trainers_wait():
    """The helper's buffer is drained by the helper: the loop's wait is the trainer's, from ``transfer``."""
    buffer = BufferStats(capacity=8, max_bytes=None, puts=10, gets=10, put_wait_s=0.3, get_wait_s=0.1,
                         mean_fill=1.0, peak_fill=4, peak_bytes=0)
    stats = DatasetStats(epoch=0, rank=0, world_size=1, worker=0, num_workers=1, items=10, num_producers=2,
                         buffer=buffer, transfer={"trainer_wait_s": 0.7, "trainer_copy_s": 0.01,
                                                  "helper_slot_wait_s": 0.0})
    summary = RunSummary(wall_s=1.0, samples=10)
    summary.add_epoch(stats)
    assert (summary.consumer_wait_s, summary.producer_wait_s) == (0.7, 0.3)
    summary.add_epoch(dataclasses.replace(stats, transfer=None))  # in process: the buffer's consumer is the loop
    assert summary.consumer_wait_s == pytest.approx(0.8)


def test_run_isolated_gives_the_same_counts_and_names_failures(pipeline, cli, no_helper_left_behind):
    root, config = pipeline
    (root / "audio" / "class0" / "0_9999.wav").write_bytes(b"RIFF not really a wav file")
    result = cli("run", config, "--set", "buffer.isolate=true", "--json", "-", "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["samples"], summary["epochs"], summary["failed"]) == (24, 2, 2)
    assert summary["failures"][0]["path"].endswith("0_9999.wav")
    assert "in a helper process" in result.stderr


@pytest.mark.parametrize("isolate", ["false", "true"])
def test_run_batches_by_duration_reports_each_epochs_padding(pipeline, isolate, monkeypatch, cli,
                                                             no_helper_left_behind):
    root, config = pipeline
    monkeypatch.setenv("AUDIOBUFFER_CACHE_DIR", str(root / "cache"))  # the header cache, for the child process
    (root / "audio" / "class0" / "0_9999.wav").write_bytes(b"RIFF not really a wav file")
    # Files of 0.2 s and a 0.5 s budget: two a batch, 6 batches an epoch; the bad header is in none.
    result = cli("run", config, "--set", "loader.max_batch_seconds=0.5", "--set", f"buffer.isolate={isolate}",
                 "--json", "-", "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["samples"], summary["batches"], summary["failed"]) == (24, 12, 2)
    assert summary["padding"] == [0.0, 0.0]  # equal lengths: nothing to pad
    assert "padding       0.0% of the batches' audio" in result.stderr and "0_9999.wav" in result.stderr


def test_run_warn_policy_logs_each_skipped_file_on_stderr(pipeline, cli):
    result, summary = run_with_a_bad_file(pipeline, cli, "buffer.on_error=warn")
    assert summary["failed"] == 1
    (logged,) = [line for line in result.stderr.splitlines() if line.startswith("WARNING audiobuffer.")]
    assert "skipping item" in logged and "0_9999.wav" in logged


@pytest.mark.parametrize("isolate", ["false", "true"])
def test_run_raise_policy_exits_1_naming_the_file(pipeline, isolate, cli, no_helper_left_behind):
    root, config = pipeline
    (root / "audio" / "class0" / "0_9999.wav").write_bytes(b"garbage")
    result = cli("run", config, "--set", "buffer.on_error=raise", "--set", f"buffer.isolate={isolate}",
                 "--no-progress")
    assert result.returncode == 1
    assert "0_9999.wav" in result.stderr and "Traceback" not in result.stderr
    assert "caused by" not in result.stderr  # the decoder's message is in the error once, not again as its cause


def assert_config_error(result, *parts):
    """Exit status 2 and one line on stderr, without a traceback, holding each of ``parts`` in order."""
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("audiobuffer: error: "), result.stderr[:2000]
    assert "Traceback" not in result.stderr
    position = 0
    for part in map(str, parts):
        found = result.stderr.find(part, position)
        assert found >= 0, f"{part!r} not in {result.stderr!r}"
        position = found + len(part)


@pytest.mark.parametrize("args, message", [
    (["--set", "buffer.num_producers=eight"],
     "buffer.num_producers: must be an integer in [1, 1024] or 'auto', got 'eight'"),
    (["--set", "buffer.num_prodcers=8"], "buffer.num_prodcers: unknown key"),
    (["--set", "source.root=missing"], "source.root: no such directory"),
    (["--set", "device=cuda:0"], "device:"),
    (["--set", "seed=-1"], "seed: must be >= 0 and <= 9223372036854775807, got -1"),
    (["--set", "buffer.timeout=.nan"], "buffer.timeout: must be a number of seconds > 0, got nan"),
    (["--set", "buffer.warn_after=-1e12"], "buffer.warn_after: must be a number of seconds > 0, got -1000000000000.0"),
    (["--set", "decode.crop_seconds=1e300"], "decode.crop_seconds: must be a number of seconds > 0 and <= 86400"),
    (["--set", "loader.batch_size=100000000000"], "loader.batch_size: must be >= 1 and <= 1048576, got 100000000000"),
    (["--set", "source=abc"], "source: must be a section (a mapping of keys: root, manifest"),
    (["--set", "source.labels=(x"], "source.labels: "),
    (["--set", "epochs.x=1"], "--set 'epochs.x=1': epochs is not a section"),
])
def test_bad_config_exits_2_with_message_and_no_traceback(pipeline, args, message, cli):
    _, config = pipeline
    result = cli("run", config, *args)
    if "cuda" in args[-1] and result.returncode == 0:
        pytest.skip("this machine has CUDA")
    assert_config_error(result, f"{config}: ", message)


def test_old_key_names_run_with_a_note_naming_the_new_keys(pipeline, cli):
    root, config = pipeline
    old = root / "old.yaml"
    old.write_text(config.read_text().replace("num_producers:", "producers:") + "\n", encoding="utf-8")
    result = cli("run", old, "--set", "epochs=1", "--set", "buffer.capacity=16", "--json", "-",
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["producers"] == 2 and "producers 2," in result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("audiobuffer: note: ")]
    assert notes == [f"audiobuffer: note: {old}: buffer.producers is deprecated: write buffer.num_producers",
                     f"audiobuffer: note: {old}: buffer.capacity is deprecated: write buffer.buffer_size"]
    filled = cli("config", old, cwd=root)  # printed under the new names
    assert filled.returncode == 0 and yaml.safe_load(filled.stdout)["buffer"]["num_producers"] == 2
    assert "buffer.producers is deprecated" in filled.stderr
    result = cli("run", old, "--set", "buffer.producers=eight")  # the error names the key as written
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"audiobuffer: note: {old}: buffer.producers is deprecated: write buffer.num_producers",
        f"audiobuffer: error: {old}: buffer.producers: must be an integer in [1, 1024] or 'auto', got 'eight'"]
    both = cli("run", old, "--set", "buffer={producers: 2, num_producers: 3}")
    assert_config_error(both, f"{old}: buffer.producers: the old name of buffer.num_producers, which is given too")


def test_missing_config_file_exits_2(tmp_path, cli):
    result = cli("run", tmp_path / "nope.yaml")
    assert_config_error(result, tmp_path / "nope.yaml", ": cannot read config file")


@pytest.mark.timeout(60)
def test_alias_bomb_ends_quickly_with_one_short_line(tmp_path, cli):
    """A 9-level "billion laughs" list as source.root: the error quotes only its prefix."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines + ["source:", "  root: *l8"]) + "\n")
    result = cli("run", path)
    assert_config_error(result, path, ": source.root: Input should be a valid string, got [[[[[[[[['lol'")
    assert len(result.stderr) < 600


@pytest.mark.parametrize("content, message", [
    ("source: {root: audio}\n# caf\u00e9\n".encode("latin-1"), "not UTF-8 text: byte 0xe9 at line 2, column 6"),
    (b"source: [unclosed\nbuffer: {", "not valid YAML at line 2, column 7: "),
], ids=["latin-1", "malformed"])
def test_unreadable_config_exits_2_with_one_line(tmp_path, content, message, cli):
    path = tmp_path / "pipeline.yaml"
    path.write_bytes(content)
    assert_config_error(cli("run", path), path, ": ", message)


def test_set_paths_resolve_against_the_current_directory(pipeline, tmp_path_factory, cli):
    root, config = pipeline
    (root / "conf").mkdir()
    moved = root / "conf" / "pipeline.yaml"
    moved.write_text(config.read_text().replace("root: audio", "root: ../audio"))
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    make_corpus(elsewhere / "mine", 4, seconds=0.2)
    result = cli("run", moved, "--set", "source.root=mine", "--set", "epochs=1", "--json", "-",
                 "--no-progress", cwd=elsewhere)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["samples"] == 4  # mine/, not conf/mine or the file's ../audio
    result = cli("run", moved, "--set", "epochs=1", "--json", "-", "--no-progress", cwd=elsewhere)
    assert result.returncode == 0 and json.loads(result.stdout)["samples"] == 12  # the file's own path: its folder


def test_config_reference_prints_the_shipped_reference(tmp_path, cli):
    result = cli("config", "--reference", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "configs" / "reference.yaml").read_text(encoding="utf-8")
    help_text = cli("run", "--help").stdout
    assert "audiobuffer config --reference" in " ".join(help_text.split())


def test_config_checks_a_config_and_prints_it_filled_in(pipeline, cli):
    root, config = pipeline
    result = cli("config", config, "--set", "buffer.num_producers=3", cwd=root)
    assert result.returncode == 0, result.stderr
    filled = yaml.safe_load(result.stdout)
    assert filled["buffer"]["num_producers"] == 3 and filled["source"]["root"] == str(root / "audio")
    assert filled["buffer"]["buffer_size"] == 64  # a default, filled in
    assert_config_error(cli("config", config, "--set", "seed=-1"), config, ": seed: must be >= 0")
    assert_config_error(cli("config"), "give either --reference or CONFIG.yaml")


def test_run_on_images_reports_images_per_second(tmp_path, cli):
    image = pytest.importorskip("PIL.Image")
    for i in range(6):
        image.new("RGB", (12, 10), (40 * i, 0, 0)).save(tmp_path / f"{i}_img.png")
    path = tmp_path / "images.yaml"
    path.write_text(yaml.safe_dump({"source": {"root": "."}, "decode": {"kind": "image", "size": 8},
                                    "loader": {"batch_size": 4}, "device": "cpu"}))
    out = tmp_path / "summary.json"
    result = cli("run", path, "--no-progress", "--json", out)
    assert result.returncode == 0, result.stderr
    assert "images/s" in result.stdout and "audio" not in result.stdout and "sample rate" not in result.stdout
    summary = json.loads(out.read_text())
    assert summary["kind"] == "image" and summary["samples"] == 6
    assert "audio_s" not in summary and "audio_s_per_s" not in summary


def test_input_bound_advice_fits_the_kind_of_sample():
    image = RunSummary(kind="image", wall_s=1.0, consumer_wait_s=0.5, producers=1, samples=10)
    image.judge()
    assert image.verdict == "input-bound" and "smaller images" in image.advice and "sample rate" not in image.advice
    assert "10.0 images/s" in image.lines()[1] and "audio" not in "\n".join(image.lines())
    audio = RunSummary(wall_s=1.0, consumer_wait_s=0.5, producers=1, samples=10, audio_s=5.0)
    audio.judge()
    assert "sample rate" in audio.advice and "5.0 s of audio/s" in audio.lines()[1]


@pytest.mark.slow
def test_demo_end_to_end(tmp_path, cli):
    out = tmp_path / "demo.json"
    result = cli("demo", "--epochs", 2, "--per-class", 5, "--cache-dir", tmp_path / "cache",
                 "--device", "cpu", "--json", out, "--no-progress")
    assert result.returncode == 0, result.stderr
    demo = json.loads(out.read_text())
    assert (demo["train_files"], demo["test_files"], demo["classes"]) == (40, 10, 10)
    assert demo["summary"]["samples"] == 2 * 40 and demo["summary"]["epochs"] == 2
    assert 0.0 <= demo["test_accuracy"] <= 1.0 and len(demo["history"]) == 2
    assert "accuracy" in result.stdout and "time split" in result.stdout
    made = {p: p.stat().st_mtime_ns for p in Path(demo["corpus"]).rglob("*") if p.is_file()}
    again = cli("demo", "--epochs", 1, "--per-class", 5, "--cache-dir", tmp_path / "cache",
                "--device", "cpu", "--json", "-", "--no-progress")
    assert again.returncode == 0 and json.loads(again.stdout)["corpus"] == demo["corpus"]
    # the corpus is reused, not made again
    assert made and {p: p.stat().st_mtime_ns for p in made} == made
    assert {p for p in Path(demo["corpus"]).rglob("*") if p.is_file()} == set(made)


def test_demo_rejects_bad_arguments(cli):
    result = cli("demo", "--epochs", 0)
    assert result.returncode == 2 and "--epochs must be >= 1" in result.stderr


@pytest.mark.subprocess
def test_console_script_is_installed():
    result = subprocess.run(["audiobuffer", "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("audiobuffer ")


# -- what every command shares: its help, a stdout that cannot encode every file name ------------------

def test_help_lists_every_command(capsys):
    from audiobuffer.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    listed = capsys.readouterr().out
    for command in ("run", "config", "demo", "bench", "stress", "pack", "index"):
        assert re.search(rf"^\s+{command}\s+\S", listed, re.MULTILINE), (command, listed)


#: A file name a Windows console or redirect (cp1252) cannot encode.
NOT_CP1252 = "7_b\u0142\u0105d_\u65e5\u672c"


def cp1252_stdout(monkeypatch):
    """sys.stdout as Windows gives it to a redirected process: cp1252, strict errors (set in the test's
    body: pytest sets its own sys.stdout again once the fixtures are set up)."""
    stdout = io.TextIOWrapper(io.BytesIO(), encoding="cp1252")
    monkeypatch.setattr(sys, "stdout", stdout)
    audiobuffer_logger = logging.getLogger("audiobuffer")
    monkeypatch.setattr(audiobuffer_logger, "level", audiobuffer_logger.level)  # main() sets it
    return stdout


def printed(stdout):
    stdout.flush()
    return stdout.buffer.getvalue().decode("cp1252")


def test_run_names_a_file_stdout_cannot_encode_and_writes_its_json(tmp_path, monkeypatch):
    from audiobuffer.cli.main import main

    make_corpus(tmp_path / "audio", 3, seconds=0.1)
    (tmp_path / "audio" / f"{NOT_CP1252}.wav").write_bytes(b"RIFF not really a wav file")  # skipped, listed
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"source": {"root": "audio"}, "buffer": {"num_producers": 1, "on_error": "skip"},
                                      "device": "cpu"}), encoding="utf-8")
    out = tmp_path / "summary.json"
    stdout = cp1252_stdout(monkeypatch)
    assert main(["run", str(config), "--json", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text(encoding="utf-8"))["failed"] == 1
    assert "7_b\\u0142\\u0105d_\\u65e5\\u672c.wav" in printed(stdout)  # escaped, not a crash


def test_pack_names_an_output_folder_stdout_cannot_encode(tmp_path, monkeypatch):
    from audiobuffer.cli.main import main

    make_corpus(tmp_path / "src", 3, seconds=0.05)
    out = tmp_path / NOT_CP1252
    stdout = cp1252_stdout(monkeypatch)
    assert main(["pack", str(tmp_path / "src"), str(out), "--shard-size", "1MB", "--no-progress"]) == 0
    assert (out / "index.json").is_file()
    assert "packed 3 files" in printed(stdout) and "\\u65e5\\u672c" in printed(stdout)


def test_the_saved_reference_config_says_what_to_fill_in_and_runs_once_filled(tmp_path, cli):
    reference = cli("config", "--reference", cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr
    saved = tmp_path / "my.yaml"
    saved.write_text(reference.stdout, encoding="utf-8")
    assert_config_error(cli("run", "my.yaml", cwd=tmp_path), "my.yaml: source.root: fill in the folder",
                        "--set source.root=PATH")
    make_corpus(tmp_path / "audio", 4, seconds=0.1)
    filled = cli("run", "my.yaml", "--set", "source.root=audio", "--set", "device=cpu", "--json", "-",
                 "--no-progress", cwd=tmp_path)
    assert filled.returncode == 0, filled.stderr
    assert json.loads(filled.stdout)["samples"] == 4


def test_json_report_is_utf8_with_unix_newlines_where_text_files_write_crlf(tmp_path, monkeypatch):
    windows_text_files(monkeypatch)
    report = {"failures": [{"path": f"{NOT_CP1252}.wav"}], "samples": 3}
    write_json(tmp_path / "summary.json", report)
    data = (tmp_path / "summary.json").read_bytes()
    assert b"\r" not in data and json.loads(data.decode("utf-8")) == report


def test_run_reports_the_zeros_of_a_padded_crop_without_batches_by_duration(pipeline, cli):
    # 0.2 s files padded to a 0.5 s crop: three fifths of every batch are zeros, and the summary says so.
    root, config = pipeline
    result = cli("run", config, "--set", "decode.crop_seconds=0.5", "--set", "decode.pad=true",
                 "--set", "epochs=1", "--json", "-", "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["padding"] == [pytest.approx(0.6)]
    assert "padding       60.0% of the batches' audio" in result.stderr


def test_a_warning_of_ours_is_one_line_without_a_source_location(pipeline, cli):
    root, config = pipeline
    result = cli("run", config, "--no-progress", "--set", "decode.crop_seconds=0.1",
                 "--set", "loader.max_batch_seconds=1")
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "every item lasts the crop" in line]
    assert warned and all(line.startswith("audiobuffer: warning: ") for line in warned), result.stderr
    assert ".py:" not in result.stderr
