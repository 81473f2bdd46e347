"""Settling a delivered batch in the engine, once the database says what happened to each entry.

A parcel (one claimed batch) leaves the engine whole; its failed members go back to their slot
after the live backoff, or, past ``max_attempts``, are dead in the engine, ``failed`` in the
database, and alerted on. Entries that fired before their row's time are put back at it. The
batch's counts and lateness go to the metrics, and each reminder carrying its subscribing call's
trace gets a span there.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.utils import timezone

from couponcenter.core import tracing
from couponcenter.core.db.row_movement import retry_if_moved
from reminders import metrics
from reminders.alerts import raise_alert
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import member, try_sub_id_of
from reminders.models import ReminderSettings, ReminderSubscription

from .messages import Item

Status = ReminderSubscription.Status


@dataclass
class Report:
    """What a delivery did, for settling to act on."""

    delivered: list[Item] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    dropped: int = 0
    failed_items: list[Item] = field(default_factory=list)  # for their traces
    capped: int = 0  # over the per-user push cap: inbox only
    digested: int = 0  # held notifications folded into a push
    early: list[Item] = field(default_factory=list)  # fired before their row's time: put back


def reminders_settle(
    topic: str,
    slot_of: dict[str, int],
    parcels: list[tuple[int, int, list[str]]],
    live: ReminderSettings,
    report: Report,
) -> dict[str, int]:
    """Settle the batch ``report`` tells of: ``parcels`` whole, or (without parcels) each handed-on
    entry of ``slot_of`` ({member: slot}) one by one."""
    now_ms = epoch_ms()
    if report.dead:
        dead = ReminderSubscription.objects.filter(pk__in=report.dead, status=Status.SCHEDULED)
        retry_if_moved(lambda: dead.update(status=Status.FAILED, updated_at=timezone.now()))
    for item in report.early:  # its entry fired ahead of its row: back at the row's time
        queue.schedule(
            topic, member(item.sub_id), epoch_ms(item.remind_at), slot=slot_of[item.member]
        )
    if parcels:
        errors = dict(report.failed)
        settled = [
            (slot, parcel_id, [(m, errors[m]) for m in members if m in errors])
            for slot, parcel_id, members in parcels
        ]
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
            details={
                "topic": topic,
                "subscriptions": report.dead[:20],
                "error": report.failed[0][1],
            },
        )
    counts = {
        "delivered": len(report.delivered),
        "failed": len(report.failed) - len(report.dead),
        "dead": len(report.dead),
        "dropped": report.dropped,
        "capped": report.capped,
        "digested": report.digested,
    }
    # A staged reminder shows at its due moment: on time, not early.
    lateness = [
        max(0, now_ms - int(item.remind_at.timestamp() * 1000)) for item in report.delivered
    ]
    metrics.record(topic, counts, lateness)
    if tracing.enabled():
        _trace_delivery(topic, live, report)
    return {
        "delivered": len(report.delivered),
        "failed": len(report.failed),
        "dead": len(report.dead),
        "dropped": report.dropped,
    }


def _trace_delivery(topic: str, live: ReminderSettings, report: Report) -> None:
    """Each reminder that carries its subscribing call's trace gets a span there, from its due
    moment to now, linked to this Celery task's span."""
    dead = set(report.dead)
    outcomes = [(item, "delivered") for item in report.delivered] + [
        (item, "dead" if item.sub_id in dead else "failed") for item in report.failed_items
    ]
    for item, outcome in outcomes:
        tracing.end_job_span(
            "reminder.deliver",
            item.traceparent,
            due=item.remind_at,
            outcome=outcome,
            attributes={
                "couponcenter.topic": topic,
                "couponcenter.subscription": item.sub_id,
                "couponcenter.user_id": item.user_id,
                "couponcenter.gateway": live.gateway,
                "couponcenter.batch": len(report.delivered) + len(report.failed),
            },
        )


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
            topic,
            slot,
            items,
            now_ms=now_ms,
            max_attempts=numbers.max_attempts,
            backoff_base_ms=numbers.backoff_base_ms,
            backoff_cap_ms=numbers.backoff_cap_ms,
        )


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
    queue.settle_parcels(
        topic,
        parcels,
        now_ms=now_ms,
        max_attempts=numbers.max_attempts,
        backoff_base_ms=numbers.backoff_base_ms,
        backoff_cap_ms=numbers.backoff_cap_ms,
    )


def reminders_dead(topic: str, members: list[str]) -> int:
    """The reaper sent these entries to dead (every delivery attempt timed out): mark them
    ``failed`` and alert, as a delivery that failed its last attempt does."""
    sub_ids = [sub_id for m in members if (sub_id := try_sub_id_of(m)) is not None]
    scheduled = ReminderSubscription.objects.filter(pk__in=sub_ids, status=Status.SCHEDULED)
    failed = retry_if_moved(
        lambda: scheduled.update(status=Status.FAILED, updated_at=timezone.now())
    )
    raise_alert(
        title=f"{len(members)} reminders dead: delivery timed out on every attempt",
        details={"topic": topic, "subscriptions": sub_ids[:20], "error": "visibility timeout"},
    )
    metrics.record(topic, {"dead": len(members)})
    return failed
