"""``audiobuffer probe-budgets``: the budgets a step allows, written into the YAML as a mapping."""

from __future__ import annotations

import logging
import sys

import pytest
from helpers import duration_manifest

from audiobuffer.cli.main import main
from audiobuffer.config import load_config

STEP = """
import torch

LIMIT = 2e8


def step(batch):
    n, frames = batch["audio"].shape
    if n * frames ** 1.5 > LIMIT:
        raise torch.OutOfMemoryError(f"{n} x {frames}")
"""


@pytest.fixture
def step_module(tmp_path, monkeypatch):
    (tmp_path / "probe_step_model.py").write_text(STEP, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    yield "probe_step_model:step"
    sys.modules.pop("probe_step_model", None)


def true_budget(edge: float, rate: int = 1000) -> float:
    return int(2e8 // round(edge * rate) ** 1.5) * edge


def test_the_budgets_go_into_a_new_yaml_and_load(tmp_path, step_module, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        "# my run\nsource:\n  root: .\ndecode:\n  sample_rate: 1000\n"
        "loader:\n  max_batch_seconds: 60\n  buckets: 3\n",
        encoding="utf-8",
    )
    out = tmp_path / "probed.yaml"
    assert (
        main(
            [
                "probe-budgets",
                str(config),
                "--step",
                step_module,
                "--edges",
                "1,2.5,6",
                "--margin",
                "0",
                "--out",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    assert "wrote 3 budgets" in capsys.readouterr().err
    budgets = load_config(out).loader.max_batch_seconds
    assert list(budgets) == [1.0, 2.5, 6.0]
    for edge, seconds in budgets.items():
        assert 0.95 * true_budget(edge) <= seconds <= true_budget(edge) + 1e-3
    assert load_config(out).loader.buckets is None and config.read_text(
        encoding="utf-8"
    ).startswith("# my run")


def test_in_place_from_the_durations_of_the_manifest(tmp_path, step_module):
    manifest = duration_manifest(tmp_path, [0.5, 0.6, 1.0, 1.2, 3.0, 3.5, 4.0])
    config = tmp_path / "run.yaml"
    config.write_text(
        f"source:\n  manifest: {manifest.name}\n  duration_column: seconds\ndecode:\n"
        f"  sample_rate: 1000\nloader:\n  max_batch_seconds: 30\n  buckets: 2\n",
        encoding="utf-8",
    )
    assert (
        main(
            [
                "probe-budgets",
                str(config),
                "--step",
                step_module,
                "--in-place",
                "-q",
                "--margin",
                "0.2",
            ]
        )
        == 0
    )
    budgets = load_config(config).loader.max_batch_seconds
    assert isinstance(budgets, dict) and len(budgets) == 2 and list(budgets)[-1] == 4.0
    # the command leaves the package's logger as it found it (a warning later in this process shows)
    assert logging.getLogger("audiobuffer").level == logging.NOTSET
    for edge, seconds in budgets.items():
        assert seconds <= 0.8 * true_budget(edge) + 1e-3


@pytest.mark.parametrize(
    "args, message",
    [
        (["--step", "nonexistent_module_xyz:step"], "cannot import"),
        (["--step", "probe_step_model"], "MODULE:FUNCTION"),
        (["--step", "probe_step_model:missing"], "no callable 'missing'"),
        (["--edges", "2,1"], "bucket_edges must increase"),
        (["--edges", "a,b"], "--edges must be seconds"),
    ],
)
def test_a_bad_step_or_edges_is_one_line_and_status_2(tmp_path, step_module, capsys, args, message):
    config = tmp_path / "run.yaml"
    config.write_text("source:\n  root: .\n", encoding="utf-8")
    argv = ["probe-budgets", str(config), "--step", step_module, "--edges", "1,2", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_no_batch_fits_is_status_1(tmp_path, step_module, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("source:\n  root: .\ndecode:\n  sample_rate: 1000000\n", encoding="utf-8")
    assert main(["probe-budgets", str(config), "--step", step_module, "--edges", "10"]) == 1
    assert "does not fit" in capsys.readouterr().err


@pytest.mark.parametrize("written, count", [
    ("100000000", 10**8), ("1e8", 10**8), ("75GiB", 75 * 2**30), ("80GB", 80 * 10**9),
    ("64M", 64 * 10**6),
])
def test_the_memory_limit_reads_as_people_write_bytes(written, count):
    from audiobuffer.cli.probe_budgets import build_parser

    args = build_parser().parse_args(["c.yaml", "--step", "m:f", "--memory-limit", written])
    assert args.memory_limit == count


@pytest.mark.parametrize("written", ["abc", "1.5", "0", "-3", "8QB"])
def test_a_memory_limit_that_is_no_count_of_bytes_is_refused(written, capsys):
    from audiobuffer.cli.probe_budgets import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["c.yaml", "--step", "m:f", "--memory-limit", written])
    assert "--memory-limit" in capsys.readouterr().err
