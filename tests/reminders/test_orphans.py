"""Entries left in Redis for rows that are final (the subscribe/unsubscribe on-commit race): the
worker's reconcile removes them, leaves live and freshly changed rows alone, and counts them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from reminders import metrics
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC, member
from reminders.models import ReminderSubscription, TimeoutJob
from reminders.runtime.worker import Reconciler
from reminders.services import (
    subscription_subscribe,
    subscription_unsubscribe,
    timeout_job_cancel,
    timeout_job_create,
)
from reminders.services.orphans import QUIET_S, queues_prune_orphans
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "timeout.default"


def _indexed(topic: str, slot: int, job_id: str) -> bool:
    return job_id in queue.due_before(topic, slot, before_ms=2**52, limit=10_000)


def _orphaned_subscription(user_id: int, coupon) -> tuple[ReminderSubscription, str]:
    """Subscribe, unsubscribe, then the subscribe's late on-commit index lands after all."""
    sub, _ = subscription_subscribe(user_id=user_id, coupon=coupon)
    assert subscription_unsubscribe(user_id=user_id, coupon_id=coupon.pk)
    entry = member(sub.pk)
    queue.schedule(REMINDER_TOPIC, entry, epoch_ms(sub.remind_at), slot=sub.slot)
    return sub, entry


def _age(model, pk, field: str) -> None:
    model.objects.filter(pk=pk).update(**{field: timezone.now() - timedelta(seconds=QUIET_S + 5)})


def test_an_entry_for_a_cancelled_subscription_is_removed(reminder_settings):
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(minutes=10))
    sub, entry = _orphaned_subscription(61, coupon)
    live, _ = subscription_subscribe(user_id=62, coupon=coupon)
    _age(ReminderSubscription, sub.pk, "updated_at")
    _age(ReminderSubscription, live.pk, "updated_at")
    removed = queues_prune_orphans(due_before=timezone.now() + timedelta(hours=1))
    assert removed == {REMINDER_TOPIC: 1}
    assert not _indexed(REMINDER_TOPIC, sub.slot, entry)
    assert _indexed(REMINDER_TOPIC, live.slot, member(live.pk))  # live: kept


def test_a_freshly_changed_row_is_left_alone(reminder_settings):
    """Within QUIET_S a re-subscribe may be about to index it again: not touched."""
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(minutes=10))
    sub, entry = _orphaned_subscription(63, coupon)
    assert queues_prune_orphans(due_before=timezone.now() + timedelta(hours=1)) == {}
    assert _indexed(REMINDER_TOPIC, sub.slot, entry)


def test_entries_beyond_the_window_wait_for_a_later_pass(reminder_settings):
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=5))
    sub, entry = _orphaned_subscription(64, coupon)
    _age(ReminderSubscription, sub.pk, "updated_at")
    assert queues_prune_orphans(due_before=timezone.now() + timedelta(hours=1)) == {}
    assert _indexed(REMINDER_TOPIC, sub.slot, entry)


def test_a_cancelled_timeout_job_entry_is_removed_and_counted(reminder_settings):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="O-1",
                             action_time=timezone.now() + timedelta(minutes=5))  # fmt: skip
    timeout_job_cancel(job=job)
    queue.schedule(TOPIC, str(job.pk), epoch_ms(job.action_time), slot=job.slot)
    _age(TimeoutJob, job.pk, "gmt_modified")
    reconcile = Reconciler(every_s=0, window_s=3600)
    reconcile()  # the first pass is the full rebuild (no epoch marker yet)
    reconcile()
    assert not _indexed(TOPIC, job.slot, str(job.pk))
    assert metrics.totals(TOPIC, minutes=5)["orphaned"] == 1
