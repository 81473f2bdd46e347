"""Delivering a batch through an external gateway (webhook, log): deliver, then mark ``sent``.

The gateway cannot share the database's transaction, so the message's ``dedup_key`` (the sorted
subscription ids) is its ``Idempotency-Key``: a crash between the POST and marking ``sent`` is
absorbed by the receiver. Only the failed messages are retried. An entry whose row is due later
than the clock says fired early and is put back, never sent ahead of time.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from couponcenter.core.db.row_movement import retry_if_moved
from reminders.gateways import Gateway
from reminders.members import sub_id_of
from reminders.models import ReminderSettings, ReminderSubscription

from .messages import EARLY_TOLERANCE_S, Item, drop_hopeless, merge
from .settling import Report

Status = ReminderSubscription.Status


def reminders_deliver_external(
    gateway: Gateway, members: list[str], attempts: dict[str, int], live: ReminderSettings
) -> Report:
    member_of = {sub_id_of(m): m for m in members}
    now = timezone.now()
    late = live.late_limit if live.late_policy == ReminderSettings.LatePolicy.DROP else None
    not_before = now + timedelta(seconds=EARLY_TOLERANCE_S)
    report, items, too_late = Report(), [], []
    rows = ReminderSubscription.objects.filter(
        pk__in=member_of, status=Status.SCHEDULED
    ).values_list("pk", "user_id", "remind_at", "coupon_id", "traceparent")
    for pk, user_id, remind_at, coupon_id, trace in rows:
        item = Item(member_of[pk], pk, user_id, remind_at, coupon_id, trace)
        if late is not None and now - remind_at > late:
            too_late.append(pk)
        elif remind_at > not_before:
            report.early.append(item)
        else:
            items.append(item)
    if too_late:
        late_rows = ReminderSubscription.objects.filter(pk__in=too_late, status=Status.SCHEDULED)
        report.dropped = retry_if_moved(
            lambda: late_rows.update(
                status=Status.DROPPED, drop_reason="late", updated_at=timezone.now()
            )
        )
    items, hopeless = drop_hopeless(items, now, marked=Status.SCHEDULED)
    report.dropped += hopeless
    groups = merge(items, live.merge_window_ms)
    results = gateway.deliver([g.message for g in groups]) if groups else []
    for group, result in zip(groups, results, strict=True):
        if result.ok:
            report.delivered += group.items
            continue
        report.failed += [(item.member, result.error) for item in group.items]
        report.failed_items += group.items
        if max(attempts.get(item.member, 1) for item in group.items) >= live.max_attempts:
            report.dead += [item.sub_id for item in group.items]
    if report.delivered:
        sent = ReminderSubscription.objects.filter(
            pk__in=[item.sub_id for item in report.delivered], status=Status.SCHEDULED
        )
        sent_at = timezone.now()
        retry_if_moved(lambda: sent.update(status=Status.SENT, sent_at=sent_at, updated_at=sent_at))
    return report
