"""What delivery decides from the row, now that the dispatcher hands entries on unread: a coupon
that can no longer help drops its reminders however late it changed; nothing goes out before its
row's time; members of earlier releases are delivered like today's."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.coupons import services as coupon_services
from couponcenter.coupons.models import Coupon
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.scripts import Parcel
from reminders.members import REMINDER_TOPIC, legacy_member, member
from reminders.models import Notification, ReminderSubscription
from reminders.runtime.worker import build_worker
from reminders.services import subscription_subscribe
from reminders.services.delivery import reminders_deliver
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db(transaction=True)
Status = ReminderSubscription.Status


def _claim(slot: int = 0, ahead_ms: int = 60_000) -> Parcel:
    """Claim what is due as the worker does (after moving it into store from later): one
    parcel."""
    until = epoch_ms() + ahead_ms
    queue.promote(REMINDER_TOPIC, {slot: queue.HANDED_TOKEN}, until_ms=until)
    return queue.claim_parcel(REMINDER_TOPIC, slot, now_ms=epoch_ms() + ahead_ms,
                              limit=100, visibility_ms=60_000,
                              lease_token=queue.HANDED_TOKEN)  # fmt: skip


def _batch(parcel: Parcel) -> dict:
    """The Celery batch the worker publishes for ``parcel``."""
    return {"topic": REMINDER_TOPIC, "parcels": [[parcel.slot, parcel.parcel_id, parcel.members]]}


def _slot_sizes(slot: int = 0) -> tuple[int, int, int]:
    (stats,) = queue.stats(REMINDER_TOPIC, [slot], now_ms=epoch_ms())
    return stats.store, stats.prepare, stats.dead


def _drain():
    worker = build_worker([REMINDER_TOPIC])
    try:
        return worker.run_until_idle()
    finally:
        worker.shutdown()


@pytest.mark.parametrize("gateway", ["inbox", "log"])
def test_a_coupon_sold_out_after_the_hand_off_drops_its_reminders(reminder_settings, gateway):
    reminder_settings.change(slots=1, gateway=gateway)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=30), total_stock=5)
    subs = [subscription_subscribe(user_id=u, coupon=coupon)[0] for u in (1, 2, 3)]
    parcel = _claim()
    assert sorted(parcel.job_ids()) == sorted(member(s.pk) for s in subs)
    Coupon.objects.filter(pk=coupon.pk).update(claimed_count=5)  # sold out while in flight

    result = reminders_deliver(_batch(parcel))

    assert (result["delivered"], result["dropped"]) == (0, 3)
    rows = ReminderSubscription.objects.filter(coupon=coupon)
    assert {(r.status, r.drop_reason, r.sent_at) for r in rows} == {
        (Status.DROPPED, "sold_out", None)
    }
    assert not Notification.objects.exists()
    assert _slot_sizes() == (0, 0, 0)  # settled: nothing left for the reaper


def test_a_batch_delivers_the_live_coupons_and_drops_the_cancelled_ones(reminder_settings):
    reminder_settings.change(slots=1)
    opens = timezone.now() + timedelta(seconds=30)
    live, doomed = CouponFactory(claim_opens_at=opens), CouponFactory(claim_opens_at=opens)
    kept, _ = subscription_subscribe(user_id=1, coupon=live)
    lost, _ = subscription_subscribe(user_id=2, coupon=doomed)
    parcel = _claim()
    Coupon.objects.filter(pk=doomed.pk).update(status=Coupon.Status.CANCELLED)

    result = reminders_deliver(_batch(parcel))

    assert (result["delivered"], result["dropped"]) == (1, 1)
    kept.refresh_from_db(), lost.refresh_from_db()
    assert kept.status == Status.SENT
    assert (lost.status, lost.drop_reason) == (Status.DROPPED, "cancelled")
    assert list(Notification.objects.values_list("user_id", flat=True)) == [1]


@pytest.mark.parametrize("gateway", ["log", "inbox"])
def test_an_entry_that_fires_before_its_row_is_due_is_put_back_not_sent(reminder_settings, gateway):
    """External gateways send at once, so an entry that fires ahead of its row (one indexed by
    an earlier release before its coupon moved, or any stale copy) must not send. The inbox
    must not stage it either: an unsubscribe waits only on rows due within the look-ahead
    window, so a row staged an hour ahead could show after the user said no."""
    reminder_settings.change(slots=1, gateway=gateway, prestage_ms=30_000)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1))
    sub, _ = subscription_subscribe(user_id=4, coupon=coupon)
    parcel = _claim(ahead_ms=2 * 3_600_000)  # as if its due time had come
    assert parcel.job_ids() == [member(sub.pk)]

    result = reminders_deliver(_batch(parcel))

    assert result["delivered"] == 0
    sub.refresh_from_db()
    assert sub.status == Status.SCHEDULED
    assert not Notification.objects.filter(user_id=4).exists()
    back = queue.place(REMINDER_TOPIC, 0, member(sub.pk))
    assert back == queue.Place("scheduled", epoch_ms(sub.remind_at))
    assert _slot_sizes() == (1, 0, 0)


def test_an_entry_within_the_look_ahead_window_is_staged_hidden(reminder_settings):
    reminder_settings.change(slots=1, prestage_ms=30_000)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=80))
    sub, _ = subscription_subscribe(user_id=6, coupon=coupon)
    parcel = _claim(ahead_ms=60_000)
    assert parcel.job_ids() == [member(sub.pk)]

    assert reminders_deliver(_batch(parcel))["delivered"] == 1

    sub.refresh_from_db()
    (note,) = Notification.objects.filter(user_id=6)
    assert sub.status == Status.SENT
    assert note.visible_at == sub.remind_at > timezone.now()
    assert _slot_sizes() == (0, 0, 0)


def test_a_member_of_an_earlier_release_is_delivered_once(eager_celery, reminder_settings):
    reminder_settings.change(slots=1)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=30))
    sub, _ = subscription_subscribe(user_id=9, coupon=coupon)
    old = legacy_member(sub.pk, 9, coupon.pk)
    queue.cancel(REMINDER_TOPIC, member(sub.pk), slot=0)
    queue.schedule(REMINDER_TOPIC, old, epoch_ms(sub.remind_at), slot=0)

    # The worker's first start may index today's member beside it (an upgrade's rebuild does):
    # the row lets only one of them through.
    assert _drain().claimed >= 1

    assert Notification.objects.filter(user_id=9).count() == 1
    sub.refresh_from_db()
    assert sub.status == Status.SENT
    assert _slot_sizes() == (0, 0, 0)


def test_an_old_entry_left_behind_by_a_moved_coupon_waits_for_the_new_time(
    eager_celery, reminder_settings
):
    """An earlier release's entry stays at the old time when the coupon moves (the move indexes
    today's member): when it fires, delivery finds the row due two hours later and puts today's
    member back at that time; nothing reaches the inbox before then."""
    reminder_settings.change(slots=1, prestage_ms=0)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=30))
    sub, _ = subscription_subscribe(user_id=5, coupon=coupon)
    old_due = epoch_ms(sub.remind_at)
    old = legacy_member(sub.pk, 5, coupon.pk)
    queue.schedule(REMINDER_TOPIC, old, old_due, slot=0)
    coupon_services.coupon_update(coupon=coupon, claim_opens_at=coupon.claim_opens_at
                                  + timedelta(hours=2))  # fmt: skip
    sub.refresh_from_db()

    assert _drain().claimed == 1  # the old entry only: today's is two hours away

    assert not Notification.objects.filter(user_id=5).exists()
    sub.refresh_from_db()
    assert sub.status == Status.SCHEDULED
    assert queue.place(REMINDER_TOPIC, 0, old) == queue.Place("absent", None)
    today = queue.place(REMINDER_TOPIC, 0, member(sub.pk))
    assert today == queue.Place("scheduled", epoch_ms(sub.remind_at))


def test_an_entry_that_names_no_subscription_fails_alone(reminder_settings):
    """A stray entry (written by hand, or by a release that spelled members otherwise) must not
    fail the reminders claimed with it: they are delivered, it is retried and then dead."""
    reminder_settings.change(slots=1, max_attempts=2)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=30))
    sub, _ = subscription_subscribe(user_id=7, coupon=coupon)
    queue.schedule(REMINDER_TOPIC, "#12", epoch_ms(sub.remind_at), slot=0)

    for attempt in (1, 2):
        parcel = _claim(ahead_ms=3_600_000)
        assert "#12" in parcel.job_ids()
        result = reminders_deliver(_batch(parcel))
        assert result["failed"] == 1
        assert result["delivered"] == (1 if attempt == 1 else 0)

    assert Notification.objects.filter(user_id=7).count() == 1
    sub.refresh_from_db()
    assert sub.status == Status.SENT
    assert _slot_sizes() == (0, 0, 1)  # the stray is dead, where the console lists it
    assert queue.place(REMINDER_TOPIC, 0, "#12").where == "dead"
