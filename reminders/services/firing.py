"""The rows of generic timeout jobs as they fire: taken, settled, ended, dead, and the next
occurrence of a recurring one. The handler that fires them (``handlers.timeout_jobs``) calls
these; each is one statement or one transaction, written for PostgreSQL and for SQLite.

Invariants:
- the row's status changes with conditional UPDATEs (``status = PENDING``, or ``RUNNING`` under
  the attempt that took it), so a redelivered job whose row was already processed is dropped,
  not run twice;
- the attempt in the row is the fence of what fired: only the worker whose take recorded it
  settles the row, so a worker that stalled and resumed cannot settle a job another worker took
  over since (that take recorded a higher attempt).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from couponcenter.core.db.row_movement import retry_if_moved
from couponcenter.core.db.times import aware_time, db_time
from reminders.engine.clock import epoch_ms
from reminders.engine.scripts import Claimed
from reminders.models import TimeoutJob
from reminders.recurrence import budget
from reminders.selectors.timeout_topics import timeout_topic_specs

from .timeouts import HISTORY_APPEND, timeout_jobs_index_on_commit

logger = logging.getLogger(__name__)
Status = TimeoutJob.Status
LIVE = (Status.PENDING, Status.RUNNING)
TABLE = TimeoutJob._meta.db_table
# An action time stored with microseconds is due in the millisecond its entry was scored with.
DUE_SLACK_MS = 1
DEAD_LOCK_TIMEOUT_MS = 2000
# The columns a take returns: the fields of the ``TimeoutJob`` it fires.
_TAKE_FIELDS = (
    "job_id",
    "topic",
    "biz_type",
    "biz_id",
    "action_time",
    "attribute",
    "slot",
    "attempts",
    "recurrence",
    "series_start",
    "traceparent",
)
# The rows a take moves (False: SQLite, which locks the whole database, not rows). The status
# outside the subquery too: it keeps the UPDATE to the live partition (reminders/partition_layout).
_TAKE_WHERE = {
    True: f"job_id IN (SELECT job_id FROM {TABLE} WHERE job_id IN ({{ids}}) "
    f"AND status IN (%s, %s) FOR UPDATE SKIP LOCKED) AND status IN {tuple(map(int, LIVE))}",
    False: "job_id IN ({ids}) AND status IN (%s, %s)",
}


def timeout_jobs_take_rows(due: dict[int, Claimed]) -> tuple[list[TimeoutJob], set[int]]:
    """Pending (or running: a redelivery after a worker died or stalled) rows of these entries,
    moved to running with the entry's attempt in one ``UPDATE ... RETURNING`` per attempt count
    (nearly always one); rows rescheduled past their entry's due time go back to pending and
    are not returned. Returns the jobs taken, in the claim's order, and the ids of the live rows
    another transaction holds locked: skipped, never waited for (on PostgreSQL), since the
    dispatch loop takes a suspect itself and must not stop behind a row lock."""
    if not due:
        return [], set()
    by_attempt: dict[int, list[int]] = defaultdict(list)
    for pk, entry in due.items():
        by_attempt[entry.attempt].append(pk)
    rows = []
    where = _TAKE_WHERE[connection.vendor == "postgresql"]
    with connection.cursor() as cursor:
        for attempt, job_ids in by_attempt.items():
            ids = ",".join(["%s"] * len(job_ids))
            rows += _fetch_all(
                cursor,
                f"UPDATE {TABLE} SET status = %s, attempts = %s, gmt_modified = %s "
                f"WHERE {where.format(ids=ids)} RETURNING {', '.join(_TAKE_FIELDS)}",
                [
                    Status.RUNNING,
                    attempt,
                    db_time(timezone.now()),
                    *job_ids,
                    Status.PENDING,
                    Status.RUNNING,
                ],
            )
        busy: set[int] = set()
        missing = set(due) - {row[0] for row in rows}
        if missing and connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT job_id FROM {TABLE} WHERE job_id IN ({','.join(['%s'] * len(missing))})"
                " AND status IN (%s, %s)",
                [*missing, Status.PENDING, Status.RUNNING],
            )
            busy = {row[0] for row in cursor.fetchall()}
    jobs, moved = [], []
    for row in rows:
        values = dict(zip(_TAKE_FIELDS, row, strict=True))
        values["action_time"] = aware_time(values["action_time"])
        if values["series_start"] is not None:
            values["series_start"] = aware_time(values["series_start"])
        if isinstance(values["attribute"], str):  # SQLite returns JSON text from raw SQL
            values["attribute"] = json.loads(values["attribute"])
        job = TimeoutJob(status=Status.RUNNING, **values)
        entry = due[job.pk]
        if entry.due_ms and epoch_ms(job.action_time) > entry.due_ms + DUE_SLACK_MS:
            moved.append(job.pk)
        else:
            jobs.append(job)
    if moved:
        back = TimeoutJob.objects.filter(pk__in=moved, status=Status.RUNNING)
        retry_if_moved(lambda: back.update(status=Status.PENDING))
    order = {pk: i for i, pk in enumerate(due)}  # the claim's order: due time, oldest first
    return sorted(jobs, key=lambda job: order[job.pk]), busy


def timeout_jobs_settle(
    fired: list[tuple[TimeoutJob, int, str | None]],
    *,
    max_attempts: int,
    times: dict[int, datetime | None],
    ended: dict[int, str],
) -> tuple[set[int], dict[int, str]]:
    """Record what fired, as ``(job, attempt, error)`` (``None``: it succeeded), in one
    transaction: each row still running under its attempt is processed, or pending again with
    its error, or dead at ``max_attempts``, the attempt appended to its history; each recurring
    job processed or dead gets its next occurrence at its time in ``times``
    (``timeout_jobs_next_times``), and those whose series ends (``ended``) say why. Returns the
    ids settled and the series that ended among them."""
    settled: set[int] = set()
    final: set[int] = set()  # processed or dead: a recurring job's next occurrence is due
    by_outcome: dict[tuple[int, str | None], list[int]] = defaultdict(list)
    for job, attempt, error in fired:
        by_outcome[(attempt, error)].append(job.pk)
    with transaction.atomic():
        for (attempt, error), job_ids in by_outcome.items():
            if error is None:
                rows = _settle_rows(job_ids, attempt, outcome="fired", status=Status.PROCESSED)
                final |= rows
            else:
                dead = attempt >= max_attempts
                rows = _settle_rows(
                    job_ids,
                    attempt,
                    outcome="dead" if dead else "failed",
                    error=error,
                    last_error=error,
                    status=Status.DEAD if dead else Status.PENDING,
                )
                final |= rows if dead else set()
            settled |= rows
        # In the transaction that records the firing: created once, never lost.
        timeout_jobs_next_occurrences([job for job, _, _ in fired if job.pk in final], times)
        ended = {pk: reason for pk, reason in ended.items() if pk in final}
        _mark_ended(ended, {job.pk: attempt for job, attempt, _ in fired})
    return settled, ended


def _settle_rows(
    job_ids: list[int], attempt: int, *, outcome: str, error: str | None = None, **sets: Any
) -> set[int]:
    """``UPDATE ... SET <sets>`` the rows still running under ``attempt``, appending the attempt
    to their ``history``; returns their ids."""
    if not job_ids:
        return set()
    columns = ", ".join(f"{name} = %s" for name in sets)
    append = HISTORY_APPEND[connection.vendor == "postgresql"]
    now = timezone.now()
    with connection.cursor() as cursor:
        rows = _fetch_all(
            cursor,
            f"UPDATE {TABLE} SET {columns}, gmt_modified = %s, history = {append} "
            f"WHERE job_id IN ({','.join(['%s'] * len(job_ids))}) AND status = %s "
            "AND attempts = %s RETURNING job_id",
            [
                *sets.values(),
                db_time(now),
                attempt,
                now.isoformat(),
                outcome,
                error or "",
                *job_ids,
                Status.RUNNING,
                attempt,
            ],
        )
        return {row[0] for row in rows}


def _fetch_all(cursor, sql: str, params: list) -> list[tuple]:
    """Run ``sql`` and fetch its rows, again if it met a row another transaction moved between
    partitions (``row_movement``): each row's outcome is then decided by its current status."""

    def run() -> list[tuple]:
        cursor.execute(sql, params)
        return cursor.fetchall()

    return retry_if_moved(run)


def _mark_ended(ended: dict[int, str], attempts: dict[int, int]) -> None:
    """The jobs whose series ended (settled already): the reason in ``last_error`` and in their
    history, as an outcome of its own."""
    now = timezone.now()
    append = HISTORY_APPEND[connection.vendor == "postgresql"]
    with connection.cursor() as cursor:
        for pk, reason in ended.items():
            cursor.execute(
                f"UPDATE {TABLE} SET last_error = %s, gmt_modified = %s, history = {append} "
                "WHERE job_id = %s",
                [reason, db_time(now), attempts[pk], now.isoformat(), "series_ended", reason, pk],
            )


def timeout_jobs_mark_dead(job_ids: list[int], *, error: str) -> int:
    """Live rows of these jobs go dead with ``error``; returns how many did. Called from the
    dispatch loop's reaper, which must not wait on a row another transaction holds: past
    ``DEAD_LOCK_TIMEOUT_MS`` this fails (and the row says what it said)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = {DEAD_LOCK_TIMEOUT_MS}")
        live = TimeoutJob.objects.filter(pk__in=job_ids, status__in=LIVE)
        return retry_if_moved(
            lambda: live.update(status=Status.DEAD, last_error=error, gmt_modified=timezone.now())
        )


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
        if not job.recurrence or calc is None:
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
        found = known[query]
        if isinstance(found, str):
            ended[job.pk] = found
        else:
            times[job.pk] = found
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
            topic=job.topic,
            biz_type=job.biz_type,
            biz_id=job.biz_id,
            action_time=at,
            attribute=job.attribute,
            recurrence=job.recurrence,
            series_start=job.series_start or job.action_time,
            slot=job.slot & (spec.slots - 1),  # its series' slot (the creator's fair key)
        )
        try:
            with transaction.atomic():
                successor.save()
        except IntegrityError:
            logger.warning("job %s: a pending job holds its key; the series ends there", job.pk)
            continue
        made.append(successor)
    if made:
        timeout_jobs_index_on_commit(made, specs)
    return made
