"""Generic timeout jobs (the task table of docs/timeouts.md): create, reschedule, cancel, end,
rebuild. Creating many at once is ``services.timeouts_bulk``; firing them is
``handlers.timeout_jobs``, which writes their rows through ``services.firing``.

Invariants:
- the ``TimeoutJob`` row is the truth; Redis is indexed only after the row commits
  (``transaction.on_commit``), so a rolled-back create never fires;
- a job fires at least once: it leaves Redis only when its handler succeeded (ack), was dropped
  because its row is no longer pending, or went dead after ``max_attempts`` (the row says DEAD);
- the row's status changes with conditional UPDATEs (``status = PENDING``), so a redelivered job
  whose row was already processed is dropped, not run twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from django.core.exceptions import ValidationError
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from couponcenter.core import tracing
from couponcenter.core.db.row_movement import retry_if_moved
from couponcenter.core.errors import BusinessError, QuotaExceeded
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.keys import slot_for
from reminders.models import TimeoutJob
from reminders.recurrence import vetting
from reminders.selectors.timeout_topics import (
    TimeoutTopicSpec,
    timeout_topic_spec,
    timeout_topic_specs,
)
from reminders.services.indexing import rebuild_rows
from reminders.services.quotas import quota_attributes_check, quota_creations_take
from reminders.timeout_topic_rules import slot_basis

logger = logging.getLogger(__name__)


class TimeoutJobConflict(BusinessError):
    code = "duplicate"


Status = TimeoutJob.Status


def series_first_time(rule: str, action_time: datetime, *, vetted: bool = False) -> datetime:
    """When the series of a new recurring job starts (``vetting.first_occurrence``), or a
    ValidationError that says why its rule is refused. ``vetted``: the rule passed ``vet`` for
    another job of the same request."""
    try:
        if vetted:
            return vetting.start_of(rule, action_time, timezone.now())
        return vetting.first_occurrence(rule, action_time, timezone.now())
    except ValueError as exc:
        raise ValidationError({"recurrence": [f"Invalid: {exc}."]}) from None
    except OSError as exc:  # the child process: not the rule's fault
        logger.exception("checking a recurrence rule failed")
        raise BusinessError(
            "recurrence_unavailable", "Recurrence rules cannot be checked right now; retry."
        ) from exc


def topic_spec_or_error(topic: str) -> TimeoutTopicSpec:
    """The spec of ``topic``, or a ValidationError that names the known topics."""
    spec = timeout_topic_spec(topic)
    if spec is None:
        raise ValidationError({"topic": [f"Unknown topic; known: {sorted(timeout_topic_specs())}"]})
    return spec


def timeout_job_create(
    *,
    topic: str,
    biz_type: str,
    biz_id: str,
    action_time: datetime,
    attribute: dict[str, Any] | None = None,
    recurrence: str = "",
    owner_id: int | None = None,
) -> TimeoutJob:
    """Create a pending job and schedule it once the row commits; ``TimeoutJobConflict`` when one
    is pending for the same (topic, biz_type, biz_id). ``recurrence``: an RRULE or a cron
    expression (``reminders.recurrence``): the series starts at ``action_time``. ``owner_id``:
    the account it is created for (its fair key counts within it: ``slot_basis``)."""
    spec = topic_spec_or_error(topic)
    series_start = action_time if recurrence else None
    if recurrence:
        action_time = series_first_time(recurrence, action_time)
    job = TimeoutJob(
        topic=topic,
        biz_type=biz_type,
        biz_id=biz_id,
        action_time=action_time,
        attribute=attribute or {},
        recurrence=recurrence,
        series_start=series_start,
        slot=slot_for(slot_basis(spec, biz_type, biz_id, attribute, owner_id=owner_id), spec.slots),
        traceparent=tracing.current_traceparent(),
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
        queue.schedule(topic, str(job.job_id), epoch_ms(action_time), slot=job.slot)

    transaction.on_commit(index)
    return job


def timeout_job_ensure(
    *,
    topic: str,
    biz_type: str,
    biz_id: str,
    action_time: datetime,
    attribute: dict[str, Any] | None = None,
    recurrence: str = "",
    owner_id: int | None = None,
) -> tuple[TimeoutJob, bool]:
    """The idempotent create: ``(job, True)`` for a new one, or ``(the pending job, False)``
    when (topic, biz_type, biz_id) has one already (left as it is: a retried request must not
    move it). ``owner_id``: the account it is created for (None: staff and code), whose quotas
    it counts against (``services.quotas``)."""
    if owner_id is not None:
        quota_attributes_check(by_field=[("attribute", attribute)])
        try:
            quota_creations_take(owner_id=owner_id, new_per_topic={topic: 1})
        except QuotaExceeded:  # a retry of a create that made its job still gets that job
            existing = timeout_job_pending_by_key(topic=topic, biz_type=biz_type, biz_id=biz_id)
            if existing is None:
                raise
            return existing, False
    for _ in range(3):  # the pending job fired or was cancelled in between: try again
        try:
            job = timeout_job_create(
                topic=topic,
                biz_type=biz_type,
                biz_id=biz_id,
                action_time=action_time,
                attribute=attribute,
                recurrence=recurrence,
                owner_id=owner_id,
            )
            return job, True
        except TimeoutJobConflict:
            existing = timeout_job_pending_by_key(topic=topic, biz_type=biz_type, biz_id=biz_id)
            if existing is not None:
                return existing, False
    raise TimeoutJobConflict(message=f"A job for {biz_type}:{biz_id} keeps changing; retry.")


def timeout_job_pending_by_key(*, topic: str, biz_type: str, biz_id: str) -> TimeoutJob | None:
    return TimeoutJob.objects.filter(
        topic=topic, biz_type=biz_type, biz_id=biz_id, status=Status.PENDING
    ).first()


class Indexable(Protocol):
    """What scheduling a job needs: a model instance or a bulk create's ``BulkJob``."""

    @property
    def job_id(self) -> int: ...

    @property
    def topic(self) -> str: ...

    @property
    def action_time(self) -> datetime: ...

    @property
    def slot(self) -> int: ...


def timeout_jobs_index_on_commit(jobs: Sequence[Indexable], specs: dict) -> None:
    """Schedule these new jobs' entries (``specs``: their topics' specs) once the transaction
    commits."""
    by_topic: dict[str, list[tuple[str, int, int]]] = {}
    for job in jobs:
        by_topic.setdefault(job.topic, []).append(
            (str(job.job_id), epoch_ms(job.action_time), job.slot)
        )

    def index() -> None:
        for topic, items in by_topic.items():
            queue.record_layout(topic, specs[topic].slots)
            queue.schedule_many(topic, items)

    if by_topic:
        transaction.on_commit(index)


def _pending_by_pk(pk: int) -> Q:
    """The job ``pk`` while it is pending, in a form PostgreSQL finds by the primary key.

    ``status = 0`` is the predicate of the partial indexes of pending jobs: with statistics taken
    while few jobs were pending, the planner picks ``timeoutjob_due`` for ``pk = X AND status = 0``
    and walks every pending job (11 ms a cancel with 100,000 pending). ``status <= 0`` means the
    same (pending is the lowest status; the column is checked ``>= 0``) and matches no partial
    index, so the primary key is the only way in."""
    return Q(pk=pk, status__lte=Status.PENDING)


def timeout_job_reschedule(*, job: TimeoutJob, action_time: datetime) -> TimeoutJob:
    """Move a pending job to ``action_time``. A job that is firing (or fired, or was cancelled)
    is refused with ``not_pending``: cancel and reschedule racing the firing have exactly one
    outcome, since the handler fires only rows it moved from pending to running itself."""
    with transaction.atomic():
        pending = TimeoutJob.objects.filter(_pending_by_pk(job.pk))
        moved = retry_if_moved(
            lambda: pending.update(action_time=action_time, gmt_modified=timezone.now())
        )
        job.refresh_from_db()
        if not moved:
            raise BusinessError(
                "not_pending", f"Job {job.pk} is {job.get_status_display().lower()}."
            )
        due_ms = epoch_ms(action_time)
        transaction.on_commit(
            lambda: queue.schedule(job.topic, str(job.job_id), due_ms, slot=job.slot)
        )
    return job


def timeout_job_cancel(*, job: TimeoutJob) -> TimeoutJob:
    """Cancel a pending job; a job that already fired or was cancelled is left as it is."""
    pending = TimeoutJob.objects.filter(_pending_by_pk(job.pk))
    cancelled = retry_if_moved(
        lambda: pending.update(status=TimeoutJob.Status.CANCELLED, gmt_modified=timezone.now())
    )
    job.refresh_from_db()
    if not cancelled:
        raise BusinessError("not_pending", f"Job {job.pk} is {job.get_status_display().lower()}.")
    transaction.on_commit(lambda: queue.cancel(job.topic, str(job.job_id), slot=job.slot))
    return job


def timeout_job_end(*, job: TimeoutJob, reason: str, by: str) -> TimeoutJob:
    """Staff end a job that is pending or stuck running: cancelled, with who and why in its
    ``last_error`` and history, and its entry out of Redis. A worker still firing it can no
    longer settle it (the row is not running under its attempt), nor create a next occurrence.
    A row another transaction holds is refused (``busy``) after ``END_LOCK_TIMEOUT_MS``, never
    waited on for longer; one that fired or was cancelled already is ``not_live``."""
    reason = " ".join(reason.split())
    if not reason:
        raise ValidationError({"reason": ["Say why the job is ended."]})
    text = f"ended by {by}: {reason}"[:500]
    now = timezone.now()
    append = HISTORY_APPEND[connection.vendor == "postgresql"]

    def end() -> bool:
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"SET LOCAL lock_timeout = {END_LOCK_TIMEOUT_MS}")
            cursor.execute(
                f"UPDATE {TimeoutJob._meta.db_table} SET status = %s, last_error = %s, "
                f"gmt_modified = %s, history = {append} WHERE job_id = %s AND status IN (%s, %s) "
                "RETURNING job_id",
                [
                    Status.CANCELLED,
                    text,
                    connection.ops.adapt_datetimefield_value(now),
                    job.attempts,
                    now.isoformat(),
                    "ended",
                    text,
                    job.pk,
                    Status.PENDING,
                    Status.RUNNING,
                ],
            )
            return cursor.fetchone() is not None

    try:
        ended = retry_if_moved(end)
    except OperationalError as exc:
        if getattr(exc.__cause__, "pgcode", None) != LOCK_NOT_AVAILABLE:
            raise
        raise BusinessError(
            "busy", f"Job {job.pk} is held by another transaction; try again."
        ) from exc
    job.refresh_from_db()
    if not ended:
        raise BusinessError("not_live", f"Job {job.pk} is {job.get_status_display().lower()}.")
    logger.warning("job %s ended by %s: %s", job.pk, by, reason)
    transaction.on_commit(lambda: queue.cancel(job.topic, str(job.job_id), slot=job.slot))
    return job


END_LOCK_TIMEOUT_MS = 2000
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's error code for a lock timeout
# history || [{"attempt", "at", "outcome", "error"}], per database (False: SQLite's JSON1).
HISTORY_APPEND = {
    True: "COALESCE(history, '[]'::jsonb) || jsonb_build_array(jsonb_build_object("
    "'attempt', %s::int, 'at', %s::text, 'outcome', %s::text, 'error', %s::text))",
    False: "json_insert(COALESCE(history, '[]'), '$[#]', json_object("
    "'attempt', %s, 'at', %s, 'outcome', %s, 'error', %s))",
}


def timeout_jobs_rebuild(
    *, due_before: datetime | None = None, progress: Callable[[int], None] | None = None
) -> int:
    """Re-index pending jobs (all, or those due before ``due_before``) into Redis; idempotent.

    Uses the engine's NX mode: a job already in store, prepare or dead is left alone.
    """
    # Running rows too: a worker that died while firing leaves them running, and their entries
    # must come back if Redis lost them.
    pending = TimeoutJob.objects.filter(status__in=(Status.PENDING, Status.RUNNING))
    if due_before is not None:
        pending = pending.filter(action_time__lt=due_before)
    return rebuild_rows(
        pending,
        ("topic", "action_time", "slot"),
        lambda r: (r[1], (str(r[0]), epoch_ms(r[2]), r[3])),
        progress=progress,
    )
