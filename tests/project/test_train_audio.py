"""scripts/train_audio.py: a smoke run on a few real recordings, two ranks under torchrun, and
checkpoints, mid-epoch resume and the deterministic mode on a tiny generated corpus.

A run of one process is started as a command where the command itself is under test (the smoke
run, Ctrl-C, the thread settings made before torch loads); elsewhere it runs in this process
(``helpers.run_script_here``: the script's ``train`` under its ``script_main``), which spares a
start of torch a run.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import REPO, import_script, make_corpus, run_script_here

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


def run(args, *, env=None, **kwargs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(args, capture_output=True, text=True, timeout=360, env=env, **kwargs)


@pytest.fixture(scope="module")
def script():
    return import_script(SCRIPT)


def test_smoke_run_trains_evaluates_and_checkpoints(small_fsdd, tmp_path):
    """The command trains, evaluates and checkpoints; an OMP_NUM_THREADS the user set (run() sets
    1) is kept, and said (test_threads_auto_says_its_choice_and_sets_the_wait_before_torch checks
    the rest of --threads)."""
    config, _ = small_fsdd
    result = run([sys.executable, SCRIPT, "--config", config, "--max-steps", "3", "--json", tmp_path / "m.json"])
    assert result.returncode == 0, result.stderr
    assert ("torch intra-op threads 1 (OMP_NUM_THREADS=1); idle OpenMP threads: OMP_WAIT_POLICY=PASSIVE"
            in result.stdout.splitlines())
    assert "30 train / 10 test files, 10 classes, 1 rank(s), 3 steps per epoch" in result.stdout
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["epochs"][0]["test_accuracy"] is not None
    checkpoint = torch.load(tmp_path / "model.pt", weights_only=True)
    assert checkpoint["classes"] == [str(d) for d in range(10)] and "model" in checkpoint
    assert (checkpoint["epoch"], checkpoint["step"]) == (1, 0)  # the next run would start epoch 2


@pytest.mark.filterwarnings("ignore:.*buffer.producers is deprecated:DeprecationWarning")
def test_bad_config_is_reported(small_fsdd, script, tmp_path):
    config, _ = small_fsdd
    result = run_script_here(script, "--config", config, "--set", "buffer.producers=0",
                             cwd=tmp_path)
    assert result.returncode == 2
    assert "buffer.producers" in result.stderr and "Traceback" not in result.stderr


def test_torchrun_two_ranks_see_disjoint_shards(small_fsdd, tmp_path):
    config, files = small_fsdd
    seen_dir = tmp_path / "seen"
    result = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", SCRIPT,
                  "--config", config, "--seen-log", seen_dir])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rank(s)" in result.stdout
    rank0 = [p for line in _seen(seen_dir / "rank0.jsonl") for p in line["paths"]]
    rank1 = [p for line in _seen(seen_dir / "rank1.jsonl") for p in line["paths"]]
    train_files = {str(f) for f in files if not f.name.endswith("_4.wav")}
    assert len(rank0) == len(rank1) == 15
    assert not set(rank0) & set(rank1)
    assert set(rank0) | set(rank1) == train_files


# -- checkpoints, resume, progress and the deterministic mode (tiny generated corpus) ---------------

TINY_TRAIN_FILES = 30  # of 36; 6 are the test split
TINY_STEPS = 8  # ceil(30 / 4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A config over 36 generated quarter-second tones in 3 classes, with a small model: fast to
    train. Shared by the module's tests: a run writes in its own folder, never in this one."""
    tmp_path = tmp_path_factory.mktemp("tiny")
    paths = make_corpus(tmp_path / "audio", 36, classes=3, seconds=0.25)
    config = {"source": {"root": "audio", "labels": r"^(\d+)_"}, "decode": {"sample_rate": 8000},
              "buffer": {"num_producers": 2, "buffer_size": 16}, "loader": {"batch_size": 4, "pin_memory": False},
              "device": "cpu", "epochs": 2, "seed": 0,
              "train": {"channels": 4, "n_mels": 16, "n_fft": 128, "hop_length": 64,
                        "test_files": r"_000[0-5]\.wav$"}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    train_files = sorted(str(p) for p in paths if not p.name.endswith(tuple(f"_000{i}.wav" for i in range(6))))
    assert len(train_files) == TINY_TRAIN_FILES
    return path, train_files


def _seen(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train(script, config, *args, cwd, env=None):
    result = run_script_here(script, "--config", config, *args, cwd=cwd, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("isolate", [False, True])
def test_resume_mid_epoch_trains_on_each_sample_once(tiny, script, tmp_path, isolate):
    """Stopped after 3 steps and resumed: epoch 0 trains on every file exactly once, steps run on from
    3, and the checkpoint went to ./runs/CONFIG-NAME/ (not into the source tree). In process, and with
    buffer.isolate (an IsolatedLoader)."""
    config, train_files = tiny
    setup = ["--set", f"buffer.isolate={str(isolate).lower()}"]
    first = _train(script, config, *setup, "--stop-at-step", "3", "--save-every", "0", "--seen-log",
                   tmp_path / "seen", "--json", tmp_path / "first.json", cwd=tmp_path)
    checkpoint = tmp_path / "runs" / "tiny" / "last.pt"
    assert "stopped at epoch 1, step 3 of 8" in first.stdout and checkpoint.is_file()
    assert json.loads((tmp_path / "first.json").read_text()) == {"world_size": 1, "epochs": [],
                                                                 "stopped_at": {"epoch": 0, "step": 3}}
    saved = torch.load(checkpoint, weights_only=True)
    assert (saved["epoch"], saved["step"]) == (0, 3) and saved["ranks"][0]["dataset"] is not None
    assert set(saved) >= {"model", "optimizer", "schedule"}

    second = _train(script, config, *setup, "--resume", tmp_path / "runs" / "tiny", "--seen-log",
                    tmp_path / "seen", "--progress", "--json", tmp_path / "second.json", cwd=tmp_path)
    assert "resuming" in second.stdout and "epoch 2/2" in second.stdout
    # The progress bar within the epoch starts at the step resumed from.
    assert "epoch 1/2:  38%" in second.stderr and f"3/{TINY_STEPS}" in second.stderr and "step/s" in second.stderr

    steps = _seen(tmp_path / "seen" / "rank0.jsonl")
    epoch0 = [line for line in steps if line["epoch"] == 0]
    assert [line["step"] for line in epoch0] == list(range(TINY_STEPS))
    trained = [p for line in epoch0 for p in line["paths"]]
    assert sorted(trained) == train_files  # each file once: none skipped, none repeated
    epoch1 = [p for line in steps if line["epoch"] == 1 for p in line["paths"]]
    assert sorted(epoch1) == train_files
    metrics = json.loads((tmp_path / "second.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [0, 1] and metrics["stopped_at"] is None


def _stop_by_duration(script, config, folder):
    """One rank batching by duration (--max-batch-seconds 1), stopped after 3 of its 8 batches, in
    ``folder``: checkpoints in ck/, seen logs in seen/, the durations' cache in cache/; the first
    run's result and the options the runs share."""
    env = {"AUDIOBUFFER_CACHE_DIR": str(folder / "cache")}
    common = ["--set", "epochs=1", "--max-batch-seconds", "1", "--checkpoint-dir", folder / "ck",
              "--seen-log", folder / "seen"]
    first = _train(script, config, *common, "--stop-at-step", "3", cwd=folder, env=env)
    return first, common, env


def test_max_batch_seconds_batches_by_duration_and_resumes_mid_epoch(tiny, script, tmp_path):
    """--max-batch-seconds 1: four quarter-second files a batch (8 batches of the 30 files), stopped after
    3 steps and resumed: epoch 0 trains on every file exactly once, in batches within the budget."""
    config, train_files = tiny
    first, common, env = _stop_by_duration(script, config, tmp_path)
    assert f"1 rank(s), {TINY_STEPS} steps per epoch" in first.stdout
    _train(script, config, *common, "--resume", tmp_path / "ck", cwd=tmp_path, env=env)
    lines = _seen(tmp_path / "seen" / "rank0.jsonl")
    assert [line["step"] for line in lines] == list(range(TINY_STEPS))
    assert all(len(line["paths"]) <= 4 for line in lines)
    assert sorted(p for line in lines for p in line["paths"]) == train_files


def test_deterministic_resumed_run_repeats_an_unbroken_one(tiny, script, tmp_path):
    config, _ = tiny
    _train(script, config, "--deterministic", "--checkpoint-dir", tmp_path / "a", "--seen-log",
           tmp_path / "seen-a", "--json", tmp_path / "a.json", cwd=tmp_path)
    _train(script, config, "--deterministic", "--checkpoint-dir", tmp_path / "b", "--stop-at-step", "11",
           "--seen-log", tmp_path / "seen-b", cwd=tmp_path)
    _train(script, config, "--deterministic", "--checkpoint-dir", tmp_path / "b", "--resume",
           tmp_path / "b" / "last.pt", "--seen-log", tmp_path / "seen-b", "--json", tmp_path / "b.json",
           cwd=tmp_path)
    assert _seen(tmp_path / "seen-a" / "rank0.jsonl") == _seen(tmp_path / "seen-b" / "rank0.jsonl")
    unbroken = json.loads((tmp_path / "a.json").read_text())["epochs"]
    resumed = json.loads((tmp_path / "b.json").read_text())["epochs"]
    assert len(unbroken) == len(resumed) == 2
    for a, b in zip(unbroken, resumed):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
        assert b["test_accuracy"] == a["test_accuracy"]
    assert not (tmp_path / "runs").exists()  # --checkpoint-dir was used


def test_resume_refuses_a_checkpoint_from_another_setup(tiny, script, tmp_path):
    config, _ = tiny
    _train(script, config, "--stop-at-step", "2", "--checkpoint-dir", tmp_path / "ck", cwd=tmp_path)
    result = run_script_here(script, "--config", config, "--resume", tmp_path / "ck", "--set",
                             "loader.batch_size=2", cwd=tmp_path)
    assert result.returncode == 2
    assert "train_audio: error: --resume" in result.stderr and "steps" in result.stderr
    assert "Traceback" not in result.stderr
    missing = run_script_here(script, "--config", config, "--resume", tmp_path / "nowhere",
                              cwd=tmp_path)
    assert missing.returncode == 2 and "no checkpoint" in missing.stderr and "Traceback" not in missing.stderr
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    junk = run_script_here(script, "--config", config, "--resume", tmp_path / "junk.pt",
                           cwd=tmp_path)
    assert junk.returncode == 2 and "cannot read" in junk.stderr and "Traceback" not in junk.stderr


def test_checkpoints_stay_out_of_the_source_tree():
    config = yaml.safe_load((REPO / "configs" / "fsdd.yaml").read_text())
    assert "checkpoint" not in config.get("train", {})  # so the default, ./runs/fsdd/, applies
    ignored = (REPO / ".gitignore").read_text().split()
    assert "/runs/" in ignored


def _torchrun(ranks):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
            SCRIPT]


def _stopped_options(config, folder):
    return ["--config", config, "--set", "epochs=1", "--checkpoint-dir", folder / "ck",
            "--seen-log", folder / "seen"]


def test_torchrun_resumes_a_checkpoint_of_another_rank_count(tiny, script, tmp_path):
    """Two ranks stop after 2 of their 4 steps: each rank's dataset state was gathered into the one
    checkpoint. It resumes on three ranks (torchrun) and on one (no torchrun): the ranks' dataset
    states are merged and the 14 files not yet trained on are dealt again, so epoch 0 covers every
    file once (one repeated: padding 14 to 3 equal shares). (A resume on two ranks, each rank's
    own state restored: test_ctrl_c_under_torchrun_saves_one_checkpoint_for_both_ranks.)"""
    from collections import Counter

    config, train_files = tiny
    three_ranks, one_rank = tmp_path / "three", tmp_path / "one"
    first = run([*_torchrun(2), *_stopped_options(config, three_ranks), "--stop-at-step", "2"],
                cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    saved = torch.load(three_ranks / "ck" / "last.pt", weights_only=True)
    assert (saved["step"], saved["world_size"], len(saved["ranks"])) == (2, 2, 2)
    for name in ("ck", "seen"):
        shutil.copytree(three_ranks / name, one_rank / name)
    three = run([*_torchrun(3), *_stopped_options(config, three_ranks), "--resume", three_ranks / "ck"],
                cwd=tmp_path)
    assert three.returncode == 0, three.stdout + three.stderr
    assert "3 rank(s), 3 steps per epoch" in three.stdout
    assert "at epoch 1, after step 2 of its 2 rank(s): what they had not trained on is dealt " \
           "over 3" in three.stdout, three.stdout
    _train(script, *_stopped_options(config, one_rank)[1:], "--resume", one_rank / "ck", cwd=tmp_path)
    for seen, ranks, repeats in ((three_ranks / "seen", 3, 1), (one_rank / "seen", 2, 0)):
        lines = [line for r in range(ranks) for line in _seen(seen / f"rank{r}.jsonl")]
        counts = Counter(p for line in lines for p in line["paths"])
        assert sorted(counts) == train_files
        assert sum(counts.values()) - len(counts) == repeats
    after = [len(_seen(three_ranks / "seen" / f"rank{r}.jsonl")) for r in range(3)]
    assert after == [2 + 2, 2 + 2, 2]  # equal steps after the resume on every rank
    assert [line["step"] for line in _seen(one_rank / "seen" / "rank0.jsonl")] == [0, 1, *range(4, 8)]


def test_a_checkpoint_of_batches_by_duration_resumes_on_two_ranks(tiny, script, tmp_path):
    """One rank stops after 3 of its 8 batches by duration; two ranks (torchrun) resume: the 5
    batches left are dealt over them (3 each, one repeated), and epoch 0 covers every file."""
    from collections import Counter

    config, train_files = tiny
    _, common, env = _stop_by_duration(script, config, tmp_path)
    two = run([*_torchrun(2), "--config", config, *common, "--resume", tmp_path / "ck"], cwd=tmp_path,
              env=env)
    assert two.returncode == 0, two.stdout + two.stderr
    ranks = [_seen(tmp_path / "seen" / f"rank{r}.jsonl") for r in (0, 1)]
    assert [len(lines) for lines in ranks] == [3 + 3, 3]
    counts = Counter(p for lines in ranks for line in lines for p in line["paths"])
    assert sorted(counts) == train_files and all(len(line["paths"]) <= 4 for line in ranks[1])


# -- Ctrl-C: a checkpoint, one line with the resume command, exit 130 ------------------------------

INTERRUPT_TIMEOUT = 120.0


def _interrupt_when_training(args, seen, *, cwd, group=False):
    """Start ``args``, wait until its seen log shows 3 steps, send SIGINT (to the process group with
    ``group``: what a terminal's Ctrl-C does), and return the finished process's exit code and output."""
    import signal
    import time

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                            start_new_session=group)
    try:
        deadline = time.monotonic() + INTERRUPT_TIMEOUT
        while sum(p.read_text().count("\n") for p in seen.glob("rank*.jsonl")) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.05)  # polling a file another process writes
        if group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=INTERRUPT_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    return proc.returncode, out, err


def _resume_line(out):
    lines = [line for line in out.splitlines() if line.startswith("interrupted at epoch")]
    assert len(lines) == 1, out
    return lines[0]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process: POSIX (CTRL_C_EVENT needs a console)")
def test_ctrl_c_saves_mid_epoch_says_how_to_resume_and_the_resumed_epoch_is_exact(tiny, script, tmp_path):
    """SIGINT mid-epoch: exit 130 with no traceback, a checkpoint with the loader's state, one line naming
    it and the resume command; that command, run to the epoch's end, trains on every file once."""
    import shlex

    config, train_files = tiny
    seen = tmp_path / "seen"
    args = [sys.executable, str(SCRIPT), "--config", str(config), "--set", "epochs=40", "--set",
            "loader.batch_size=1", "--save-every", "0", "--seen-log", str(seen)]
    code, out, err = _interrupt_when_training(args, seen, cwd=tmp_path)
    assert code == 130, out + err
    assert "Traceback" not in err, err
    line = _resume_line(out)
    checkpoint = (tmp_path / "runs" / "tiny" / "last.pt").resolve()
    assert f"checkpoint {checkpoint};" in line, line
    saved = torch.load(checkpoint, weights_only=True)
    epoch, step = saved["epoch"], saved["step"]
    steps = TINY_TRAIN_FILES  # batches of one
    assert f"interrupted at epoch {epoch + 1}, step {step} of {steps}" in line
    if step:  # mid-epoch: the loader's state came with it
        assert saved["ranks"][0]["dataset"] is not None

    resume = shlex.split(line.split("resume with: ", 1)[1])
    assert resume[:2] == [sys.executable, str(SCRIPT)] and resume[-2:] == ["--resume", str(checkpoint)], resume
    # Run on to the end of the interrupted epoch only (in this process: the command's first two
    # words, the interpreter and the script, are checked above).
    done = run_script_here(script, *resume[2:], "--stop-at-step", str((epoch + 1) * steps),
                           cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming {checkpoint} at epoch {epoch + 1}, step {step}" in done.stdout, done.stdout
    lines = [line for line in _seen(seen / "rank0.jsonl") if line["epoch"] == epoch]
    assert [line["step"] for line in lines] == list(range(steps))  # none repeated, none skipped
    assert sorted(p for line in lines for p in line["paths"]) == train_files


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a process group: POSIX")
def test_ctrl_c_under_torchrun_saves_one_checkpoint_for_both_ranks(tiny, tmp_path):
    """Ctrl-C to torchrun's process group (the ranks get SIGINT from the terminal and from torchrun):
    the ranks agree on one step, rank 0 writes one checkpoint holding both ranks' states, and resuming
    it with two ranks restores each rank's shard: the steps run on from the one saved on each rank,
    and the epoch trains on every file once across the ranks."""
    config, train_files = tiny
    seen = tmp_path / "seen"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
                "--config", str(config), "--set", "loader.batch_size=1", "--save-every", "0",
                "--checkpoint-dir", str(tmp_path / "ck"), "--seen-log", str(seen)]
    code, out, err = _interrupt_when_training([*torchrun, "--set", "epochs=40"], seen, cwd=tmp_path, group=True)
    assert code != 0, out + err
    line = _resume_line(out)
    assert "torchrun --nproc_per_node=2" in line and f"--resume {(tmp_path / 'ck' / 'last.pt').resolve()}" in line
    saved = torch.load(tmp_path / "ck" / "last.pt", weights_only=True)
    epoch, step = saved["epoch"], saved["step"]
    steps = TINY_TRAIN_FILES // 2
    assert (saved["world_size"], len(saved["ranks"])) == (2, 2)
    assert f"interrupted at epoch {epoch + 1}, step {step} of {steps}" in line
    if step:  # mid-epoch: each rank's loader state came with it
        assert all(rank["dataset"] is not None for rank in saved["ranks"])
    done = run([*torchrun, "--set", "epochs=40", "--resume", str(tmp_path / "ck"),
                "--stop-at-step", str((epoch + 1) * steps)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    trained = []
    for rank in (0, 1):
        lines = [line for line in _seen(seen / f"rank{rank}.jsonl") if line["epoch"] == epoch]
        assert [line["step"] for line in lines] == list(range(steps))
        trained += [p for line in lines for p in line["paths"]]
    assert sorted(trained) == train_files


def test_default_save_every_writes_a_checkpoint_within_an_fsdd_epoch(fsdd, script):
    """configs/fsdd.yaml's epoch (2700 train files in batches of 32: 85 steps) holds a mid-epoch save."""
    config = yaml.safe_load((REPO / "configs" / "fsdd.yaml").read_text())
    steps = -(-2700 // config["loader"]["batch_size"])
    save_every = script._parser().parse_args(["--config", "x"]).save_every
    assert 0 < save_every < steps


def test_threads_auto_says_its_choice_and_sets_the_wait_before_torch(tiny, script, tmp_path):
    """--threads auto (the default): one thread a core and OMP_WAIT_POLICY=PASSIVE, said in one line;
    --threads N pins; a bad value is refused by name. (An OMP_NUM_THREADS the user set is kept:
    test_smoke_run_trains_evaluates_and_checkpoints.)"""
    from audiobuffer.options import usable_cores

    config, _ = tiny
    cleared = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
    env = {k: v for k, v in os.environ.items() if k not in cleared}
    args = [sys.executable, SCRIPT, "--config", config, "--set", "epochs=1", "--max-steps", "1"]
    auto = subprocess.run(args, capture_output=True, text=True, timeout=360, env=env, cwd=tmp_path)
    assert auto.returncode == 0, auto.stderr
    cores = usable_cores()
    assert (f"torch intra-op threads {cores} (auto: {cores} cores); idle OpenMP threads: OMP_WAIT_POLICY=PASSIVE"
            in auto.stdout.splitlines())
    pinned = run_script_here(script, *args[2:], "--threads", "1", cwd=tmp_path)
    assert pinned.returncode == 0 and "torch intra-op threads 1 (--threads); " in pinned.stdout
    bad = run_script_here(script, *args[2:], "--threads", "none", cwd=tmp_path)
    assert bad.returncode == 2 and "argument --threads: must be an integer >= 1 or 'auto', got 'none'" in bad.stderr
