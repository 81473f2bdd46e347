"""Entries in Redis whose row says they must not fire: removed by the worker's reconcile.

A subscribe and an unsubscribe of the same reminder (or a create and a cancel of a timeout job)
commit in order, but their ``on_commit`` Redis calls can run in the other order: the entry is then
indexed for a row that is already cancelled. Nothing is sent for it (delivery and the timeout
handler act only on live rows), but it stays in the backlog and is claimed for nothing.

``queues_prune_orphans`` looks at the entries due within the reconcile window, reads their rows in
bulk, and removes the entries whose row is final (cancelled, dropped, failed, processed, dead) or
gone. A row changed in the last ``QUIET_S`` seconds is left alone: a re-subscribe or a requeue
racing the prune would otherwise lose its fresh entry.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPICS, try_sub_id_of
from reminders.models import ReminderSubscription, TimeoutJob
from reminders.selectors import reminder_settings_get
from reminders.selectors.timeout_topics import timeout_topic_specs

QUIET_S = 60
SCAN_LIMIT = 5000  # entries looked at per slot and pass
LIVE_SUBSCRIPTION = (ReminderSubscription.Status.SCHEDULED,)
LIVE_JOB = (TimeoutJob.Status.PENDING, TimeoutJob.Status.RUNNING)


def queues_prune_orphans(*, due_before: datetime, now: datetime | None = None) -> dict[str, int]:
    """Remove orphaned entries due before ``due_before``; returns how many, per topic."""
    now = now or timezone.now()
    quiet = now - timedelta(seconds=QUIET_S)
    before_ms = epoch_ms(due_before)
    removed: dict[str, int] = {}
    slots = reminder_settings_get().slots
    for topic in REMINDER_TOPICS:
        removed[topic] = _prune(
            topic, queue.served_slot_count(topic, slots), before_ms, _subscription_orphans(quiet)
        )
    for name, spec in timeout_topic_specs().items():
        removed[name] = _prune(
            name, queue.served_slot_count(name, spec.slots), before_ms, _job_orphans(quiet)
        )
    return {topic: n for topic, n in removed.items() if n}


def _prune(topic: str, slots: int, before_ms: int, orphans) -> int:
    found: list[tuple[str, int]] = []
    for slot in range(slots):
        ids = queue.due_before(topic, slot, before_ms=before_ms, limit=SCAN_LIMIT)
        found += [(job_id, slot) for job_id in orphans(ids)]
    return queue.cancel_many(topic, found) if found else 0


def _subscription_orphans(quiet: datetime):
    def orphans(members: list[str]) -> list[str]:
        by_id = {}
        for value in members:
            sub_id = try_sub_id_of(value)
            if sub_id is not None:
                by_id[sub_id] = value
        rows = {
            pk: (status, changed)
            for pk, status, changed in ReminderSubscription.objects.filter(
                pk__in=list(by_id)
            ).values_list("pk", "status", "updated_at")
        }
        return [
            value for pk, value in by_id.items() if _final(rows.get(pk), LIVE_SUBSCRIPTION, quiet)
        ]

    return orphans


def _job_orphans(quiet: datetime):
    def orphans(ids: list[str]) -> list[str]:
        by_id = {int(j): j for j in ids if j.isdigit() and len(j) <= 18}
        rows = {
            pk: (status, changed)
            for pk, status, changed in TimeoutJob.objects.filter(pk__in=list(by_id)).values_list(
                "pk", "status", "gmt_modified"
            )
        }
        return [job_id for pk, job_id in by_id.items() if _final(rows.get(pk), LIVE_JOB, quiet)]

    return orphans


def _final(row, live: tuple, quiet: datetime) -> bool:
    """An entry is an orphan when its row is gone, or final and quiet for ``QUIET_S``."""
    if row is None:
        return True
    status, changed = row
    return status not in live and changed < quiet
