"""Behaviours the README and docs/ promise, each with a test of its own (issue 13, item 12):
the PostgreSQL schema's invariants, the demo admin command, delivery backpressure, the "drop"
late policy, and the delivery's lock timeout. Real PostgreSQL, real Redis."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from couponcenter.core.redis import broker_client
from couponcenter.coupons.models import UserCoupon
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC, member
from reminders.models import Notification, ReminderSubscription
from reminders.runtime.worker import build_worker
from reminders.services import subscription_subscribe
from reminders.services.delivery import reminders_deliver
from tests.support.factories import CouponFactory

Status = ReminderSubscription.Status
LEAD_S = 60  # the factory's coupons remind a minute before they open


def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the production schema is PostgreSQL's")


# --- the schema -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_user_coupon_table_keeps_room_for_hot_updates_and_no_status_index():
    _postgres_only()
    table = UserCoupon._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [table])
        options = cursor.fetchone()[0] or []
        assert "fillfactor=50" in options
        # Vacuumed once 2 % of it is dead, so what the retention deletes is reused (0008).
        assert "autovacuum_vacuum_scale_factor=0.02" in options
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        indexes = dict(cursor.fetchall())
    assert indexes, "the table has indexes"
    # Not in a key nor in a partial condition: a status change must stay a HOT update.
    assert not [name for name, ddl in indexes.items() if "status" in ddl], indexes


@pytest.mark.django_db
def test_the_sweeper_reads_pending_tasks_through_a_partial_index():
    _postgres_only()
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'expirytask_pending_due'")
        ddl = cursor.fetchone()[0]
    assert "(expire_at, id)" in ddl and "WHERE" in ddl and "'pending'" in ddl, ddl


# The demo admin (made once, its password kept, reset on request):
# tests/couponcenter/test_demo_admin.py


# --- backpressure ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_no_reminder_is_claimed_while_the_delivery_queue_is_at_its_limit(
    reminder_settings, settings
):
    settings.DELIVERY_QUEUE = f"backpressure-{uuid.uuid4().hex[:8]}"  # nobody else consumes it
    reminder_settings.change(max_delivery_queue=2, prestage_ms=0)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=LEAD_S - 1))
    subscription_subscribe(user_id=51, coupon=coupon)
    client = broker_client()
    queue_key = settings.DELIVERY_QUEUE
    client.rpush(queue_key, "waiting-1", "waiting-2")  # two batches nobody consumes yet
    worker = build_worker([REMINDER_TOPIC])
    try:
        assert worker.run_once().claimed == 0
        assert ReminderSubscription.objects.get(user_id=51).status == Status.SCHEDULED
        client.lpop(queue_key)  # one consumed: room again
        worker.may_claim._checked = float("-inf")  # read the depth on the next tick
        assert worker.run_once().claimed == 1
    finally:
        worker.shutdown()
        client.delete(queue_key)


# --- the "drop" late policy -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_drop_policy_drops_what_is_later_than_the_limit_and_delivers_the_rest(
    reminder_settings, eager_celery
):
    reminder_settings.change(late_policy="drop", late_limit=timedelta(minutes=5), prestage_ms=0)
    opens = timezone.now() + timedelta(minutes=2)
    late, _ = subscription_subscribe(user_id=52, coupon=CouponFactory(claim_opens_at=opens))
    recent, _ = subscription_subscribe(user_id=53, coupon=CouponFactory(claim_opens_at=opens))
    # As after a long outage: one reminder is 10 minutes overdue, the other 1 minute.
    for sub, overdue in ((late, timedelta(minutes=10)), (recent, timedelta(minutes=1))):
        due = timezone.now() - overdue
        ReminderSubscription.objects.filter(pk=sub.pk).update(remind_at=due)
        queue.schedule(REMINDER_TOPIC, member(sub.pk),
                       epoch_ms(due), slot=sub.slot)  # fmt: skip
    worker = build_worker([REMINDER_TOPIC])
    try:
        worker.run_until_idle()
    finally:
        worker.shutdown()
    late.refresh_from_db()
    recent.refresh_from_db()
    assert (late.status, late.drop_reason) == (Status.DROPPED, "late")
    assert recent.status == Status.SENT
    assert not Notification.objects.filter(user_id=52).exists()
    assert Notification.objects.filter(user_id=53).count() == 1


# --- the delivery's lock timeout ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_delivery_waiting_on_a_held_row_fails_after_the_lock_timeout_and_is_retried(
    reminder_settings, settings
):
    _postgres_only()
    settings.DELIVERY_LOCK_TIMEOUT_MS = 300
    reminder_settings.change(prestage_ms=0)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=LEAD_S - 1))
    sub, _ = subscription_subscribe(user_id=54, coupon=coupon)
    locked, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:  # a session that died holding the row: idle in transaction
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute(f"SELECT 1 FROM {ReminderSubscription._meta.db_table} "
                               "WHERE id = %s FOR UPDATE", [sub.pk])  # fmt: skip
                locked.set()
                release.wait(30)
                cursor.execute("ROLLBACK")
        finally:
            other.close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(30)
        member = f"{sub.pk}:54:{coupon.pk}"
        report = reminders_deliver({"topic": REMINDER_TOPIC, "parts": [[sub.slot, [member]]]})
    finally:
        release.set()
        holder.join(30)
    assert report["failed"] == 1 and report["delivered"] == 0
    sub.refresh_from_db()
    assert sub.status == Status.SCHEDULED  # nothing written: it is retried, not lost
    assert not Notification.objects.filter(user_id=54).exists()
