"""Chaos: the Redis that holds the schedule (and Celery's broker) restarted empty, then flushed,
in the middle of a run. PostgreSQL is the truth: the worker's reconcile (every second here) and
``manage.py rebuild_reminder_queues`` put every pending reminder back, and the inbox ledger keeps
a redelivered one from showing twice."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.conf import settings

from reminders.models import Notification
from tests.chaos.conftest import (
    assert_each_notified_once,
    reminders_due_over,
    wait_all_notified,
    wait_for,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _says_reindexed(log: str) -> bool:
    """The reminder worker's log says it put missing entries back (``runtime.worker``)."""
    return "re-indexed missing entries" in log or "full rebuild" in log


def _progress(beyond: int, stack, what: str) -> None:
    wait_for(lambda: Notification.objects.count() >= beyond, timeout=60, interval=0.05,
             what=f"{what}: {beyond} notifications\n{stack.logs()}")  # fmt: skip


def test_redis_restarted_empty_then_flushed_mid_run(private_redis, stack, reminder_settings):
    stack.env.update(REDIS_URL=private_redis.url, CELERY_BROKER_URL=private_redis.url,
                     RECONCILE_EVERY_S="1")  # fmt: skip
    reminder_settings.change(slots=8, batch_size=50, visibility_timeout_ms=3000,
                             max_attempts=10, backoff_ms=200, tick_interval_ms=100)  # fmt: skip
    stack.start()
    subs = reminders_due_over(users=3000, start_s=2, spread_s=16)
    _progress(300, stack, "first deliveries")

    # 1. SHUTDOWN NOSAVE and start again: schedule, in-flight entries, leases, Celery queue gone.
    [worker] = [p for p in stack.procs if p.name == "reminder-worker"]
    logged = len(worker.output())
    private_redis.restart(down_s=1.0)
    at_restart = Notification.objects.count()
    assert at_restart < len(subs), "the restart came too late to test anything"
    # Really lost: the worker found pending reminders missing from Redis and put them back, and
    # says so only when it re-indexed some (its full rebuild on the lost epoch marker, or the
    # reconcile). Read from its log, not the backlog: the worker refills the backlog within a
    # second of the restart, before a loaded machine lets this test look.
    wait_for(lambda: _says_reindexed(worker.output()[logged:]), timeout=60, interval=0.1,
             what=f"the worker re-indexing the lost schedule\n{stack.logs()}")  # fmt: skip
    _progress(at_restart + 300, stack, "recovery after the restart")

    # 2. FLUSHALL, and an operator's rebuild on top of the worker's reconcile (both idempotent).
    private_redis.flushall()
    at_flush = Notification.objects.count()
    assert at_flush < len(subs), "the flush came too late to test anything"
    rebuild = subprocess.run(
        [sys.executable, "manage.py", "rebuild_reminder_queues"],
        cwd=settings.BASE_DIR, env=stack.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert rebuild.returncode == 0 and "rebuild done" in rebuild.stdout, rebuild.stderr[-3000:]

    wait_all_notified(subs, stack, timeout=120)
    assert_each_notified_once(subs)
    assert all(p.alive() for p in stack.procs), "every process recovered without a restart"
    assert _says_reindexed(worker.output()), "the reconcile ran"
