"""The per-minute counters in Redis: ``metrics.count`` (what the benchmarks poll) reads the same
figure as ``metrics.totals`` (what the console reads), over the same window."""

from __future__ import annotations

from reminders import metrics

TOPIC = "coupon.reminder"
NOW = 1_800_000_000.0  # a fixed moment, on a minute boundary


def test_count_sums_one_counter_over_the_window_like_totals():
    metrics.record(TOPIC, {"dispatched": 5, "delivered": 2}, now=NOW - 20 * 60)  # outside 15 min
    metrics.record(TOPIC, {"dispatched": 7}, now=NOW - 14 * 60)
    metrics.record(TOPIC, {"dispatched": 11, "failed": 1}, now=NOW - 61)
    metrics.record(TOPIC, {"dispatched": 13, "delivered": 3}, now=NOW + 30)

    assert metrics.count(TOPIC, "dispatched", minutes=15, now=NOW + 30) == 7 + 11 + 13
    assert metrics.count(TOPIC, "delivered", minutes=15, now=NOW + 30) == 3
    assert metrics.count(TOPIC, "dispatched", minutes=30, now=NOW + 30) == 5 + 7 + 11 + 13
    totals = metrics.totals(TOPIC, minutes=15, now=NOW + 30)
    assert metrics.count(TOPIC, "dispatched", minutes=15, now=NOW + 30) == totals["dispatched"]
    assert metrics.count(TOPIC, "failed", minutes=15, now=NOW + 30) == totals["failed"] == 1


def test_count_of_a_counter_never_written_is_zero():
    assert metrics.count(TOPIC, "dropped", minutes=60, now=NOW) == 0
