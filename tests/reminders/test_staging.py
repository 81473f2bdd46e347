"""Pre-staged reminders: in the inbox ahead of their due time, hidden until then, and withdrawn
by a cancel, an unsubscribe, a moved opening or a sold-out coupon before that moment."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from couponcenter.coupons import services as coupon_services
from reminders import selectors
from reminders.engine import queue
from reminders.gateways import InboxGateway
from reminders.members import REMINDER_TOPIC
from reminders.models import Notification, ReminderSubscription
from reminders.runtime.worker import build_worker
from reminders.services import subscription_subscribe, subscription_unsubscribe
from tests.support.factories import CouponFactory, api_user

pytestmark = pytest.mark.django_db(transaction=True)
Status = ReminderSubscription.Status
PERMS = ("couponcenter.act_for_any_user",)
LEAD_S = 60  # the factory's coupons remind a minute before they open


def _coupon(due_in_s: float, **kw):
    opens = timezone.now() + timedelta(seconds=due_in_s + LEAD_S)
    return CouponFactory(claim_opens_at=opens, **kw)


def _drain():
    worker = build_worker([REMINDER_TOPIC])
    try:
        return worker.run_until_idle()
    finally:
        worker.shutdown()


def _indexed(slots=16) -> int:
    return sum(s.store + s.prepare for s in queue.stats(REMINDER_TOPIC, range(slots), now_ms=0))


def _staged(user_id: int, coupon) -> ReminderSubscription:
    sub, _ = subscription_subscribe(user_id=user_id, coupon=coupon)
    assert _drain().claimed >= 1
    sub.refresh_from_db()
    return sub


def test_a_reminder_due_within_the_window_is_written_early_and_hidden_until_due(
    eager_celery, reminder_settings
):
    coupon = _coupon(20)
    sub = _staged(31, coupon)
    note = Notification.objects.get(user_id=31)
    assert note.visible_at == sub.remind_at > note.created_at
    assert sub.status == Status.SENT and sub.sent_at == sub.remind_at
    assert _indexed() == 0  # claimed and acked: the due moment has nothing left to do
    # Hidden until its due moment, shown from then on.
    assert not selectors.notification_list(user_id=31).exists()
    just_before = sub.remind_at - timedelta(milliseconds=1)
    assert not selectors.notification_list(user_id=31, now=just_before).exists()
    assert list(selectors.notification_list(user_id=31, now=sub.remind_at)) == [note]


def test_the_apis_show_a_staged_reminder_as_still_scheduled(eager_celery, reminder_settings):
    coupon = _coupon(20)
    _staged(32, coupon)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_user(perms=PERMS)[1]}")
    inbox = client.get("/api/users/32/notifications/")
    assert inbox.status_code == 200 and inbox.json()["count"] == 0
    subs = client.get("/api/users/32/reminders/").json()["results"]
    assert [(s["status"], s["sent_at"]) for s in subs] == [("scheduled", None)]


def test_outside_the_window_nothing_is_claimed(eager_celery, reminder_settings):
    reminder_settings.change(prestage_ms=5_000)
    subscription_subscribe(user_id=33, coupon=_coupon(20))
    assert _drain().claimed == 0
    assert not Notification.objects.exists()


def test_prestage_off_waits_for_the_due_time(eager_celery, reminder_settings):
    reminder_settings.change(prestage_ms=0)
    subscription_subscribe(user_id=34, coupon=_coupon(5))
    assert _drain().claimed == 0
    assert _indexed() == 1


def test_external_gateways_are_never_staged(eager_celery, reminder_settings, settings):
    settings.NOTIFY_WEBHOOK_URL = "https://hooks.example.test/notify"
    reminder_settings.change(gateway="webhook")
    subscription_subscribe(user_id=35, coupon=_coupon(20))
    assert _drain().claimed == 0  # a push cannot be hidden: it waits for its due time


def test_unsubscribe_before_the_due_time_withdraws_the_staged_reminder(
    eager_celery, reminder_settings
):
    coupon = _coupon(20)
    sub = _staged(36, coupon)
    assert subscription_unsubscribe(user_id=36, coupon_id=coupon.pk) is True
    sub.refresh_from_db()
    assert sub.status == Status.CANCELLED and sub.sent_at is None
    assert not Notification.objects.filter(user_id=36).exists()
    assert _indexed() == 0
    assert _drain().claimed == 0


def test_withdrawing_one_of_a_merged_message_restages_the_others(eager_celery, reminder_settings):
    opens = timezone.now() + timedelta(seconds=20 + LEAD_S)
    coupons = [CouponFactory(claim_opens_at=opens) for _ in range(3)]
    for coupon in coupons:
        subscription_subscribe(user_id=37, coupon=coupon)
    _drain()
    merged = Notification.objects.get(user_id=37)
    assert len(merged.payload["subscriptions"]) == 3
    assert subscription_unsubscribe(user_id=37, coupon_id=coupons[0].pk) is True
    assert not Notification.objects.filter(pk=merged.pk).exists()
    assert _indexed() == 2  # the other two are scheduled and indexed again
    assert _drain().claimed == 2
    again = Notification.objects.get(user_id=37)
    assert again.visible_at == merged.visible_at
    assert sorted(c["id"] for c in again.payload["coupons"]) == sorted(c.pk for c in coupons[1:])
    statuses = ReminderSubscription.objects.filter(user_id=37).order_by("coupon_id")
    assert [s.status for s in statuses] == [Status.CANCELLED, Status.SENT, Status.SENT]


def test_a_reminder_staged_later_joins_the_hidden_message_of_its_merge_window(
    eager_celery, reminder_settings
):
    # Claimed in two rounds (the second coupon moved into the window after the first was staged),
    # the user's reminders of one merge window still make one message, as they would have at
    # the due moment without pre-staging.
    opens = timezone.now() + timedelta(seconds=20 + LEAD_S)
    first, second, third = (CouponFactory(claim_opens_at=opens) for _ in range(3))
    subscription_subscribe(user_id=36, coupon=first)
    assert _drain().claimed == 1
    alone = Notification.objects.get(user_id=36)
    assert len(alone.payload["subscriptions"]) == 1
    subscription_subscribe(user_id=36, coupon=second)
    subscription_subscribe(user_id=36, coupon=third)
    assert _drain().claimed == 2
    merged = Notification.objects.get(user_id=36)  # one row: the hidden one was folded in
    assert merged.title.startswith("3 coupons you follow open")
    assert merged.visible_at == alone.visible_at
    subs = ReminderSubscription.objects.filter(user_id=36)
    assert sorted(merged.payload["subscriptions"]) == sorted(s.pk for s in subs)
    assert sorted(c["id"] for c in merged.payload["coupons"]) == sorted(
        c.pk for c in (first, second, third)
    )
    assert {s.status for s in subs} == {Status.SENT}
    # Withdrawing one of them still finds the merged row and stages the other two again.
    assert subscription_unsubscribe(user_id=36, coupon_id=first.pk) is True
    assert not Notification.objects.filter(user_id=36).exists()
    assert _drain().claimed == 2
    assert len(Notification.objects.get(user_id=36).payload["subscriptions"]) == 2


def test_a_reminder_of_another_window_or_user_stays_a_message_of_its_own(
    eager_celery, reminder_settings
):
    opens = timezone.now() + timedelta(seconds=20 + LEAD_S)
    later = opens + timedelta(milliseconds=reminder_settings.merge_window_ms * 3)
    subscription_subscribe(user_id=40, coupon=CouponFactory(claim_opens_at=opens))
    subscription_subscribe(user_id=41, coupon=CouponFactory(claim_opens_at=opens))
    _drain()
    subscription_subscribe(user_id=40, coupon=CouponFactory(claim_opens_at=later))
    _drain()
    assert Notification.objects.filter(user_id=40).count() == 2
    assert Notification.objects.filter(user_id=41).count() == 1


def test_a_cancelled_coupon_withdraws_its_staged_reminders(eager_celery, reminder_settings):
    coupon = _coupon(20)
    for user in (38, 39):
        subscription_subscribe(user_id=user, coupon=coupon)
    _drain()
    assert Notification.objects.filter(user_id__in=(38, 39)).count() == 2
    coupon_services.coupon_cancel(coupon=coupon)
    assert not Notification.objects.filter(user_id__in=(38, 39)).exists()
    assert set(
        ReminderSubscription.objects.filter(coupon=coupon).values_list("status", flat=True)
    ) == {Status.CANCELLED}


def test_a_moved_opening_withdraws_and_moves_the_staged_reminder(eager_celery, reminder_settings):
    coupon = _coupon(20)
    sub = _staged(40, coupon)
    later = coupon.claim_opens_at + timedelta(hours=1)
    coupon_services.coupon_update(coupon=coupon, claim_opens_at=later)
    sub.refresh_from_db()
    assert sub.status == Status.SCHEDULED and sub.remind_at == later - coupon.reminder_lead
    assert not Notification.objects.filter(user_id=40).exists()
    assert _indexed() == 1
    assert _drain().claimed == 0  # an hour away now


def test_a_coupon_sold_out_before_the_due_time_withdraws_and_drops(eager_celery, reminder_settings):
    # Claims made while it was open; then the opening moves out and the reminder is staged.
    coupon = CouponFactory(total_stock=5)
    coupon_services.coupon_claim(coupon_id=coupon.pk, user_id=500)
    coupon = coupon_services.coupon_update(
        coupon=coupon, claim_opens_at=timezone.now() + timedelta(seconds=20 + LEAD_S)
    )
    sub = _staged(41, coupon)
    assert Notification.objects.filter(user_id=41).exists()
    coupon_services.coupon_update(coupon=coupon, total_stock=1)  # nothing left to claim
    sub.refresh_from_db()
    assert (sub.status, sub.drop_reason) == (Status.DROPPED, "sold_out")
    assert not Notification.objects.filter(user_id=41).exists()


def test_a_reminder_already_shown_is_not_withdrawn(eager_celery, reminder_settings):
    coupon = _coupon(-5)  # due five seconds ago: delivered visible at once
    sub = _staged(42, coupon)
    note = Notification.objects.get(user_id=42)
    assert note.visible_at <= timezone.now() and sub.sent_at <= timezone.now()
    assert subscription_unsubscribe(user_id=42, coupon_id=coupon.pk) is False
    assert Notification.objects.filter(pk=note.pk).exists()
    sub.refresh_from_db()
    assert sub.status == Status.SENT


def _locked_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0]


def _in_thread(target, out: dict, name: str) -> threading.Thread:
    def run():
        try:
            out[name] = target()
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_an_unsubscribe_racing_the_staging_delivery_still_wins(
    on_postgres, eager_celery, reminder_settings, monkeypatch
):
    """Delivery has written the hidden row and holds the subscription's lock; the unsubscribe
    waits for it, then withdraws what delivery committed: nothing is ever shown."""
    if not on_postgres:
        pytest.skip("needs PostgreSQL (row locks seen in pg_stat_activity)")
    coupon = _coupon(20)
    sub, _ = subscription_subscribe(user_id=43, coupon=coupon)
    written, release = threading.Event(), threading.Event()
    deliver = InboxGateway.deliver

    def deliver_then_wait(self, messages):
        delivered = deliver(self, messages)
        written.set()
        assert release.wait(30)
        return delivered

    monkeypatch.setattr(InboxGateway, "deliver", deliver_then_wait)
    out: dict = {}
    staging = _in_thread(_drain, out, "drain")
    assert written.wait(30)
    unsubscribing = _in_thread(
        lambda: subscription_unsubscribe(user_id=43, coupon_id=coupon.pk), out, "unsubscribed"
    )
    deadline = time.monotonic() + 30
    while _locked_waiters() < 1:  # observed: the unsubscribe is blocked on the row lock
        assert time.monotonic() < deadline, "the unsubscribe never waited for the lock"
        time.sleep(0.01)
    release.set()
    staging.join(30)
    unsubscribing.join(30)
    assert out["unsubscribed"] is True
    sub.refresh_from_db()
    assert sub.status == Status.CANCELLED
    assert not Notification.objects.filter(user_id=43).exists()
