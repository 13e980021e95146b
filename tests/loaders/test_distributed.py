"""Equal DDP shards under a real torchrun: every rank the same count, together every item; in samples and
in batches by duration."""

import json
import math

import numpy as np
import pytest
from helpers import REPO, duration_manifest, run_torchrun

N = 11
DURATIONS = np.random.default_rng(0).uniform(0.2, 6.0, 97).round(2)


@pytest.fixture(scope="module")
def shard_reports(tmp_path_factory):
    """One torchrun of two ranks (tests/ddp_shards.py) for both tests of equal shards: the reports
    of shards of N items and of batches by duration of DURATIONS."""
    folder = tmp_path_factory.mktemp("shards")
    manifest = duration_manifest(folder, DURATIONS)
    equal, duration = folder / "equal.json", folder / "duration.json"
    result = run_torchrun(REPO / "tests" / "ddp_shards.py", manifest, equal, duration)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(equal.read_text()), json.loads(duration.read_text())


#: The tests that read ``shard_reports``: in one pytest-xdist worker, so that it runs once.
SHARD_REPORTS = pytest.mark.xdist_group("distributed_shard_reports")


@SHARD_REPORTS
@pytest.mark.timeout(300)
def test_torchrun_ranks_get_equal_disjoint_shards(shard_reports):
    report = shard_reports[0]
    for key, ranks in report.items():
        mode = key.split("-")[0]
        counts = [len(r["seen"]) for r in ranks]
        assert counts[0] == counts[1] == ranks[0]["len"] == ranks[1]["len"], (key, counts)
        together = ranks[0]["seen"] + ranks[1]["seen"]
        if mode == "pad":
            assert counts[0] == 6 and set(together) == set(range(N))  # one item repeated to even out
        else:
            assert counts[0] == 5 and len(set(together)) == 10 and len(together) == 10  # one item left out


@SHARD_REPORTS
@pytest.mark.timeout(300)
def test_torchrun_ranks_get_equal_batches_by_duration(shard_reports):
    durations, report = DURATIONS, shard_reports[1]
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


def _launchers(script, args, *, nodes, timeout=240):
    """``nodes`` torchrun launchers of one rank each, meeting at a c10d rendezvous on the loopback
    address, as on ``nodes`` machines; their exit codes and output."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
               "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               "--rdzv-id=resize", "--local-addr=127.0.0.1", str(script), *map(str, args)]
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(nodes)]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out + err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


@pytest.mark.timeout(400)
def test_two_launchers_then_three_ranks_resume_with_every_item_once(tmp_path):
    """Two launchers (two nodes on one machine) stop mid-epoch; one launcher of three ranks merges
    their states and finishes the epoch: every item once across the ranks, then a full 3-rank
    epoch."""
    script, path = REPO / "tests" / "ddp_resize.py", tmp_path / "report.json"
    for code, output in _launchers(script, ["stop", path], nodes=2):
        assert code == 0, output[-3000:]
    result = run_torchrun(script, "resume", path, nproc=3)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(path.read_text(encoding="utf-8"))
    before = [i for seen in report["seen"] for i in seen]
    after = [i for rest in report["rest"] for i in rest]
    assert [len(s) for s in report["seen"]] == [3, 5] and len(report["states"]) == 2
    assert not set(before) & set(after) and set(before) | set(after) == set(range(41))
    assert len({len(rest) for rest in report["rest"]}) == 1  # equal shares (padded)
    assert len(after) - len(set(after)) < 3
    following = [i for f in report["following"] for i in f]
    assert set(following) == set(range(41)) and [len(f) for f in report["following"]] == [14] * 3
