"""Subscribe → dispatch → deliver, in-process against the real database and Redis."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from couponcenter.core.time import utc_text
from couponcenter.coupons import services as coupon_services
from couponcenter.coupons.models import Coupon
from reminders.engine import queue
from reminders.members import REMINDER_TOPIC
from reminders.models import Notification, ReminderSubscription
from reminders.runtime.worker import build_worker
from reminders.services import messages, subscription_subscribe, subscription_unsubscribe
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _coupon(opens_in_s: float, **kw):
    return CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=opens_in_s), **kw)


def _drain():
    worker = build_worker([REMINDER_TOPIC])
    try:
        return worker.run_until_idle()
    finally:
        worker.shutdown()


def _store_total(slots=16):
    return sum(s.store + s.prepare for s in queue.stats(REMINDER_TOPIC, range(slots), now_ms=0))


def test_due_reminder_lands_in_inbox_once(eager_celery, reminder_settings):
    coupon = _coupon(30)  # remind_at = opens - 60 s: already due
    sub, created = subscription_subscribe(user_id=7, coupon=coupon)
    assert created and _store_total() == 1
    report = _drain()
    assert report.claimed == 1
    inbox = Notification.objects.filter(user_id=7)
    assert inbox.count() == 1
    assert coupon.name in inbox.get().title
    sub.refresh_from_db()
    assert sub.status == ReminderSubscription.Status.SENT
    assert _store_total() == 0
    # Redelivery of the same reminder (e.g. after a Redis rebuild) does not show twice.
    queue.schedule(REMINDER_TOPIC, f"{sub.pk}:7:{coupon.pk}", 0, slot=sub.slot)
    ReminderSubscription.objects.filter(pk=sub.pk).update(status="scheduled")
    _drain()
    assert Notification.objects.filter(user_id=7).count() == 1


def test_the_wording_stays_true_however_late_it_is_read(eager_celery, reminder_settings):
    """On time: the opening as a clock time (not "opens in 1 minute", false a minute later);
    delivered after the opening: it says the coupon is open."""
    opens = timezone.now().replace(microsecond=0) + timedelta(seconds=30)
    opens += timedelta(seconds=1) if opens.second == 0 else timedelta(0)
    on_time = CouponFactory(claim_opens_at=opens)
    subscription_subscribe(user_id=11, coupon=on_time)
    late = _coupon(30)
    subscription_subscribe(user_id=12, coupon=late)
    opened = timezone.now() - timedelta(seconds=5)
    Coupon.objects.filter(pk=late.pk).update(claim_opens_at=opened)  # the worker was down
    _drain()
    local = timezone.localtime(on_time.claim_opens_at)
    note = Notification.objects.get(user_id=11)
    assert note.title == f"{on_time.name} opens at {local:%H:%M:%S} {local.tzname()}"
    assert note.payload["coupons"][0]["claim_opens_at"] == utc_text(on_time.claim_opens_at)
    assert Notification.objects.get(user_id=12).title == f"{late.name} is open now"


@pytest.mark.parametrize(
    ("opens", "said"),
    [
        ("11:35:45", "at 11:35:45 UTC"),  # the exact time, not 11:35 (a tap at 11:35:10 is 409)
        ("11:35:00", "at 11:35 UTC"),  # on the minute: the minute says it exactly
        ("11:35:44.300000", "at 11:35:45 UTC"),  # rounded up, never down
        ("11:59:59.000001", "at 12:00 UTC"),
    ],
)
def test_the_opening_time_is_never_said_earlier_than_it_is(settings, opens, said):
    settings.TIME_ZONE = "UTC"
    day = "2026-11-27T"
    now = datetime.fromisoformat(f"{day}09:00:00+00:00")
    assert messages._when(datetime.fromisoformat(f"{day}{opens}+00:00"), now) == said


def test_future_reminder_waits(eager_celery, reminder_settings):
    coupon = _coupon(3600)
    subscription_subscribe(user_id=8, coupon=coupon)
    assert _drain().claimed == 0
    assert not Notification.objects.exists()


def test_same_window_reminders_merge_into_one(eager_celery, reminder_settings):
    opens = timezone.now() + timedelta(seconds=30)
    coupons = [CouponFactory(claim_opens_at=opens) for _ in range(3)]
    for c in coupons:
        subscription_subscribe(user_id=9, coupon=c)
    _drain()
    note = Notification.objects.get(user_id=9)
    assert note.title.startswith("3 coupons you follow open")
    assert sorted(c["id"] for c in note.payload["coupons"]) == sorted(c.pk for c in coupons)


def test_cancelled_coupon_sends_nothing(eager_celery, reminder_settings):
    coupon = _coupon(30)
    sub, _ = subscription_subscribe(user_id=10, coupon=coupon)
    coupon_services.coupon_cancel(coupon=coupon)
    sub.refresh_from_db()
    assert sub.status == ReminderSubscription.Status.CANCELLED
    assert _store_total() == 0
    _drain()
    assert not Notification.objects.exists()


def test_sold_out_coupon_reminder_is_dropped(eager_celery, reminder_settings):
    coupon = _coupon(30, total_stock=1)
    sub, _ = subscription_subscribe(user_id=11, coupon=coupon)
    type(coupon).objects.filter(pk=coupon.pk).update(claimed_count=1)
    _drain()
    sub.refresh_from_db()
    assert (sub.status, sub.drop_reason) == ("dropped", "sold_out")
    assert not Notification.objects.exists()
    assert _store_total() == 0


def test_unsubscribe_removes_entry_and_is_idempotent(reminder_settings):
    coupon = _coupon(3600)
    subscription_subscribe(user_id=12, coupon=coupon)
    assert subscription_unsubscribe(user_id=12, coupon_id=coupon.pk) is True
    assert subscription_unsubscribe(user_id=12, coupon_id=coupon.pk) is False
    assert _store_total() == 0


def test_moving_opening_time_moves_reminders(reminder_settings):
    coupon = _coupon(3600)
    subs = [subscription_subscribe(user_id=u, coupon=coupon)[0] for u in (20, 21, 22)]
    new_open = timezone.now() + timedelta(hours=2)
    coupon_services.coupon_update(coupon=coupon, claim_opens_at=new_open)
    expected_ms = int((new_open - timedelta(seconds=60)).timestamp() * 1000)
    for sub in subs:
        sub.refresh_from_db()
        assert sub.remind_at == new_open - timedelta(seconds=60)
        assert queue.earliest_due(REMINDER_TOPIC, [sub.slot]) == expected_ms


def test_reaped_dead_reminders_are_marked_failed_and_alerted(reminder_settings, caplog):
    from reminders.services.settling import reminders_dead

    coupon = _coupon(3600)
    sub, _ = subscription_subscribe(user_id=30, coupon=coupon)
    with caplog.at_level("ERROR", logger="reminders.gateways"):
        assert reminders_dead(REMINDER_TOPIC, [f"{sub.pk}:30:{coupon.pk}"]) == 1
    sub.refresh_from_db()
    assert sub.status == ReminderSubscription.Status.FAILED
    assert any("ALERT" in r.getMessage() for r in caplog.records)
