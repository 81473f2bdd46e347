"""A Redis flush loses nothing: ``rebuild_reminder_queues`` and the worker's reconcile re-index
every pending job and scheduled reminder from the database, exactly once, and each fires once.

"Flush" here means deleting every key under this test's own prefix (never FLUSHDB).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from reminders.engine import keys, queue, scripts
from reminders.members import REMINDER_TOPIC, member
from reminders.models import Notification, ReminderSubscription, TimeoutJob
from reminders.runtime.worker import Reconciler, build_worker
from reminders.services import subscription_subscribe, timeout_job_cancel
from tests.conftest import delete_keys
from tests.reminders import test_timeouts_handlers as handlers
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db

# Shared fixtures (settings.TIMEOUT_TOPICS override, job factory, the callable action's record).
topics, make_job, calls = handlers.topics, handlers.make_job, handlers.calls

TOPIC, SLOTS = "t.call", 4
REMINDER_SLOTS = 16  # ReminderSettings.slots default
ACTION = "tests.reminders.test_timeouts_handlers.record_call"


@pytest.fixture
def call_topic(topics):
    topics(t_call={"type": "callable", "path": ACTION, "slots": SLOTS})


@pytest.fixture
def flush(redis_client, redis_prefix):
    def run() -> None:
        delete_keys(redis_client, f"{redis_prefix}:*")
        assert not list(redis_client.scan_iter(match=f"{redis_prefix}:*"))

    return run


@pytest.fixture
def subscribe(django_capture_on_commit_callbacks, reminder_settings):
    def make(user_ids, *, opens_in_s: float = 30) -> list[ReminderSubscription]:
        coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=opens_in_s))
        with django_capture_on_commit_callbacks(execute=True):
            return [subscription_subscribe(user_id=u, coupon=coupon)[0] for u in user_ids]

    return make


def members(redis_client, topic: str, slots: int) -> dict[int, list[str]]:
    """Slot -> every member in its store, prepare and dead sets (duplicates kept)."""
    out = {}
    for slot in range(slots):
        k = keys.slot_keys(topic, slot)
        found = [
            scripts.as_str(m)
            for key in (k.store, k.later, k.prepare, k.dead)
            for m in redis_client.zrange(key, 0, -1)
        ]
        if found:
            out[slot] = sorted(found)
    return out


def expected_jobs(topic: str = TOPIC) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    pending = TimeoutJob.objects.filter(topic=topic, status=TimeoutJob.Status.PENDING)
    for pk, slot in pending.values_list("pk", "slot"):
        out.setdefault(slot, []).append(str(pk))
    return {slot: sorted(ids) for slot, ids in out.items()}


def expected_reminders() -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    scheduled = ReminderSubscription.objects.filter(status="scheduled")
    for s in scheduled:
        out.setdefault(s.slot, []).append(member(s.pk))
    return {slot: sorted(ids) for slot, ids in out.items()}


def rebuild() -> str:
    out = StringIO()
    call_command("rebuild_reminder_queues", stdout=out, stderr=StringIO())
    return out.getvalue()


def drain(*topic_names: str):
    worker = build_worker(list(topic_names))
    try:
        return worker.run_until_idle()
    finally:
        worker.shutdown()


def test_rebuild_after_flush_restores_each_pending_entry_once_and_each_fires_once(
    call_topic, make_job, subscribe, flush, redis_client, calls, eager_celery
):
    due = [make_job(TOPIC) for _ in range(40)]
    later = [make_job(TOPIC, in_s=3600) for _ in range(5)]
    subs = subscribe(range(1000, 1012))
    before_jobs, before_reminders = members(redis_client, TOPIC, SLOTS), expected_reminders()
    assert before_jobs == expected_jobs() and len(before_jobs) == SLOTS
    assert members(redis_client, REMINDER_TOPIC, REMINDER_SLOTS) == before_reminders

    flush()
    output = rebuild()

    assert "timeout jobs: 45 re-indexed (45 pending in the database)" in output
    assert "reminders: 12 re-indexed (12 pending in the database)" in output
    assert members(redis_client, TOPIC, SLOTS) == before_jobs
    assert members(redis_client, REMINDER_TOPIC, REMINDER_SLOTS) == before_reminders
    assert queue.earliest_due(TOPIC, [later[0].slot]) is not None

    assert "timeout jobs: 0 re-indexed" in rebuild()  # idempotent: nothing added twice
    assert members(redis_client, TOPIC, SLOTS) == before_jobs
    assert members(redis_client, REMINDER_TOPIC, REMINDER_SLOTS) == before_reminders

    report = drain(TOPIC, REMINDER_TOPIC)
    assert report.claimed == 40 + 12
    assert Counter(calls) == Counter({job.pk: 1 for job in due})
    processed = TimeoutJob.objects.filter(status=TimeoutJob.Status.PROCESSED)
    assert set(processed.values_list("pk", flat=True)) == {job.pk for job in due}
    assert TimeoutJob.objects.filter(status=TimeoutJob.Status.PENDING).count() == 5
    assert Counter(Notification.objects.values_list("user_id", flat=True)) == Counter(
        {sub.user_id: 1 for sub in subs}
    )
    assert members(redis_client, TOPIC, SLOTS) == expected_jobs()  # only the 5 later ones

    rebuild()  # fired jobs are no longer pending: nothing comes back, nothing fires again
    assert members(redis_client, TOPIC, SLOTS) == expected_jobs()
    assert drain(TOPIC, REMINDER_TOPIC).claimed == 0
    assert len(calls) == 40


def test_processed_and_cancelled_jobs_are_not_rebuilt(
    call_topic, make_job, flush, redis_client, calls, django_capture_on_commit_callbacks
):
    fired, cancelled = make_job(TOPIC), make_job(TOPIC, in_s=60)
    drain(TOPIC)
    with django_capture_on_commit_callbacks(execute=True):
        timeout_job_cancel(job=cancelled)
    pending = make_job(TOPIC, in_s=60)
    flush()
    rebuild()
    assert members(redis_client, TOPIC, SLOTS) == {pending.slot: [str(pending.pk)]}
    assert calls == [fired.pk]


def test_rebuild_leaves_in_flight_and_dead_entries_alone(call_topic, make_job, redis_client):
    in_flight, dead = make_job(TOPIC, biz_id="x-1"), make_job(TOPIC, biz_id="x-2")
    for job in (in_flight, dead):
        token = scripts.lease_acquire(
            redis_client, keys.slot_keys(TOPIC, job.slot), holder="test", ttl_ms=60_000
        )
        queue.claim(TOPIC, job.slot, now_ms=10**13, limit=10, visibility_ms=60_000,
                    lease_token=token)  # fmt: skip
        if job is dead:
            queue.bury(TOPIC, job.slot, [(str(job.pk), "boom")], now_ms=0, lease_token=token)
    assert "timeout jobs: 0 re-indexed" in rebuild()
    for job, where in ((in_flight, "prepare"), (dead, "dead")):
        k = keys.slot_keys(TOPIC, job.slot)
        expected = "in flight" if where == "prepare" else where
        assert queue.place(TOPIC, job.slot, str(job.pk)).where == expected
        assert redis_client.zscore(getattr(k, where), str(job.pk)) is not None


def test_rebuild_serves_slots_of_an_older_larger_layout(
    topics, make_job, flush, redis_client, calls
):
    topics(t_call={"type": "callable", "path": ACTION, "slots": 16})
    jobs = [make_job(TOPIC, biz_id=f"L-{n}") for n in range(20)]
    assert max(j.slot for j in jobs) >= SLOTS  # some rows point past the new slot count
    topics(t_call={"type": "callable", "path": ACTION, "slots": SLOTS})  # slot count shrinks
    flush()  # ...and the layout set that remembered 16 slots goes with the flush
    rebuild()
    assert drain(TOPIC).claimed == 20
    assert sorted(calls) == sorted(j.pk for j in jobs)


def test_worker_reconcile_brings_back_jobs_due_within_the_window(
    call_topic, make_job, subscribe, flush, redis_client, calls, settings, eager_celery
):
    soon = [make_job(TOPIC, in_s=s) for s in (-5, -1, 30, 300)]
    far = make_job(TOPIC, in_s=3 * 3600)
    subs = subscribe([2001, 2002])
    Reconciler(every_s=3600)()  # first start: sets the epoch marker (and re-indexes in full)

    # Entries lost while the marker survives (say, a failover to a replica that lagged): the
    # periodic reconcile brings back what is due within its window, and only that.
    for slot in range(SLOTS):
        k = keys.slot_keys(TOPIC, slot)
        redis_client.delete(k.store, k.later)
    assert redis_client.exists(keys.epoch())
    Reconciler(every_s=0, window_s=600)()
    back = {m for ids in members(redis_client, TOPIC, SLOTS).values() for m in ids}
    assert back == {str(j.pk) for j in soon}
    assert str(far.pk) not in back
    assert members(redis_client, REMINDER_TOPIC, REMINDER_SLOTS) == expected_reminders()

    # A flush takes the marker with it: the next reconcile notices at once and rebuilds in full.
    flush()
    Reconciler(every_s=3600)()
    back = {m for ids in members(redis_client, TOPIC, SLOTS).values() for m in ids}
    assert back == {str(j.pk) for j in [*soon, far]}

    # The worker runs the same reconcile as housekeeping before it claims: after another flush
    # its first tick re-indexes and fires what is due.
    flush()
    report = drain(TOPIC, REMINDER_TOPIC)
    assert report.claimed == 2 + 2
    assert sorted(calls) == sorted(j.pk for j in soon[:2])
    assert set(Notification.objects.values_list("user_id", flat=True)) == {s.user_id for s in subs}
    back = {m for ids in members(redis_client, TOPIC, SLOTS).values() for m in ids}
    assert back == {str(j.pk) for j in [*soon[2:], far]}


def test_first_start_is_calm_and_a_loss_is_a_warning(
    call_topic, make_job, flush, redis_client, caplog
):
    # A first start finds every pending entry in Redis already (scheduled as it was created):
    # the full check re-indexes nothing and says so at INFO.
    make_job(TOPIC, in_s=300)
    with caplog.at_level("INFO", logger="reminders.runtime.worker"):
        Reconciler(every_s=3600)()
    records = [r for r in caplog.records if r.name == "reminders.runtime.worker"]
    assert [r.levelname for r in records] == ["INFO"]
    assert "holds the whole schedule" in records[0].getMessage()
    assert redis_client.exists(keys.epoch())

    # Redis restarted without its data: the same check re-indexes the job, and that is a WARNING.
    flush()
    caplog.clear()
    with caplog.at_level("INFO", logger="reminders.runtime.worker"):
        Reconciler(every_s=3600)()
    records = [r for r in caplog.records if r.name == "reminders.runtime.worker"]
    assert [r.levelname for r in records] == ["WARNING"]
    assert "full rebuild" in records[0].getMessage()
    assert records[0].counts == {"timeout jobs": 1, "reminders": 0}
