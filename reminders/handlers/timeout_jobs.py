"""Firing generic timeout jobs: the engine handler of every generic topic (``TimeoutTopic`` rows
and ``settings.TIMEOUT_TOPICS``), what their executors fire, and how the results settle.

Invariants:
- a job fires at least once: it leaves Redis only when its action succeeded (ack), was dropped
  because its row is no longer pending, or went dead after ``max_attempts`` (the row says DEAD);
- the row's status changes with conditional UPDATEs (``status = PENDING``), so a redelivered job
  whose row was already processed is dropped, not run twice.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import requests
from celery import current_app
from django.db import connection, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from couponcenter.core import tracing
from couponcenter.core.db.times import aware_time, db_time
from couponcenter.core.webhooks import post_signed
from reminders import metrics
from reminders.alerts import raise_alert
from reminders.engine import queue
from reminders.engine.queue import epoch_ms as queue_epoch_ms
from reminders.engine.scripts import Claimed
from reminders.engine.topic_model import DROP, HANDED_ON, Result, Retry
from reminders.handlers.executors import Fired
from reminders.models import TimeoutJob
from reminders.services.timeouts import (
    HISTORY_APPEND,
    timeout_jobs_next_occurrences,
    timeout_jobs_next_times,
)
from reminders.timeout_topic_rules import TimeoutTopicSpec

if TYPE_CHECKING:
    from reminders.runtime.executors import TopicExecutors

logger = logging.getLogger(__name__)
Status = TimeoutJob.Status
LIVE = (Status.PENDING, Status.RUNNING)
TABLE = TimeoutJob._meta.db_table
# An action time stored with microseconds is due in the millisecond its entry was scored with.
DUE_SLACK_MS = 1


def timeout_jobs_handle(
    topic: str, entries: Sequence[Claimed], slot: int, *, executors: TopicExecutors
) -> dict[str, Result]:
    """The engine handler of a generic topic: take the claimed jobs' rows and hand the jobs to
    the topic's executor, which fires and settles them (``settle_fired``) off the dispatch loop.

    One statement takes the batch's rows from pending to running (``_take``); only the rows it
    took fire, so a cancel or a reschedule that committed first wins, and one that comes later
    is refused (``not_pending``): exactly one outcome. A row whose action time moved past the
    entry's due time (rescheduled while its old entry was being claimed) is put back and its
    entry dropped: the reschedule indexed the new time.

    An executor that holds (a threaded worker, ``TIMEOUT_HOLD_MS``) gets the entries as they
    are, claimed up to the hold before they fall due; it takes the rows the same way at each
    job's due time (``timeout_jobs_take``), so the outcomes are the same, decided later.
    """
    results: dict[str, Result] = {e.job_id: DROP for e in entries}
    executor = executors.get(topic)
    if executor is None:  # the topic is gone: nothing can fire its jobs
        return results
    # Taken and fired by the executor at each job's due time; a suspect (it comes alone, due
    # now) is taken here, so its quarantine begins before the loop claims again.
    if executor.holds and not any(e.suspect for e in entries):
        held = [e for e in entries if e.job_id.isdigit()]
        executor.hold(slot, held)
        results.update(dict.fromkeys((e.job_id for e in held), HANDED_ON))
        return results
    due = {int(e.job_id): e for e in entries if e.job_id.isdigit()}
    jobs, busy = _take(due)
    for job in jobs:
        results[str(job.pk)] = HANDED_ON
    for pk in busy:
        results[str(pk)] = Retry(BUSY)
    executor.submit(
        slot,
        [(job, due[job.pk].attempt) for job in jobs],
        suspect=any(due[job.pk].suspect for job in jobs),
    )
    return results


def timeout_jobs_take(
    spec: TimeoutTopicSpec, slot: int, entries: list[Claimed]
) -> list[tuple[TimeoutJob, int]]:
    """An executor's held entries fell due: take their rows (``_take``) and return the jobs to
    fire with their attempts. The entries whose rows were refused (cancelled, fired, or moved
    to a later time) are acked; when the database fails, every entry is retried with backoff
    (or left in flight for the reaper when Redis fails too)."""
    due = {int(e.job_id): e for e in entries}
    try:
        jobs, busy = _take(due)
    except Exception as exc:
        logger.exception("taking %d due jobs of %s failed", len(entries), spec.name)
        _retry_handed(spec, slot, entries, f"{exc.__class__.__name__}: {exc}"[:500])
        return []
    if busy:
        _retry_handed(spec, slot, [due[pk] for pk in busy], BUSY)
    taken = {job.pk for job in jobs} | busy
    refused = [e.job_id for e in entries if int(e.job_id) not in taken]
    if refused:
        try:
            queue.ack_handed_many(spec.name, {slot: refused})
        except Exception:  # left in flight: the reaper brings them back, and they are refused
            logger.exception("acking %d refused jobs of %s failed", len(refused), spec.name)
    return [(job, due[job.pk].attempt) for job in jobs]


def _retry_handed(spec: TimeoutTopicSpec, slot: int, entries: list[Claimed], error: str) -> None:
    queue.nack_handed(spec.name, slot, [(e.job_id, error) for e in entries],
                      now_ms=queue_epoch_ms(timezone.now()), max_attempts=spec.max_attempts,
                      backoff_base_ms=spec.backoff_base_ms,
                      backoff_cap_ms=spec.backoff_cap_ms)  # fmt: skip


def _take(due: dict[int, Claimed]) -> tuple[list[TimeoutJob], set[int]]:
    """Pending (or running: a redelivery after a worker died or stalled) rows of these entries,
    moved to running with the entry's attempt in one ``UPDATE ... RETURNING`` per attempt count
    (nearly always one); rows rescheduled past their entry's due time go back to pending and
    are not returned. Returns the jobs taken and the ids of the live rows another transaction
    holds locked: skipped, never waited for (on PostgreSQL), since the dispatch loop takes a
    suspect itself and must not stop behind a row lock; they are retried with backoff.

    The attempt in the row is the fence of what fired: only the worker whose take recorded it
    settles the row (``_settle_rows``), so a worker that stalled and resumed cannot settle a job
    another worker took over since (that take recorded a higher attempt).
    """
    if not due:
        return [], set()
    fields = ["job_id", "topic", "biz_type", "biz_id", "action_time", "attribute", "slot",
              "attempts", "recurrence", "series_start", "traceparent"]  # fmt: skip
    by_attempt: dict[int, list[int]] = defaultdict(list)
    for pk, entry in due.items():
        by_attempt[entry.attempt].append(pk)
    rows = []
    where = _TAKE_WHERE[connection.vendor == "postgresql"]
    with connection.cursor() as cursor:
        for attempt, job_ids in by_attempt.items():
            ids = ",".join(["%s"] * len(job_ids))
            cursor.execute(
                f"UPDATE {TABLE} SET status = %s, attempts = %s, gmt_modified = %s "
                f"WHERE {where.format(ids=ids)} RETURNING {', '.join(fields)}",
                [Status.RUNNING, attempt, db_time(timezone.now()), *job_ids, Status.PENDING,
                 Status.RUNNING],
            )  # fmt: skip
            rows += cursor.fetchall()
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
        values = dict(zip(fields, row, strict=True))
        values["action_time"] = aware_time(values["action_time"])
        if values["series_start"] is not None:
            values["series_start"] = aware_time(values["series_start"])
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
    return sorted(jobs, key=lambda job: order[job.pk]), busy


BUSY = "its row is locked by another transaction"
DEAD_LOCK_TIMEOUT_MS = 2000
# The rows a take moves (False: SQLite, which locks the whole database, not rows).
_TAKE_WHERE = {
    True: f"job_id IN (SELECT job_id FROM {TABLE} WHERE job_id IN ({{ids}}) "
    "AND status IN (%s, %s) FOR UPDATE SKIP LOCKED)",
    False: "job_id IN ({ids}) AND status IN (%s, %s)",
}


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
        cursor.execute(
            f"UPDATE {TABLE} SET {columns}, gmt_modified = %s, history = {append} "
            f"WHERE job_id IN ({','.join(['%s'] * len(job_ids))}) AND status = %s "
            "AND attempts = %s RETURNING job_id",
            [*sets.values(), db_time(now), attempt, now.isoformat(), outcome, error or "",
             *job_ids, Status.RUNNING, attempt],
        )  # fmt: skip
        return {row[0] for row in cursor.fetchall()}


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


def settle_fired(spec: TimeoutTopicSpec, fired: list[Fired]) -> dict[str, int]:
    """Settle what an executor fired, in bulk: the rows first (processed, or pending again with
    the error, or dead past ``max_attempts``), then the engine (ack, or nack with backoff: the
    engine's attempt count decides dead the same way), then one alert for the dead. Recurring
    jobs settle ``RECURRING_PER_SETTLE`` at a time, so the evaluation of their rules never keeps
    a whole batch unsettled until its visibility timeout."""
    chunks: list[list[Fired]] = [[]]
    recurring = 0
    for f in fired:
        if f.job.recurrence:
            if recurring == RECURRING_PER_SETTLE:
                chunks.append([])
                recurring = 0
            recurring += 1
        chunks[-1].append(f)
    counts: dict[str, int] = defaultdict(int)
    for chunk in chunks:
        for name, n in _settle_chunk(spec, chunk).items():
            counts[name] += n
    return dict(counts)


# Rule evaluations before a settle: each under a millisecond nearly always, and even all at the
# recurrence budget (12.5 s at 250 ms) inside a topic's visibility timeout.
RECURRING_PER_SETTLE = 50


def _settle_chunk(spec: TimeoutTopicSpec, fired: list[Fired]) -> dict[str, int]:
    settled: set[int] = set()
    final: set[int] = set()  # processed or dead: a recurring job's next occurrence is due
    by_outcome: dict[tuple[int, str | None], list[int]] = defaultdict(list)
    for f in fired:
        by_outcome[(f.attempt, f.error)].append(f.job.pk)
    # Evaluated before the transaction, under the recurrence budget: a rule holds no row lock.
    may_end = [f.job for f in fired if f.error is None or f.attempt >= spec.max_attempts]
    times, ended = timeout_jobs_next_times(may_end, now=timezone.now(), topic=spec.name)
    with transaction.atomic():
        for (attempt, error), job_ids in by_outcome.items():
            if error is None:
                rows = _settle_rows(job_ids, attempt, outcome="fired", status=Status.PROCESSED)
                final |= rows
            else:
                dead = attempt >= spec.max_attempts
                rows = _settle_rows(job_ids, attempt, outcome="dead" if dead else "failed",
                                    error=error, last_error=error,
                                    status=Status.DEAD if dead else Status.PENDING)  # fmt: skip
                final |= rows if dead else set()
            settled |= rows
        # In the transaction that records the firing: created once, never lost.
        timeout_jobs_next_occurrences([f.job for f in fired if f.job.pk in final], times)
        ended = {pk: reason for pk, reason in ended.items() if pk in final}
        _mark_ended(ended, {f.job.pk: f.attempt for f in fired})
    if ended:
        logger.error("%d recurring series of %s ended: %s", len(ended), spec.name,
                     next(iter(ended.values())), extra={"jobs": sorted(ended)[:20]})  # fmt: skip
        raise_alert(
            title=f"{len(ended)} recurring series ended: their rule ran past its budget or "
            "no longer parses",
            details={"topic": spec.name, "jobs": sorted(ended)[:20],
                     "error": next(iter(ended.values()))},
        )  # fmt: skip
    stale = [f for f in fired if f.job.pk not in settled]
    if stale:
        slots = sorted({f.slot for f in stale})
        logger.warning(
            "lease lost on %s:%s; dropping the batch in hand (%d jobs taken over by another "
            "worker)", spec.name, ",".join(map(str, slots)), len(stale),
        )  # fmt: skip
    fired = [f for f in fired if f.job.pk in settled]
    ok = [f for f in fired if f.error is None]
    failed = [f for f in fired if f.error is not None]
    acks: dict[int, list[str]] = defaultdict(list)
    for f in ok:
        acks[f.slot].append(str(f.job.pk))
    if acks:
        queue.ack_handed_many(spec.name, acks)
    nacks: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for f in failed:
        nacks[f.slot].append((str(f.job.pk), f.error))
    now_ms = queue_epoch_ms(timezone.now())
    for slot, items in nacks.items():
        queue.nack_handed(spec.name, slot, items, now_ms=now_ms, max_attempts=spec.max_attempts,
                          backoff_base_ms=spec.backoff_base_ms,
                          backoff_cap_ms=spec.backoff_cap_ms)  # fmt: skip
    dead = [f for f in failed if f.attempt >= spec.max_attempts]
    if failed:
        logger.warning(
            "%d timeout jobs failed (%d dead)", len(failed), len(dead),
            extra={"topic": spec.name, "jobs": [f.job.pk for f in failed[:20]],
                   "error": failed[0].error},
        )  # fmt: skip
    if dead:
        raise_alert(
            title=f"{len(dead)} timeout jobs dead after {spec.max_attempts} attempts",
            details={"topic": spec.name, "jobs": [f.job.pk for f in dead[:20]],
                     "error": dead[0].error},
        )  # fmt: skip
    metrics.record(
        spec.name,
        {"delivered": len(ok), "failed": len(failed) - len(dead), "dead": len(dead)},
        [max(0, f.fired_ms - queue_epoch_ms(f.job.action_time)) for f in ok],
    )
    if tracing.enabled():
        _trace_fired(spec, fired, dead={f.job.pk for f in dead})
    return {"acked": len(ok), "retried": len(failed) - len(dead), "dead": len(dead)}


def _trace_fired(spec: TimeoutTopicSpec, fired: list[Fired], *, dead: set[int]) -> None:
    """Each job that carries its scheduling call's trace gets a span there: due time to now."""
    for f in fired:
        outcome = "fired" if f.error is None else ("dead" if f.job.pk in dead else "retried")
        tracing.end_job_span(
            "timeout.fire", f.job.traceparent, due=f.job.action_time, outcome=outcome,
            attributes={"couponcenter.topic": spec.name, "couponcenter.job_id": f.job.pk,
                        "couponcenter.attempt": f.attempt, "couponcenter.topic_type": spec.type,
                        "couponcenter.error": f.error or ""},
        )  # fmt: skip


def job_payload(job: TimeoutJob) -> dict[str, Any]:
    return {
        "job_id": job.pk,
        "topic": job.topic,
        "biz_type": job.biz_type,
        "biz_id": job.biz_id,
        "action_time": job.action_time.isoformat(),
        "attribute": job.attribute,
    }


def fire_jobs(
    spec: TimeoutTopicSpec, jobs: list[TimeoutJob], session: requests.Session | None
) -> dict[int, str | None]:
    """Fire ``jobs`` by the topic's type; returns the error of each job that failed.

    - ``log``: one log line per job;
    - ``callable``: ``path(jobs)`` once; it may return ``{job_id: error}`` for jobs that failed
      (raising fails the whole batch);
    - ``celery``: one task for the batch, called with ``jobs=[payload, ...]``;
    - ``http``: a signed POST per job (the body is the job's payload), on the executor's session.
    """
    if spec.type == "log":
        for job in jobs:
            logger.info("timeout fired: %s %s:%s (job %s, due %s)", job.topic, job.biz_type,
                        job.biz_id, job.pk, job.action_time.isoformat(),
                        extra=job_payload(job))  # fmt: skip
        return {}
    if spec.type == "callable":
        answer = import_string(spec.path)(jobs) or {}
        return {int(job_id): str(error)[:500] for job_id, error in answer.items() if error}
    if spec.type == "celery":
        # A signature of a task this process knows honours task_always_eager; send_task never does.
        payloads = [job_payload(job) for job in jobs]
        current_app.signature(spec.task, kwargs={"jobs": payloads}).apply_async()
        return {}
    errors: dict[int, str | None] = {}
    for job in jobs:
        body = json.dumps(job_payload(job), sort_keys=True).encode()
        try:
            post_signed(spec.url, body, secret=spec.secret, session=session,
                        idempotency_key=f"{job.topic}:{job.pk}",
                        timeout_s=spec.timeout_ms / 1000, allow_http=spec.allow_http)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - any failure of the call is retried
            errors[job.pk] = f"{exc.__class__.__name__}: {exc}"[:500]
    return errors


def timeout_jobs_dead(topic: str, job_ids: list[str]) -> int:
    """The reaper sent these jobs to dead (their handler never finished): mark them DEAD."""
    ids = [int(j) for j in job_ids if j.isdigit()]
    # The reaper runs on the dispatch loop, which must not wait on a row another transaction
    # holds: past the lock timeout the reap fails, is logged, and the row says what it said.
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = {DEAD_LOCK_TIMEOUT_MS}")
        dead = TimeoutJob.objects.filter(pk__in=ids, status__in=LIVE).update(
            status=TimeoutJob.Status.DEAD, last_error="visibility timeout",
            gmt_modified=timezone.now(),
        )  # fmt: skip
    raise_alert(
        title=f"{len(job_ids)} timeout jobs dead: their handler never finished",
        details={"topic": topic, "jobs": ids[:20], "error": "visibility timeout"},
    )
    return dead
