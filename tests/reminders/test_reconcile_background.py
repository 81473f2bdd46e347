"""The worker process's periodic reconcile runs in a thread of its own, off the dispatch loop.

Seen in bench_reminders: the reconcile, run inside a dispatch tick once a minute, read the 50,000
reminders due within its window and re-indexed them while every claim waited, a 0.5 s spike of
lateness in a steady 5,000/s. Here the reconcile is held at its start (its database work wrapped
to wait on an event, the only stand-in in these tests) to show the tick does not wait for it, that
one runs at a time, and that it still brings back what Redis lost.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from reminders import services
from reminders.engine import keys, queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC, member
from reminders.runtime import worker as worker_module
from reminders.runtime.worker import Reconciler, build_worker
from reminders.services import subscription_subscribe
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.django_db(transaction=True)]

SLOTS = 16  # ReminderSettings.slots default
WAIT_S = 60  # an event that never comes fails the test instead of hanging it


@pytest.fixture
def held_reconcile(monkeypatch):
    """The reconcile's database work waits for ``release``; ``entered`` says it got there."""
    entered, release = threading.Event(), threading.Event()
    real = services.queues_rebuild

    def held(**kwargs):
        entered.set()
        assert release.wait(WAIT_S), "never released"
        return real(**kwargs)

    monkeypatch.setattr(worker_module.services, "queues_rebuild", held)
    yield entered, release
    release.set()


def indexed(redis_client) -> set[str]:
    found = set()
    for slot in range(SLOTS):
        k = keys.slot_keys(REMINDER_TOPIC, slot)
        for key in (k.store, k.later, k.prepare, k.dead):
            found |= {scripts.as_str(m) for m in redis_client.zrange(key, 0, -1)}
    return {m for m in found if not m.startswith("#")}  # "#<id>": a parcel in flight


def lose_everything_but_the_marker(redis_client) -> None:
    for slot in range(SLOTS):
        k = keys.slot_keys(REMINDER_TOPIC, slot)
        redis_client.delete(k.store, k.later)
    assert redis_client.exists(keys.epoch())


@pytest.fixture
def subscriptions(reminder_settings, redis_client):
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(minutes=3))
    subs = [subscription_subscribe(user_id=u, coupon=coupon)[0] for u in (3001, 3002, 3003)]
    Reconciler(every_s=3600)()  # first start: sets the epoch marker
    before = indexed(redis_client)
    assert len(before) == len(subs)
    return before


def test_the_periodic_reconcile_runs_in_the_background_one_at_a_time(
    subscriptions, held_reconcile, redis_client
):
    entered, release = held_reconcile
    lose_everything_but_the_marker(redis_client)
    reconcile = Reconciler(every_s=0, window_s=600, background=True)
    try:
        first = reconcile()
        assert first is not None and entered.wait(WAIT_S)
        assert reconcile() is None  # still running: no second one beside it
        assert not first.done()
        release.set()
        first.result(timeout=WAIT_S)
        assert indexed(redis_client) == subscriptions
        again = reconcile()  # due again (every_s=0) once the last one ended
        assert again is not None
        again.result(timeout=WAIT_S)
        assert indexed(redis_client) == subscriptions
    finally:
        release.set()
        reconcile.close()


def test_a_dispatch_tick_does_not_wait_for_the_reconcile(
    subscriptions, held_reconcile, redis_client, settings
):
    entered, release = held_reconcile
    settings.RECONCILE_EVERY_S = 0
    lose_everything_but_the_marker(redis_client)
    dispatcher = build_worker(threaded=True)
    try:
        dispatcher.run_once()  # takes the housekeeping lease and starts the reconcile
        assert entered.wait(WAIT_S)
        dispatcher.run_once()  # a whole tick while the reconcile is still held
        assert not indexed(redis_client)
    finally:
        release.set()
        dispatcher.shutdown()  # waits for the reconcile in flight
    assert indexed(redis_client) == subscriptions


def test_the_reconcile_does_not_index_again_what_is_in_a_parcel(redis_client, reminder_settings):
    """A parcel keeps its ids as one string, which NX cannot see into: the reconcile reads the
    slots' parcels and leaves their reminders alone, and still brings back one that was lost."""
    reminder_settings.change(slots=1)
    now = timezone.now()
    in_flight = CouponFactory(claim_opens_at=now + timedelta(seconds=50))  # due 10 s ago
    lost = CouponFactory(claim_opens_at=now + timedelta(seconds=10))  # due 50 s ago
    flying, _ = subscription_subscribe(user_id=1, coupon=in_flight)
    gone, _ = subscription_subscribe(user_id=2, coupon=lost)
    redis_client.set(keys.epoch(), "set by a running worker")
    queue.cancel(REMINDER_TOPIC, member(gone.pk), slot=0)  # Redis lost this one
    parcel = queue.claim_parcel(REMINDER_TOPIC, 0, now_ms=epoch_ms(), limit=10,
                                visibility_ms=30_000, lease_token=queue.HANDED_TOKEN)  # fmt: skip
    assert parcel.job_ids() == [member(flying.pk)]  # in flight, in a parcel

    Reconciler(every_s=0, window_s=300)()

    assert indexed(redis_client) == {member(gone.pk)}  # the parcel's id is not seen by zsets
    # A full rebuild by hand (rebuild_reminder_queues) leaves it alone too.
    assert services.queues_rebuild()["reminders"] == 0
    assert indexed(redis_client) == {member(gone.pk)}
