"""Equal DDP shards under a real torchrun: every rank the same count, together every item; in samples and
in batches by duration."""

import json
import math

import numpy as np
import pytest
from helpers import REPO, duration_manifest, run_torchrun

N = 11


@pytest.mark.timeout(300)
def test_torchrun_ranks_get_equal_disjoint_shards(tmp_path):
    out = tmp_path / "report.json"
    result = run_torchrun(REPO / "tests" / "ddp_equal_shards.py", out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    for key, ranks in report.items():
        mode = key.split("-")[0]
        counts = [len(r["seen"]) for r in ranks]
        assert counts[0] == counts[1] == ranks[0]["len"] == ranks[1]["len"], (key, counts)
        together = ranks[0]["seen"] + ranks[1]["seen"]
        if mode == "pad":
            assert counts[0] == 6 and set(together) == set(range(N))  # one item repeated to even out
        else:
            assert counts[0] == 5 and len(set(together)) == 10 and len(together) == 10  # one item left out


@pytest.mark.timeout(300)
def test_torchrun_ranks_get_equal_batches_by_duration(tmp_path):
    durations = np.random.default_rng(0).uniform(0.2, 6.0, 97).round(2)
    manifest = duration_manifest(tmp_path, durations)
    out = tmp_path / "report.json"
    result = run_torchrun(REPO / "tests" / "ddp_duration_batches.py", manifest, out)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    for key, ranks in report.items():
        mode = key.split("-")[0]
        counts = [len(r["batches"]) for r in ranks]
        assert ranks[0]["counts"] == ranks[1]["counts"] == counts, key  # all-gathered on each rank
        assert counts[0] == counts[1] == ranks[0]["len"] == ranks[1]["len"], (key, counts)
        batches = [tuple(b) for r in ranks for b in r["batches"]]
        assert all(len(b) == 1 or len(b) * max(durations[list(b)]) <= 8.0 for b in batches)
        items = [i for b in batches for i in b]
        planned = ranks[0]["planned"]
        if mode == "pad":  # each item in exactly one rank's batches, but for whole batches repeated to even out
            assert counts[0] == math.ceil(planned / 2) and set(items) == set(range(97))
            assert len(set(batches)) == planned
        else:  # drop: at most one batch left out, no item twice
            assert counts[0] == planned // 2 and len(items) == len(set(items))
