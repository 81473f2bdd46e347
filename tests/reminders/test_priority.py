"""High-priority coupons' reminders are claimed before normal ones when both are due
(docs/reminders.md): the dispatcher in-process, Celery eager, real DB and Redis."""

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC, REMINDER_TOPIC_HIGH
from reminders.models import Notification
from reminders.runtime.worker import build_worker
from reminders.services import subscription_subscribe
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _due_coupons():
    """Both due now; the normal coupon's reminders are the older ones."""
    now = timezone.now()
    normal = CouponFactory(claim_opens_at=now + timedelta(seconds=20))
    high = CouponFactory(claim_opens_at=now + timedelta(seconds=30), reminder_priority="high")
    return normal, high


def _subscribe(coupon, user_ids) -> None:
    for user_id in user_ids:
        sub, _ = subscription_subscribe(user_id=user_id, coupon=coupon)
        assert sub.priority == coupon.reminder_priority


def _notified_users() -> list[int]:
    return list(Notification.objects.order_by("id").values_list("user_id", flat=True))


def test_high_priority_reminders_are_delivered_first(eager_celery, reminder_settings):
    reminder_settings.change(slots=1, batch_size=2)
    normal, high = _due_coupons()
    normal_users, high_users = list(range(1, 11)), list(range(101, 111))
    _subscribe(normal, normal_users)  # subscribed (and due) first
    _subscribe(high, high_users)
    worker = build_worker([REMINDER_TOPIC, REMINDER_TOPIC_HIGH])
    try:
        report = worker.run_until_idle()
    finally:
        worker.shutdown()
    assert report.claimed == 20
    order = _notified_users()
    assert sorted(order[:10]) == high_users
    assert sorted(order[10:]) == normal_users


def test_short_time_budget_is_spent_on_high_priority_first(
    eager_celery, reminder_settings, settings
):
    # A tick claims for a third of the lease time (5 s: about 1.7 s). The worker's clock
    # advances 10 ms each time it is read, so however fast or slow the machine, 400 one-entry
    # batches outlast the budget and the tick ends with high-priority work still due; the real
    # slot leases (5 s in Redis) are renewed between ticks.
    settings.WORKER_LEASE_MS = 5000
    reminder_settings.change(slots=1, batch_size=1)
    normal, high = _due_coupons()
    _subscribe(normal, range(1, 6))
    _subscribe(high, range(101, 501))
    worker = build_worker([REMINDER_TOPIC, REMINDER_TOPIC_HIGH])
    ticks = itertools.count(epoch_ms(), 10)
    worker.clock = lambda: next(ticks)
    try:
        report = worker.run_once()
        assert report.busy
        first_tick = _notified_users()
        assert first_tick and all(u >= 101 for u in first_tick)
        worker.run_until_idle()
    finally:
        worker.shutdown()
    order = _notified_users()
    assert len(order) == 405
    assert all(u >= 101 for u in order[:400]) and sorted(order[400:]) == [1, 2, 3, 4, 5]
