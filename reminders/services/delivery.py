"""Delivering reminder batches: gateway, ledger, then settling the parcels in the engine.

A batch is what the dispatcher handed on from one claim round, one engine parcel per claimed
batch: ``{"topic", "parcels": [[slot, parcel id, "member,member,..."], ...], "attempts":
{member: n}}`` (members as ``reminders.members`` spells them; a member missing from ``attempts``
is on its first attempt). Each parcel is settled whole once the batch is done. The per-entry
forms ``{"topic", "parts": [[slot, [member, ...]], ...]}`` and ``{"topic", "slot",
"members"}``, whose entries are in flight one by one, are accepted too: a Celery queue may hold
tasks in them while a deploy rolls.

Invariants:
- a subscription is delivered only while it is ``scheduled``, and only while its coupon can still
  help (not cancelled, sold out or closed: such reminders are ``dropped`` with the reason, and
  counted). The dispatcher hands entries on without looking at them, so this is the one check,
  made as late as it can be. For the inbox, marking it ``sent``
  (an ``UPDATE ... WHERE status = 'scheduled' RETURNING``, which takes the row locks) and writing
  the notification commit together, so redelivery, reaping and racing Celery workers can never
  show a user the same reminder twice;
- for external gateways (webhook) the message's ``dedup_key`` (the sorted subscription ids) is the
  ``Idempotency-Key``, so a crash between the POST and marking ``sent`` is absorbed by the receiver;
- a user's reminders whose ``remind_at`` falls in the same merge window become one message;
- only failed messages are retried (``settle_parcels``, with backoff); past ``max_attempts`` they
  are dead in the engine, ``failed`` in the database, and an alert is raised;
- entries leave the prepare set only after the database says what happened to them;
- nothing is sent before its row's ``remind_at``: an entry that fired early (a stale copy, one
  indexed before its coupon moved) is put back at that time. The inbox stages
  hidden only what falls due within the look-ahead window (``staged_withdraw`` waits on exactly
  those rows), and puts back what is due later.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from couponcenter.core import tracing
from couponcenter.core.caching import TTLCache
from couponcenter.core.db.times import aware_time, db_time
from couponcenter.coupons import rules
from couponcenter.coupons.models import Coupon
from reminders import metrics
from reminders.alerts import raise_alert
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.gateways import Gateway, InboxGateway, Message, gateway_for
from reminders.members import member, sub_id_of, try_sub_id_of
from reminders.models import ReminderSettings, ReminderSubscription
from reminders.selectors import reminder_settings_get

from .indexing import BULK_CHUNK
from .push_cap import push_cap_apply
from .staging import hidden_reminder_notes, notifications_delete

logger = logging.getLogger(__name__)
Status = ReminderSubscription.Status
TABLE = ReminderSubscription._meta.db_table
COUPON_TTL_S = 5.0  # names and opening times in messages may lag an edit by this much
# Coupon states (cancelled, sold out) are re-read at most this often per process: a hot coupon
# is in every batch of a burst.
COUPON_STATE_TTL_S = 1.0
# A row due this much later than the clock says was not due when its entry fired (clocks of the
# dispatching and delivering hosts may differ by less): external gateways put it back.
EARLY_TOLERANCE_S = 5.0


@dataclass
class Item:
    member: str
    sub_id: int
    user_id: int
    remind_at: datetime
    coupon_id: int
    traceparent: str = ""  # the subscribing call's trace (core.tracing)


@dataclass
class Group:
    """One message: a user's reminders of one merge window."""

    user_id: int
    items: list[Item]
    message: Message | None = None


@dataclass
class Report:
    delivered: list[Item] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    dropped: int = 0
    failed_items: list[Item] = field(default_factory=list)  # for their traces
    capped: int = 0  # over the per-user push cap: inbox only
    digested: int = 0  # held notifications folded into a push
    early: list[Item] = field(default_factory=list)  # fired before their row's time: put back


def reminders_deliver(batch: dict[str, Any]) -> dict[str, int]:
    topic = batch["topic"]
    parcels = [(slot, parcel_id, packed.split(",")) for slot, parcel_id, packed in
               batch.get("parcels", ())]  # fmt: skip
    if parcels:
        slot_of = {member: slot for slot, _, members in parcels for member in members}
    else:  # the per-entry forms (tasks a Celery queue may still hold while a deploy rolls)
        parts = batch["parts"] if "parts" in batch else [[batch["slot"], batch["members"]]]
        slot_of = {member: slot for slot, members in parts for member in members}
    members = list(slot_of)
    # An entry that names no subscription (written by hand, or in a spelling ``members`` does
    # not read) fails alone, retried and then dead where the console shows it, instead of
    # failing its whole batch at every attempt.
    strays = {m for m in members if try_sub_id_of(m) is None}
    if strays:
        logger.error("%d entries of %s name no subscription, e.g. %r", len(strays), topic,
                     min(strays))  # fmt: skip
        members = [m for m in members if m not in strays]
    attempts = batch.get("attempts") or {}
    redelivered = sum(1 for m in members if attempts.get(m, 1) >= 2)
    # Checked now, not from the process's cache: one small query a batch, and a change of the
    # policy (the push cap, the late limit) applies from the next batch on.
    live = reminder_settings_get(max_age_s=0)
    try:
        gateway = gateway_for(live.gateway)
        if isinstance(gateway, InboxGateway):
            report = _deliver_inbox(gateway, members, live)
        else:
            report = _deliver_external(gateway, members, attempts, live)
    except Exception as exc:  # noqa: BLE001 - whatever failed, the batch is settled as failed
        report = _crashed(members, attempts, live, exc)
    report.failed += [(m, "not a reminder member") for m in sorted(strays)]
    return {**_settle(topic, slot_of, parcels, live, report), "redelivered": redelivered}


def _crashed(
    members: list[str], attempts: dict[str, int], live: ReminderSettings, exc: Exception
) -> Report:
    """The whole batch failed before any message was out (the inbox transaction rolled back):
    every entry is failed with the real error, retried or dead by its attempts, never left in
    flight for the reaper (which could only say "visibility timeout")."""
    logger.exception("delivering %d reminders failed", len(members))
    error = f"{exc.__class__.__name__}: {exc}"[:300]
    report = Report(failed=[(member, error) for member in members])
    report.dead = [sub_id_of(m) for m in members if attempts.get(m, 1) >= live.max_attempts]
    return report


# --- inbox: one transaction ----------------------------------------------------------------------


# The scheduled rows among the batch's, in a form that matches no partial index (see below).
STILL_SCHEDULED = "(status || '') = %s"


def _claim_rows(sql_where: str, params: list, sub_ids: list[int], sets: str, set_params: list):
    """``UPDATE ... SET <sets> WHERE <sql_where> AND id IN (...) RETURNING`` the rows it changed.

    By the primary key whatever the table's statistics say. With statistics taken while few
    reminders were scheduled (a quiet night, then a flood of subscriptions before autovacuum
    analyses the table), PostgreSQL may plan ``status = 'scheduled' AND id IN (...)`` on the
    partial index of scheduled rows and walk all of them for every batch, tens of times slower
    than by key. ``sql_where`` tests the status as
    ``STILL_SCHEDULED``, which no partial index matches, and sequential scans are off for these
    statements alone, so the primary key is the only way in."""
    rows = []
    postgres = connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        if postgres:
            cursor.execute("SET LOCAL enable_seqscan = off")
        for start in range(0, len(sub_ids), 5000):
            chunk = sub_ids[start : start + 5000]
            cursor.execute(
                f"UPDATE {TABLE} SET {sets} WHERE {sql_where} "
                f"AND id IN ({','.join(['%s'] * len(chunk))}) "
                "RETURNING id, user_id, remind_at, coupon_id, traceparent",
                [*set_params, *params, *chunk],
            )
            rows += cursor.fetchall()
        if postgres:
            cursor.execute("SET LOCAL enable_seqscan TO DEFAULT")
    return rows


def _deliver_inbox(gateway: Gateway, members: list[str], live: ReminderSettings) -> Report:
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
            late = _claim_rows(f"{STILL_SCHEDULED} AND remind_at < %s",
                               [Status.SCHEDULED, db_time(cutoff)],
                               sub_ids, "status = %s, drop_reason = %s, updated_at = %s",
                               [Status.DROPPED, "late", db_time(now)])  # fmt: skip
            report.dropped = len(late)
        # A reminder claimed ahead of its due time (pre-staged) is "sent" for showing then, but
        # only within the look-ahead window: ``staged_withdraw`` waits only on rows due within
        # it, so a row staged further ahead could slip past an unsubscribe racing this
        # transaction and show anyway. An entry that fired earlier than that is put back.
        horizon = now + timedelta(milliseconds=live.prestage_ms, seconds=EARLY_TOLERANCE_S)
        rows = _claim_rows(f"{STILL_SCHEDULED} AND remind_at <= %s",
                           [Status.SCHEDULED, db_time(horizon)], sub_ids,
                           "status = %s, sent_at = CASE WHEN remind_at > %s THEN remind_at "
                           "ELSE %s END, updated_at = %s",
                           [Status.SENT, *[db_time(now)] * 3])  # fmt: skip
        items = [
            Item(member_of[pk], pk, user, aware_time(at), coupon, trace)
            for pk, user, at, coupon, trace in rows
        ]
        if len(rows) < len(sub_ids):
            report.early = _early_items(member_of, {row[0] for row in rows}, horizon)
        items, hopeless = _drop_hopeless(items, now, marked=Status.SENT)
        report.dropped += hopeless
        staged = _unstage_mates(items, now, live.merge_window_ms)
        groups = _merge(items + staged, live.merge_window_ms)
        for group in groups:
            due = min(item.remind_at for item in group.items)
            if due > now:
                group.message.visible_at = due
        if groups:
            messages = [g.message for g in groups]
            cap = push_cap_apply(messages, live, now)
            report.capped, report.digested = cap.capped, cap.digested
            gateway.deliver(messages)
    report.delivered = items
    return report


def _early_items(member_of: dict[int, str], claimed: set[int], horizon: datetime) -> list[Item]:
    """The batch's rows still ``scheduled`` and due after ``horizon``: their entries fired
    early (a stale copy, one indexed before its coupon moved)."""
    rest = [pk for pk in member_of if pk not in claimed]
    rows = ReminderSubscription.objects.filter(
        pk__in=rest, status=Status.SCHEDULED, remind_at__gt=horizon
    ).values_list("pk", "user_id", "remind_at", "coupon_id", "traceparent")
    return [Item(member_of[pk], pk, *row) for pk, *row in rows]


def coupon_drop_reasons(coupon_ids: set[int], *, now: datetime) -> dict[int, str | None]:
    """Why reminders of each coupon should be dropped (None: still worth sending), from a
    per-process cache of at most ``COUPON_STATE_TTL_S``."""

    def load(missing: set[int]) -> dict[int, str | None]:
        rows = Coupon.objects.filter(pk__in=missing).values(
            "pk", *rules.WINDOW_FIELDS, *rules.STOCK_FIELDS
        )
        found = {row.pop("pk"): rules.reminder_drop_reason(now=now, **row) for row in rows}
        return {coupon_id: found.get(coupon_id, "deleted") for coupon_id in missing}

    return _drop_reasons.get_many(coupon_ids, load)


_drop_reasons: TTLCache[int, str | None] = TTLCache(COUPON_STATE_TTL_S)


def _drop_hopeless(items: list[Item], now: datetime, *, marked: str) -> tuple[list[Item], int]:
    """Items whose coupon can no longer help are ``dropped`` with the reason; the rest are
    returned with how many were dropped. ``marked``: the status their rows have now (the inbox
    marked them ``sent`` in this transaction, so the mark is overwritten before anyone sees
    it; an external gateway has not sent them yet, so they are still ``scheduled``)."""
    reasons = coupon_drop_reasons({item.coupon_id for item in items}, now=now)
    if not any(reasons.values()):
        return items, 0
    kept, dropped = [], defaultdict(list)
    for item in items:
        reason = reasons[item.coupon_id]
        if reason:
            dropped[reason].append(item.sub_id)
        else:
            kept.append(item)
    count = 0
    for reason, sub_ids in dropped.items():
        count += ReminderSubscription.objects.filter(pk__in=sub_ids, status=marked).update(
            status=Status.DROPPED, drop_reason=reason, sent_at=None, updated_at=now
        )
    return kept, count


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
    buckets = {(item.user_id, _bucket(item.remind_at, window)) for item in items}
    users = sorted({user for user, _ in buckets})
    notes, mates = [], set()
    for pk, user, visible_at, subs in hidden_reminder_notes(users, now):
        if (user, _bucket(visible_at, window)) in buckets:
            notes.append(pk)
            mates |= subs
    if not notes:
        return []
    kept = []
    ids = sorted(mates)
    for start in range(0, len(ids), BULK_CHUNK):
        kept += (
            ReminderSubscription.objects.select_for_update()
            .filter(pk__in=ids[start : start + BULK_CHUNK], status=Status.SENT, sent_at__gt=now)
            .order_by("pk")
            .values_list("pk", "user_id", "remind_at", "coupon_id", "traceparent")
        )
    notifications_delete(notes)
    return [
        Item(member(pk), pk, user, remind_at, coupon, trace)
        for pk, user, remind_at, coupon, trace in kept
    ]


def _bucket(moment: datetime, window_ms: int) -> int:
    return epoch_ms(moment) // window_ms


# --- external gateways: deliver, then mark -------------------------------------------------------


def _deliver_external(
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
        report.dropped = ReminderSubscription.objects.filter(
            pk__in=too_late, status=Status.SCHEDULED
        ).update(status=Status.DROPPED, drop_reason="late")
    items, hopeless = _drop_hopeless(items, now, marked=Status.SCHEDULED)
    report.dropped += hopeless
    groups = _merge(items, live.merge_window_ms)
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
        ReminderSubscription.objects.filter(
            pk__in=[item.sub_id for item in report.delivered], status=Status.SCHEDULED
        ).update(status=Status.SENT, sent_at=timezone.now())
    return report


# --- messages ------------------------------------------------------------------------------------


def _merge(items: list[Item], window_ms: int) -> list[Group]:
    by_key: dict[tuple[int, int], list[Item]] = defaultdict(list)
    window = max(window_ms, 1)
    for item in items:
        by_key[(item.user_id, _bucket(item.remind_at, window))].append(item)
    coupons = _coupon_info({item.coupon_id for item in items})
    groups = [Group(user_id, group_items) for (user_id, _), group_items in by_key.items()]
    # One clock reading per batch, and each opening's words worked out once: a burst is 2,000
    # messages a batch about one coupon, and a local-time conversion per message would add a
    # fifth to delivery's time.
    now, whens = timezone.now(), {}
    for group in groups:
        group.message = _message(group, coupons, now, whens)
    return groups


@dataclass(frozen=True)
class CouponInfo:
    """What a message says about a coupon, prepared once per coupon, not once per reminder."""

    name: str
    opens_at: datetime | None
    payload: dict[str, Any]


_UNKNOWN = CouponInfo("a coupon", None, {"id": None, "name": "a coupon"})


_coupons: TTLCache[int, CouponInfo] = TTLCache(COUPON_TTL_S)


def _coupon_info(coupon_ids: set[int]) -> dict[int, CouponInfo]:
    """Per coupon, from a short per-process cache (a hot coupon is in every batch)."""

    def load(missing: set[int]) -> dict[int, CouponInfo]:
        rows = Coupon.objects.filter(pk__in=missing).values_list("pk", "name", "claim_opens_at")
        return {
            pk: CouponInfo(
                name, opens_at, {"id": pk, "name": name, "claim_opens_at": opens_at.isoformat()}
            )
            for pk, name, opens_at in rows
        }

    return _coupons.get_many(coupon_ids, load)


def _when(opens_at: datetime | None, now: datetime) -> str:
    """Words that stay true however late the message is read: the opening as a clock time (the
    payload carries the exact time for the client's own zone), or that it is open already."""
    if opens_at is None or opens_at <= now:
        return "now"
    local = timezone.localtime(opens_at)
    day = "" if local.date() == timezone.localtime(now).date() else f"{local:%Y-%m-%d} "
    return f"at {day}{local:%H:%M} {local.tzname()}"


def _message(
    group: Group, coupons: dict[int, CouponInfo], now: datetime, whens: dict[datetime | None, str]
) -> Message:
    """``whens``: opening -> its words at ``now``, filled in as openings come up."""
    info = [coupons.get(item.coupon_id, _UNKNOWN) for item in group.items]
    opens_at = min((c.opens_at for c in info if c.opens_at), default=None)
    when = whens.get(opens_at)
    if when is None:
        when = whens[opens_at] = _when(opens_at, now)
    if len(info) == 1:
        name = info[0].name
        title = f"{name} is open now" if when == "now" else f"{name} opens {when}"
        body = name
        sub_ids = [group.items[0].sub_id]
    else:
        title = (f"{len(info)} coupons you follow are open now" if when == "now"
                 else f"{len(info)} coupons you follow open {when}")  # fmt: skip
        body = ", ".join(c.name for c in info)
        sub_ids = sorted(item.sub_id for item in group.items)
    key = "reminder:" + "-".join(map(str, sub_ids))
    if len(key) > 190:
        key = "reminder:h:" + hashlib.sha1(key.encode()).hexdigest()
    return Message(
        user_id=group.user_id,
        dedup_key=key,
        title=title,
        body=body,
        payload={"coupons": [c.payload for c in info], "subscriptions": sub_ids},
    )


# --- settling ------------------------------------------------------------------------------------


def _settle(
    topic: str,
    slot_of: dict[str, int],
    parcels: list[tuple[int, int, list[str]]],
    live: ReminderSettings,
    report: Report,
) -> dict[str, int]:
    now_ms = epoch_ms()
    if report.dead:
        ReminderSubscription.objects.filter(pk__in=report.dead, status=Status.SCHEDULED).update(
            status=Status.FAILED
        )
    for item in report.early:  # its entry fired ahead of its row: back at the row's time
        queue.schedule(topic, member(item.sub_id), epoch_ms(item.remind_at),
                       slot=slot_of[item.member])  # fmt: skip
    if parcels:
        errors = dict(report.failed)
        settled = [(slot, parcel_id, [(m, errors[m]) for m in members if m in errors])
                   for slot, parcel_id, members in parcels]  # fmt: skip
        reminders_retry_parcels(topic, settled, live=live, now_ms=now_ms)
    else:
        failed = {m for m, _ in report.failed}
        done: dict[int, list[str]] = defaultdict(list)
        for m, slot in slot_of.items():
            if m not in failed:
                done[slot].append(m)
        queue.ack_handed_many(topic, done)
        retry: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for m, error in report.failed:
            retry[slot_of[m]].append((m, error))
        reminders_retry(topic, retry, live=live, now_ms=now_ms)
    if report.dead:
        raise_alert(
            title=f"{len(report.dead)} reminders dead after {live.max_attempts} attempts",
            details={"topic": topic, "subscriptions": report.dead[:20],
                     "error": report.failed[0][1]},
        )  # fmt: skip
    metrics.record(
        topic,
        {"delivered": len(report.delivered), "failed": len(report.failed) - len(report.dead),
         "dead": len(report.dead), "dropped": report.dropped, "capped": report.capped,
         "digested": report.digested},
        # A staged reminder shows at its due moment: on time, not early.
        [max(0, now_ms - epoch_ms(item.remind_at)) for item in report.delivered],
    )  # fmt: skip
    if tracing.enabled():
        _trace_delivery(topic, live, report)
    return {"delivered": len(report.delivered), "failed": len(report.failed),
            "dead": len(report.dead), "dropped": report.dropped}  # fmt: skip


def _trace_delivery(topic: str, live: ReminderSettings, report: Report) -> None:
    """Each reminder that carries its subscribing call's trace gets a span there, from its due
    moment to now, linked to this Celery task's span."""
    dead = set(report.dead)
    outcomes = [(item, "delivered") for item in report.delivered] + [
        (item, "dead" if item.sub_id in dead else "failed") for item in report.failed_items
    ]
    for item, outcome in outcomes:
        tracing.end_job_span(
            "reminder.deliver", item.traceparent, due=item.remind_at, outcome=outcome,
            attributes={"couponcenter.topic": topic, "couponcenter.subscription": item.sub_id,
                        "couponcenter.user_id": item.user_id, "couponcenter.gateway": live.gateway,
                        "couponcenter.batch": len(report.delivered) + len(report.failed)},
        )  # fmt: skip


def reminders_retry(
    topic: str,
    failures: dict[int, list[tuple[str, str]]],
    *,
    live: ReminderSettings,
    now_ms: int,
) -> None:
    """Handed-on entries that failed ({slot: [(member, error)]}): back to their slots after the
    live backoff, or dead past the attempt limit."""
    numbers = live.topic_settings()
    for slot, items in failures.items():
        queue.nack_handed(
            topic, slot, items, now_ms=now_ms, max_attempts=numbers.max_attempts,
            backoff_base_ms=numbers.backoff_base_ms, backoff_cap_ms=numbers.backoff_cap_ms,
        )  # fmt: skip


def reminders_retry_parcels(
    topic: str,
    parcels: list[tuple[int, int, list[tuple[str, str]]]],
    *,
    live: ReminderSettings,
    now_ms: int,
) -> None:
    """Parcels handed on and done with, [(slot, parcel id, [(member, error)])]: each leaves the
    engine; its failed members go back to their slot after the live backoff, or dead past the
    attempt limit."""
    numbers = live.topic_settings()
    queue.settle_parcels(topic, parcels, now_ms=now_ms, max_attempts=numbers.max_attempts,
                         backoff_base_ms=numbers.backoff_base_ms,
                         backoff_cap_ms=numbers.backoff_cap_ms)  # fmt: skip


def reminders_dead(topic: str, members: list[str]) -> int:
    """The reaper sent these entries to dead (every delivery attempt timed out): mark them
    ``failed`` and alert, as a delivery that failed its last attempt does."""
    sub_ids = [sub_id for m in members if (sub_id := try_sub_id_of(m)) is not None]
    failed = ReminderSubscription.objects.filter(pk__in=sub_ids, status=Status.SCHEDULED).update(
        status=Status.FAILED, updated_at=timezone.now()
    )
    raise_alert(
        title=f"{len(members)} reminders dead: delivery timed out on every attempt",
        details={"topic": topic, "subscriptions": sub_ids[:20], "error": "visibility timeout"},
    )
    metrics.record(topic, {"dead": len(members)})
    return failed
