"""Delivering merged reminder messages: gateway, ledger, then ack or nack in the engine.

Order matters for at-least-once with no duplicates for the user: the gateway first (the inbox
ledger is unique on (user_id, dedup_key), webhooks get the key as Idempotency-Key), then the
subscriptions are marked sent, then the entries leave the prepare set. A crash anywhere in between
leaves the entries in prepare; the reaper brings them back and the ledger absorbs the repeat.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from django.utils import timezone

from reminders import metrics
from reminders.delivery import Message, gateway_for, raise_alert
from reminders.engine import queue
from reminders.models import ReminderSubscription
from reminders.selectors import reminder_settings_get
from reminders.topics import REMINDER_TOPIC

logger = logging.getLogger(__name__)
Status = ReminderSubscription.Status


def _message_for(user_id: int, subs: list[ReminderSubscription], window_ms: int) -> Message:
    names = [s.coupon.name for s in subs]
    first = min(s.remind_at for s in subs)
    lead = int(subs[0].coupon.reminder_lead.total_seconds())
    when = f"{lead // 60} minute{'s' if lead // 60 != 1 else ''}" if lead >= 60 else f"{lead} s"
    title = (
        f"{names[0]} opens in {when}"
        if len(subs) == 1
        else f"{len(subs)} coupons you follow open in {when}"
    )
    return Message(
        user_id=user_id,
        # Stable across redeliveries: the user and the window of the (database) remind_at.
        dedup_key=f"reminder:{int(first.timestamp() * 1000) // max(window_ms, 1)}",
        title=title,
        body=", ".join(names),
        payload={
            "coupons": [
                {
                    "id": s.coupon_id,
                    "name": s.coupon.name,
                    "claim_opens_at": s.coupon.claim_opens_at.isoformat(),
                }
                for s in subs
            ],
            "subscriptions": [s.pk for s in subs],
        },  # fmt: skip
    )


def reminders_deliver(batch: list[dict[str, Any]]) -> dict[str, int]:
    """Deliver one batch of merged messages of one topic (as built by the dispatcher)."""
    if not batch:
        return {"delivered": 0, "failed": 0, "dead": 0}
    topic = batch[0].get("topic", REMINDER_TOPIC)
    live = reminder_settings_get()
    sub_ids = {int(m.split(":", 1)[0]) for msg in batch for m in msg["members"]}
    subs = ReminderSubscription.objects.select_related("coupon").in_bulk(sub_ids)
    settled: dict[int, list[str]] = defaultdict(list)  # slot -> members to ack
    messages, groups = [], []
    for msg in batch:
        live_subs, members = [], []
        for member in msg["members"]:
            sub = subs.get(int(member.split(":", 1)[0]))
            if sub is None or sub.status != Status.SCHEDULED:
                settled[_slot(sub, member)].append(member)  # cancelled, sent or gone: done
                continue
            live_subs.append(sub)
            members.append(member)
        if live_subs:
            messages.append(_message_for(msg["user_id"], live_subs, live.merge_window_ms))
            groups.append((msg, live_subs, members))
    results = gateway_for(live.gateway).deliver(messages) if messages else []
    return _settle(topic, live, groups, results, settled)


def _slot(sub: ReminderSubscription | None, member: str) -> int:
    if sub is not None:
        return sub.slot
    from reminders.engine.keys import slot_for

    user_id = int(member.split(":")[1])
    return slot_for(user_id, reminder_settings_get().slots)


def _settle(topic: str, live, groups, results, settled: dict[int, list[str]]) -> dict[str, int]:
    now = timezone.now()
    now_ms = int(time.time() * 1000)
    delivered_subs, lateness, failures = [], [], defaultdict(list)
    dead_subs, dead_count = [], 0
    for (msg, subs, members), result in zip(groups, results, strict=True):
        if result.ok:
            delivered_subs += [s.pk for s in subs]
            lateness += [now_ms - int(s.remind_at.timestamp() * 1000) for s in subs]
            for s, m in zip(subs, members, strict=True):
                settled[s.slot].append(m)
            continue
        for s, m in zip(subs, members, strict=True):
            failures[s.slot].append((m, result.error))
        if msg["attempt"] >= live.max_attempts:
            dead_subs += [s.pk for s in subs]
            dead_count += len(subs)
    if delivered_subs:
        ReminderSubscription.objects.filter(pk__in=delivered_subs, status=Status.SCHEDULED).update(
            status=Status.SENT, sent_at=now
        )
    if dead_subs:
        ReminderSubscription.objects.filter(pk__in=dead_subs, status=Status.SCHEDULED).update(
            status=Status.FAILED
        )
    for slot, members in settled.items():
        queue.ack_handed(topic, slot, members)
    for slot, failed in failures.items():
        queue.nack_handed(
            topic, slot, failed, now_ms=now_ms, max_attempts=live.max_attempts,
            backoff_base_ms=live.backoff_ms, backoff_cap_ms=max(live.backoff_ms, 300_000),
        )  # fmt: skip
    failed_count = sum(map(len, failures.values()))
    if dead_subs:
        raise_alert(
            title=f"{dead_count} reminders dead after {live.max_attempts} attempts",
            details={"topic": topic, "subscriptions": dead_subs[:20],
                     "error": next(iter(failures.values()))[0][1]},
        )  # fmt: skip
    metrics.record(
        topic,
        {"delivered": len(delivered_subs), "failed": failed_count - dead_count, "dead": dead_count},
        lateness,
    )
    return {"delivered": len(delivered_subs), "failed": failed_count, "dead": dead_count}
