"""The producer tuner's decisions, from scripted observations (no threads, no clock)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from audiobuffer.engine.tuner import (
    MAX_CHECK_SKIP,
    PoolTuning,
    ProducerTuner,
    TunerMemory,
    TunerSample,
)

STEP = 0.05  # seconds per simulated step: 1000 items/s make 50 items, above min_items


def drive(tuner: ProducerTuner, rate: Callable[[int], float], *, consumer_wait: Callable[[int], float],
          producer_wait: Callable[[int], float] = lambda c: 0.0, cpu: Callable[[int], float] = lambda c: 0.0,
          steps: int = 40, step: float = STEP) -> list[int]:
    """Feed ``steps`` steps of a simulated pool whose rate, waits and CPU use (cores busy) depend on the count."""
    t = items = cwait = pwait = cpu_s = 0.0
    counts = []
    count = tuner.observe(TunerSample(t, 0, 0.0, 0.0))
    for _ in range(steps):
        t += step
        items += rate(count) * step
        cwait += consumer_wait(count) * step
        pwait += producer_wait(count) * step * max(1, count)
        cpu_s += cpu(count) * step
        count = tuner.observe(TunerSample(t, int(items), cwait, pwait, cpu_s))
        counts.append(count)
    return counts


def test_scales_up_to_the_cores_and_stops_where_adding_does_not_help():
    # Two cores: 2 producers decode twice as fast as one; a third adds nothing.
    tuner = ProducerTuner(4, allow_inline=False, retry=60.0, warmup=False)
    counts = drive(tuner, lambda c: 1000 * min(c, 2), consumer_wait=lambda c: 0.5)
    assert counts[:3] == [2, 3, 2]  # kept a second, tried a third at once, took it back; stays
    assert set(counts[2:]) == {2}
    assert tuner.cap == 2
    assert [c for _, c, _ in tuner.history][:1] == [1]


def test_starts_inline_and_stays_when_a_hand_over_costs_more_than_it_gains():
    # GIL-bound tiny files: the consumer alone is fastest.
    tuner = ProducerTuner(4, retry=60.0, warmup=False)
    counts = drive(tuner, lambda c: {0: 3000, 1: 2000}.get(c, 1900), consumer_wait=lambda c: 0.0 if c == 0 else 0.6)
    assert tuner.history[0][1:] == (0, "start")
    assert counts[:2] == [1, 0]  # one producer, far slower than inline: back at once, not on to two
    assert set(counts[1:]) == {0}
    assert tuner.history[-1][2].startswith("back: 2000/s against 3000/s")
    assert 2 not in counts


def test_inline_is_left_when_threads_are_faster():
    tuner = ProducerTuner(2, warmup=False)
    counts = drive(tuner, lambda c: {0: 800, 1: 1000}.get(c, 1900), consumer_wait=lambda c: 0.0 if c == 0 else 0.5)
    assert counts[:3] == [1, 2, 2]
    assert counts[-1] == 2
    assert [reason.split(":")[0] for _, _, reason in tuner.history][:5] == [
        "start", "trying a producer instead of inline", "kept", "consumer waited 50%", "kept"]


def test_from_inline_a_flat_first_producer_that_starves_the_consumer_leads_to_two():
    # Compressed audio on two cores: one producer is barely faster than inline (the hand-over eats the
    # overlap), two decode in parallel. The trial goes on to two, judged against inline.
    tuner = ProducerTuner(2, retry=60.0, warmup=False)
    counts = drive(tuner, lambda c: {0: 1000, 1: 1060, 2: 1900}[c], consumer_wait=lambda c: 0.0 if c == 0 else 0.5)
    assert counts[:3] == [1, 2, 2]
    reasons = [reason for _, _, reason in tuner.history]
    assert reasons[2].startswith("one producer: 1060/s against 1000/s, consumer waited 50%: trying two")
    assert reasons[3].startswith("kept: 1900/s against 1000/s")


def test_from_inline_two_that_do_not_beat_inline_go_back_to_inline():
    # One producer a little slower than inline (a noisy interval, or a hand-over that eats the overlap)
    # goes on to two, which do not pay either.
    tuner = ProducerTuner(4, retry=60.0, warmup=False)
    counts = drive(tuner, lambda c: {0: 1000, 1: 900}.get(c, 1000), consumer_wait=lambda c: 0.0 if c == 0 else 0.5)
    assert counts[:3] == [1, 2, 0] and set(counts[2:]) == {0}
    assert tuner.cap == 0


def test_from_inline_one_producer_under_the_slower_bar_goes_back_without_trying_two():
    # 740 < 0.75 * 1000: the hand-over costs more than any overlap gives, so two are not tried.
    tuner = ProducerTuner(4, retry=60.0, warmup=False)
    counts = drive(tuner, lambda c: {0: 1000, 1: 740}.get(c, 1000), consumer_wait=lambda c: 0.0 if c == 0 else 0.5)
    assert counts[:2] == [1, 0] and set(counts[1:]) == {0}
    assert [reason.split(":")[0] for _, _, reason in tuner.history] == ["start", "trying a producer instead of inline",
                                                                         "back"]


def test_from_inline_one_producer_just_over_the_slower_bar_still_tries_two():
    # 760 >= 0.75 * 1000 (740 above goes back): a noisy interval must not cost the whole back-off.
    tuner = ProducerTuner(4, retry=60.0, warmup=False)
    counts = drive(tuner, lambda c: {0: 1000, 1: 760}.get(c, 1000), consumer_wait=lambda c: 0.0 if c == 0 else 0.5)
    assert counts[:2] == [1, 2]


def test_without_inline_it_starts_with_one_producer_and_never_goes_to_zero():
    tuner = ProducerTuner(4, allow_inline=False, warmup=False)
    counts = drive(tuner, lambda c: 5000 if c == 0 else 1000, consumer_wait=lambda c: 0.0)
    assert tuner.history[0][1] == 1 and set(counts) == {1}


def test_retires_producers_that_wait_for_room():
    # The consumer is the bottleneck: producers mostly wait for room in the buffer.
    tuner = ProducerTuner(8, start=4, warmup=False)
    counts = drive(tuner, lambda c: 1000, consumer_wait=lambda c: 0.0, producer_wait=lambda c: 0.8)
    assert counts[:3] == [3, 2, 1]
    assert set(counts[2:]) == {1}  # never below one by retiring: inline would slow the consumer more


def test_an_interval_waits_for_enough_items():
    # 10 items/s and min_items=50: an interval closes only after 5 s; then the decision comes.
    tuner = ProducerTuner(4, min_items=50, allow_inline=False, warmup=False)
    counts = drive(tuner, lambda c: 10, consumer_wait=lambda c: 0.9, steps=120)  # 6 s
    first_change = counts.index(2)
    assert (first_change + 1) * STEP >= 5.0  # not before the interval had 50 items
    assert [reason for _, _, reason in tuner.history][:2] == ["start", "consumer waited 90%"]


def test_no_decision_before_the_interval_has_passed():
    tuner = ProducerTuner(4, interval=1.0, allow_inline=False, warmup=False)
    counts = drive(tuner, lambda c: 10_000, consumer_wait=lambda c: 0.9, steps=19)  # 0.95 s
    assert set(counts) == {1}


def test_never_above_the_ceiling():
    tuner = ProducerTuner(2, allow_inline=False, warmup=False)
    counts = drive(tuner, lambda c: 1000 * c, consumer_wait=lambda c: 0.9)
    assert max(counts) == 2


def test_a_failed_trial_is_tried_again_after_a_growing_wait():
    # Adding never helps: each trial goes back, and the next one waits twice as long.
    tuner = ProducerTuner(4, allow_inline=False, retry=1.0, max_retry=3.0, warmup=False)
    drive(tuner, lambda c: 1000, consumer_wait=lambda c: 0.5, steps=400)  # 20 s
    trials = [t for t, count, reason in tuner.history if count == 2 and reason.startswith("consumer waited")]
    gaps = [b - a for a, b in zip(trials, trials[1:])]
    # retry 1 s, 2 s, then capped at 3 s, each after the step that judged the trial (float steps: +1)
    for gap, retry in zip(gaps, [1.0, 2.0, 3.0, 3.0, 3.0]):
        assert retry + STEP - 1e-6 <= gap <= retry + 2 * STEP + 1e-6
    assert len(gaps) >= 5


def test_pool_tuning_logs_each_decision_and_keeps_seconds_since_the_start(caplog):
    clock = iter([10.0, 10.05, 10.1, 10.15]).__next__
    counters = iter([(0, 0.0, 0.0), (100, 0.0, 0.0), (140, 0.0, 0.0)]).__next__
    tuning = PoolTuning(ProducerTuner(2, warmup=False), "pool", counters, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="audiobuffer.engine.tuner"):
        assert tuning.begin() == 0
        assert tuning.check() == 1  # inline at 2000/s: try a producer
        assert tuning.check() == 0  # 800/s: back
    assert [(round(t, 2), n) for t, n, _ in tuning.history] == [(0.0, 0), (0.05, 1), (0.1, 0)]
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "pool: decoding inline at 0.000 s (start)"
    assert messages[1].startswith("pool: 1 producer at 0.050 s (trying a producer")
    assert messages[2].startswith("pool: decoding inline at 0.100 s (back: 800/s against 2000/s")


# -- across epochs: TunerMemory --------------------------------------------------------------------

def test_the_next_epoch_starts_where_the_last_settled_and_waits_out_the_back_off():
    def rate(c):
        return {0: 3000, 1: 2000}.get(c, 1900)

    def consumer_wait(c):
        return 0.0 if c == 0 else 0.6

    memory = TunerMemory()
    first = ProducerTuner(4, retry=0.5, warmup=False)
    drive(first, rate, consumer_wait=consumer_wait, steps=6)  # inline, one producer fails at 0.1 s, back
    memory.remember(first)
    # The back-off doubled by the failed trial; 0.3 s of the 0.5 s it started were left at the end.
    assert (memory.count, memory.retry) == (0, 1.0) and abs(memory.wait - 0.3) < 1e-9
    second = ProducerTuner(4, retry=0.5, memory=memory, warmup=False)
    counts = drive(second, rate, consumer_wait=consumer_wait, steps=30)
    assert second.history[0][1:] == (0, "start where the last epoch settled, no trial for 0.3 s, one more not "
                                        "checked (it did not pay from here last time)")
    # One more failed just before: no check of it at once; the 0.3 s left run out (about 6 steps), then a
    # trial (it fails: back, and the back-off doubles), then no trial for 1 s (20 steps).
    assert [r.split(":")[0] for _, _, r in second.history][1:3] == ["trying a producer instead of inline", "back"]
    tried = counts.index(1)
    assert 5 <= tried <= 8 and set(counts[:tried]) == {0}
    assert set(counts[tried + 1:tried + 20]) == {0}
    assert second.settled()[:2] == (0, 4.0)
    memory.remember(second)
    assert memory.ups == (0, 1, 1)  # the next epoch starting at inline skips the check of one more
    third = ProducerTuner(4, retry=0.5, memory=memory, warmup=False)
    counts = drive(third, rate, consumer_wait=consumer_wait, steps=10)
    assert third.history[0][2].endswith("one more not checked (it did not pay from here last time)")
    assert set(counts) == {0}


def test_a_count_that_was_kept_is_where_the_next_epoch_starts_without_a_cap():
    memory = TunerMemory()
    first = ProducerTuner(4, warmup=False, retry=1.0)
    # Two cores: one and two producers are kept, a third fails: back to two, capped there.
    drive(first, lambda c: {0: 800, 1: 1000}.get(c, 1900), consumer_wait=lambda c: 0.0 if c == 0 else 0.5, steps=5)
    assert [c for _, c, _ in first.history] == [0, 1, 1, 2, 2, 3, 2] and first.cap == 2
    memory.remember(first)
    assert (memory.count, memory.retry) == (2, 2.0)
    # A later trial of three that pays (a changed workload) is kept: nothing failed where it settled.
    third = ProducerTuner(4, memory=memory, warmup=False)
    drive(third, lambda c: 1000 * c, consumer_wait=lambda c: 0.5, steps=60)  # past the 2 s back-off
    assert third.history[0][2] == ("start where the last epoch settled, no trial for 0.95 s, one more not checked "
                                   "(it did not pay from here last time)")
    assert third.count == 4 and third.settled() == (4, None, None)
    memory.remember(third)
    fourth = ProducerTuner(4, memory=memory, warmup=False)
    drive(fourth, lambda c: 1000 * c, consumer_wait=lambda c: 0.5, steps=2)
    assert fourth.history[0][1:] == (4, "start where the last epoch settled") and fourth.cap == 4


def test_an_epoch_too_short_to_judge_leaves_the_memory_as_it_was():
    memory = TunerMemory()
    first = ProducerTuner(4, warmup=False)
    drive(first, lambda c: 1000, consumer_wait=lambda c: 0.0, steps=3)
    memory.remember(first)
    before = (memory.count, memory.retry)
    short = ProducerTuner(1, memory=memory)  # a short tail: one item's worth of producers, no interval judged
    short.observe(TunerSample(0.0, 0, 0.0, 0.0))
    short.observe(TunerSample(0.05, 10, 0.0, 0.0))  # fewer than min_items
    memory.remember(short)
    assert (memory.count, memory.retry) == before


def test_a_trial_cut_short_is_not_remembered():
    tuner = ProducerTuner(4, warmup=False)
    drive(tuner, lambda c: 1000, consumer_wait=lambda c: 0.0, steps=1)  # inline -> trying one producer
    assert tuner.count == 1
    memory = TunerMemory()
    memory.remember(tuner)
    assert memory.count == 0  # the count before the unjudged trial
    memory.remember(object())  # a scripted tuner without settled(): ignored
    assert memory.count == 0


def test_the_first_interval_only_warms_up():
    # The epoch's start is slow (first calls, cold caches): judged against it, one producer would be kept.
    tuner = ProducerTuner(4, retry=60.0)
    t = 0.0
    assert tuner.observe(TunerSample(t, 0, 0.0, 0.0)) == 0
    items = 0
    counts = []
    for step, rate in enumerate([1000, 3000, 2000, 1900] + [3000] * 4):  # the first interval: the slow start
        t += STEP
        items += int(rate * STEP)
        counts.append(tuner.observe(TunerSample(t, items, 0.0 if step < 2 or step > 3 else STEP * 0.6, 0.0)))
    assert counts[:4] == [0, 1, 0, 0]  # no decision on the start; then inline is judged at its real rate
    assert [reason.split(":")[0] for _, _, reason in tuner.history] == [
        "start", "trying a producer instead of inline", "back"]
    assert "2000/s against 3000/s" in tuner.history[2][2]


def _memory(count, retry=None, wait=None, checks=(None, 0, 1), ups=(None, 0, 1)):
    memory = TunerMemory()
    memory._settled = (count, retry, retry if wait is None else wait, checks, ups)
    return memory


def test_a_count_carried_over_is_checked_downwards_when_the_work_got_cheaper():
    # The first epoch settled on two producers; now decoding is cheap and threads only cost.
    tuner = ProducerTuner(4, memory=_memory(2), warmup=False, retry=60.0)
    counts = drive(tuner, lambda c: {0: 9000, 1: 6000, 2: 3000}.get(c, 2500),
                   consumer_wait=lambda c: 0.0 if c == 0 else 0.5, steps=8)
    # One fewer, kept; one fewer again, kept. Each kept step is as a failed trial of the count above:
    # one producer, just measured slower than inline, is not tried again within the back-off.
    assert counts[:2] == [1, 0] and set(counts[1:]) == {0}
    reasons = [reason.split(":")[0] for _, _, reason in tuner.history]
    assert reasons == ["start where the last epoch settled", "checking one fewer than the count carried over",
                       "kept one fewer", "checking one fewer than the count carried over", "kept one fewer"]
    assert tuner.cap == 0 and tuner.settled()[:2] == (0, 60.0)  # a walk down keeps the back-off it had


def test_a_walk_down_caps_without_doubling_and_a_step_back_up_keeps_the_cap():
    # From three: two kept, one kept, inline clearly slower: back up to one, still capped there.
    tuner = ProducerTuner(4, memory=_memory(3), warmup=False, retry=0.5)
    counts = drive(tuner, lambda c: {0: 1000, 1: 5000, 2: 5000}.get(c, 5000), consumer_wait=lambda c: 0.0,
                   steps=4)
    assert counts[:4] == [2, 1, 0, 1]
    assert tuner.history[-1][2].startswith("back up")
    # the next epoch starts capped, the back-off not doubled
    assert tuner.cap == 1 and tuner.settled()[:2] == (1, 0.5)


def test_short_intervals_are_not_judged_by_cpu_time():
    # 20 ms on two cores is 40 ms of CPU time: a few ticks of a coarse process clock. Not trusted.
    tuner = ProducerTuner(2, cores=2, warmup=False)
    counts = drive(tuner, lambda c: 1000, consumer_wait=lambda c: 0.0 if c == 0 else 0.9, cpu=lambda c: 2.0,
                   steps=3, step=0.04)
    assert counts[0] == 1  # the trial runs as if no CPU were measured


def test_short_intervals_add_up_to_a_cpu_window():
    # Every core busy, intervals of 40 ms: the first window closes after three (0.24 core-seconds);
    # the trial started before it goes back, and none follows, even once its back-off has passed.
    tuner = ProducerTuner(2, cores=2, warmup=False, retry=0.2)
    counts = drive(tuner, lambda c: 1000, consumer_wait=lambda c: 0.0 if c == 0 else 0.9, cpu=lambda c: 2.0,
                   steps=30, step=0.04)
    assert counts[:3] == [1, 2, 0] and set(counts[2:]) == {0}


def test_after_keeping_one_fewer_the_count_above_is_tried_again_once_the_back_off_has_passed():
    tuner = ProducerTuner(4, memory=_memory(1), warmup=False, retry=0.5)
    counts = drive(tuner, lambda c: {0: 9000}.get(c, 6000), consumer_wait=lambda c: 0.0 if c == 0 else 0.5,
                   steps=20)
    assert set(counts[:11]) == {0}  # kept at once; then 0.5 s (ten steps) with no trial
    reasons = [r.split(":")[0] for _, _, r in tuner.history]
    assert reasons[:4] == ["start where the last epoch settled", "checking one fewer than the count carried over",
                           "kept one fewer", "trying a producer instead of inline"]
    kept_at, tried_at = tuner.history[2][0], tuner.history[3][0]
    assert tried_at - kept_at >= 0.5  # inline's own trial, once the back-off has passed


def test_a_count_carried_over_that_is_right_stays_after_one_check():
    tuner = ProducerTuner(2, memory=_memory(2), warmup=False)
    counts = drive(tuner, lambda c: {0: 500, 1: 1000, 2: 1900}[c], consumer_wait=lambda c: 0.5, steps=10)
    assert counts[:2] == [1, 2] and set(counts[1:]) == {2}
    assert tuner.history[-1][2].startswith("back up: 1000/s against 1900/s")
    assert tuner.cap == 2 and tuner.settled() == (2, None, None)


def test_a_count_carried_over_at_the_lowest_is_not_checked_downwards():
    tuner = ProducerTuner(4, memory=_memory(1), allow_inline=False, warmup=False)
    counts = drive(tuner, lambda c: 1000, consumer_wait=lambda c: 0.0, steps=4)
    assert set(counts) == {1} and len(tuner.history) == 1


def test_after_the_check_reaches_inline_a_climb_that_pays_is_not_checked_again():
    steps = iter(range(1000))

    def rate(count):  # cheap at first; from the fifth step on, producers pay
        return (9000 if count == 0 else 6000) if next(steps) < 4 else 1000 * (count + 1) ** 2

    tuner = ProducerTuner(4, memory=_memory(1), warmup=False, retry=0.05)
    counts = drive(tuner, rate, consumer_wait=lambda c: 0.5, steps=20)
    reasons = [reason for _, _, reason in tuner.history]
    assert sum("checking one fewer" in r for r in reasons) == 1 and counts[-1] == 4


def test_no_producer_is_added_while_the_process_uses_every_core():
    # A transform whose numpy already keeps both cores busy: a thread more would find no CPU.
    tuner = ProducerTuner(2, cores=2, warmup=False)
    counts = drive(tuner, lambda c: 180, consumer_wait=lambda c: 0.0 if c == 0 else 0.9,
                   cpu=lambda c: 1.93, steps=40, step=0.2)
    assert set(counts) == {0} and len(tuner.history) == 1
    # The same with a core to spare: inline's trials run (one producer, then two), and go back.
    tuner = ProducerTuner(2, cores=2, warmup=False)
    counts = drive(tuner, lambda c: 180, consumer_wait=lambda c: 0.0 if c == 0 else 0.9,
                   cpu=lambda c: 1.0, steps=4, step=0.2)
    assert counts[:3] == [1, 2, 0]


def test_a_starved_consumer_gets_no_producer_more_without_cpu_for_it():
    tuner = ProducerTuner(4, start=2, allow_inline=False, cores=4, warmup=False)
    counts = drive(tuner, lambda c: 1000 * c, consumer_wait=lambda c: 0.5, cpu=lambda c: 3.8 if c >= 2 else 1.9,
                   step=0.2)
    assert set(counts) == {2}


def test_one_producer_that_saturates_the_cores_is_not_taken_on_to_two():
    tuner = ProducerTuner(2, cores=2, warmup=False)
    counts = drive(tuner, lambda c: 1000, consumer_wait=lambda c: 0.0 if c == 0 else 0.9,
                   cpu=lambda c: 1.0 if c == 0 else 1.95, steps=3, step=0.2)
    assert counts[:2] == [1, 0]
    assert tuner.history[-1][2].startswith("back: 1000/s against 1000/s")


def test_pool_tuning_hands_the_tuner_the_process_cpu_time():
    seen = []

    class Recording(ProducerTuner):
        def observe(self, sample):
            seen.append(sample.cpu_s)
            return super().observe(sample)

    now = iter([0.0, 1.0])
    cpu = iter([5.0, 6.5])
    tuning = PoolTuning(Recording(2), "pool", lambda: (0, 0.0, 0.0), clock=lambda: next(now),
                        cpu_clock=lambda: next(cpu))
    tuning.begin()
    tuning.check()
    assert seen == [5.0, 6.5]


def test_a_check_of_one_fewer_that_went_back_up_is_skipped_for_doubling_runs_of_epochs():
    # Two cores, compressed audio: two producers decode twice as fast as one, epoch after epoch. Each
    # check of one fewer costs an interval at half the rate, so after one goes back up the next epochs
    # starting at two skip it: 1, then 2, 4, and at most MAX_CHECK_SKIP epochs in a row.
    memory = _memory(2)
    checked = []
    for _ in range(22):
        tuner = ProducerTuner(2, memory=memory, warmup=False, retry=60.0)
        counts = drive(tuner, lambda c: 1000 * c, consumer_wait=lambda c: 0.5 if c < 2 else 0.0, steps=4)
        reasons = [reason for _, _, reason in tuner.history]
        checked.append(any(r.startswith("checking one fewer") for r in reasons))
        assert counts[-1] == 2 and (checked[-1] or "one fewer not checked" in reasons[0])
        memory.remember(tuner)
    assert MAX_CHECK_SKIP == 8
    runs = "".join("c" if c else "." for c in checked)
    assert runs == "c.c..c....c........c.."  # skips of 1, 2, 4, then 8 (the most)
    assert memory.checks == (2, 6, 8)  # two of the eight skipped since the last check


def test_a_kept_check_or_another_count_checks_again():
    memory = _memory(2)
    memory._settled = (2, None, None, (2, 3, 8), (None, 0, 1))  # a check from two went back up: three epochs skip it
    cheaper = ProducerTuner(2, memory=memory, warmup=False, retry=60.0)
    drive(cheaper, lambda c: 1000 * c, consumer_wait=lambda c: 0.0, steps=1)
    assert "one fewer not checked" in cheaper.history[0][2] and cheaper.checks == (2, 2, 8)
    # The work got cheaper: the checks are where a changed workload shows, so a kept one starts over.
    memory._settled = (2, None, None, (2, 0, 8), (None, 0, 1))
    tuner = ProducerTuner(2, memory=memory, warmup=False, retry=60.0)
    drive(tuner, lambda c: 1000, consumer_wait=lambda c: 0.0, steps=3)
    assert [r.split(":")[0] for _, _, r in tuner.history][:3] == ["start where the last epoch settled",
                                                                  "checking one fewer than the count carried over",
                                                                  "kept one fewer"]
    assert tuner.checks == (None, 0, 1)
    # A start at another count than the failed check's is checked, its wait starting over.
    memory._settled = (3, None, None, (2, 3, 8), (None, 0, 1))
    other = ProducerTuner(4, memory=memory, warmup=False, retry=60.0)
    drive(other, lambda c: 1000 * c, consumer_wait=lambda c: 0.5, steps=3)
    assert [r for _, _, r in other.history][1].startswith("checking one fewer")
    assert other.checks == (3, 1, 2)


def test_a_kept_check_starts_the_skips_over_for_a_later_check_of_the_same_walk():
    # Three producers carried over, with a long wait from earlier failed checks; two do as well as three
    # (kept), one does not (back up to two): that failure is the first of its walk, so it skips one epoch.
    memory = TunerMemory()
    memory._settled = (3, None, None, (3, 0, 8), (None, 0, 1))
    tuner = ProducerTuner(3, memory=memory, warmup=False, retry=60.0, allow_inline=False)
    drive(tuner, lambda c: {3: 1000, 2: 1000, 1: 500}[c], consumer_wait=lambda c: 0.0, steps=4)
    assert [r.split(":")[0] for _, _, r in tuner.history][1:5] == [
        "checking one fewer than the count carried over", "kept one fewer",
        "checking one fewer than the count carried over", "back up"]
    assert tuner.checks == (2, 1, 2)


# -- across short epochs: the back-off's clock and the check of one more ---------------------------

def _epochs(memory: TunerMemory, count: int, rate: Callable[[int], float], *, seconds: float = 2.0,
            consumer_wait: Callable[[int], float] = lambda c: 0.0 if c == 0 else 0.5,
            **options) -> list[ProducerTuner]:
    """``count`` epochs of ``seconds`` each, each a fresh tuner starting from ``memory`` (as a dataset's
    next pool does), with the first interval warming up as in a real pool."""
    tuners = []
    for _ in range(count):
        tuner = ProducerTuner(2, memory=memory, retry=0.5, **options)
        drive(tuner, rate, consumer_wait=consumer_wait, steps=round(seconds / STEP))
        memory.remember(tuner)
        tuners.append(tuner)
    return tuners


def test_a_count_settled_behind_a_long_back_off_is_checked_upwards_in_the_next_short_epoch():
    # Two-second epochs that settled on inline with a 4 s back-off (failed trials on a noisy start), where
    # two producers are in fact 1.6 times as fast: the next epoch tries one more at its start.
    memory = _memory(0, retry=4.0)
    tuners = _epochs(memory, 3, lambda c: {0: 1000, 1: 1060, 2: 1600}[c])
    second = tuners[0]
    assert [c for _, c, _ in second.history][:3] == [0, 1, 2]
    assert second.history[1][2] == "checking one more than the count carried over"
    assert second.history[1][0] <= 3 * STEP  # on the first interval past the warm-up
    assert second.count == 2 and memory.count == 2
    assert all(t.history[0][1] == 2 for t in tuners[1:])


def test_the_back_off_clock_runs_on_across_short_epochs():
    # Producers never pay: each check of one more fails, so checks thin out (1, 2, 4 ... epochs skipped),
    # and the back-off's seconds carry from epoch to epoch instead of starting again with each one.
    memory = _memory(0, retry=1.5)
    tuners = _epochs(memory, 12, lambda c: {0: 1000, 1: 900, 2: 900}[c], seconds=1.0, max_retry=1.5)
    trials = [sum(1 for _, c, r in t.history if c == 1) for t in tuners]
    # Without the clock running on, no epoch of 1 s would ever reach its 1.5 s back-off; with it, the
    # back-off passes within every second epoch or so, checks or not.
    assert sum(trials) >= 5
    checks = ["checking one more" in "".join(r for _, _, r in t.history) for t in tuners]
    assert checks[0] and not checks[1]  # a failed check skips the next epoch's
    assert memory.wait is not None and 0.0 <= memory.wait <= 1.5


def test_rates_are_of_work_where_items_differ_in_cost():
    # Batches by duration: runs of short utterances (2 s) and of long ones (20 s) take turns, an interval
    # each. Two producers decode 1.6 times the audio per second that inline does; in items per second
    # the long run a trial lands on looks 6 times slower than the short run before it.
    def run(weighted: bool) -> ProducerTuner:
        tuner = ProducerTuner(2, retry=60.0, warmup=False, min_items=1)
        t = items = work = cwait = 0.0
        count = tuner.observe(TunerSample(t, 0, 0.0, 0.0, work=0.0 if weighted else None))
        for step in range(12):
            seconds = 2.0 if step % 2 == 0 else 20.0  # each item's duration in this interval
            audio = {0: 1000.0, 1: 1060.0, 2: 1600.0}[count] * STEP  # seconds of audio decoded
            t += STEP
            items += audio / seconds
            work += audio
            cwait += (0.0 if count == 0 else 0.5) * STEP
            count = tuner.observe(TunerSample(t, int(items), cwait, 0.0, work=work if weighted else None))
        return tuner

    weighted = run(True)
    assert [c for _, c, _ in weighted.history][:4] == [0, 1, 2, 2] and weighted.count == 2
    assert weighted.history[3][2].startswith("kept: 1600/s against 1000/s")
    unweighted = run(False)  # what items per second alone decide: back, and held there
    assert unweighted.count == 0


def test_a_trial_that_just_failed_is_not_checked_again_at_the_next_epochs_start():
    """Inline is best (tiny files): the first epoch tries one producer, which does not pay; the next
    epoch starts at inline and waits out the back-off instead of checking one more at once."""
    memory = TunerMemory()
    rate = lambda c: {0: 1000, 1: 600}.get(c, 500)  # noqa: E731
    first = ProducerTuner(4, retry=0.5, warmup=False)
    drive(first, rate, consumer_wait=lambda c: 0.0, steps=4)
    assert [c for _, c, _ in first.history] == [0, 1, 0]
    memory.remember(first)
    assert memory.ups == (0, 1, 1)
    second = ProducerTuner(4, retry=0.5, memory=memory, warmup=False)
    counts = drive(second, rate, consumer_wait=lambda c: 0.0, steps=4)  # shorter than the back-off left
    assert set(counts) == {0}
    assert second.history[0][2].endswith("one more not checked (it did not pay from here last time)")
