"""Firing generic timeout jobs: the engine handler of every topic in ``TIMEOUT_TOPICS``.

Invariants:
- a job fires at least once: it leaves Redis only when its action succeeded (ack), was dropped
  because its row is no longer pending, or went dead after ``max_attempts`` (the row says DEAD);
- the row's status changes with conditional UPDATEs (``status = PENDING``), so a redelivered job
  whose row was already processed is dropped, not run twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from celery import current_app
from django.utils import timezone
from django.utils.module_loading import import_string

from couponcenter.core.webhooks import post_signed
from reminders.alerts import raise_alert
from reminders.engine.scripts import Claimed
from reminders.engine.topics import DROP, OK, Dead, Result, Retry
from reminders.models import TimeoutJob
from reminders.selectors.topics import TimeoutTopicSpec, timeout_topic_spec

logger = logging.getLogger(__name__)


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
        # A signature of a task this process knows honours task_always_eager; send_task never does.
        current_app.signature(spec.task, kwargs={"job": job_payload(job)}).apply_async()
    elif spec.type == "http":
        _post_signed(spec, job)


def _post_signed(spec: TimeoutTopicSpec, job: TimeoutJob) -> None:
    body = json.dumps(job_payload(job), sort_keys=True).encode()
    post_signed(spec.url, body, secret=spec.secret, idempotency_key=f"{job.topic}:{job.pk}")


def timeout_jobs_dead(topic: str, job_ids: list[str]) -> int:
    """The reaper sent these jobs to dead (their handler never finished): mark them DEAD."""
    ids = [int(j) for j in job_ids if j.isdigit()]
    dead = TimeoutJob.objects.filter(pk__in=ids, status=TimeoutJob.Status.PENDING).update(
        status=TimeoutJob.Status.DEAD, last_error="visibility timeout", gmt_modified=timezone.now()
    )
    raise_alert(
        title=f"{len(job_ids)} timeout jobs dead: their handler never finished",
        details={"topic": topic, "jobs": ids[:20], "error": "visibility timeout"},
    )
    return dead
