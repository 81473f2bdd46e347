"""The per-user push cap (docs/reminders.md) with real processes: at most N pushes per user
per rolling day, enforced across a reminder worker and two Celery worker processes; what is
over the cap lands in the inbox unpushed, and (digest policy) rides on the user's next allowed
push. Exactly once still holds: every reminder is in the inbox once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from reminders import metrics
from reminders.members import REMINDER_TOPIC
from reminders.models import Notification, ReminderSettings
from reminders.services import subscription_subscribe
from tests.e2e.conftest import backlog, wait_for
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEAD = timedelta(seconds=5)


def _coupons(count: int, *, in_s: float = 8, name: str = "C"):
    """Coupons opening a second apart: each reminder is its own message (no merging)."""
    opens = timezone.now() + timedelta(seconds=in_s)
    return [CouponFactory(claim_opens_at=opens + timedelta(seconds=i), reminder_lead=LEAD,
                          name=f"{name}{i}") for i in range(count)]  # fmt: skip


def _delivered(count: int, stack) -> None:
    wait_for(
        lambda: Notification.objects.count() >= count
        and backlog() == {"store": 0, "prepare": 0, "dead": 0},
        timeout=120, what=f"{count} notifications\n{stack.logs()}",
    )  # fmt: skip


def test_the_cap_holds_under_a_burst_across_processes(stack, reminder_settings):
    """Small batches spread each user's reminders over many delivery tasks, run by two Celery
    processes (four pool workers) at once: still exactly one push per user."""
    reminder_settings.change(push_cap_per_day=1, over_cap=ReminderSettings.OverCap.DIGEST,
                             batch_size=7, merge_window_ms=0, tick_interval_ms=100)  # fmt: skip
    stack.start_celery()
    stack.start_celery()
    stack.start_reminder_worker()
    users, coupons = range(500, 530), _coupons(4)
    for user_id in users:
        for coupon in coupons:
            subscription_subscribe(user_id=user_id, coupon=coupon)
    _delivered(len(users) * len(coupons), stack)

    for user_id in users:
        rows = list(Notification.objects.filter(user_id=user_id).values_list("push", "held"))
        assert len(rows) == 4, (user_id, rows)  # exactly once: every reminder, in the inbox
        assert sorted(rows) == [(False, True)] * 3 + [(True, False)], (user_id, rows)
    assert metrics.totals(REMINDER_TOPIC, minutes=10)["capped"] == 3 * len(users)


def test_a_live_change_of_the_cap_and_the_digest_it_releases(stack, reminder_settings):
    reminder_settings.change(push_cap_per_day=1, over_cap=ReminderSettings.OverCap.DIGEST,
                             merge_window_ms=0, tick_interval_ms=100)  # fmt: skip
    stack.start()
    first = _coupons(3, name="Morning ")
    for coupon in first:
        subscription_subscribe(user_id=7, coupon=coupon)
    _delivered(3, stack)
    held = list(Notification.objects.filter(user_id=7, held=True).order_by("visible_at"))
    assert len(held) == 2
    assert Notification.objects.filter(user_id=7, push=True).count() == 1

    # Raised to 2 while the workers run: the next reminder is pushed, and carries the two held.
    reminder_settings.change(push_cap_per_day=2)
    (evening,) = _coupons(1, name="Evening ")
    subscription_subscribe(user_id=7, coupon=evening)
    _delivered(4, stack)
    push = Notification.objects.get(user_id=7, payload__coupons__0__id=evening.pk)
    assert push.push and not push.held
    assert push.title.endswith("· and 2 more coupons you follow"), push.title
    assert [d["notification"] for d in push.payload["digest"]] == [n.pk for n in held]
    assert sorted(c["id"] for c in push.payload["digest_coupons"]) == sorted(
        n.payload["coupons"][0]["id"] for n in held
    )
    assert "Morning" in push.body
    assert not Notification.objects.filter(user_id=7, held=True).exists()
    assert metrics.totals(REMINDER_TOPIC, minutes=10)["digested"] == 2

    # Over the raised cap again, with the inbox-only policy: unpushed and not held.
    reminder_settings.change(over_cap=ReminderSettings.OverCap.INBOX)
    (late,) = _coupons(1, name="Night ")
    subscription_subscribe(user_id=7, coupon=late)
    _delivered(5, stack)
    night = Notification.objects.get(user_id=7, payload__coupons__0__id=late.pk)
    assert (night.push, night.held) == (False, False)


def test_the_day_rolls(stack, reminder_settings):
    """A push older than 24 hours no longer counts: the next reminder is pushed again."""
    reminder_settings.change(push_cap_per_day=1, merge_window_ms=0, tick_interval_ms=100)
    stack.start()
    (old,) = _coupons(1, name="Yesterday ")
    subscription_subscribe(user_id=9, coupon=old)
    _delivered(1, stack)
    Notification.objects.filter(user_id=9).update(
        visible_at=timezone.now() - timedelta(hours=24, minutes=1)
    )
    (today,) = _coupons(1, name="Today ")
    subscription_subscribe(user_id=9, coupon=today)
    _delivered(2, stack)
    assert Notification.objects.get(user_id=9, payload__coupons__0__id=today.pk).push
