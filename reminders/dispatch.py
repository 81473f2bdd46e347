"""Coupon reminders on the engine: the ``coupon.reminder`` topic's handler (article 000).

A claimed batch of one slot is turned into delivery batches:
- entries whose coupon can no longer help (cancelled, sold out, claim window over) or that are later
  than the late limit under the "drop" policy are dropped and counted, never sent;
- a user's reminders due within the same merge window become one message;
- messages go to Celery in batches (``deliver_reminders``), never one task per reminder.

The handed-on entries stay in the slot's prepare set: the delivery task acks the delivered ones and
nacks the failed ones, so a Celery worker dying mid-delivery only delays them until the visibility
deadline, when the reaper puts them back (at-least-once; the inbox ledger makes it once for the
user).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from functools import partial

from django.utils import timezone

from couponcenter.models import Coupon
from reminders import metrics
from reminders.engine.scripts import Claimed
from reminders.engine.topics import DROP, HANDED_ON, Result, Topic
from reminders.models import ReminderSubscription
from reminders.selectors import reminder_settings_get
from reminders.services.subscriptions import parse_member
from reminders.topics import REMINDER_TOPIC, REMINDER_TOPIC_HIGH

logger = logging.getLogger(__name__)

# Messages per Celery task: big enough to amortise a task, small enough to retry cheaply.
DELIVERY_BATCH = 500
# Coupon states are re-read at most this often per process (a hot coupon is in every batch).
COUPON_STATE_TTL_S = 1.0

_coupon_cache: dict[int, tuple[float, str | None]] = {}


def reminder_topics() -> list[Topic]:
    """The high-priority reminder topic (drained first) and the normal one."""
    live = reminder_settings_get()
    return [
        Topic(
            name=name,
            handler=partial(handle_reminders, name),
            priority=priority,
            slots=live.slots,
            max_attempts=live.max_attempts,
            visibility_ms=live.visibility_timeout_ms,
            batch_size=live.batch_size,
            backoff_base_ms=live.backoff_ms,
        )
        for name, priority in ((REMINDER_TOPIC_HIGH, 1), (REMINDER_TOPIC, 0))
    ]


def coupon_drop_reasons(coupon_ids: set[int], *, now=None) -> dict[int, str | None]:
    """Why reminders of each coupon should be dropped (None: still worth sending)."""
    now_s = time.monotonic()
    fresh = {c: r for c, (at, r) in _coupon_cache.items() if now_s - at < COUPON_STATE_TTL_S}
    missing = coupon_ids - fresh.keys()
    if missing:
        now = now or timezone.now()
        rows = Coupon.objects.filter(pk__in=missing).values(
            "pk", "status", "claimed_count", "total_stock", "claim_closes_at", "expires_at"
        )
        found = {row["pk"]: _drop_reason(row, now) for row in rows}
        for coupon_id in missing:
            reason = found.get(coupon_id, "deleted")
            _coupon_cache[coupon_id] = (now_s, reason)
            fresh[coupon_id] = reason
    return {c: fresh[c] for c in coupon_ids}


def _drop_reason(row: dict, now) -> str | None:
    if row["status"] == Coupon.Status.CANCELLED:
        return "cancelled"
    if row["claimed_count"] >= row["total_stock"]:
        return "sold_out"
    for end in (row["claim_closes_at"], row["expires_at"]):
        if end is not None and now >= end:
            return "closed"
    return None


def handle_reminders(topic: str, entries: Sequence[Claimed]) -> list[Result]:
    """The engine handler: drop what can't help, merge per user, hand batches to Celery."""
    live = reminder_settings_get()
    now_ms = int(time.time() * 1000)
    parsed = [parse_member(e.job_id) for e in entries]
    reasons = coupon_drop_reasons({coupon_id for _, _, coupon_id in parsed})
    late_ms = int(live.late_limit.total_seconds() * 1000)
    results: list[Result] = []
    dropped: dict[str, list[int]] = defaultdict(list)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    window = max(live.merge_window_ms, 1)
    for i, (entry, (sub_id, user_id, coupon_id)) in enumerate(zip(entries, parsed, strict=True)):
        reason = reasons[coupon_id]
        if reason is None and live.late_policy == "drop" and now_ms - entry.due_ms > late_ms:
            reason = "late"
        if reason:
            dropped[reason].append(sub_id)
            results.append(DROP)
            continue
        groups[(user_id, entry.due_ms // window)].append(i)
        results.append(HANDED_ON)
    _mark_dropped(dropped)
    _hand_to_delivery(topic, entries, groups)
    metrics.record(
        topic,
        {"dispatched": len(entries) - sum(map(len, dropped.values())),
         "dropped": sum(map(len, dropped.values()))},
    )  # fmt: skip
    return results


def _mark_dropped(dropped: dict[str, list[int]]) -> None:
    for reason, sub_ids in dropped.items():
        ReminderSubscription.objects.filter(
            pk__in=sub_ids, status=ReminderSubscription.Status.SCHEDULED
        ).update(status=ReminderSubscription.Status.DROPPED, drop_reason=reason)


def _hand_to_delivery(
    topic: str, entries: Sequence[Claimed], groups: dict[tuple[int, int], list[int]]
) -> None:
    from reminders.tasks import deliver_reminders

    messages = [
        {
            "topic": topic,
            "user_id": user_id,
            "members": [entries[i].job_id for i in indexes],
            "due_ms": min(entries[i].due_ms for i in indexes),
            "attempt": max(entries[i].attempt for i in indexes),
        }
        for (user_id, _), indexes in groups.items()
    ]
    for start in range(0, len(messages), DELIVERY_BATCH):
        deliver_reminders.delay(messages[start : start + DELIVERY_BATCH])


def delivery_queue_depth() -> int:
    """Reminder batches waiting in the Celery queue (for backpressure)."""
    from django.conf import settings

    from couponcenter.celery import app

    with app.connection_for_write() as conn:
        try:
            return conn.default_channel.client.llen(settings.DELIVERY_QUEUE)
        except AttributeError:  # not a Redis broker: no cheap depth, no backpressure
            return 0
