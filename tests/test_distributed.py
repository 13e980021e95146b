"""Equal DDP shards under a real torchrun: every rank the same count, together every item."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

N = 11


@pytest.mark.timeout(300)
def test_torchrun_ranks_get_equal_disjoint_shards(tmp_path):
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(REPO / "tests" / "ddp_equal_shards.py"), str(out)],
                            capture_output=True, text=True, timeout=240, env=env)
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
