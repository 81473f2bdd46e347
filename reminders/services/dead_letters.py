"""Steering the engine's dead queues: requeue and purge (the console's and ``/api/ops/``'s writes).

Invariants:
- a requeue puts the database row back in shape first (``TimeoutJob`` DEAD -> PENDING with its
  attempts reset; ``ReminderSubscription`` FAILED -> SCHEDULED), and moves the Redis entries only
  once that commits: a handler that meets a requeued entry always finds a pending row;
- a timeout job whose business key got a new pending job meanwhile stays dead (the unique
  "one pending job per biz" rule), and its entry stays in the dead queue;
- one action touches at most ``REQUEUE_CAP`` entries, so a click never floods the workers;
- a purge only deletes the Redis entries: the rows keep saying DEAD / FAILED, which is the truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from couponcenter.core.db.row_movement import retry_if_moved
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPICS, try_sub_id_of
from reminders.models import ReminderSubscription, TimeoutJob
from reminders.selectors.queues import topic_slot_counts

REQUEUE_CAP = 10_000  # entries per action


@dataclass
class RequeueResult:
    requested: int = 0
    requeued: int = 0  # entries moved from dead back to store (filled once the rows commit)
    rows_fixed: int = 0
    skipped: list[str] = field(default_factory=list)  # left dead: a newer pending job exists


def _fix_reminder_rows(job_ids: Sequence[str]) -> int:
    sub_ids = [s for s in map(try_sub_id_of, job_ids) if s is not None]
    failed = ReminderSubscription.objects.filter(
        pk__in=sub_ids, status=ReminderSubscription.Status.FAILED
    )
    return retry_if_moved(
        lambda: failed.update(
            status=ReminderSubscription.Status.SCHEDULED, updated_at=timezone.now()
        )
    )


def _fix_timeout_rows(topic: str, job_ids: Sequence[str]) -> tuple[int, list[str]]:
    pks = [int(j) for j in job_ids if j.isdigit() and len(j) <= 18]
    dead = TimeoutJob.objects.filter(pk__in=pks, topic=topic, status=TimeoutJob.Status.DEAD)
    newer_pending = TimeoutJob.objects.filter(
        topic=OuterRef("topic"),
        biz_type=OuterRef("biz_type"),
        biz_id=OuterRef("biz_id"),
        status=TimeoutJob.Status.PENDING,
    )
    blocked = [str(pk) for pk in dead.filter(Exists(newer_pending)).values_list("pk", flat=True)]
    movable = dead.exclude(pk__in=[int(b) for b in blocked])
    fixed = retry_if_moved(
        lambda: movable.update(
            status=TimeoutJob.Status.PENDING, attempts=0, gmt_modified=timezone.now()
        )
    )
    return fixed, blocked


def dead_letters_requeue(*, topic: str, slot: int, job_ids: Sequence[str]) -> RequeueResult:
    """Requeue these dead jobs of one slot (at most ``REQUEUE_CAP``): rows first, then Redis."""
    job_ids = list(dict.fromkeys(job_ids))[:REQUEUE_CAP]
    result = RequeueResult(requested=len(job_ids))
    if not job_ids:
        return result
    with transaction.atomic():
        if topic in REMINDER_TOPICS:
            result.rows_fixed = _fix_reminder_rows(job_ids)
        else:
            result.rows_fixed, result.skipped = _fix_timeout_rows(topic, job_ids)
        movable = [j for j in job_ids if j not in set(result.skipped)]

        def move() -> None:
            result.requeued += queue.requeue_dead(
                topic, slot, now_ms=epoch_ms(), job_ids=movable, limit=len(movable)
            )

        if movable:
            transaction.on_commit(move)
    return result


def dead_letters_requeue_matching(
    *, topic: str, slot: int | None = None, limit: int = REQUEUE_CAP
) -> RequeueResult:
    """Requeue up to ``limit`` (capped at ``REQUEUE_CAP``) dead jobs of a topic, or of one slot."""
    budget = max(0, min(limit, REQUEUE_CAP))
    total = RequeueResult()
    slots = range(topic_slot_counts().get(topic, 0)) if slot is None else [slot]
    for s in slots:
        if budget <= 0:
            break
        ids = [d.job_id for d in queue.list_dead(topic, s, limit=budget)]
        if not ids:
            continue
        one = dead_letters_requeue(topic=topic, slot=s, job_ids=ids)
        budget -= len(ids)
        total.requested += one.requested
        total.rows_fixed += one.rows_fixed
        total.skipped += one.skipped
        # The slot's move runs on commit (at once outside a transaction); so does this sum,
        # registered after it.
        transaction.on_commit(lambda one=one: _add_moved(total, one))
    return total


def _add_moved(total: RequeueResult, one: RequeueResult) -> None:
    total.requeued += one.requeued


def dead_letters_purge(*, topic: str, slot: int, job_ids: Sequence[str]) -> int:
    """Delete these dead jobs for good (at most ``REQUEUE_CAP``); returns how many were dead."""
    job_ids = list(dict.fromkeys(job_ids))[:REQUEUE_CAP]
    if not job_ids:
        return 0
    return queue.purge_dead(topic, slot, job_ids=job_ids, limit=len(job_ids))
