"""A delivery that fails for any reason (here the webhook gateway lost its target after it was
configured) is recorded as failed with its real error, and retried with backoff or sent dead on
that basis: nothing is left in flight for the reaper (issue 13, item 7)."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from reminders import metrics
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from reminders.models import ReminderSubscription
from reminders.selectors import reminder_settings_get
from reminders.services import subscription_subscribe
from reminders.services.delivery import reminders_deliver
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gateway_without_target(reminder_settings, settings):
    """The webhook gateway, valid when saved; then its target goes from the environment."""

    def configure(**extra):
        settings.NOTIFY_WEBHOOK_URL = "https://hooks.example.test/notify"
        settings.NOTIFY_WEBHOOK_SECRET = "delivery-test-secret-of-32-bytes-at-least"
        reminder_settings.change(slots=1, gateway="webhook", backoff_ms=60_000, **extra)
        assert reminder_settings_get(max_age_s=0).gateway == "webhook"  # this process runs it
        settings.NOTIFY_WEBHOOK_URL = ""  # the environment changed under a running service

    return configure


def _claimed(count: int) -> dict:
    """``count`` reminders claimed as the worker claims them (one parcel): the Celery batch."""
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=30))
    for user_id in range(1, count + 1):
        subscription_subscribe(user_id=user_id, coupon=coupon)
    parcel = queue.claim_parcel(REMINDER_TOPIC, 0, now_ms=epoch_ms() + 60_000, limit=100,
                                visibility_ms=60_000, lease_token=queue.HANDED_TOKEN)  # fmt: skip
    assert parcel.size == count
    return {"topic": REMINDER_TOPIC, "parcels": [[0, parcel.parcel_id, parcel.members]]}


def _where() -> tuple[int, int, int]:
    (stats,) = queue.stats(REMINDER_TOPIC, [0], now_ms=epoch_ms())
    return stats.store, stats.prepare, stats.dead


def test_a_crashing_delivery_is_failed_and_retried_not_left_for_the_reaper(
    gateway_without_target, caplog
):
    gateway_without_target()
    batch = _claimed(3)
    with caplog.at_level(logging.ERROR):
        result = reminders_deliver(batch)
    assert result["failed"] == 3 and result["delivered"] == 0
    assert _where() == (3, 0, 0)  # back in store, waiting out the backoff; none in flight
    (dead,) = queue.list_dead(REMINDER_TOPIC, 0) or [None]  # none dead yet
    assert dead is None
    assert "NOTIFY_WEBHOOK_URL" in caplog.text
    assert set(ReminderSubscription.objects.values_list("status", flat=True)) == {"scheduled"}
    assert metrics.totals(REMINDER_TOPIC, minutes=1)["failed"] == 3


def test_on_its_last_attempt_it_is_dead_with_its_real_error(gateway_without_target, caplog):
    gateway_without_target(max_attempts=1)
    batch = _claimed(2)
    with caplog.at_level(logging.ERROR):
        result = reminders_deliver(batch)
    assert result["dead"] == 2
    assert _where() == (0, 0, 2)
    errors = {d.last_error for d in queue.list_dead(REMINDER_TOPIC, 0)}
    assert len(errors) == 1 and "NOTIFY_WEBHOOK_URL" in errors.pop()
    assert set(ReminderSubscription.objects.values_list("status", flat=True)) == {"failed"}
    assert "ALERT" in caplog.text
