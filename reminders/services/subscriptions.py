"""Coupon reminder subscriptions (docs/reminders.md) on the engine's ``coupon.reminder`` topic.

Invariants:
- one subscription per (user, coupon); subscribing twice is a no-op. On PostgreSQL the unique
  index covers the live rows (scheduled, failed: reminders/partition_layout.py); a finished one
  is found first and scheduled afresh, never doubled by a new row;
- ``remind_at = coupon.claim_opens_at - coupon.reminder_lead``;
- the row commits first and is indexed in Redis on commit; the entry's member is the
  subscription id (``members.member``) in slot ``crc32(user_id) & (slots - 1)``, and the
  slot is stored on the row so a cancel finds the entry
  after the slot count changed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Case, IntegerField, Value, When
from django.utils import timezone

from couponcenter.core import tracing
from couponcenter.core.db.row_movement import retry_if_moved
from couponcenter.core.errors import BusinessError
from couponcenter.coupons import rules
from couponcenter.coupons.models import Coupon
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.keys import slot_for
from reminders.members import member, reminder_topic_for
from reminders.models import ReminderSubscription
from reminders.selectors import reminder_settings_get

from .indexing import (
    BULK_CHUNK,
    by_topic,
    index_on_commit,
    layouts_record_on_commit,
    rebuild_rows,
    unindex_on_commit,
)
from .staging import staged_withdraw

Status = ReminderSubscription.Status


class SubscribeRefused(BusinessError):
    """Codes: ``cancelled``, ``closed``, ``already_open``."""


def remind_at_for(coupon: Coupon) -> datetime:
    return coupon.claim_opens_at - coupon.reminder_lead


def _refusal(coupon: Coupon, now: datetime) -> str | None:
    return rules.subscribe_refusal(now=now, **rules.fields_of(coupon))


def subscription_subscribe(
    *, user_id: int, coupon: Coupon, now: datetime | None = None
) -> tuple[ReminderSubscription, bool]:
    """Subscribe ``user_id`` to ``coupon``'s reminder; returns (subscription, created)."""
    refusal = _refusal(coupon, now or timezone.now())
    if refusal:
        raise SubscribeRefused(refusal)
    slots = reminder_settings_get().slots
    with transaction.atomic():
        sub = _subscription_locked(user_id, coupon)
        created = sub is None
        if sub is None:
            try:
                with transaction.atomic():
                    sub = ReminderSubscription.objects.create(
                        user_id=user_id,
                        coupon=coupon,
                        remind_at=remind_at_for(coupon),
                        slot=slot_for(user_id, slots),
                        priority=coupon.reminder_priority,
                        traceparent=tracing.current_traceparent(),
                    )
            except IntegrityError:  # a concurrent subscribe made it first: as if it were here
                sub = _subscription_locked(user_id, coupon)
                if sub is None:
                    raise
                created = False
        if not created and sub.status in (Status.SCHEDULED, Status.SENT):
            return sub, False  # pending, or the user was reminded already: a no-op
        if sub.status == Status.FAILED:  # its entry is dead in its old slot (and topic)
            unindex_on_commit([(sub.pk, sub.slot, sub.priority)])
        if not created:  # unsubscribed, dropped or failed before: schedule afresh
            sub.status, sub.remind_at = Status.SCHEDULED, remind_at_for(coupon)
            sub.slot, sub.drop_reason, sub.sent_at = slot_for(user_id, slots), "", None
            sub.priority = coupon.reminder_priority
            sub.traceparent = tracing.current_traceparent()
            sub.save()
        layouts_record_on_commit(slots)
        index_on_commit([sub])
    return sub, True


def _subscription_locked(user_id: int, coupon: Coupon) -> ReminderSubscription | None:
    """The (user, coupon) subscription, row-locked: the live one (at most one, by the unique
    index), else the latest finished one (a second exists only if a subscribe raced a cancel)."""
    rows = (
        ReminderSubscription.objects.select_for_update()
        .filter(user_id=user_id, coupon=coupon)
        .order_by(
            Case(
                When(status__in=(Status.SCHEDULED, Status.FAILED), then=Value(0)),
                default=Value(1),
                output_field=IntegerField(),
            ),
            "-pk",
        )
    )
    return retry_if_moved(rows.first)


def subscription_unsubscribe(*, user_id: int, coupon_id: int) -> bool:
    """Cancel a user's reminder; idempotent. True if a scheduled (or staged, still hidden)
    reminder was cancelled."""
    with transaction.atomic():
        staged_withdraw(
            subscriptions=ReminderSubscription.objects.filter(user_id=user_id, coupon_id=coupon_id)
        )  # takes the row lock, waiting for a delivery staging it right now
        sub = retry_if_moved(
            ReminderSubscription.objects.select_for_update()
            .filter(user_id=user_id, coupon_id=coupon_id, status=Status.SCHEDULED)
            .first
        )
        if sub is None:
            return False
        sub.status = Status.CANCELLED
        sub.save(update_fields=["status", "updated_at"])
        unindex_on_commit([(sub.pk, sub.slot, sub.priority)])
    return True


def subscriptions_reschedule_for_coupon(*, coupon: Coupon) -> int:
    """The coupon's opening time moved: move every scheduled reminder (bulk, in batches), and
    the staged ones not shown yet."""
    staged_withdraw(subscriptions=ReminderSubscription.objects.filter(coupon=coupon))
    remind_at = remind_at_for(coupon)
    scheduled = ReminderSubscription.objects.filter(coupon=coupon, status=Status.SCHEDULED)
    moved = retry_if_moved(lambda: scheduled.update(remind_at=remind_at, updated_at=timezone.now()))
    rows = scheduled.values_list("pk", "user_id", "slot", "priority").order_by("pk")
    due_ms = epoch_ms(remind_at)

    def reschedule() -> None:
        for chunk in _chunks(rows.iterator(chunk_size=BULK_CHUNK), BULK_CHUNK):
            grouped = by_topic(
                chunk,
                lambda r: (reminder_topic_for(r[3]), (member(r[0]), due_ms, r[2])),
            )
            for topic, items in grouped.items():
                queue.schedule_many(topic, items)

    transaction.on_commit(reschedule)
    return moved


def subscriptions_cancel_for_coupon(*, coupon: Coupon) -> int:
    """The coupon was cancelled: cancel its scheduled reminders, and the staged ones not shown
    yet."""
    staged_withdraw(subscriptions=ReminderSubscription.objects.filter(coupon=coupon))
    scheduled = ReminderSubscription.objects.filter(coupon=coupon, status=Status.SCHEDULED)

    def cancel() -> tuple[list, int]:
        rows = list(scheduled.values_list("pk", "slot", "priority"))
        return rows, scheduled.update(status=Status.CANCELLED, updated_at=timezone.now())

    rows, cancelled = retry_if_moved(cancel)
    unindex_on_commit(rows)
    return cancelled


def subscriptions_drop_for_coupon(*, coupon: Coupon, reason: str) -> int:
    """The coupon can no longer be claimed (sold out, window closed): drop its staged
    reminders not shown yet. Scheduled ones are dropped when they fall due (delivery checks the
    coupon then)."""
    withdrawn = staged_withdraw(subscriptions=ReminderSubscription.objects.filter(coupon=coupon))
    if withdrawn:
        staged = ReminderSubscription.objects.filter(pk__in=withdrawn)
        retry_if_moved(
            lambda: staged.update(
                status=Status.DROPPED, drop_reason=reason, updated_at=timezone.now()
            )
        )
    return len(withdrawn)


def subscriptions_rebuild(
    *, due_before: datetime | None = None, progress: Callable[[int], None] | None = None
) -> int:
    """Re-index scheduled reminders (all, or due before ``due_before``); idempotent (NX).

    A reminder in flight in a parcel is left out: NX sees store, prepare and dead, not inside a
    parcel (the engine keeps a parcel's ids as one string), and re-adding one would deliver it a
    second time for nothing. A slot's parcels are read for each chunk, after its rows: a rebuild
    of millions runs for minutes, and what was claimed meanwhile must be left out too."""
    scheduled = ReminderSubscription.objects.filter(status=Status.SCHEDULED)
    if due_before is not None:
        scheduled = scheduled.filter(remind_at__lt=due_before)
    return rebuild_rows(
        scheduled,
        ("remind_at", "slot", "priority"),
        lambda r: (reminder_topic_for(r[3]), (member(r[0]), epoch_ms(r[1]), r[2])),
        in_flight=queue.in_parcels,
        progress=progress,
    )


def _chunks(iterable, size: int):
    chunk = []
    for item in iterable:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
