"""scripts/train_audio.py: a smoke run on a few real recordings, and two ranks under torchrun."""

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from helpers import REPO

SCRIPT = REPO / "scripts" / "train_audio.py"
pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def small_fsdd(tmp_path, fsdd):
    """A config over 40 FSDD recordings (4 per digit, of which the first is the test file)."""
    files = [fsdd / f"{digit}_jackson_{i}.wav" for digit in range(10) for i in (4, 5, 6, 7)]
    config = yaml.safe_load((REPO / "configs" / "fsdd.yaml").read_text())
    config["source"] = {"files": [str(f) for f in files], "labels": r"^(\d+)_"}
    config["epochs"] = 1
    config["loader"]["batch_size"] = 4
    config["train"]["checkpoint"] = str(tmp_path / "model.pt")
    path = tmp_path / "fsdd-small.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, files


def run(args, **kwargs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, timeout=360, env=env, **kwargs)


def test_smoke_run_trains_evaluates_and_checkpoints(small_fsdd, tmp_path):
    config, _ = small_fsdd
    result = run([sys.executable, SCRIPT, "--config", config, "--max-steps", "3", "--json", tmp_path / "m.json"])
    assert result.returncode == 0, result.stderr
    assert "30 train / 10 test files, 10 classes, 1 rank(s), 3 steps per epoch" in result.stdout
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["epochs"][0]["test_accuracy"] is not None
    checkpoint = torch.load(tmp_path / "model.pt", weights_only=False)
    assert checkpoint["classes"] == [str(d) for d in range(10)] and "model" in checkpoint


def test_bad_config_is_reported(small_fsdd):
    config, _ = small_fsdd
    result = run([sys.executable, SCRIPT, "--config", config, "--set", "buffer.producers=0"])
    assert result.returncode == 2
    assert "buffer.producers" in result.stderr and "Traceback" not in result.stderr


def test_torchrun_two_ranks_see_disjoint_shards(small_fsdd, tmp_path):
    config, files = small_fsdd
    seen_dir = tmp_path / "seen"
    result = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", SCRIPT,
                  "--config", config, "--seen-log", seen_dir])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rank(s)" in result.stdout
    rank0 = json.loads((seen_dir / "rank0.json").read_text())
    rank1 = json.loads((seen_dir / "rank1.json").read_text())
    train_files = {str(f) for f in files if not f.name.endswith("_4.wav")}
    assert len(rank0) == len(rank1) == 15
    assert not set(rank0) & set(rank1)
    assert set(rank0) | set(rank1) == train_files
