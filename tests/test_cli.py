import json
import os
import subprocess
import sys

import pytest
import yaml

from helpers import make_corpus

pytestmark = pytest.mark.timeout(300)


def audiobuffer(*args, cwd=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "audiobuffer", *map(str, args)], capture_output=True, text=True,
                          timeout=240, cwd=cwd, env=env)


@pytest.fixture
def pipeline(tmp_path):
    make_corpus(tmp_path / "audio", 12, seconds=0.2)
    config = {"source": {"root": "audio", "labels": r"^(\d+)_"}, "decode": {"sample_rate": 16000},
              "buffer": {"producers": 2, "on_error": "skip"}, "loader": {"batch_size": 5}, "epochs": 2,
              "device": "cpu"}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return tmp_path, path


def test_run_end_to_end_with_json_summary(pipeline):
    root, config = pipeline
    out = root / "summary.json"
    result = audiobuffer("run", config, "--json", out, "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert (summary["samples"], summary["epochs"], summary["batches"], summary["failed"]) == (24, 2, 6, 0)
    assert summary["audio_s"] == pytest.approx(24 * 0.2)
    assert summary["verdict"] in ("input-bound", "compute-bound") and summary["advice"]
    assert "samples       24 in 2 epoch(s)" in result.stdout and "verdict" in result.stdout


def test_run_counts_skipped_files_and_overrides(pipeline):
    root, config = pipeline
    (root / "audio" / "class0" / "0_9999.wav").write_bytes(b"RIFF not really a wav file")
    result = audiobuffer("run", config, "--set", "epochs=1", "--set", "buffer.producers=3", "--json", "-",
                         "--no-progress")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["samples"], summary["failed"], summary["producers"]) == (12, 1, 3)
    assert summary["failures"][0]["path"].endswith("0_9999.wav")
    assert "skipped files 1" in result.stderr and "0_9999.wav" in result.stderr


def test_run_raise_policy_exits_1_naming_the_file(pipeline):
    root, config = pipeline
    (root / "audio" / "class0" / "0_9999.wav").write_bytes(b"garbage")
    result = audiobuffer("run", config, "--set", "buffer.on_error=raise", "--no-progress")
    assert result.returncode == 1
    assert "0_9999.wav" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--set", "buffer.producers=eight"], "buffer.producers: Input should be a valid integer, got 'eight'"),
    (["--set", "buffer.prodcers=8"], "buffer.prodcers: unknown key"),
    (["--set", "source.root=missing"], "source.root: no such directory"),
    (["--set", "device=cuda:0"], "device:"),
])
def test_bad_config_exits_2_with_message_and_no_traceback(pipeline, args, message):
    _, config = pipeline
    result = audiobuffer("run", config, *args)
    if "cuda" in args[-1] and result.returncode == 0:
        pytest.skip("this machine has CUDA")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_missing_config_file_exits_2(tmp_path):
    result = audiobuffer("run", tmp_path / "nope.yaml")
    assert result.returncode == 2 and "cannot read config" in result.stderr and "Traceback" not in result.stderr


def test_demo_end_to_end(tmp_path):
    out = tmp_path / "demo.json"
    result = audiobuffer("demo", "--epochs", 2, "--per-class", 5, "--cache-dir", tmp_path / "cache",
                         "--device", "cpu", "--json", out, "--no-progress")
    assert result.returncode == 0, result.stderr
    demo = json.loads(out.read_text())
    assert (demo["train_files"], demo["test_files"], demo["classes"]) == (40, 10, 10)
    assert demo["summary"]["samples"] == 2 * 40 and demo["summary"]["epochs"] == 2
    assert 0.0 <= demo["test_accuracy"] <= 1.0 and len(demo["history"]) == 2
    assert "accuracy" in result.stdout and "time split" in result.stdout
    again = audiobuffer("demo", "--epochs", 1, "--per-class", 5, "--cache-dir", tmp_path / "cache", "--device", "cpu",
                        "--json", "-", "--no-progress")
    assert again.returncode == 0 and json.loads(again.stdout)["corpus"] == demo["corpus"]  # the corpus is reused


def test_demo_rejects_bad_arguments():
    result = audiobuffer("demo", "--epochs", 0)
    assert result.returncode == 2 and "--epochs must be >= 1" in result.stderr


def test_console_script_is_installed():
    result = subprocess.run(["audiobuffer", "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("audiobuffer ")
