"""The per-user push cap (docs/reminders.md, Push cap).

``ReminderSettings.push_cap_per_day`` = N: in any rolling 24 hours a user gets at most N pushed
notifications. A reminder over the cap still lands in the inbox, unpushed (``push = false``);
with the ``digest`` policy it is also ``held``, and the user's next allowed push carries it
(``payload["digest"]``, "... and 2 more coupons you follow"), which releases it.

Exactly once and exact under concurrency: the count and the decision happen in the inbox write's
own transaction, after a transaction-scoped advisory lock per user (PostgreSQL; taken in one
order, so two deliveries cannot deadlock), so two Celery processes delivering to one user
decide one after the other. SQLite serializes writers anyway: the delivery's first statement
(claiming the subscriptions) already holds its write lock. One query for the locks, one for the
counts, one for the held rows per batch: no round trip per reminder.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count

from reminders.gateways import Message
from reminders.models import Notification, ReminderSettings

DAY = timedelta(hours=24)
LOCK_CLASS = 7_321  # advisory lock namespace of the push cap (first key of the two-key form)
DIGEST_MAX = 50  # held notifications one push carries at most (the rest wait for the next)


@dataclass
class CapReport:
    capped: int = 0  # messages over the cap: inbox only
    digested: int = 0  # held notifications folded into a push


def push_cap_apply(messages: list[Message], live: ReminderSettings, now: datetime) -> CapReport:
    """Decide ``push`` / ``held`` on ``messages`` (not yet written) inside the caller's
    transaction, and fold held notifications into the pushes allowed."""
    cap = live.push_cap_per_day
    report = CapReport()
    if not cap or not messages:
        return report
    users = sorted({m.user_id for m in messages})
    _lock_users(users)
    pushed = _pushed_since(users, now - DAY)
    digest = live.over_cap == ReminderSettings.OverCap.DIGEST
    allowed_users: set[int] = set()
    for message in sorted(messages, key=lambda m: (m.visible_at or now, m.dedup_key)):
        if pushed.get(message.user_id, 0) < cap:
            pushed[message.user_id] = pushed.get(message.user_id, 0) + 1
            allowed_users.add(message.user_id)
            continue
        message.push, message.held = False, digest
        report.capped += 1
    if digest and allowed_users:
        report.digested = _fold_held([m for m in messages if m.push and m.user_id in allowed_users])
    return report


def _lock_users(users: list[int]) -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, k) FROM (SELECT DISTINCT hashtext('push:' || u) AS k"
            " FROM unnest(%s::bigint[]) AS u ORDER BY 1) AS keys",
            [LOCK_CLASS, users],
        )


def _pushed_since(users: list[int], since: datetime) -> dict[int, int]:
    """Per user: pushed notifications shown after ``since`` (staged ones due later included:
    they are pushes of this rolling day too). One grouped query per 5,000 users."""
    counts: dict[int, int] = {}
    for start in range(0, len(users), 5000):
        counts.update(
            Notification.objects.filter(
                user_id__in=users[start : start + 5000], push=True, visible_at__gt=since
            )
            .order_by()
            .values_list("user_id")
            .annotate(n=Count("id"))
            .values_list("user_id", "n")
        )
    return counts


def _fold_held(pushes: list[Message]) -> int:
    """Each allowed push carries its user's held notifications (oldest first), which are no
    longer held; returns how many were folded."""
    first_push: dict[int, Message] = {}
    for message in pushes:
        first_push.setdefault(message.user_id, message)
    held: dict[int, list[tuple[int, str, dict]]] = defaultdict(list)
    rows = (
        Notification.objects.filter(user_id__in=list(first_push), held=True)
        .order_by("user_id", "visible_at", "id")
        .values_list("id", "user_id", "title", "payload")
    )
    for pk, user_id, title, payload in rows:
        if len(held[user_id]) < DIGEST_MAX:
            held[user_id].append((pk, title, payload))
    folded = [pk for items in held.values() for pk, _, _ in items]
    if not folded:
        return 0
    Notification.objects.filter(pk__in=folded, held=True).update(held=False)
    for user_id, items in held.items():
        message = first_push[user_id]
        coupons = [c for _, _, payload in items for c in payload.get("coupons", [])]
        more = len(coupons) or len(items)
        message.payload = {
            **message.payload,
            "digest": [{"notification": pk, "title": title} for pk, title, _ in items],
            "digest_coupons": coupons,
        }
        names = ", ".join(c.get("name", "") for c in coupons if c.get("name"))
        message.title = (
            f"{message.title} · and {more} more coupon{'s' if more != 1 else ''} you follow"
        )[:200]
        message.body = f"{message.body}\nAlso: {names}" if names else message.body
    return len(folded)
