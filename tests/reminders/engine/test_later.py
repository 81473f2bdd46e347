"""Two tiers of the schedule: jobs due after the next few minutes wait in ``later`` and are moved
into ``store`` (where claims look) by the slot's owner ahead of time (standalone and cluster)."""

import pytest

from reminders.engine import queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.engine.dispatcher import Dispatcher
from reminders.engine.keys import slot_keys
from reminders.engine.scripts import LeaseLost
from reminders.engine.topic_model import OK, EngineSettings, Topic, TopicSettings

T = "orders.timeout"
SOON = queue.LATER_AFTER_MS // 2
FAR = queue.LATER_AFTER_MS * 10


def _zset(client, key) -> dict[str, int]:
    return {m.decode(): int(s) for m, s in client.zrange(key, 0, -1, withscores=True)}


def _recording_dispatcher(client, seen: list, **options) -> Dispatcher:
    """A one-slot dispatcher of ``T`` whose handler records the ids it is handed."""

    def handler(entries):
        seen.extend(e.job_id for e in entries)
        return [OK] * len(entries)

    config = lambda: EngineSettings(topics={T: TopicSettings(slots=1)})  # noqa: E731
    return Dispatcher([Topic(T, handler, slots=1)], config=config, client=client, **options)


def test_jobs_due_after_the_next_minutes_wait_in_later(client, now):
    k = slot_keys(T, 0)
    added = queue.schedule_many(T, [("near", now + SOON, 0), ("far", now + FAR, 0),
                                    ("late", now - 5, 0)], client=client, now_ms=now)  # fmt: skip
    assert added == 3
    assert _zset(client, k.store) == {"near": now + SOON, "late": now - 5}
    assert _zset(client, k.later) == {"far": now + FAR}
    (stats,) = queue.stats(T, [0], now_ms=now, client=client)
    assert (stats.store, stats.due, stats.oldest_overdue_ms) == (3, 1, 5)  # both tiers
    assert queue.place(T, 0, "far", client=client) == queue.Place("scheduled", now + FAR)
    assert queue.due_before(T, 0, before_ms=now + FAR + 1, limit=10, client=client) == [
        "late", "near", "far"
    ]  # fmt: skip
    assert queue.due_between(T, [0], now, [now + SOON + 1, now + FAR + 1], client=client) == [1, 1]


def test_a_reschedule_moves_a_job_between_the_tiers_and_is_not_new(client, now):
    k = slot_keys(T, 0)
    queue.schedule_many(T, [("j", now + FAR, 0)], client=client, now_ms=now)
    assert queue.schedule_many(T, [("j", now + SOON, 0)], client=client, now_ms=now) == 0
    assert _zset(client, k.store) == {"j": now + SOON} and _zset(client, k.later) == {}
    assert queue.schedule_many(T, [("j", now + FAR, 0)], client=client, now_ms=now) == 0
    assert _zset(client, k.store) == {} and _zset(client, k.later) == {"j": now + FAR}


def test_a_rebuild_and_a_cancel_find_a_job_in_later(client, now):
    queue.schedule_many(T, [("j", now + FAR, 0)], client=client, now_ms=now)
    # NX: scheduled in later already, whichever tier the rebuild would put it in.
    assert queue.schedule_many(T, [("j", now, 0)], nx=True, client=client, now_ms=now) == 0
    assert queue.schedule_many(T, [("j", now + FAR, 0)], nx=True, client=client, now_ms=now) == 0
    assert queue.cancel(T, "j", slot=0, client=client) == "store"
    assert queue.stats(T, [0], now_ms=now, client=client)[0].store == 0


def test_promotion_moves_what_falls_due_keeping_due_times_bounded_and_fenced(client, lease, now):
    k = slot_keys(T, 0)
    queue.schedule_many(T, [(f"j{i}", now + FAR + i, 0) for i in range(5)], client=client,
                        now_ms=now)  # fmt: skip
    token = lease(T)
    assert queue.promote(T, {0: token}, until_ms=now + FAR + 2, limit=2, client=client) == {0: 2}
    assert _zset(client, k.store) == {"j0": now + FAR, "j1": now + FAR + 1}
    assert queue.promote(T, {0: token}, until_ms=now + FAR + 2, client=client) == {0: 1}
    assert set(_zset(client, k.later)) == {"j3", "j4"}
    assert queue.promote(T, {0: "1:not-the-holder"}, until_ms=now + FAR * 2,
                         client=client) == {}  # fmt: skip
    with pytest.raises(LeaseLost):
        scripts.promote(client, k, token="1:not-the-holder", until_ms=now + FAR * 2, limit=10)
    assert set(_zset(client, k.later)) == {"j3", "j4"}  # nothing moved without the lease


def test_a_worker_promotes_and_claims_a_job_scheduled_long_before(redis_client):
    start = epoch_ms()
    queue.schedule_many(T, [("j", start + FAR, 0)], client=redis_client, now_ms=start)
    assert queue.stats(T, [0], now_ms=start, client=redis_client)[0].store == 1
    clock = [start]
    seen = []
    dispatcher = _recording_dispatcher(redis_client, seen, clock=lambda: clock[0])
    try:
        assert dispatcher.run_once().claimed == 0  # far away: still in later
        assert redis_client.zcard(slot_keys(T, 0).later) == 1
        clock[0] = start + FAR - queue.LATER_AFTER_MS + 1  # now within the promotion window
        assert dispatcher.run_once().claimed == 0  # moved into store, not due yet
        assert redis_client.zcard(slot_keys(T, 0).store) == 1
        clock[0] = start + FAR
        assert dispatcher.run_once().claimed == 1 and seen == ["j"]
    finally:
        dispatcher.shutdown()


def test_a_backlog_that_fell_due_in_later_is_promoted_tick_by_tick_until_claimed(redis_client):
    """What fell due in later while no worker ran (more than one promotion moves) is caught up
    at once: ``--once`` does not stop with due work left in later, and no tick waits for the
    next maintenance interval to move more."""
    start = epoch_ms()
    jobs = [(f"j{i}", start - 1000 + i, 0) for i in range(25)]
    queue.schedule_many(T, jobs, client=redis_client, now_ms=start - FAR)  # all into later
    assert redis_client.zcard(slot_keys(T, 0).later) == 25
    seen = []
    dispatcher = _recording_dispatcher(redis_client, seen, maintenance_every_ms=3_600_000)
    dispatcher.maintenance.promote_limit = 4
    try:
        total = dispatcher.run_until_idle()
    finally:
        dispatcher.shutdown()
    assert total.claimed == 25
    assert sorted(seen) == sorted(job for job, _, _ in jobs)
    k = slot_keys(T, 0)
    assert redis_client.zcard(k.later) == redis_client.zcard(k.store) == 0
