import json
import os
import re
import sys

import numpy as np
import pytest
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


# -- the demo's options: --num-producers (the YAML's name) and --threads ---------------------------

_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


#: A small demo: one epoch of two files a class.
_SMALL = ("demo", "--epochs", "1", "--per-class", "2", "--device", "cpu", "--no-progress", "--json", "-")


@pytest.fixture
def demo(tmp_path, cli, monkeypatch):
    """The demo run here (``cli``), without the thread settings of the environment."""
    for name in _THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    return lambda *args: cli(*_SMALL, "--cache-dir", tmp_path, *args)


@pytest.mark.timeout(400)
def test_demo_num_producers_is_the_yaml_name_and_producers_still_works(demo):
    from audiobuffer.cli.main import command_parsers

    assert command_parsers()["demo"].parse_args(["--num-producers", "3"]).num_producers == 3
    done = demo("--producers", "1")
    assert done.returncode == 0, done.stderr
    assert "demo --producers is deprecated: write --num-producers" in done.stderr
    assert json.loads(done.stdout)["num_producers"] == 1 and "1 producers)" in done.stderr


@pytest.mark.timeout(400)
def test_demo_says_how_many_threads_it_chose(tmp_path, cli_process):
    """'auto' threads: one a core, but one left to the producers where the machine is busy (never
    fewer than one), idle OpenMP threads asleep (OMP_WAIT_POLICY set before torch is imported), said
    in one line with the load it was chosen by. In a new process: torch is not imported there yet."""
    from audiobuffer.options import usable_cores

    env = {k: v for k, v in os.environ.items() if k not in _THREAD_ENV}
    done = cli_process(*_SMALL, "--cache-dir", tmp_path, "--num-producers", "1", env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    cores = usable_cores()
    said = re.fullmatch(rf"torch intra-op threads (\d+) \(auto: {cores} cores, (?:load average [\d.]+ on "
                        rf"{cores} usable cores|CPU \d+% busy|load unknown .*?)(: busy, 1 left to the "
                        rf"producers)?\); idle OpenMP threads: OMP_WAIT_POLICY=PASSIVE", result["threads"])
    assert said, result["threads"]
    threads = max(1, cores - 1) if said[2] else cores
    assert int(said[1]) == result["intra_op_threads"] == threads
    assert f"threads       {result['threads']}" in done.stderr.splitlines()


@pytest.mark.parametrize("load, threads", [(0.2, 2), (0.99, 2), (1.0, 1), (7.0, 1)])
def test_auto_threads_leave_the_producers_a_core_only_on_a_busy_machine(monkeypatch, load, threads):
    import torch

    from audiobuffer.cli import _measure, _threads

    monkeypatch.setattr(_threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(_measure, "machine_load", lambda: (load, f"load average {2 * load:.2f} on 2 usable cores"))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    try:
        line = _threads.set_torch_threads("auto", device_type="cpu", wait=None, spare=1)
        assert torch.get_num_threads() == threads, line
    finally:
        torch.set_num_threads(before)
    assert line.startswith(f"torch intra-op threads {threads} (auto: 2 cores, load average")
    assert ("busy, 1 left to the producers" in line) == (threads == 1)


@pytest.mark.timeout(400)
def test_demo_takes_a_thread_count_and_keeps_the_users_openmp_wait(demo, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    done = demo("--threads", "1")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["intra_op_threads"] == 1
    assert result["threads"] == "torch intra-op threads 1 (--threads); idle OpenMP threads: OMP_WAIT_POLICY=ACTIVE"
    bad = demo("--threads", "0")
    assert bad.returncode == 2 and "argument --threads: must be an integer >= 1, got 0" in bad.stderr


def test_quiet_openmp_sets_passive_only_before_torch_and_never_over_the_users_setting(monkeypatch):
    from audiobuffer.cli._threads import parse_threads, quiet_openmp

    env: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", env)
    assert "torch" in sys.modules  # this test process: too late to set it
    assert quiet_openmp() is None and env == {}
    monkeypatch.delitem(sys.modules, "torch")
    assert quiet_openmp() == "OMP_WAIT_POLICY=PASSIVE" and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env.clear()
    env["GOMP_SPINCOUNT"] = "1000"
    assert quiet_openmp() == "GOMP_SPINCOUNT=1000" and "OMP_WAIT_POLICY" not in env
    assert parse_threads("auto") == "auto" and parse_threads("3") == 3
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match="--threads"):
            parse_threads(bad)
