"""The benchmarks run (smoke only: speed is measured by the scripts, never asserted here)."""

import json
import os
import subprocess
import sys

import pytest

from audiobuffer.bench import main as bench_main
from helpers import REPO

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
    assert plot.stat().st_size > 10_000


def test_decode_bench_rejects_unknown_approaches(capsys):
    with pytest.raises(SystemExit):
        bench_main(["--approaches", "magic"])
    assert "unknown approaches" in capsys.readouterr().err


def test_stress_quick_checks_pass(tmp_path):
    from audiobuffer.stress import main as stress_main

    out = tmp_path / "stress.json"
    assert stress_main(["--quick", "--shapes", "2x2x4,1x3x1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["lost"] == report["duplicated"] == report["bound_violations"] == 0
    assert report["items_moved"] > 0 and len(report["summary"]) == 2


@pytest.mark.parametrize("impl", ["buffer", "buffer-many", "queue"])
@pytest.mark.parametrize("jitter", [False, True])
def test_stress_round_moves_each_item_once(impl, jitter):
    from audiobuffer.stress import run_round

    result = run_round(impl, producers=3, consumers=2, capacity=3, items=3000 if not jitter else 300, payload=16,
                       jitter=jitter, seed=1)
    assert (result.lost, result.duplicated, result.bound_ok) == (0, 0, True)


def test_stress_shape_errors():
    from audiobuffer.stress import parse_shapes

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
    from audiobuffer.stress import main as stress_main

    out = tmp_path / "soak.json"
    assert stress_main(["--quick", "--minutes", "0.05", "--shapes", "2x2x4,3x1x2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passes"] >= 2
    assert report["lost"] == report["duplicated"] == report["bound_violations"] == 0
    assert report["threads_end"] == report["threads_start"]
    assert report["fds_end"] == report["fds_start"]
