"""Firing generic timeout jobs: the engine handler of every generic topic (``TimeoutTopic`` rows
and ``settings.TIMEOUT_TOPICS``), what their executors fire, and how the results settle. The
rows are written by ``services.firing``; this module orders the steps between the database, the
engine and the receivers.

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
from dataclasses import dataclass
from typing import Any, Protocol

from celery import current_app
from django.utils import timezone
from django.utils.module_loading import import_string

from couponcenter.core import tracing
from couponcenter.core.time import utc_text
from couponcenter.core.webhooks import OutboundPool, post_signed
from reminders import metrics
from reminders.alerts import headline, raise_alert
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.scripts import Claimed
from reminders.engine.topic_model import DROP, HANDED_ON, Result, Retry
from reminders.models import TimeoutJob
from reminders.services.firing import (
    timeout_jobs_mark_dead,
    timeout_jobs_next_times,
    timeout_jobs_settle,
    timeout_jobs_take_rows,
)
from reminders.timeout_topic_rules import TimeoutTopicSpec

logger = logging.getLogger(__name__)
BUSY = "its row is locked by another transaction"


@dataclass(frozen=True, slots=True)
class Fired:
    """A job an executor fired, waiting to be settled (``settle_fired``)."""

    slot: int
    job: TimeoutJob
    attempt: int
    error: str | None  # None: the action succeeded
    fired_ms: int


class Executor(Protocol):
    """What the handler hands a topic's jobs to (``runtime.topic_executor.TopicExecutor``)."""

    @property
    def holds(self) -> bool: ...

    def hold(self, slot: int, entries: list[Claimed]) -> None: ...

    def submit(
        self, slot: int, jobs: list[tuple[TimeoutJob, int]], *, suspect: bool = False
    ) -> None: ...


class Executors(Protocol):
    """This worker's executors, one per topic (``runtime.executors.TopicExecutors``)."""

    def get(self, topic: str) -> Executor | None: ...


def timeout_jobs_handle(
    topic: str, entries: Sequence[Claimed], slot: int, *, executors: Executors
) -> dict[str, Result]:
    """The engine handler of a generic topic: take the claimed jobs' rows and hand the jobs to
    the topic's executor, which fires and settles them (``settle_fired``) off the dispatch loop.

    One statement takes the batch's rows from pending to running (``timeout_jobs_take_rows``);
    only the rows it took fire, so a cancel or a reschedule that committed first wins, and one
    that comes later is refused (``not_pending``): exactly one outcome. A row whose action time
    moved past the entry's due time (rescheduled while its old entry was being claimed) is put
    back and its entry dropped: the reschedule indexed the new time.

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
    jobs, busy = timeout_jobs_take_rows(due)
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
    """An executor's held entries fell due: take their rows (``timeout_jobs_take_rows``) and
    return the jobs to fire with their attempts. The entries whose rows were refused (cancelled,
    fired, or moved to a later time) are acked; when the database fails, every entry is retried
    with backoff (or left in flight for the reaper when Redis fails too)."""
    due = {int(e.job_id): e for e in entries}
    try:
        jobs, busy = timeout_jobs_take_rows(due)
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
    queue.nack_handed(
        spec.name,
        slot,
        [(e.job_id, error) for e in entries],
        now_ms=epoch_ms(timezone.now()),
        max_attempts=spec.max_attempts,
        backoff_base_ms=spec.backoff_base_ms,
        backoff_cap_ms=spec.backoff_cap_ms,
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
    # Evaluated before the transaction, under the recurrence budget: a rule holds no row lock.
    may_end = [f.job for f in fired if f.error is None or f.attempt >= spec.max_attempts]
    times, ended = timeout_jobs_next_times(may_end, now=timezone.now(), topic=spec.name)
    settled, ended = timeout_jobs_settle(
        [(f.job, f.attempt, f.error) for f in fired],
        max_attempts=spec.max_attempts,
        times=times,
        ended=ended,
    )
    if ended:
        _report_ended(spec, ended)
    stale = [f for f in fired if f.job.pk not in settled]
    if stale:
        slots = sorted({f.slot for f in stale})
        logger.warning(
            "lease lost on %s:%s; dropping the batch in hand (%d jobs taken over by another "
            "worker)",
            spec.name,
            ",".join(map(str, slots)),
            len(stale),
        )
    fired = [f for f in fired if f.job.pk in settled]
    ok = [f for f in fired if f.error is None]
    failed = [f for f in fired if f.error is not None]
    _settle_in_engine(spec, ok, failed)
    dead = [f for f in failed if f.attempt >= spec.max_attempts]
    if failed:
        _report_failed(spec, failed, dead)
    metrics.record(
        spec.name,
        {
            "dispatched": len(fired),
            "delivered": len(ok),
            "failed": len(failed) - len(dead),
            "dead": len(dead),
        },
        [max(0, f.fired_ms - epoch_ms(f.job.action_time)) for f in ok],
    )
    if tracing.enabled():
        _trace_fired(spec, fired, dead={f.job.pk for f in dead})
    return {"acked": len(ok), "retried": len(failed) - len(dead), "dead": len(dead)}


def _settle_in_engine(spec: TimeoutTopicSpec, ok: list[Fired], failed: list[Fired]) -> None:
    """Ack what succeeded; nack what failed, with backoff (the engine's attempt count decides
    dead the same way the rows did)."""
    acks: dict[int, list[str]] = defaultdict(list)
    for f in ok:
        acks[f.slot].append(str(f.job.pk))
    if acks:
        queue.ack_handed_many(spec.name, acks)
    nacks: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for f in failed:
        nacks[f.slot].append((str(f.job.pk), f.error))
    now_ms = epoch_ms(timezone.now())
    for slot, items in nacks.items():
        queue.nack_handed(
            spec.name,
            slot,
            items,
            now_ms=now_ms,
            max_attempts=spec.max_attempts,
            backoff_base_ms=spec.backoff_base_ms,
            backoff_cap_ms=spec.backoff_cap_ms,
        )


def _report_ended(spec: TimeoutTopicSpec, ended: dict[int, str]) -> None:
    error = next(iter(ended.values()))
    logger.error(
        "%d recurring series of %s ended: %s",
        len(ended),
        spec.name,
        error,
        extra={"jobs": sorted(ended)[:20]},
    )
    raise_alert(
        title=f"{len(ended)} recurring series ended: their rule ran past its budget or "
        "no longer parses",
        details={"topic": spec.name, "jobs": sorted(ended)[:20], "error": error},
    )


def _report_failed(spec: TimeoutTopicSpec, failed: list[Fired], dead: list[Fired]) -> None:
    summary = f"{len(failed)} timeout jobs failed ({len(dead)} dead)"
    logger.warning(
        "%s",
        headline(summary, {"topic": spec.name, "error": failed[0].error}),
        extra={
            "topic": spec.name,
            "jobs": [f.job.pk for f in failed[:20]],
            "error": failed[0].error,
        },
    )
    if dead:
        raise_alert(
            title=f"{len(dead)} timeout jobs dead after {spec.max_attempts} attempts",
            details={
                "topic": spec.name,
                "jobs": [f.job.pk for f in dead[:20]],
                "error": dead[0].error,
            },
        )


def _trace_fired(spec: TimeoutTopicSpec, fired: list[Fired], *, dead: set[int]) -> None:
    """Each job that carries its scheduling call's trace gets a span there: due time to now."""
    for f in fired:
        outcome = "fired" if f.error is None else ("dead" if f.job.pk in dead else "retried")
        tracing.end_job_span(
            "timeout.fire",
            f.job.traceparent,
            due=f.job.action_time,
            outcome=outcome,
            attributes={
                "couponcenter.topic": spec.name,
                "couponcenter.job_id": f.job.pk,
                "couponcenter.attempt": f.attempt,
                "couponcenter.topic_type": spec.type,
                "couponcenter.error": f.error or "",
            },
        )


def job_payload(job: TimeoutJob) -> dict[str, Any]:
    return {
        "job_id": job.pk,
        "topic": job.topic,
        "biz_type": job.biz_type,
        "biz_id": job.biz_id,
        "action_time": utc_text(job.action_time),
        "attribute": job.attribute,
    }


def fire_jobs(
    spec: TimeoutTopicSpec, jobs: list[TimeoutJob], pool: OutboundPool | None
) -> dict[int, str | None]:
    """Fire ``jobs`` by the topic's type; returns the error of each job that failed.

    - ``log``: one log line per job;
    - ``callable``: ``path(jobs)`` once; it may return ``{job_id: error}`` for jobs that failed
      (raising fails the whole batch);
    - ``celery``: one task for the batch, called with ``jobs=[payload, ...]``;
    - ``http``: a signed POST per job (the body is the job's payload), on the executor's pool,
      its ``webhook-id`` the job's idempotency key (``<topic>:<job_id>``, the same on every
      retry).
    """
    if spec.type == "log":
        for job in jobs:
            logger.info(
                "timeout fired: %s %s:%s (job %s, due %s)",
                job.topic,
                job.biz_type,
                job.biz_id,
                job.pk,
                utc_text(job.action_time),
                extra=job_payload(job),
            )
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
    secrets = spec.signing_secrets(timezone.now())
    for job in jobs:
        body = json.dumps(job_payload(job), sort_keys=True).encode()
        try:
            post_signed(
                spec.url,
                body,
                secrets=secrets,
                pool=pool,
                idempotency_key=f"{job.topic}:{job.pk}",
                timeout_s=spec.timeout_ms / 1000,
                allow_http=spec.allow_http,
                legacy_signature=spec.legacy_signature,
            )
        except Exception as exc:  # noqa: BLE001 - any failure of the call is retried
            errors[job.pk] = f"{exc.__class__.__name__}: {exc}"[:500]
    return errors


def timeout_jobs_dead(topic: str, job_ids: list[str]) -> int:
    """The reaper sent these jobs to dead (their handler never finished): mark them DEAD."""
    ids = [int(j) for j in job_ids if j.isdigit()]
    dead = timeout_jobs_mark_dead(ids, error="visibility timeout")
    raise_alert(
        title=f"{len(job_ids)} timeout jobs dead: their handler never finished",
        details={"topic": topic, "jobs": ids[:20], "error": "visibility timeout"},
    )
    return dead
