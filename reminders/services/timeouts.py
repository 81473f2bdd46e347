"""Generic timeout jobs (docs/timeouts.md): create, cancel, rebuild. Firing them is
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

import io
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from couponcenter.core import tracing
from couponcenter.core.errors import BusinessError, QuotaExceeded
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.keys import slot_for
from reminders.models import TimeoutJob
from reminders.recurrence import budget, vetting
from reminders.selectors.topics import timeout_topic_spec, timeout_topic_specs
from reminders.services.quotas import quota_attributes_check, quota_creations_take
from reminders.topic_specs import slot_basis

REBUILD_CHUNK = 5000
logger = logging.getLogger(__name__)


class TimeoutJobConflict(BusinessError):
    code = "duplicate"


# Most jobs one bulk create may carry (one transaction, one INSERT per chunk).
BULK_MAX = 10_000
BULK_CHUNK = 2000
Status = TimeoutJob.Status


def _first_time(rule: str, action_time: datetime, *, vetted: bool = False) -> datetime:
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


def _spec_or_error(topic: str):
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
    spec = _spec_or_error(topic)
    series_start = action_time if recurrence else None
    if recurrence:
        action_time = _first_time(recurrence, action_time)
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
            job = timeout_job_create(topic=topic, biz_type=biz_type, biz_id=biz_id,
                                     action_time=action_time, attribute=attribute,
                                     recurrence=recurrence, owner_id=owner_id)  # fmt: skip
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


class BulkJob(NamedTuple):
    """A job the bulk create made (the fields its answer and the Redis index need: building
    10,000 model instances would cost more than inserting them)."""

    job_id: int
    topic: str
    biz_type: str
    biz_id: str
    action_time: datetime
    slot: int


def timeout_jobs_bulk_create(
    jobs: list[dict[str, Any]], *, owner_id: int | None = None
) -> list[tuple[BulkJob | TimeoutJob, bool]]:
    """Create up to ``BULK_MAX`` jobs in one transaction, indexed in Redis once it commits.

    Idempotent per job as ``timeout_job_ensure``: a key with a pending job gives that job
    (``created`` False). The same key twice in one request is a ValidationError; a create racing
    this one on the same key rolls the whole request back (``TimeoutJobConflict``; retry it).
    Returns ``(job, created)`` in the order given: a ``BulkJob`` for a new one, the pending
    ``TimeoutJob`` for an existing one. ``owner_id``: the account they are created for (None:
    staff and code), whose quotas they count against (``services.quotas``): over one, nothing
    is created.
    """
    if len(jobs) > BULK_MAX:
        raise ValidationError({"jobs": [f"At most {BULK_MAX:,} jobs per request."]})
    keys = [(j["topic"], j["biz_type"], j["biz_id"]) for j in jobs]
    if len(set(keys)) != len(keys):
        seen, dupes = set(), []
        for key in keys:
            if key in seen:
                dupes.append(":".join(key))
            seen.add(key)
        raise ValidationError({"jobs": [f"Repeated business keys: {', '.join(dupes[:5])}."]})
    specs = {topic: _spec_or_error(topic) for topic in {k[0] for k in keys}}
    jobs = _with_series_starts(jobs)
    if owner_id is not None:
        quota_attributes_check(
            by_field=[(f"jobs.{i}.attribute", j.get("attribute")) for i, j in enumerate(jobs)]
        )
    with transaction.atomic():
        existing = _pending_by_keys(keys)
        fresh = [j for j, key in zip(jobs, keys, strict=True) if key not in existing]
        if owner_id is not None and fresh:
            quota_creations_take(
                owner_id=owner_id, new_per_topic=Counter(j["topic"] for j in fresh)
            )
        try:
            with transaction.atomic():
                new = _insert_jobs(fresh, specs, owner_id)
        except IntegrityError as exc:
            raise TimeoutJobConflict(
                message="Another request created a job for one of these keys meanwhile; retry."
            ) from exc
        _index_on_commit(new, specs)
    made = {(j.topic, j.biz_type, j.biz_id): j for j in new}
    return [(made[key], True) if key in made else (existing[key], False) for key in keys]


def _with_series_starts(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs, each recurring one starting when its series does (``series_start`` its given
    action time): each distinct rule vetted once, at most ``vetting.BULK_MAX_RULES`` of them,
    and all of it within ``vetting.REQUEST_LIMIT_BUDGETS`` budgets of time."""
    rules = {j.get("recurrence") or "" for j in jobs} - {""}
    if not rules:
        return jobs
    if len(rules) > vetting.BULK_MAX_RULES:
        most = vetting.BULK_MAX_RULES
        raise ValidationError({"jobs": [f"At most {most} distinct recurrence rules per request."]})
    deadline = time.monotonic() + vetting.request_limit_s()
    vetted: set[str] = set()
    starts: dict[tuple[str, datetime], datetime] = {}
    out = []
    for j in jobs:
        rule = j.get("recurrence") or ""
        if rule:
            at = j["action_time"]
            if (rule, at) not in starts:
                if time.monotonic() > deadline:
                    raise ValidationError({"jobs": [
                        "Its recurrence rules take too long to check: send fewer distinct rules "
                        "or start times per request."]})  # fmt: skip
                starts[(rule, at)] = _first_time(rule, at, vetted=rule in vetted)
                vetted.add(rule)
            j = {**j, "series_start": at, "action_time": starts[(rule, at)]}
        out.append(j)
    return out


_INSERT_COLUMNS = ("topic", "biz_type", "biz_id", "status", "action_time", "attribute", "slot",
                   "attempts", "last_error", "recurrence", "series_start", "gmt_create",
                   "gmt_modified", "traceparent")  # fmt: skip


def _insert_jobs(jobs: list[dict[str, Any]], specs: dict, owner_id: int | None) -> list[BulkJob]:
    """The rows in as few statements as the database allows: on PostgreSQL the ids from the
    sequence in one query and the rows in one ``COPY``; elsewhere a multi-row ``INSERT ...
    RETURNING`` per chunk. (The ORM's bulk_create spends more time preparing 10,000 rows than
    the database spends writing them; a 10,000-row INSERT spends most of its time quoting.)"""
    if not jobs:
        return []
    if connection.vendor == "postgresql":
        return _copy_jobs(jobs, specs, owner_id)
    adapt = connection.ops.adapt_datetimefield_value  # db_time, looked up once for 10,000 rows
    now = adapt(timezone.now())
    traced = tracing.current_traceparent()  # the request's, for every job it makes
    rows, made = [], []
    for j in jobs:
        spec, attribute = specs[j["topic"]], j.get("attribute") or {}
        at, rule = j["action_time"], j.get("recurrence") or ""
        slot = slot_for(
            slot_basis(spec, j["biz_type"], j["biz_id"], attribute, owner_id=owner_id), spec.slots
        )
        rows.append((j["topic"], j["biz_type"], j["biz_id"], Status.PENDING, adapt(at),
                     json.dumps(attribute), slot, 0, "", rule,
                     adapt(j["series_start"]) if rule else None,
                     now, now, traced))  # fmt: skip
        made.append(BulkJob(0, j["topic"], j["biz_type"], j["biz_id"], at, slot))
    table = TimeoutJob._meta.db_table
    ids: dict[tuple[str, str, str], int] = {}
    with connection.cursor() as cursor:
        for start in range(0, len(rows), BULK_CHUNK):
            chunk = rows[start : start + BULK_CHUNK]
            values = ",".join([f"({','.join(['%s'] * len(_INSERT_COLUMNS))})"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(_INSERT_COLUMNS)}) VALUES {values} "
                "RETURNING job_id, topic, biz_type, biz_id",
                [value for row in chunk for value in row],
            )
            # Matched by key (unique in one request), not by order: SQLite does not promise it.
            ids.update({(t, b, i): pk for pk, t, b, i in cursor.fetchall()})
    return [job._replace(job_id=ids[(job.topic, job.biz_type, job.biz_id)]) for job in made]


def _copy_jobs(jobs: list[dict[str, Any]], specs: dict, owner_id: int | None) -> list[BulkJob]:
    table = TimeoutJob._meta.db_table
    now = timezone.now().isoformat()
    traced = tracing.current_traceparent()  # the request's, for every job it makes
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'job_id')) FROM generate_series(1, %s)",
            [table, len(jobs)],
        )
        ids = [row[0] for row in cursor.fetchall()]
        lines, made = [], []
        for pk, j in zip(ids, jobs, strict=True):
            spec, attribute = specs[j["topic"]], j.get("attribute") or {}
            at, rule = j["action_time"], j.get("recurrence") or ""
            slot = slot_for(
                slot_basis(spec, j["biz_type"], j["biz_id"], attribute, owner_id=owner_id),
                spec.slots,
            )
            when = at.isoformat()
            fields = (str(pk), _copy_text(j["topic"]), _copy_text(j["biz_type"]),
                      _copy_text(j["biz_id"]), str(Status.PENDING), when,
                      _copy_text(json.dumps(attribute)) if attribute else "{}", str(slot), "0", "",
                      _copy_text(rule),
                      j["series_start"].isoformat() if rule else "\\N", now, now,
                      traced)  # fmt: skip
            lines.append("\t".join(fields))
            made.append(BulkJob(pk, j["topic"], j["biz_type"], j["biz_id"], at, slot))
        data = io.StringIO("\n".join(lines) + "\n")
        with connection.wrap_database_errors:  # a unique violation is Django's IntegrityError
            cursor.cursor.copy_expert(
                f"COPY {table} (job_id, {', '.join(_INSERT_COLUMNS)}) FROM STDIN", data
            )
    return made


def _copy_text(value: str) -> str:
    """A value in COPY's text format (backslash, tab, newline and carriage return escaped)."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
                 .replace("\r", "\\r"))  # fmt: skip
    return value


def _pending_by_keys(keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], TimeoutJob]:
    found: dict[tuple[str, str, str], TimeoutJob] = {}
    by_type: dict[tuple[str, str], list[str]] = {}
    for topic, biz_type, biz_id in keys:
        by_type.setdefault((topic, biz_type), []).append(biz_id)
    for (topic, biz_type), ids in by_type.items():
        if connection.vendor == "postgresql":
            # One statement with an array parameter, not 2,000 placeholders a chunk to parse.
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT job_id FROM {TimeoutJob._meta.db_table} WHERE biz_type = %s "
                    "AND biz_id = ANY(%s) AND topic = %s AND status = %s",
                    [biz_type, ids, topic, Status.PENDING],
                )
                pks = [row[0] for row in cursor.fetchall()]
            rows = TimeoutJob.objects.filter(pk__in=pks) if pks else []
            found.update({(j.topic, j.biz_type, j.biz_id): j for j in rows})
            continue
        for start in range(0, len(ids), BULK_CHUNK):
            rows = TimeoutJob.objects.filter(
                topic=topic, biz_type=biz_type, biz_id__in=ids[start : start + BULK_CHUNK],
                status=Status.PENDING,
            )  # fmt: skip
            found.update({(j.topic, j.biz_type, j.biz_id): j for j in rows})
    return found


def _index_on_commit(jobs: list[TimeoutJob], specs: dict) -> None:
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
        moved = TimeoutJob.objects.filter(_pending_by_pk(job.pk)).update(
            action_time=action_time, gmt_modified=timezone.now()
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
    cancelled = TimeoutJob.objects.filter(_pending_by_pk(job.pk)).update(
        status=TimeoutJob.Status.CANCELLED, gmt_modified=timezone.now()
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
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"SET LOCAL lock_timeout = {END_LOCK_TIMEOUT_MS}")
            cursor.execute(
                f"UPDATE {TimeoutJob._meta.db_table} SET status = %s, last_error = %s, "
                f"gmt_modified = %s, history = {append} WHERE job_id = %s AND status IN (%s, %s) "
                "RETURNING job_id",
                [Status.CANCELLED, text, connection.ops.adapt_datetimefield_value(now),
                 job.attempts, now.isoformat(), "ended", text, job.pk, Status.PENDING,
                 Status.RUNNING],
            )  # fmt: skip
            ended = cursor.fetchone() is not None
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
    """Rebuild pending jobs (all, or those due before ``due_before``) in Redis; idempotent.

    Uses the engine's NX mode: a job already in store, prepare or dead is left alone.
    """
    # Running rows too: a worker that died while firing leaves them running, and their entries
    # must come back if Redis lost them.
    pending = TimeoutJob.objects.filter(status__in=(Status.PENDING, Status.RUNNING))
    if due_before is not None:
        pending = pending.filter(action_time__lt=due_before)
    added, last_pk = 0, 0
    while True:
        chunk = list(
            pending.filter(pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", "topic", "action_time", "slot")[:REBUILD_CHUNK]
        )
        if not chunk:
            return added
        by_topic: dict[str, list[tuple[str, int, int]]] = {}
        for pk, topic, action_time, slot in chunk:
            by_topic.setdefault(topic, []).append((str(pk), epoch_ms(action_time), slot))
        for topic, items in by_topic.items():
            queue.record_layout_covering(topic, [slot for _, _, slot in items])
            added += queue.schedule_many(topic, items, nx=True)
        last_pk = chunk[-1][0]
        if progress is not None:
            progress(len(chunk))


def timeout_jobs_next_times(
    jobs: list[TimeoutJob], *, now: datetime, topic: str = ""
) -> tuple[dict[int, datetime | None], dict[int, str]]:
    """The next occurrence of each recurring job in ``jobs`` (about to settle), evaluated under
    the recurrence budget in the child process of ``topic`` (``budget.calculator``, one a
    topic, so a tenant's costly rules hold up only its own topic): never in a transaction, never
    in this process. Returns the times (None: the series is over) and the reasons of the series
    that end: a rule past the budget, one that no longer parses, or a child that failed (each
    is marked and alerted, never dropped silently). The next occurrence comes after the one that
    fired and after ``now``: what fell due while nothing ran is not replayed. Jobs of one series
    start fired together are evaluated once."""
    times: dict[int, datetime | None] = {}
    ended: dict[int, str] = {}
    known: dict[tuple[str, datetime, datetime], datetime | None | str] = {}
    calc = budget.calculator(topic) if any(job.recurrence for job in jobs) else None
    for job in jobs:
        if not job.recurrence:
            continue
        query = (job.recurrence, job.series_start or job.action_time, max(job.action_time, now))
        if query not in known:
            try:
                known[query] = calc.next_after(*query).at
            except budget.Exceeded as exc:
                known[query] = f"series ended: its next occurrence was {exc}"
            except ValueError as exc:
                known[query] = f"series ended: its recurrence no longer parses ({exc})"
            except OSError as exc:
                known[query] = f"series ended: its recurrence could not be evaluated ({exc})"
        if isinstance(known[query], str):
            ended[job.pk] = known[query]
        else:
            times[job.pk] = known[query]
    return times, ended


def timeout_jobs_next_occurrences(
    fired: list[TimeoutJob], times: dict[int, datetime | None]
) -> list[TimeoutJob]:
    """The next occurrence of each recurring job in ``fired`` (just settled: processed or dead)
    at its time in ``times`` (``timeout_jobs_next_times``), created pending in the caller's
    transaction and indexed once it commits. A series whose rule has no later time ends; a key
    that has a pending job already (created through the API meanwhile) keeps that one and the
    series ends there, logged."""
    made = []
    specs = timeout_topic_specs()
    for job in fired:
        spec = specs.get(job.topic)
        at = times.get(job.pk)
        if not job.recurrence or spec is None or at is None:
            continue
        successor = TimeoutJob(
            topic=job.topic, biz_type=job.biz_type, biz_id=job.biz_id, action_time=at,
            attribute=job.attribute, recurrence=job.recurrence,
            series_start=job.series_start or job.action_time,
            slot=job.slot & (spec.slots - 1),  # its series' slot (the creator's fair key)
        )  # fmt: skip
        try:
            with transaction.atomic():
                successor.save()
        except IntegrityError:
            logger.warning("job %s: a pending job holds its key; the series ends there", job.pk)
            continue
        made.append(successor)
    if made:
        _index_on_commit(made, specs)
    return made
