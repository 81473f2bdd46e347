"""Priorities between topics hold while a low-priority topic is flooded (docs/engine.md;
docs/operations.md, Resource-aware dispatch): on every tick the high-priority topic's due jobs
are claimed before any of the flood's, though the flood fell due first and outlasts the tick's
time budget. The engine's own dispatcher on a real Redis, its clock the test's."""

from __future__ import annotations

import itertools

from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.dispatcher import Dispatcher
from reminders.engine.keys import slot_for
from reminders.engine.topic_model import OK, Topic

HIGH, LOW = "orders.high", "orders.low"
SLOTS, FLOOD = 2, 3000


def schedule(client, topic: str, ids: list[str], due_ms: int) -> None:
    queue.schedule_many(
        topic, [(job, due_ms, slot_for(i, SLOTS)) for i, job in enumerate(ids)], client=client
    )


def test_a_flooded_low_priority_topic_never_takes_a_tick_ahead_of_a_high_priority_one(
    redis_client,
):
    now = epoch_ms()
    seen: list[tuple[str, str]] = []

    def handler(name):
        def handle(entries):
            seen.extend((name, e.job_id) for e in entries)
            return [OK] * len(entries)

        return handle

    high = Topic(HIGH, handler(HIGH), slots=SLOTS, priority=1, batch_size=1)
    low = Topic(LOW, handler(LOW), slots=SLOTS, batch_size=10)
    schedule(redis_client, LOW, [f"l{i}" for i in range(FLOOD)], now - 60_000)  # due first
    # The clock moves 10 ms each time it is read: a tick's budget (a third of the lease) runs
    # out after a bounded number of batches, however fast the machine.
    ticks = itertools.count(now, 10)
    worker = Dispatcher([high, low], client=redis_client, clock=lambda: next(ticks))
    try:
        for round_ in range(3):
            wave = [f"h{round_}-{i}" for i in range(20)]
            schedule(redis_client, HIGH, wave, now - 1000)
            seen.clear()
            report = worker.run_once()
            assert report.busy, "the flood must outlast the tick for this test to mean anything"
            topics = [name for name, _ in seen]
            assert topics[: len(wave)] == [HIGH] * len(wave)
            assert sorted(job for _, job in seen[: len(wave)]) == sorted(wave)
            assert HIGH not in topics[len(wave) :]
            left = sum(s.store for s in queue.stats(LOW, range(SLOTS), now_ms=now))
            assert left > 0  # still flooded when the next wave of high-priority jobs comes
    finally:
        worker.shutdown()
