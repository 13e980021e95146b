"""scripts/train_image.py: tiny runs on photo crops it makes, stopped mid-epoch and resumed, in one
process and under torchrun with the isolated loader. A run of one process runs in the test
process (``helpers.run_script_here``), which spares a start of torch a run."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from helpers import REPO, import_script, run_script_here

SCRIPT = REPO / "scripts" / "train_image.py"
pytestmark = [pytest.mark.slow, pytest.mark.subprocess, pytest.mark.timeout(300)]

IMAGES, TEST_IMAGES, BATCH = 24, 12, 4
STEPS = IMAGES // BATCH  # one rank
TINY = ["--images", IMAGES, "--test-images", TEST_IMAGES, "--batch-size", BATCH, "--size", 32,
        "--channels", 4, "--epochs", 1, "--save-every", 0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The photo crops, made once for the module by the first run (or the fixture itself)."""
    from audiobuffer.cli._photos import shipped_photos

    if not shipped_photos():
        pytest.skip("no shipped photograph (scikit-learn or matplotlib) is installed")
    return tmp_path_factory.mktemp("photo-crops")


def run(args, cwd, *, status=0):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*map(str, args)], capture_output=True, text=True, timeout=240,
                            env=env, cwd=cwd)
    assert result.returncode == status, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def script():
    return import_script(SCRIPT)


def run_here(script, args, cwd, *, status=0):
    """``run`` of the script's own arguments, in this process."""
    result = run_script_here(script, *args, cwd=cwd)
    assert result.returncode == status, result.stdout + result.stderr
    return result


def _seen(folder, rank):
    return [json.loads(line) for line in (folder / f"rank{rank}.jsonl").read_text().splitlines()]


def _train_files(data):
    return sorted(str(p.resolve()) for p in (data / f"train-{IMAGES}-2x2").rglob("*.jpg"))


def test_stopped_mid_epoch_resumes_and_trains_on_each_crop_once(data, script, tmp_path):
    """Stopped after 2 of 6 steps, resumed: the epoch's steps run on from 2, every training crop
    is trained on once, and the finished epoch is evaluated on the 12 classes' test crops. A
    checkpoint of another model is refused by name."""
    common = [*TINY, "--data", data, "--seen-log", tmp_path / "seen"]
    first = run_here(script, [*common, "--stop-at-step", 2], cwd=tmp_path)
    assert f"{IMAGES} train / {TEST_IMAGES} test images of 32 px, 12 classes" in first.stdout
    assert f"stopped at epoch 1, step 2 of {STEPS}" in first.stdout
    checkpoint = tmp_path / "runs" / "train_image" / "last.pt"  # the default place
    other = run_here(script, [*common, "--channels", 8, "--resume", checkpoint], cwd=tmp_path,
                     status=2)
    assert "train_image: error: --resume: the checkpoint was made with --channels 4 (now 8)" in (
        other.stderr) and "Traceback" not in other.stderr
    saved = torch.load(checkpoint, weights_only=True)
    assert (saved["epoch"], saved["step"]) == (0, 2) and saved["ranks"][0]["dataset"] is not None
    assert saved["classes"][:2] == ["china-r0c0", "china-r0c1"] and len(saved["classes"]) == 12
    assert saved["config"]["backend"] == "torch"  # the default: simplejpeg decodes, torch resizes

    second = run_here(script, [*common, "--resume", checkpoint.parent, "--json",
                               tmp_path / "m.json"], cwd=tmp_path)
    assert "resuming" in second.stdout and "epoch 1/1: loss" in second.stdout
    lines = _seen(tmp_path / "seen", 0)
    assert [line["step"] for line in lines] == list(range(STEPS))
    trained = sorted(str(Path(p).resolve()) for line in lines for p in line["paths"])
    assert trained == _train_files(data)  # none skipped, none repeated
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["stopped_at"] is None and 0.0 <= metrics["epochs"][0]["test_accuracy"] <= 1.0


def test_two_ranks_isolated_stop_and_one_process_resumes(data, script, tmp_path):
    """Two ranks (torchrun, the isolated loader) stop after their first step; one process resumes
    the checkpoint: the ranks' loader states are merged and the 16 crops left are trained on
    once. No test crops: one helper process a rank."""
    common = [SCRIPT, *TINY, "--test-images", 0, "--data", data, "--loader", "isolated",
              "--backend", "pillow",
              "--seen-log", tmp_path / "seen", "--checkpoint-dir", tmp_path / "ck"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    first = run([*torchrun, *common, "--stop-at-step", 1], cwd=tmp_path)
    assert f"2 rank(s), {STEPS // 2} steps per epoch" in first.stdout
    saved = torch.load(tmp_path / "ck" / "last.pt", weights_only=True)
    assert (saved["step"], saved["world_size"], len(saved["ranks"])) == (1, 2, 2)

    run_here(script, [*common[1:], "--resume", tmp_path / "ck"], cwd=tmp_path)
    ranks = [_seen(tmp_path / "seen", rank) for rank in (0, 1)]
    assert [line["step"] for line in ranks[0]] == [0, *range(2, STEPS)]  # 2 done, 4 left
    assert [line["step"] for line in ranks[1]] == [0]
    counts = Counter(str(Path(p).resolve()) for lines in ranks for line in lines
                     for p in line["paths"])
    assert sorted(counts) == _train_files(data) and set(counts.values()) == {1}
