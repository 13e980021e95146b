"""probe_budgets: the largest batch per bucket of a step that runs out of memory past a known
memory model, found within a few percent below, never above, in a bounded number of steps."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

import audiobuffer
from audiobuffer.options import LoaderOptions
from audiobuffer.probe import probe_budgets

RATE = 1000
EDGES = [1.0, 1.7, 2.5, 3.4, 4.6, 6.0, 8.0, 11.0, 15.0, 20.0]


class ModelStep:
    """A step whose memory grows as ``n x T**1.5`` (attention-like): past ``limit`` it raises
    ``torch.OutOfMemoryError`` (or, with ``report``, returns the bytes it would use)."""

    def __init__(self, limit: float, *, report: bool = False) -> None:
        self.limit, self.report = limit, report
        self.calls: Counter[int] = Counter()  # frames -> calls
        self.shapes: list[tuple[int, int]] = []

    def used(self, n: int, frames: int) -> float:
        return n * frames**1.5

    def __call__(self, batch):
        n, frames = batch["audio"].shape
        assert batch["lengths"].tolist() == [frames] * n and batch["audio"].device.type == "cpu"
        self.calls[frames] += 1
        self.shapes.append((n, frames))
        if self.report:
            return self.used(n, frames)
        if self.used(n, frames) > self.limit:
            raise torch.OutOfMemoryError(f"tried {n} x {frames}")
        return None

    def true_budget(self, edge: float) -> float:
        frames = round(edge * RATE)
        return math.floor(self.limit / frames**1.5) * edge


def no_memory_batch(n: int, frames: int) -> dict:
    """``(n, frames)`` audio that takes no memory (a broadcast view): large batches cost nothing."""
    return {"audio": torch.zeros(1, 1).expand(n, frames), "lengths": torch.full((n,), frames)}


@pytest.mark.parametrize("limit", [3e8, 2.1e9, 2e10])
@pytest.mark.parametrize("report", [False, True])
def test_each_budget_is_at_most_five_percent_below_the_largest_never_above(limit, report):
    step = ModelStep(limit, report=report)
    budgets = probe_budgets(
        step,
        EDGES,
        sample_rate=RATE,
        margin=0.0,
        memory_limit=int(limit) if report else None,
        max_batch_size=1 << 20,
        make_batch=no_memory_batch,
    )
    assert len(budgets) == len(EDGES)
    for edge, budget in zip(EDGES, budgets):
        true = step.true_budget(edge)
        assert 0.95 * true <= budget <= true, (edge, budget, true)
    assert max(step.calls.values()) <= 30 and len(step.calls) == len(EDGES)


def test_the_margin_leaves_its_fraction_free():
    exact = probe_budgets(ModelStep(2e8), EDGES[:3], sample_rate=RATE, margin=0.0, tolerance=0.0)
    kept = probe_budgets(ModelStep(2e8), EDGES[:3], sample_rate=RATE, margin=0.25, tolerance=0.0)
    assert kept == pytest.approx([0.75 * b for b in exact])
    assert exact == [ModelStep(2e8).true_budget(e) for e in EDGES[:3]]


def test_the_quadratic_term_counts_as_the_loader_counts_it():
    plain = probe_budgets(ModelStep(2e8), [2.0], sample_rate=RATE, margin=0.0, tolerance=0.0)
    quadratic = probe_budgets(
        ModelStep(2e8), [2.0], sample_rate=RATE, margin=0.0, tolerance=0.0, quadratic_duration=4.0
    )
    assert quadratic[0] == pytest.approx(plain[0] * (1 + 2.0 / 4.0))


def test_no_batch_fits_names_the_bucket():
    with pytest.raises(RuntimeError, match=r"one sample of 2 s \(2000 frames\) does not fit"):
        probe_budgets(ModelStep(1e3), [2.0], sample_rate=RATE)


def test_a_limit_needs_the_step_to_report_its_memory():
    with pytest.raises(TypeError, match="must return its peak memory in bytes"):
        probe_budgets(ModelStep(1e9), [1.0], sample_rate=RATE, memory_limit=10**9)


def test_the_largest_batch_size_bounds_the_search():
    step = ModelStep(1e12)
    cap = r"max_batch_size=100 fit the bucket of 1 s .*not a measurement"
    with pytest.warns(UserWarning, match=cap):
        budgets = probe_budgets(step, [1.0], sample_rate=RATE, margin=0.0, max_batch_size=100)
    assert budgets == [100.0]
    assert max(n for n, _ in step.shapes) == 100


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(bucket_edges=[2.0, 1.0]), ValueError, "bucket_edges must increase"),
        (dict(bucket_edges=[]), ValueError, "at least one"),
        (dict(bucket_edges=[math.nan]), ValueError, "finite"),
        (dict(bucket_edges="2"), TypeError, "bucket_edges"),
        (dict(bucket_edges=[1.0], margin=1.0), ValueError, "margin"),
        (dict(bucket_edges=[1.0], max_steps=1), ValueError, "max_steps"),
        (dict(bucket_edges=[1.0], memory_limit=0), ValueError, "memory_limit"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        probe_budgets(ModelStep(1e9), **kwargs)


def test_a_mapping_of_edges_serves_and_the_result_loads_as_max_batch_seconds():
    budgets = probe_budgets(ModelStep(2e8), {1.0: 0, 2.0: 0}, sample_rate=RATE, margin=0.1)
    options = LoaderOptions(max_batch_seconds=dict(zip([1.0, 2.0], budgets)))
    assert options.max_batch_seconds == {1.0: budgets[0], 2.0: budgets[1]}
    assert audiobuffer.probe_budgets is probe_budgets


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_on_cuda_a_real_step_is_probed_and_its_memory_freed():
    device = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(400, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch):
        frames = batch["audio"].view(batch["audio"].shape[0], -1, 400)
        loss = model(frames).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    before = torch.cuda.memory_allocated(device)
    budgets = probe_budgets(
        step, [1.0, 4.0], sample_rate=16000, device="cuda", memory_limit=256 << 20, margin=0.0
    )
    assert budgets[0] > 0 and budgets[1] > 0
    assert torch.cuda.memory_allocated(device) <= before + (16 << 20)
