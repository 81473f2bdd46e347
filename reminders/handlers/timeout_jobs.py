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
from django.db import connection
from django.utils import timezone
from django.utils.module_loading import import_string

from couponcenter.core.db.times import aware_time, db_time
from couponcenter.core.webhooks import post_signed
from reminders.alerts import raise_alert
from reminders.engine.queue import epoch_ms as queue_epoch_ms
from reminders.engine.scripts import Claimed
from reminders.engine.topics import DROP, OK, Dead, Result, Retry
from reminders.models import TimeoutJob
from reminders.selectors.topics import TimeoutTopicSpec, timeout_topic_spec

logger = logging.getLogger(__name__)
Status = TimeoutJob.Status
LIVE = (Status.PENDING, Status.RUNNING)
TABLE = TimeoutJob._meta.db_table
# An action time stored with microseconds is due in the millisecond its entry was scored with.
DUE_SLACK_MS = 1


def timeout_jobs_handle(topic: str, entries: Sequence[Claimed]) -> dict[str, Result]:
    """The engine handler of a generic topic: fire each claimed job's action once.

    One statement takes the batch's rows from pending to running (``_take``); only the rows it
    took fire, so a cancel or a reschedule that committed first wins, and one that comes later
    is refused (``not_pending``): exactly one outcome. A row whose action time moved past the
    entry's due time (rescheduled while its old entry was being claimed) is put back and its
    entry dropped: the reschedule indexed the new time.
    """
    spec = timeout_topic_spec(topic)
    results: dict[str, Result] = {e.job_id: DROP for e in entries}
    if spec is None:
        return results
    due = {int(e.job_id): e for e in entries if e.job_id.isdigit()}
    jobs = _take(due)
    done: list[tuple[int, int]] = []
    for job in jobs:
        entry = due[job.pk]
        try:
            _run_action(spec, job)
        except Exception as exc:  # noqa: BLE001 - any failure of the action is retried
            results[entry.job_id] = _failed(spec, job, entry.attempt, exc)
            continue
        done.append((job.pk, entry.attempt))
        results[entry.job_id] = OK
    _mark_processed(done)
    return results


def _take(due: dict[int, Claimed]) -> list[TimeoutJob]:
    """Pending (or running: a redelivery after a worker died) rows of these entries, moved to
    running in one ``UPDATE ... RETURNING``; rows rescheduled past their entry's due time go
    back to pending and are not returned."""
    if not due:
        return []
    fields = ["job_id", "topic", "biz_type", "biz_id", "action_time", "attribute", "slot",
              "attempts"]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET status = %s, gmt_modified = %s "
            f"WHERE job_id IN ({','.join(['%s'] * len(due))}) AND status IN (%s, %s) "
            f"RETURNING {', '.join(fields)}",
            [Status.RUNNING, db_time(timezone.now()), *due, Status.PENDING, Status.RUNNING],
        )
        rows = cursor.fetchall()
    jobs, moved = [], []
    for row in rows:
        values = dict(zip(fields, row, strict=True))
        values["action_time"] = aware_time(values["action_time"])
        if isinstance(values["attribute"], str):  # SQLite returns JSON text from raw SQL
            values["attribute"] = json.loads(values["attribute"])
        job = TimeoutJob(status=Status.RUNNING, **values)
        entry = due[job.pk]
        if entry.due_ms and queue_epoch_ms(job.action_time) > entry.due_ms + DUE_SLACK_MS:
            moved.append(job.pk)
        else:
            jobs.append(job)
    if moved:
        TimeoutJob.objects.filter(pk__in=moved, status=Status.RUNNING).update(status=Status.PENDING)
    order = {pk: i for i, pk in enumerate(due)}  # the claim's order: due time, oldest first
    return sorted(jobs, key=lambda job: order[job.pk])


def _mark_processed(done: Iterable[tuple[int, int]]) -> None:
    """(job id, attempt) pairs fired: one UPDATE per attempt count (nearly always just one).

    The attempt is the engine's delivery count, so a job redelivered after a reap says so.
    """
    by_attempt: dict[int, list[int]] = {}
    for pk, attempt in done:
        by_attempt.setdefault(attempt, []).append(pk)
    for attempt, job_ids in by_attempt.items():
        TimeoutJob.objects.filter(pk__in=job_ids, status=Status.RUNNING).update(
            status=Status.PROCESSED, attempts=attempt, gmt_modified=timezone.now()
        )


def _failed(spec: TimeoutTopicSpec, job: TimeoutJob, attempt: int, exc: Exception) -> Result:
    error = f"{exc.__class__.__name__}: {exc}"[:500]
    dead = attempt >= spec.max_attempts
    TimeoutJob.objects.filter(pk=job.pk, status=Status.RUNNING).update(
        attempts=attempt,
        last_error=error,
        status=Status.DEAD if dead else Status.PENDING,
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
    dead = TimeoutJob.objects.filter(pk__in=ids, status__in=LIVE).update(
        status=TimeoutJob.Status.DEAD, last_error="visibility timeout", gmt_modified=timezone.now()
    )
    raise_alert(
        title=f"{len(job_ids)} timeout jobs dead: their handler never finished",
        details={"topic": topic, "jobs": ids[:20], "error": "visibility timeout"},
    )
    return dead
