"""Delivering a batch to the inbox, in one transaction.

Marking a reminder ``sent`` (an ``UPDATE ... WHERE status = 'scheduled' RETURNING``, which takes
the row locks) and writing its notification commit together, so redelivery, reaping and racing
Celery workers can never show a user the same reminder twice. A reminder claimed ahead of its due
time is written hidden until then (pre-staged), but only within the look-ahead window:
``staged_withdraw`` waits on exactly those rows. An entry that fired earlier than that is put
back at its row's time.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from couponcenter.core.db.row_movement import retry_if_moved
from couponcenter.core.db.times import aware_time, db_time
from reminders.gateways import Gateway
from reminders.members import member, sub_id_of
from reminders.models import ReminderSettings, ReminderSubscription
from reminders.partition_layout import subscription_layout

from .indexing import BULK_CHUNK
from .messages import EARLY_TOLERANCE_S, Item, bucket, drop_hopeless, merge
from .push_cap import push_cap_apply
from .settling import Report
from .staging import hidden_reminder_notes, notifications_delete

Status = ReminderSubscription.Status
TABLE = ReminderSubscription._meta.db_table
# The scheduled rows among the batch's, in a form that matches no partial index (see below);
# ``status IN`` the live statuses keeps the statement to the live partition (PostgreSQL).
LIVE = subscription_layout().values(subscription_layout().live)
STILL_SCHEDULED = f"status IN ({LIVE}) AND (status || '') = %s"


def reminders_deliver_inbox(gateway: Gateway, members: list[str], live: ReminderSettings) -> Report:
    member_of = {sub_id_of(m): m for m in members}
    sub_ids = list(member_of)
    now = timezone.now()
    report = Report()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # A session that died holding these rows (idle in transaction) must make this task
            # fail and be retried, not wait forever; see README, idle_in_transaction.
            with connection.cursor() as cursor:
                timeout_ms = int(settings.DELIVERY_LOCK_TIMEOUT_MS)
                cursor.execute(f"SET LOCAL lock_timeout = '{timeout_ms}ms'")
        if live.late_policy == ReminderSettings.LatePolicy.DROP:
            cutoff = now - live.late_limit
            late = _claim_rows(
                f"{STILL_SCHEDULED} AND remind_at < %s",
                [Status.SCHEDULED, db_time(cutoff)],
                sub_ids,
                "status = %s, drop_reason = %s, updated_at = %s",
                [Status.DROPPED, "late", db_time(now)],
            )
            report.dropped = len(late)
        # A reminder claimed ahead of its due time (pre-staged) is "sent" for showing then, but
        # only within the look-ahead window: ``staged_withdraw`` waits only on rows due within
        # it, so a row staged further ahead could slip past an unsubscribe racing this
        # transaction and show anyway. An entry that fired earlier than that is put back.
        horizon = now + timedelta(milliseconds=live.prestage_ms, seconds=EARLY_TOLERANCE_S)
        rows = _claim_rows(
            f"{STILL_SCHEDULED} AND remind_at <= %s",
            [Status.SCHEDULED, db_time(horizon)],
            sub_ids,
            "status = %s, sent_at = CASE WHEN remind_at > %s THEN remind_at ELSE %s END, "
            "updated_at = %s",
            [Status.SENT, *[db_time(now)] * 3],
        )
        items = [
            Item(member_of[pk], pk, user, aware_time(at), coupon, trace)
            for pk, user, at, coupon, trace in rows
        ]
        if len(rows) < len(sub_ids):
            report.early = _early_items(member_of, {row[0] for row in rows}, horizon)
        items, hopeless = drop_hopeless(items, now, marked=Status.SENT)
        report.dropped += hopeless
        staged = _unstage_mates(items, now, live.merge_window_ms)
        groups = merge(items + staged, live.merge_window_ms)
        for group in groups:
            # The message's due moment, the same on every delivery of it: shown from then on (a
            # staged one not before), and the inbox ledger's partition key
            # (services.notification_partitions).
            group.message.visible_at = min(item.remind_at for item in group.items)
        if groups:
            messages = [g.message for g in groups]
            cap = push_cap_apply(messages, live, now)
            report.capped, report.digested = cap.capped, cap.digested
            gateway.deliver(messages)
    report.delivered = items
    return report


def _claim_rows(sql_where: str, params: list, sub_ids: list[int], sets: str, set_params: list):
    """``UPDATE ... SET <sets> WHERE <sql_where> AND id IN (...) RETURNING`` the rows it changed.

    By the primary key whatever the table's statistics say. With statistics taken while few
    reminders were scheduled (a quiet night, then a flood of subscriptions before autovacuum
    analyses the table), PostgreSQL plans ``status = 'scheduled' AND id IN (...)`` on the
    partial index of scheduled rows and walks all of them for every batch, where a lookup by key
    reads only the batch's rows. ``sql_where`` tests the status as ``STILL_SCHEDULED``, which no
    partial index matches, and sequential scans are off for these statements alone, so the
    primary key is the only way in."""
    rows = []
    postgres = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        if postgres:
            cursor.execute("SET LOCAL enable_seqscan = off")
        for start in range(0, len(sub_ids), 5000):
            chunk = sub_ids[start : start + 5000]
            sql = (
                f"UPDATE {TABLE} SET {sets} WHERE {sql_where} "
                f"AND id IN ({','.join(['%s'] * len(chunk))}) "
                "RETURNING id, user_id, remind_at, coupon_id, traceparent"
            )

            def claim(sql=sql, chunk=chunk) -> list[tuple]:
                cursor.execute(sql, [*set_params, *params, *chunk])
                return cursor.fetchall()

            rows += retry_if_moved(claim)
        if postgres:
            cursor.execute("SET LOCAL enable_seqscan TO DEFAULT")
    return rows


def _early_items(member_of: dict[int, str], claimed: set[int], horizon: datetime) -> list[Item]:
    """The batch's rows still ``scheduled`` and due after ``horizon``: their entries fired
    early (a stale copy, or one indexed before its coupon moved)."""
    rest = [pk for pk in member_of if pk not in claimed]
    rows = ReminderSubscription.objects.filter(
        pk__in=rest, status=Status.SCHEDULED, remind_at__gt=horizon
    ).values_list("pk", "user_id", "remind_at", "coupon_id", "traceparent")
    return [Item(member_of[pk], pk, *row) for pk, *row in rows]


def _unstage_mates(items: list[Item], now: datetime, window_ms: int) -> list[Item]:
    """Reminders already staged, hidden, in the same users' merge windows as ``items``: their
    notifications are deleted and their items returned, to be merged again with ``items``.

    Staging claims what enters the look-ahead window, so a user's reminders of one merge window
    can be claimed in different rounds (a second coupon moved into the window later). Folded
    into one message, they read as they would have without pre-staging. The mates' rows are
    locked first, as ``staged_withdraw`` locks them: a withdrawal either ran before (the mate is
    ``scheduled`` again and left out here) or waits for this delivery and then finds the
    merged row.
    """
    window = max(window_ms, 1)
    buckets = {(item.user_id, bucket(item.remind_at, window)) for item in items}
    users = sorted({user for user, _ in buckets})
    notes, mates = [], set()
    for pk, user, visible_at, subs in hidden_reminder_notes(users, now):
        if (user, bucket(visible_at, window)) in buckets:
            notes.append(pk)
            mates |= subs
    if not notes:
        return []
    kept: list[tuple] = []
    ids = sorted(mates)
    for start in range(0, len(ids), BULK_CHUNK):
        mates = (
            ReminderSubscription.objects.select_for_update()
            .filter(pk__in=ids[start : start + BULK_CHUNK], status=Status.SENT, sent_at__gt=now)
            .order_by("pk")
            .values_list("pk", "user_id", "remind_at", "coupon_id", "traceparent")
        )
        kept += retry_if_moved(functools.partial(list, mates))
    notifications_delete(notes)
    return [
        Item(member(pk), pk, user, remind_at, coupon, trace)
        for pk, user, remind_at, coupon, trace in kept
    ]
