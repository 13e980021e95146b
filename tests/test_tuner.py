"""The producer tuner's decisions, from scripted observations (no threads, no clock)."""

from __future__ import annotations

from collections.abc import Callable

from audiobuffer._tuner import ProducerTuner, TunerSample


def drive(tuner: ProducerTuner, rate: Callable[[int], float], *, consumer_wait: Callable[[int], float],
          producer_wait: Callable[[int], float] = lambda c: 0.0, steps: int = 40) -> list[int]:
    """Feed ``steps`` intervals of a simulated pool whose rate and waits depend on the count."""
    t = items = cwait = pwait = 0.0
    counts = []
    count = tuner.observe(TunerSample(t, 0, 0.0, 0.0))
    for _ in range(steps):
        t += tuner.interval
        items += rate(count) * tuner.interval
        cwait += consumer_wait(count) * tuner.interval
        pwait += producer_wait(count) * tuner.interval * max(1, count)
        count = tuner.observe(TunerSample(t, int(items), cwait, pwait))
        counts.append(count)
    return counts


def test_scales_up_to_the_cores_and_stops_where_adding_does_not_help():
    # Two cores: 2 producers decode twice as fast as one; a third adds nothing.
    tuner = ProducerTuner(4, allow_inline=False)
    counts = drive(tuner, lambda c: 1000 * min(c, 2), consumer_wait=lambda c: 0.5)
    assert counts[-1] == 2
    assert tuner.ceiling == 2
    assert max(counts) == 3  # it tried a third and took it back
    assert [c for _, c, _ in tuner.history][:1] == [1]


def test_decodes_inline_when_a_hand_over_costs_more_than_it_gains():
    # GIL-bound tiny files: more threads do not help and the consumer alone is fastest.
    tuner = ProducerTuner(4)
    counts = drive(tuner, lambda c: {0: 3000, 1: 2000}.get(c, 1900), consumer_wait=lambda c: 0.0 if c == 0 else 0.6)
    assert counts[-1] == 0
    assert any("inline" in reason for _, _, reason in tuner.history)


def test_inline_is_dropped_when_threads_are_faster():
    tuner = ProducerTuner(2)
    counts = drive(tuner, lambda c: {0: 900, 1: 1000}.get(c, 1900), consumer_wait=lambda c: 0.0 if c == 0 else 0.5)
    assert counts[-1] == 2
    assert 0 in counts  # it tried inline and went back


def test_retires_producers_that_wait_for_room():
    # The consumer is the bottleneck: producers mostly wait for room in the buffer.
    tuner = ProducerTuner(8, start=4)
    counts = drive(tuner, lambda c: 500, consumer_wait=lambda c: 0.0, producer_wait=lambda c: 0.8)
    assert counts[-1] == 1
    assert sorted(set(counts), reverse=True) == [3, 2, 1]


def test_no_decision_on_too_few_items():
    tuner = ProducerTuner(4, min_items=50)
    counts = drive(tuner, lambda c: 10, consumer_wait=lambda c: 0.9)  # 2.5 items an interval
    assert set(counts) == {1}
    assert [reason for _, _, reason in tuner.history] == ["start"]


def test_never_above_the_ceiling():
    tuner = ProducerTuner(2, allow_inline=False)
    counts = drive(tuner, lambda c: 1000 * c, consumer_wait=lambda c: 0.9)
    assert max(counts) == 2
