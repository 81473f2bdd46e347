"""Delivering merged reminder messages: gateway, ledger, then ack or nack in the engine.

Invariants:
- a subscription is delivered only while it is ``scheduled``; delivering it and marking it ``sent``
  happen in one transaction for the inbox (the notification row and the status commit together,
  after locking the rows), so redelivery, reaping and racing Celery workers can never show a user
  the same reminder twice;
- for external gateways (webhook) the message's ``dedup_key`` (the sorted subscription ids) is the
  ``Idempotency-Key``, so a crash between the POST and marking ``sent`` is absorbed by the receiver;
- only failed messages are retried (``nack_handed``, with backoff); past ``max_attempts`` they are
  dead in the engine, ``failed`` in the database, and an alert is raised;
- entries leave the prepare set only after the database says what happened to them.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from couponcenter.models import Coupon
from reminders import metrics
from reminders.delivery import Gateway, InboxGateway, Message, gateway_for, raise_alert
from reminders.engine import queue
from reminders.models import ReminderSettings, ReminderSubscription
from reminders.selectors import reminder_settings_get

logger = logging.getLogger(__name__)
Status = ReminderSubscription.Status


@dataclass
class Item:
    member: str
    sub_id: int
    slot: int
    remind_at: datetime
    coupon_id: int


@dataclass
class Group:
    """One message: a user's reminders of one merge window."""

    user_id: int
    attempt: int
    items: list[Item]
    message: Message | None = None


@dataclass
class Outcome:
    ack: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    failed: dict[int, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    delivered: list[Item] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)


def reminders_deliver(batch: dict[str, Any]) -> dict[str, int]:
    """Deliver one batch ``{"topic", "members": [...], "attempts": {member: n}}``.

    Members are ``"<sub id>:<user id>:<coupon id>"``; a member missing from ``attempts`` is on
    its first attempt.
    """
    topic, live = batch["topic"], reminder_settings_get()
    attempts = batch.get("attempts") or {}
    by_user: dict[int, list] = {}
    for m in batch["members"]:
        user_id = int(m.split(":", 2)[1])
        group = by_user.setdefault(user_id, [user_id, 1, []])
        group[1] = max(group[1], attempts.get(m, 1))
        group[2].append(m)
    outcome = Outcome()
    groups, coupons = _groups(list(by_user.values()), live, outcome)
    gateway = gateway_for(live.gateway)
    if isinstance(gateway, InboxGateway):
        _deliver_in_transaction(gateway, groups, coupons, outcome)
    else:
        _deliver_then_mark(gateway, groups, live, outcome)
    return _settle(topic, live, outcome)


def _groups(raw: list[list], live: ReminderSettings, outcome: Outcome) -> tuple[list[Group], dict]:
    members = {int(m.split(":", 1)[0]): m for _, _, ms in raw for m in ms}
    rows = ReminderSubscription.objects.filter(pk__in=members).values_list(
        "pk", "status", "slot", "remind_at", "coupon_id"
    )
    subs = {pk: (status, slot, at, coupon) for pk, status, slot, at, coupon in rows}
    now = timezone.now()
    late = live.late_limit if live.late_policy == ReminderSettings.LatePolicy.DROP else None
    window = max(live.merge_window_ms, 1)
    groups = []
    for user_id, attempt, user_members in raw:
        by_window: dict[int, list[Item]] = defaultdict(list)
        for m in user_members:
            sub_id = int(m.split(":", 1)[0])
            status, slot, remind_at, coupon_id = subs.get(sub_id, (None, None, None, None))
            if status != Status.SCHEDULED:  # sent, cancelled, dropped or deleted: nothing to do
                outcome.ack[slot if slot is not None else -1].append(m)
                continue
            if late is not None and now - remind_at > late:
                outcome.dropped.append(sub_id)
                outcome.ack[slot].append(m)
                continue
            ms = int(remind_at.timestamp() * 1000)
            by_window[ms // window].append(Item(m, sub_id, slot, remind_at, coupon_id))
        groups += [Group(user_id, attempt, items) for items in by_window.values()]
    coupons = _coupons(groups)
    for group in groups:
        group.message = _message(group, coupons)
    return groups, coupons


def _coupons(groups: list[Group]) -> dict[int, tuple]:
    coupon_ids = {item.coupon_id for g in groups for item in g.items}
    return {
        pk: (name, opens_at, lead)
        for pk, name, opens_at, lead in Coupon.objects.filter(pk__in=coupon_ids).values_list(
            "pk", "name", "claim_opens_at", "reminder_lead"
        )
    }


def _message(group: Group, coupons: dict) -> Message:
    names = [coupons[item.coupon_id][0] for item in group.items]
    lead_s = int(coupons[group.items[0].coupon_id][2].total_seconds())
    when = (
        f"{lead_s // 60} minute{'s' if lead_s // 60 != 1 else ''}"
        if lead_s >= 60
        else f"{lead_s} s"
    )
    title = (
        f"{names[0]} opens in {when}"
        if len(names) == 1
        else f"{len(names)} coupons you follow open in {when}"
    )
    sub_ids = sorted(item.sub_id for item in group.items)
    key = "reminder:" + "-".join(map(str, sub_ids))
    if len(key) > 190:
        key = "reminder:h:" + hashlib.sha1(key.encode()).hexdigest()
    return Message(
        user_id=group.user_id,
        dedup_key=key,
        title=title,
        body=", ".join(names),
        payload={
            "coupons": [
                {"id": item.coupon_id, "name": coupons[item.coupon_id][0],
                 "claim_opens_at": coupons[item.coupon_id][1].isoformat()}
                for item in group.items
            ],
            "subscriptions": sub_ids,
        },
    )  # fmt: skip


def _deliver_in_transaction(
    gateway: Gateway, groups: list[Group], coupons: dict, outcome: Outcome
) -> None:
    """Inbox: lock the subscriptions, write the rows and mark them sent in one commit.

    Subscriptions another worker sent meanwhile are left out of the message (and acked).
    """
    sub_ids = [item.sub_id for g in groups for item in g.items]
    with transaction.atomic():
        won = set(
            ReminderSubscription.objects.select_for_update()
            .filter(pk__in=sub_ids, status=Status.SCHEDULED)
            .values_list("pk", flat=True)
        )
        mine = []
        for group in groups:
            items = [item for item in group.items if item.sub_id in won]
            if len(items) < len(group.items) and items:
                group = Group(group.user_id, group.attempt, items)
                group.message = _message(group, coupons)
            if items:
                mine.append(group)
        if mine:
            gateway.deliver([g.message for g in mine])
            ReminderSubscription.objects.filter(pk__in=won).update(
                status=Status.SENT, sent_at=timezone.now()
            )
    for group in groups:
        for item in group.items:
            outcome.ack[item.slot].append(item.member)
    outcome.delivered += [item for g in mine for item in g.items]


def _deliver_then_mark(
    gateway: Gateway, groups: list[Group], live: ReminderSettings, outcome: Outcome
) -> None:
    """External gateways: deliver, then mark what went through; failed groups are retried."""
    results = gateway.deliver([g.message for g in groups]) if groups else []
    sent = []
    for group, result in zip(groups, results, strict=True):
        if result.ok:
            sent += [item.sub_id for item in group.items]
            outcome.delivered += group.items
            for item in group.items:
                outcome.ack[item.slot].append(item.member)
            continue
        for item in group.items:
            outcome.failed[item.slot].append((item.member, result.error))
        if group.attempt >= live.max_attempts:
            outcome.dead += [item.sub_id for item in group.items]
    if sent:
        ReminderSubscription.objects.filter(pk__in=sent, status=Status.SCHEDULED).update(
            status=Status.SENT, sent_at=timezone.now()
        )


def _settle(topic: str, live: ReminderSettings, outcome: Outcome) -> dict[str, int]:
    now_ms = int(time.time() * 1000)
    if outcome.dropped:
        ReminderSubscription.objects.filter(pk__in=outcome.dropped, status=Status.SCHEDULED).update(
            status=Status.DROPPED, drop_reason="late"
        )
    if outcome.dead:
        ReminderSubscription.objects.filter(pk__in=outcome.dead, status=Status.SCHEDULED).update(
            status=Status.FAILED
        )
    for slot, members in outcome.ack.items():
        if slot >= 0:
            queue.ack_handed(topic, slot, members)
    for slot, failures in outcome.failed.items():
        queue.nack_handed(
            topic, slot, failures, now_ms=now_ms, max_attempts=live.max_attempts,
            backoff_base_ms=live.backoff_ms, backoff_cap_ms=max(live.backoff_ms, 300_000),
        )  # fmt: skip
    n_failed = sum(map(len, outcome.failed.values()))
    if outcome.dead:
        first_error = next(iter(outcome.failed.values()))[0][1]
        raise_alert(
            title=f"{len(outcome.dead)} reminders dead after {live.max_attempts} attempts",
            details={"topic": topic, "subscriptions": outcome.dead[:20], "error": first_error},
        )
    metrics.record(
        topic,
        {"delivered": len(outcome.delivered), "failed": n_failed - len(outcome.dead),
         "dead": len(outcome.dead), "dropped": len(outcome.dropped)},
        [now_ms - int(item.remind_at.timestamp() * 1000) for item in outcome.delivered],
    )  # fmt: skip
    return {"delivered": len(outcome.delivered), "failed": n_failed, "dead": len(outcome.dead)}
