"""Generic timeout jobs (article 001's task table): create, cancel, re-index. Firing them is
``reminders.handlers.timeout_jobs``.

Invariants:
- the ``TimeoutJob`` row is the truth; Redis is indexed only after the row commits
  (``transaction.on_commit``), so a rolled-back create never fires;
- a job fires at least once: it leaves Redis only when its handler succeeded (ack), was dropped
  because its row is no longer pending, or went dead after ``max_attempts`` (the row says DEAD);
- the row's status changes with conditional UPDATEs (``status = PENDING``), so a redelivered job
  whose row was already processed is dropped, not run twice.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from couponcenter.core.errors import BusinessError
from reminders.engine import queue
from reminders.engine.keys import slot_for
from reminders.models import TimeoutJob
from reminders.selectors.topics import timeout_topic_spec, timeout_topic_specs

REINDEX_CHUNK = 5000


class TimeoutJobConflict(BusinessError):
    code = "duplicate"


def timeout_job_create(
    *,
    topic: str,
    biz_type: str,
    biz_id: str,
    action_time: datetime,
    attribute: dict[str, Any] | None = None,
) -> TimeoutJob:
    """Create a pending job and schedule it once the row commits."""
    spec = timeout_topic_spec(topic)
    if spec is None:
        raise ValidationError({"topic": [f"Unknown topic; known: {sorted(timeout_topic_specs())}"]})
    job = TimeoutJob(
        topic=topic,
        biz_type=biz_type,
        biz_id=biz_id,
        action_time=action_time,
        attribute=attribute or {},
        slot=slot_for(biz_id, spec.slots),
    )
    try:
        with transaction.atomic():
            job.save()
    except IntegrityError as exc:
        existing = (
            TimeoutJob.objects.filter(
                topic=topic, biz_type=biz_type, biz_id=biz_id, status=TimeoutJob.Status.PENDING
            )
            .values_list("job_id", flat=True)
            .first()
        )
        raise TimeoutJobConflict(
            message=f"A pending job for {biz_type}:{biz_id} exists (job_id {existing})."
        ) from exc

    def index() -> None:
        queue.record_layout(topic, spec.slots)
        queue.schedule(topic, str(job.job_id), queue.epoch_ms(action_time), slot=job.slot)

    transaction.on_commit(index)
    return job


def timeout_job_cancel(*, job: TimeoutJob) -> TimeoutJob:
    """Cancel a pending job; a job that already fired or was cancelled is left as it is."""
    cancelled = TimeoutJob.objects.filter(pk=job.pk, status=TimeoutJob.Status.PENDING).update(
        status=TimeoutJob.Status.CANCELLED, gmt_modified=timezone.now()
    )
    job.refresh_from_db()
    if not cancelled:
        raise BusinessError("not_pending", f"Job {job.pk} is {job.get_status_display().lower()}.")
    transaction.on_commit(lambda: queue.cancel(job.topic, str(job.job_id), slot=job.slot))
    return job


def timeout_jobs_reindex(
    *, due_before: datetime | None = None, progress: Callable[[int], None] | None = None
) -> int:
    """Re-index pending jobs (all, or those due before ``due_before``) into Redis; idempotent.

    Uses the engine's NX mode: a job already in store, prepare or dead is left alone.
    """
    pending = TimeoutJob.objects.filter(status=TimeoutJob.Status.PENDING)
    if due_before is not None:
        pending = pending.filter(action_time__lt=due_before)
    added, last_pk = 0, 0
    while True:
        chunk = list(
            pending.filter(pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", "topic", "action_time", "slot")[:REINDEX_CHUNK]
        )
        if not chunk:
            return added
        by_topic: dict[str, list[tuple[str, int, int]]] = {}
        for pk, topic, action_time, slot in chunk:
            by_topic.setdefault(topic, []).append((str(pk), queue.epoch_ms(action_time), slot))
        for topic, items in by_topic.items():
            queue.record_layout_covering(topic, [slot for _, _, slot in items])
            added += queue.schedule_many(topic, items, nx=True)
        last_pk = chunk[-1][0]
        if progress is not None:
            progress(len(chunk))
