"""Generic timeout jobs (article 001's task table) on the engine.

Invariants:
- the ``TimeoutJob`` row is the truth; Redis is indexed only after the row commits
  (``transaction.on_commit``), so a rolled-back create never fires;
- a job fires at least once: it leaves Redis only when its handler succeeded (ack), was dropped
  because its row is no longer pending, or went dead after ``max_attempts`` (the row says DEAD);
- the row's status changes with conditional UPDATEs (``status = PENDING``), so a redelivered job
  whose row was already processed is dropped, not run twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from couponcenter.errors import BusinessError
from reminders.engine import queue
from reminders.engine.keys import slot_for
from reminders.engine.scripts import Claimed
from reminders.engine.topics import DROP, OK, Dead, Result, Retry
from reminders.models import TimeoutJob
from reminders.topics import TimeoutTopicSpec, timeout_topic_spec, timeout_topic_specs

logger = logging.getLogger(__name__)

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


# --- firing ------------------------------------------------------------------------------------


def timeout_jobs_handle(topic: str, entries: Sequence[Claimed]) -> dict[str, Result]:
    """The engine handler of a generic topic: run each pending job's action once."""
    spec = timeout_topic_spec(topic)
    results: dict[str, Result] = {}
    jobs = TimeoutJob.objects.in_bulk([int(e.job_id) for e in entries if e.job_id.isdigit()])
    done: list[tuple[int, int]] = []
    for entry in entries:
        job = jobs.get(int(entry.job_id)) if entry.job_id.isdigit() else None
        if job is None or job.status != TimeoutJob.Status.PENDING or spec is None:
            results[entry.job_id] = DROP
            continue
        if not _still_pending(job):  # cancelled while earlier jobs of the batch ran
            results[entry.job_id] = DROP
            continue
        try:
            _run_action(spec, job)
        except Exception as exc:  # noqa: BLE001 - any failure of the action is retried
            results[entry.job_id] = _failed(spec, job, entry.attempt, exc)
            continue
        done.append((job.pk, entry.attempt))
        results[entry.job_id] = OK
    _mark_processed(done)
    return results


def _still_pending(job: TimeoutJob) -> bool:
    return TimeoutJob.objects.filter(pk=job.pk, status=TimeoutJob.Status.PENDING).exists()


def _mark_processed(done: Iterable[tuple[int, int]]) -> None:
    """(job id, attempt) pairs fired: one UPDATE per attempt count (nearly always just one).

    The attempt is the engine's delivery count, so a job redelivered after a reap says so.
    """
    by_attempt: dict[int, list[int]] = {}
    for pk, attempt in done:
        by_attempt.setdefault(attempt, []).append(pk)
    for attempt, job_ids in by_attempt.items():
        TimeoutJob.objects.filter(pk__in=job_ids, status=TimeoutJob.Status.PENDING).update(
            status=TimeoutJob.Status.PROCESSED, attempts=attempt, gmt_modified=timezone.now()
        )


def _failed(spec: TimeoutTopicSpec, job: TimeoutJob, attempt: int, exc: Exception) -> Result:
    error = f"{exc.__class__.__name__}: {exc}"[:500]
    dead = attempt >= spec.max_attempts
    TimeoutJob.objects.filter(pk=job.pk, status=TimeoutJob.Status.PENDING).update(
        attempts=attempt,
        last_error=error,
        status=TimeoutJob.Status.DEAD if dead else TimeoutJob.Status.PENDING,
        gmt_modified=timezone.now(),
    )
    logger.warning(
        "timeout job failed",
        extra={
            "topic": spec.name,
            "job_id": job.pk,
            "attempt": attempt,
            "error": error,
            "dead": dead,
        },
    )
    return Dead(error) if dead else Retry(error)


def job_payload(job: TimeoutJob) -> dict[str, Any]:
    return {
        "job_id": job.pk,
        "topic": job.topic,
        "biz_type": job.biz_type,
        "biz_id": job.biz_id,
        "action_time": job.action_time.isoformat(),
        "attribute": job.attribute,
    }


def _run_action(spec: TimeoutTopicSpec, job: TimeoutJob) -> None:
    if spec.type == "log":
        logger.info("timeout fired", extra=job_payload(job))
    elif spec.type == "callable":
        import_string(spec.path)(job)
    elif spec.type == "celery":
        from couponcenter.celery import app

        # A signature of a task this process knows honours task_always_eager; send_task never does.
        app.signature(spec.task, kwargs={"job": job_payload(job)}).apply_async()
    elif spec.type == "http":
        _post_signed(spec, job)


def _post_signed(spec: TimeoutTopicSpec, job: TimeoutJob) -> None:
    import requests

    from reminders.delivery import sign as sign_body

    if spec.url.startswith("http://") and not settings.WEBHOOK_ALLOW_HTTP:
        raise ValueError(f"plain-HTTP target refused: {spec.url} (set WEBHOOK_ALLOW_HTTP=1)")
    body = json.dumps(job_payload(job), sort_keys=True).encode()
    response = requests.post(
        spec.url,
        data=body,
        timeout=settings.WEBHOOK_TIMEOUT_S,
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": f"{job.topic}:{job.pk}",
            "X-Coupon-Center-Signature": f"sha256={sign_body(spec.secret, body)}",
        },
    )
    response.raise_for_status()


def timeout_jobs_dead(topic: str, job_ids: list[str]) -> int:
    """The reaper sent these jobs to dead (their handler never finished): mark them DEAD."""
    from reminders.delivery import raise_alert

    ids = [int(j) for j in job_ids if j.isdigit()]
    dead = TimeoutJob.objects.filter(pk__in=ids, status=TimeoutJob.Status.PENDING).update(
        status=TimeoutJob.Status.DEAD, last_error="visibility timeout", gmt_modified=timezone.now()
    )
    raise_alert(
        title=f"{len(job_ids)} timeout jobs dead: their handler never finished",
        details={"topic": topic, "jobs": ids[:20], "error": "visibility timeout"},
    )
    return dead
