"""CPU training: ``scripts/train_audio.py`` on FSDD with each choice of torch threads, quiet and loaded.

    python benchmarks/bench_train_threads.py                       # as the machine is now
    python benchmarks/bench_train_threads.py --load 2              # with 2 busy processes beside it
    python benchmarks/bench_train_threads.py --load 0,2 --json out.json  # both, saved

Each setting (:data:`SETTINGS`) is a ``--threads`` value and how idle OpenMP threads wait: ``spin`` is
OpenMP's default (``GOMP_SPINCOUNT=300000``, libgomp's own default spin of about 3 ms, which also keeps
the script from setting ``OMP_WAIT_POLICY``), ``passive`` is ``OMP_WAIT_POLICY=PASSIVE`` (what the
script sets unless the environment says otherwise). The settings take turns, round by round, each run
a fresh process that trains ``--epochs`` epochs of ``--steps`` steps; the first epoch is left out.
``--load N`` starts N busy Python processes for the rounds (stopped afterwards, and ending with this
process in any case): a machine shared with other work. The load average (``os.getloadavg()``) is
recorded before each run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from harness import FSDD, REPO, command_line, results

#: Each setting: its ``--threads`` and its environment ("cores": as many as this machine has).
SETTINGS: dict[str, tuple[str, dict[str, str]]] = {
    "cores-spin": ("cores", {"GOMP_SPINCOUNT": "300000"}),  # torch's default, untouched
    "1-spin": ("1", {"GOMP_SPINCOUNT": "300000"}),  # OMP_NUM_THREADS=1's effect
    "cores-passive": ("cores", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "1-passive": ("1", {"OMP_WAIT_POLICY": "PASSIVE"}),
    "auto": ("auto", {}),  # what the script does by default
}
CONFIG = REPO / "configs" / "fsdd.yaml"
TRAIN = REPO / "scripts" / "train_audio.py"
RUN_TIMEOUT = 1800.0
_ENV_CLEARED = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` busy Python processes while the block runs; each is stopped afterwards."""
    # Each also ends when this process does, however it ends (os.getppid() changes once it is gone).
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
    started = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]
    try:
        yield
    finally:
        for proc in started:
            proc.kill()
        for proc in started:
            proc.wait(timeout=30)


def train(setting: str, *, epochs: int, steps: int, fsdd: Path, work: Path) -> dict[str, Any]:
    """One fresh run of ``scripts/train_audio.py`` under ``setting``: its metrics and the line it printed."""
    threads, extra = SETTINGS[setting]
    out = work / "metrics.json"
    cmd = [sys.executable, str(TRAIN), "--config", str(CONFIG), "--no-progress", "--json", str(out),
           "--checkpoint-dir", str(work / "checkpoints"), "--save-every", "0", "--max-steps", str(steps),
           "--set", f"epochs={epochs}", "--set", f"source.root={fsdd}",
           "--threads", str(_cores()) if threads == "cores" else threads]
    env = {k: v for k, v in os.environ.items() if k not in _ENV_CLEARED}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    load = load_average()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False, cwd=work, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"train_audio.py ({setting}) failed (exit {done.returncode}):\n{done.stderr}")
    metrics: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    chosen = next((line for line in done.stdout.splitlines() if line.startswith("torch intra-op threads")), "")
    return {"epochs_s": [e["seconds"] for e in metrics["epochs"]], "load_before": load, "chosen": chosen}


def rows_of(runs: dict[tuple[int, str], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (busy processes, setting): each run's epochs after the first, their median, and the
    median against torch's default (``cores-spin``) under the same load."""
    rows = []
    for (load, setting), found in runs.items():
        later = [s for run in found for s in run["epochs_s"][1:]]
        rows.append({"busy_processes": load, "setting": setting, "median_s": statistics.median(later),
                     "epochs_s": [run["epochs_s"] for run in found],
                     "load_before": [run["load_before"] for run in found],
                     "chosen": sorted({run["chosen"] for run in found})})
    default = {row["busy_processes"]: row["median_s"] for row in rows if row["setting"] == "cores-spin"}
    for row in rows:
        base = default.get(row["busy_processes"])
        row["vs_default"] = base / row["median_s"] if base else None
    return rows


def table(rows: list[dict[str, Any]], steps: int) -> str:
    lines = [f"| busy processes | setting | epoch of {steps} steps + test, median s | vs torch's default | "
             "load before each run |", "|---|---|---|---|---|"]
    for row in rows:
        ratio = f"{row['vs_default']:.2f}x" if row["vs_default"] else "-"
        loads = ", ".join(f"{x:.1f}" for x in row["load_before"] if x is not None) or "-"
        lines.append(f"| {row['busy_processes']} | {row['setting']} | {row['median_s']:.2f} | {ratio} | {loads} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting, taking turns (default 3)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run, the first left out (default 2)")
    parser.add_argument("--steps", type=int, default=30, help="steps per epoch (default 30)")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"subset of {','.join(SETTINGS)}")
    parser.add_argument("--load", default="0", help="busy processes beside the runs, one value or several "
                                                   "(comma-separated, measured in turn; default 0)")
    parser.add_argument("--fsdd", type=Path, default=FSDD, help=f"the FSDD recordings (default {FSDD})")
    parser.add_argument("--json", metavar="PATH", help="save the measured rows as JSON here")
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or any(s not in SETTINGS for s in settings):
        parser.error(f"--settings takes a comma-separated subset of {','.join(SETTINGS)}, got {args.settings!r}")
    try:
        loads = [int(x) for x in args.load.split(",")]
    except ValueError:
        parser.error(f"--load takes counts of busy processes, e.g. 0,2, got {args.load!r}")
    if args.rounds < 1 or args.epochs < 2 or args.steps < 1 or min(loads) < 0:
        parser.error("--rounds and --steps must be >= 1, --epochs >= 2 and --load >= 0")
    if not any(args.fsdd.glob("*.wav")):
        parser.error(f"--fsdd {str(args.fsdd)!r} holds no .wav files (the FSDD recordings folder)")
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="audiobuffer-threads-") as tmp:
        for load in loads:
            with busy(load):
                for round_ in range(args.rounds):
                    for setting in settings:
                        work = Path(tmp) / f"{load}-{setting}-{round_}"
                        work.mkdir()
                        run = train(setting, epochs=args.epochs, steps=args.steps, fsdd=args.fsdd, work=work)
                        runs.setdefault((load, setting), []).append(run)
                        seconds = ", ".join(f"{s:.2f}" for s in run["epochs_s"])
                        print(f"  busy {load}, round {round_ + 1}: {setting}: {seconds} s "
                              f"(load before {run['load_before']}) {run['chosen']}", file=sys.stderr)
    rows = rows_of(runs)
    print(table(rows, args.steps))
    if args.json:  # no BENCHMARKS.md section renders these: kept apart from benchmarks/results
        measured = results("train-threads", rows, command=command_line("bench_train_threads.py", argv),
                           settings={"rounds": args.rounds, "epochs": args.epochs, "steps": args.steps,
                                     "first_epoch": "left out", "config": "configs/fsdd.yaml"})
        Path(args.json).write_text(json.dumps(measured, indent=2) + "\n", encoding="utf-8", newline="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
