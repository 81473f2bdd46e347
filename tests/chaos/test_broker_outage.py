"""Chaos: the Celery broker down for 30 s while Redis (the schedule) stays up.

The broker is a redis-server of the test's own; the engine's Redis is the shared one. While the
broker is down the reminder worker stops claiming reminders (they wait in Redis, their attempts
untouched) and a publish that fails does so at once (no reconnect loop inside the claim round),
so the worker keeps its slot leases; the Celery worker reconnects when the broker is back, empty
(tasks it held are gone: their entries are still in flight in the engine and come back after the
visibility timeout). Every reminder reaches its user once, and no lease changes hands.
"""

from __future__ import annotations

import re
import time

import pytest

from reminders.engine import leases
from reminders.models import Notification
from tests.chaos.conftest import assert_each_notified_once, reminders_due_over, wait_all_notified
from tests.chaos.faults import RedisServer
from tests.e2e.conftest import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
OUTAGE_S = 30


@pytest.fixture
def broker(settings, tmp_path):
    """Celery's broker, apart from the engine's Redis. Request it before ``stack``."""
    server = RedisServer(tmp_path / "broker").start()
    settings.CELERY_BROKER_URL = server.url
    try:
        yield server
    finally:
        server.stop()


def test_a_30_s_broker_outage_loses_and_repeats_nothing_and_keeps_the_leases(
    broker, stack, reminder_settings
):
    stack.env["CELERY_BROKER_URL"] = broker.url
    reminder_settings.change(slots=8, batch_size=50, visibility_timeout_ms=5000, max_attempts=30,
                             backoff_ms=500, tick_interval_ms=100, prestage_ms=0)  # fmt: skip
    stack.start()
    worker = stack.procs[-1]
    owner = {w.worker_id for w in leases.list_workers() if w.pid == worker.popen.pid}
    subs = reminders_due_over(users=1200, start_s=2, spread_s=OUTAGE_S + 10, slots=8)
    wait_for(Notification.objects.exists, timeout=30, interval=0.05, what="first deliveries")

    broker.shutdown()
    down_at = Notification.objects.count()
    time.sleep(OUTAGE_S)  # the outage itself, not a wait for something
    during = Notification.objects.count() - down_at
    broker.start()

    wait_all_notified(subs, stack, timeout=180)
    assert_each_notified_once(subs)
    assert 0 < down_at < len(subs)
    # Tasks already in Celery's hands may finish during the outage; new ones cannot be handed
    # on: most of what fell due in those 30 s was delivered after the broker came back.
    assert during < len(subs) - down_at, (during, down_at)
    log = worker.output()
    assert "broker unreachable" in log, log[-3000:]
    assert not re.search(r"lease lost", log), log[-3000:]
    assert worker.alive()
    # Still the same worker holding every reminder slot: no lease changed hands.
    holders = {w.worker_id for w in leases.list_workers() if w.owned.get("coupon.reminder")}
    assert holders == owner
