"""Several nodes: two torchrun launchers of two ranks each, meeting at a c10d rendezvous on the
loopback address as two machines would, read an index of shards from an S3 server (moto); one
launcher is killed mid-epoch with its ranks (a node lost), and one launcher of two ranks resumes
from the checkpoints every rank wrote (tests/ddp_nodes.py runs in the ranks)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import JOIN_TIMEOUT, REPO, make_corpus

from audiobuffer import BufferedDataset
from audiobuffer.sources import pack

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
from ddp_nodes import BATCH, EVERY, SEED, STOP_AT  # noqa: E402
from storage_helpers import BUCKET  # noqa: E402  (needs moto)

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

SCRIPT = REPO / "tests" / "ddp_nodes.py"
N = 300
#: Seconds a launcher may take to start its ranks and reach the point the test waits for.
LAUNCH_TIMEOUT = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(phase: str, out: Path, url: str, endpoint: str, *, nnodes: int, port: int, job: str,
           log: Path) -> subprocess.Popen:
    """One launcher (a node) of two ranks of ``job`` (docs/resume-distributed.md, "Several
    nodes"), in a process group of its own, output to ``log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
               "--nproc_per_node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-id={job}", "--local-addr=127.0.0.1", str(SCRIPT), phase, str(out), url,
               endpoint]
    group: dict[str, Any]
    if sys.platform == "win32":
        group = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    else:
        group = {"start_new_session": True}
    with log.open("w", encoding="utf-8") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, **group)


def tree(proc: subprocess.Popen) -> list[psutil.Process]:
    """The launcher and every process under it (its ranks start sessions of their own)."""
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_node(procs: list[psutil.Process]) -> None:
    """Kill ``procs`` at once, as a machine that dies (their process groups too, where there are
    groups), and reap them (bounded)."""
    if sys.platform != "win32":
        import signal

        groups = set()
        for p in procs:
            try:
                groups.add(os.getpgid(p.pid))
            except ProcessLookupError:
                pass
        for group in groups - {os.getpgid(0)}:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=JOIN_TIMEOUT)
    assert not alive, f"processes still alive after a kill: {[p.pid for p in alive]}"


def wait_for(paths: list[Path], launchers: list[subprocess.Popen], logs: list[Path]) -> None:
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while not all(p.exists() for p in paths):
        for proc, log in zip(launchers, logs):
            if proc.poll() is not None:
                pytest.fail(f"a launcher ended ({proc.returncode}) before its ranks were ready:\n"
                            + log.read_text(encoding="utf-8")[-3000:])
        if time.monotonic() > deadline:
            pytest.fail(f"the ranks were not ready within {LAUNCH_TIMEOUT} s")
        time.sleep(0.1)


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def fresh_shares(url: str, options: dict, epoch: int, world: int) -> list[list[str]]:
    """What each rank of a fresh ``world``-rank run delivers in ``epoch`` (no audio decoded)."""
    shares = []
    for rank in range(world):
        with BufferedDataset(url, lambda item: {"path": item.path}, shuffle=True, seed=SEED,
                             num_producers=1, rank=rank, world_size=world,
                             storage_options=options) as ds:
            ds.set_epoch(epoch)
            shares.append(sorted(s["path"] for s in ds))
    return shares


@pytest.mark.timeout(600)
def test_two_nodes_read_s3_then_one_resumes_when_the_other_is_lost(s3, tmp_path):
    make_corpus(tmp_path / "src", N, seconds=0.02)
    pack(tmp_path / "src", tmp_path / "packed", shard_size=100_000, progress=False)
    url = s3.upload_dir(tmp_path / "packed", BUCKET, "nodes") + "/index.json"
    out = tmp_path / "run"
    out.mkdir()
    older = {p.pid for p in psutil.Process().children(recursive=True)}

    # Two nodes, two ranks each: epoch 0 whole, epoch 1 up to one step past a checkpoint.
    port, logs = free_port(), [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = [launch("train", out, url, s3.endpoint, nnodes=2, port=port, job="job42", log=log)
             for log in logs]
    seen_procs: list[psutil.Process] = []
    try:
        wait_for([out / f"ready-r{r}.json" for r in range(4)], nodes, logs)
        trees = [tree(node) for node in nodes]
        seen_procs = [p for t in trees for p in t]
        assert all(len(t) >= 3 for t in trees), trees  # a launcher and its two ranks each
        kill_node(trees[1])  # the second node is lost
        (out / "go").touch()  # the first node's ranks run on into their lost peers
        try:
            nodes[0].wait(timeout=LAUNCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail("the surviving launcher did not end after its peers were lost:\n"
                        + logs[0].read_text(encoding="utf-8")[-3000:])
        assert nodes[0].returncode != 0  # its ranks failed at their next step
    finally:
        for node in nodes:
            if node.poll() is None:
                kill_node(tree(node))
    _, alive = psutil.wait_procs(seen_procs, timeout=JOIN_TIMEOUT)
    assert not alive, f"ranks left after their launchers: {[p.pid for p in alive]}"

    # One node of two ranks resumes from the checkpoints.
    log = tmp_path / "resume.log"
    node = launch("resume", out, url, s3.endpoint, nnodes=1, port=free_port(), job="job43",
                  log=log)
    try:
        code = node.wait(timeout=LAUNCH_TIMEOUT)
    finally:
        if node.poll() is None:
            kill_node(tree(node))
    assert code == 0, log.read_text(encoding="utf-8")[-3000:]
    children = [p for p in psutil.Process().children(recursive=True) if p.pid not in older]
    _, alive = psutil.wait_procs(children, timeout=JOIN_TIMEOUT)
    assert not alive, f"child processes left: {[p.pid for p in alive]}"

    everything = {f"{url.rsplit('/', 1)[0]}/{m}" for m in _members(tmp_path / "packed")}
    assert len(everything) == N
    # Epoch 0 on four ranks: every item once, the same number of steps on each rank.
    trained = [read(out / f"train-r{r}.json") for r in range(4)]
    delivered = [p for t in trained for p in t["seen"]]
    assert sorted(delivered) == sorted(everything)
    assert [t["steps"] for t in trained] == [N // 4 // BATCH] * 4
    # Epoch 1: what the last checkpoint every rank wrote says was delivered, then what the two
    # ranks delivered after the resume: each item once. What was delivered after that
    # checkpoint counts as not delivered, and is delivered again.
    resumed = [read(out / f"resume-r{r}.json") for r in range(2)]
    assert resumed[0]["before"] == resumed[1]["before"] and resumed[0]["epoch"] == 1
    before = [p for seen in resumed[0]["before"] for p in seen]
    after = [p for r in resumed for p in r["rest"]]
    saved_at = STOP_AT // EVERY * EVERY
    assert len(before) == 4 * saved_at * BATCH  # the checkpoints of that step of epoch 1
    assert not set(before) & set(after) and sorted(before + after) == sorted(everything)
    assert resumed[0]["rest_steps"] == resumed[1]["rest_steps"] == (N - len(before)) // 2 // BATCH
    past = {p for r in range(4) for p in read(out / f"ready-r{r}.json")["seen"]} - set(before)
    assert len(past) == 4 * (STOP_AT - saved_at) * BATCH > 0  # delivered, not checkpointed
    assert past <= set(after)
    # Epoch 2: a fresh two-rank epoch.
    assert [sorted(r["following"]) for r in resumed] == fresh_shares(url, s3.options(), 2, 2)
    assert [r["steps"] for r in resumed] == [N // 2 // BATCH] * 2
    counts = Counter(p for r in resumed for p in r["following"])
    assert set(counts) == everything and set(counts.values()) == {1}


def _members(packed: Path) -> list[str]:
    """The paths of the samples of the index in ``packed``, relative to its folder."""
    index = read(packed / "index.json")
    return [f"{m['shard']}/{m['name']}" for m in index["members"]]
