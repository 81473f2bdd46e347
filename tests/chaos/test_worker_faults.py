"""Chaos: reminder workers SIGKILLed at random points (20 times), a worker frozen past its lease
(fencing), and Celery workers SIGKILLed in the middle of an inbox delivery transaction."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from django.db import connection
from django.utils import timezone

from reminders.engine import leases, queue
from reminders.models import Notification, TimeoutJob
from reminders.services import timeout_job_create
from tests.chaos.conftest import (
    assert_each_notified_once,
    reminders_due_over,
    wait_all_notified,
    wait_for,
)
from tests.e2e.conftest import LEASE_MS

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FENCE_TOPIC = "chaos.fence"
FENCE_TOPICS = {
    FENCE_TOPIC: {"type": "callable", "path": "tests.chaos.actions.announce_and_sleep",
                  "slots": 1, "visibility_ms": 1500, "max_attempts": 5},
}  # fmt: skip


def test_reminder_workers_sigkilled_20_times_lose_and_repeat_nothing(stack, reminder_settings, rng):
    """Two workers; 20 times one of them (at random) is SIGKILLed after a random delay and a
    fresh one started, while reminders fall due: 3,000 over 40 s, and 600 more whenever fewer
    than 300 are left, so every kill lands while reminders are being sent however slowly the
    machine starts workers (a fixed window let the last kills land after it on a loaded one)."""
    # No pre-staging: the reminders are claimed as they fall due, over the 40 s the kills land in.
    reminder_settings.change(slots=16, batch_size=50, visibility_timeout_ms=3000,
                             max_attempts=20, backoff_ms=200, tick_interval_ms=100,
                             prestage_ms=0)  # fmt: skip
    stack.start()
    workers = [stack.procs[-1], stack.start_reminder_worker()]
    subs = reminders_due_over(users=3000, start_s=2, spread_s=40)
    due_until = time.monotonic() + 42  # the last reminder's due time
    wait_for(Notification.objects.exists, timeout=30, interval=0.05, what="first deliveries")

    mid_run, next_user = 0, 3001
    for _ in range(20):
        # Keep the window open by the clock, not by a count: with no pre-staging nothing is sent
        # before it is due, so reminders due well after the kill are still unsent at it, however
        # long a loaded machine took to start the last replacement.
        if due_until - time.monotonic() < 10:
            subs |= reminders_due_over(users=600, start_s=1, spread_s=12, coupons=4,
                                       first_user=next_user, exact=False)  # fmt: skip
            due_until = time.monotonic() + 13
            next_user += 600
        time.sleep(rng.uniform(0.1, 1.2))  # a random point in the victim's loop
        victim = rng.randrange(len(workers))
        workers[victim].kill()
        delivered = Notification.objects.count()
        mid_run += 0 < delivered < len(subs)
        # Half the time the replacement is killed again before it is even ready.
        workers[victim] = stack.start_reminder_worker(wait=rng.random() < 0.5)

    assert mid_run == 20, f"only {mid_run} of 20 kills landed while reminders were being sent"
    wait_all_notified(subs, stack, timeout=120)
    assert_each_notified_once(subs)


def _log_lines(proc, pattern: str) -> list[str]:
    return re.findall(pattern, proc.output())


def _owned(proc) -> dict[str, list[int]]:
    for w in leases.list_workers():
        if w.pid == proc.popen.pid:
            return w.owned
    return {}


def test_worker_paused_past_its_lease_is_fenced_off(stack, reminder_settings, settings):
    """A worker frozen (SIGSTOP) in the middle of a batch loses its slots to the other worker,
    which reaps and redoes the batch; resumed (SIGCONT), the frozen one cannot ack its stale
    batch (LeaseLost) and rejoins. Reminders flowing meanwhile reach each user once."""
    settings.TIMEOUT_TOPICS = FENCE_TOPICS
    stack.env["TIMEOUT_TOPICS_JSON"] = json.dumps(FENCE_TOPICS)
    reminder_settings.change(slots=8, batch_size=50, visibility_timeout_ms=3000,
                             max_attempts=10, backoff_ms=200, tick_interval_ms=100,
                             prestage_ms=0)  # fmt: skip
    stack.start()
    workers = [stack.procs[-1], stack.start_reminder_worker()]
    subs = reminders_due_over(users=1500, start_s=2, spread_s=14)
    job = timeout_job_create(topic=FENCE_TOPIC, biz_type="chaos", biz_id="fence",
                             action_time=timezone.now(), attribute={"sleep_s": 4})  # fmt: skip
    started = f"chaos-action start job={job.pk} "

    def runner():
        return next((w for w in workers if started in w.output()), None)

    frozen = wait_for(runner, timeout=30, interval=0.02, what="the fence job to start")
    other = next(w for w in workers if w is not frozen)
    os.killpg(frozen.popen.pid, signal.SIGSTOP)
    try:
        paused_at = time.monotonic()
        # The other worker sees the frozen one's heartbeat go stale, takes every slot once the
        # leases expire, reaps the in-flight job after its visibility timeout and runs it.
        wait_for(lambda: started in other.output(), timeout=30, what="the job to be taken over")
        wait_for(
            lambda: TimeoutJob.objects.filter(
                pk=job.pk, status=TimeoutJob.Status.PROCESSED
            ).exists(),
            timeout=30,
            what=f"the other worker to finish the job\n{other.output()[-3000:]}",
        )
        every_slot = list(range(queue.served_slot_count("coupon.reminder", 8)))
        wait_for(lambda: _owned(other).get("coupon.reminder") == every_slot, timeout=30,
                 what=f"the other worker to own every slot: {_owned(other)}")  # fmt: skip
        assert time.monotonic() - paused_at > LEASE_MS / 1000
    finally:
        os.killpg(frozen.popen.pid, signal.SIGCONT)

    # Resumed: its action finishes, but the other worker's take recorded a higher attempt in the
    # row, so the stale settlement moves nothing, in the database or in Redis.
    fenced = rf"lease lost on {re.escape(FENCE_TOPIC)}:0; dropping the batch in hand"
    wait_for(lambda: _log_lines(frozen, fenced), timeout=30, what=f"LeaseLost\n{frozen.output()}")
    wait_for(lambda: _owned(frozen).get("coupon.reminder"), timeout=30, what="the rebalance")
    assert frozen.alive() and other.alive()

    wait_all_notified(subs, stack, timeout=90)
    assert_each_notified_once(subs)
    job.refresh_from_db()
    # Delivered twice underneath (at-least-once: the frozen worker's run did happen), recorded
    # once, by the worker that owned the slot: the stale ack moved nothing.
    assert (job.status, job.attempts) == (TimeoutJob.Status.PROCESSED, 2)
    assert len(_log_lines(frozen, rf"chaos-action done job={job.pk} ")) == 1


# --- Celery killed mid-delivery ------------------------------------------------------------------

IN_DELIVERY = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
  AND (query LIKE 'UPDATE reminders_remindersubscription SET status%%'
       OR query LIKE 'INSERT INTO reminders_notification%%')
"""


def _delivery_transactions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(IN_DELIVERY)
        return cursor.fetchone()[0]


def test_celery_worker_killed_mid_delivery_transaction(stack, reminder_settings, pg_proxy, rng):
    """The Celery worker reaches PostgreSQL through a slow link (20 ms a round trip), so an inbox
    delivery transaction stays open for a while; three times it is SIGKILLed (the whole process
    group) while one is open, and a fresh worker started. The transaction rolls back, the entries
    come back after their visibility timeout, and every user is notified once."""
    reminder_settings.change(slots=8, batch_size=100, visibility_timeout_ms=3000,
                             max_attempts=10, backoff_ms=200, tick_interval_ms=100,
                             max_delivery_queue=4)  # fmt: skip
    pg_proxy.latency_s = 0.02
    direct = stack.env["DATABASE_URL"]
    stack.start_reminder_worker()
    stack.env["DATABASE_URL"] = pg_proxy.database_url  # Celery only
    celery = stack.start_celery()
    stack.env["DATABASE_URL"] = direct
    subs = reminders_due_over(users=2000, start_s=1, spread_s=6)

    for kill in range(3):
        wait_for(_delivery_transactions, timeout=60, interval=0.005,
                 what=f"an open delivery transaction (kill {kill})\n{stack.logs()}")  # fmt: skip
        time.sleep(rng.uniform(0, 0.02))
        celery.kill()
        assert Notification.objects.count() < len(subs), "the kill came too late"
        stack.env["DATABASE_URL"] = pg_proxy.database_url
        celery = stack.start_celery()
        stack.env["DATABASE_URL"] = direct

    wait_all_notified(subs, stack, timeout=120)
    assert_each_notified_once(subs)
    # The kills landed: some batches came back and were delivered on a later attempt (each
    # delivery task reports how many of its reminders were redelivered).
    logs = "".join(p.output() for p in stack.procs if p.name == "celery")
    redelivered = sum(int(n) for n in re.findall(r"'redelivered': (\d+)", logs))
    assert redelivered > 0, logs[-3000:]
