"""Changing the slot count (4 -> 16 -> 4) under a running worker: entries scheduled under every
layout stay reachable, are delivered exactly once, and a cancel still finds them."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.coupons import services as coupon_services
from reminders.engine import queue
from reminders.members import REMINDER_TOPIC, member
from reminders.models import Notification, ReminderSubscription
from reminders.services import subscription_subscribe, subscription_unsubscribe
from tests.e2e.conftest import backlog, drained, wait_for
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEAD = timedelta(seconds=5)
PER_COUPON = 40
LEAVERS = 5


def _in_store(sub: ReminderSubscription) -> bool:
    return queue.place(REMINDER_TOPIC, sub.slot, member(sub.pk)).where == "scheduled"


def _subscribe(coupon, user_ids) -> list[ReminderSubscription]:
    return [subscription_subscribe(user_id=u, coupon=coupon)[0] for u in user_ids]


def test_slot_count_change_keeps_every_reminder_reachable(stack, reminder_settings):
    reminder_settings.change(slots=4, tick_interval_ms=200)
    stack.start()
    later = timezone.now() + timedelta(hours=1)
    coupons = [CouponFactory(claim_opens_at=later, reminder_lead=LEAD) for _ in range(3)]
    a, b, c = coupons

    subs_a = _subscribe(a, range(1, PER_COUPON + 1))  # under 4 slots
    reminder_settings.change(slots=16)
    subs_b = _subscribe(b, range(101, PER_COUPON + 101))  # under 16 slots
    leavers_a = subs_a[:LEAVERS]
    for sub in leavers_a:  # scheduled under the old layout: the cancel must still find it
        assert _in_store(sub)
        assert subscription_unsubscribe(user_id=sub.user_id, coupon_id=a.pk)
        assert not _in_store(sub)
    reminder_settings.change(slots=4)
    subs_c = _subscribe(c, range(201, PER_COUPON + 201))  # back under 4 slots
    leavers_b = [s for s in subs_b if s.slot >= 4][:LEAVERS]  # slots the 4-layout does not have
    assert len(leavers_b) == LEAVERS
    for sub in leavers_b:
        assert subscription_unsubscribe(user_id=sub.user_id, coupon_id=b.pk)
        assert not _in_store(sub)
    assert {s.slot for s in subs_a + subs_c} <= set(range(4))
    assert any(s.slot >= 4 for s in subs_b)
    assert queue.served_slot_count(REMINDER_TOPIC, 4) == 16  # the 16-layout is still served

    # Staggered due times, so the worker delivers while entries of both layouts are pending.
    now = timezone.now()
    for i, coupon in enumerate(coupons):
        coupon_services.coupon_update(coupon=coupon, claim_opens_at=now + LEAD + timedelta(
            seconds=2 + 2 * i))  # fmt: skip
    expected = {s.user_id for s in subs_a + subs_b + subs_c} - {
        s.user_id for s in leavers_a + leavers_b
    }
    wait_for(
        lambda: Notification.objects.count() >= len(expected),
        timeout=30,
        what=f"{len(expected)} notifications\n{stack.logs()}",
    )
    drained(stack=stack)

    assert Counter(Notification.objects.values_list("user_id", flat=True)) == dict.fromkeys(
        expected, 1
    )
    statuses = Counter(ReminderSubscription.objects.values_list("status", flat=True))
    assert statuses == {"sent": len(expected), "cancelled": 2 * LEAVERS}
    assert backlog() == {"store": 0, "prepare": 0, "dead": 0}
