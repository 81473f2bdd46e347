"""Creating generic timeout jobs in bulk: up to ``BULK_MAX`` in one transaction, in as few
statements as the database allows, indexed in Redis once it commits. One job at a time is
``services.timeouts``.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from datetime import datetime
from typing import Any, NamedTuple

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from couponcenter.core import tracing
from reminders.engine.keys import slot_for
from reminders.models import TimeoutJob
from reminders.recurrence import vetting
from reminders.services.quotas import quota_attributes_check, quota_creations_take
from reminders.services.timeouts import (
    TimeoutJobConflict,
    series_first_time,
    timeout_jobs_index_on_commit,
    topic_spec_or_error,
)
from reminders.timeout_topic_rules import slot_basis

# Most jobs one bulk create may carry (one transaction, one INSERT per chunk).
BULK_MAX = 10_000
BULK_CHUNK = 2000
TOO_SLOW_TO_CHECK = (
    "Its recurrence rules take too long to check: send fewer distinct rules or start times per "
    "request."
)
Status = TimeoutJob.Status


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
    specs = {topic: topic_spec_or_error(topic) for topic in {k[0] for k in keys}}
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
        timeout_jobs_index_on_commit(new, specs)
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
                    raise ValidationError({"jobs": [TOO_SLOW_TO_CHECK]})
                starts[(rule, at)] = series_first_time(rule, at, vetted=rule in vetted)
                vetted.add(rule)
            j = {**j, "series_start": at, "action_time": starts[(rule, at)]}
        out.append(j)
    return out


_INSERT_COLUMNS = (
    "topic",
    "biz_type",
    "biz_id",
    "status",
    "action_time",
    "attribute",
    "slot",
    "attempts",
    "last_error",
    "recurrence",
    "series_start",
    "gmt_create",
    "gmt_modified",
    "traceparent",
)


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
        rows.append(
            (
                j["topic"],
                j["biz_type"],
                j["biz_id"],
                Status.PENDING,
                adapt(at),
                json.dumps(attribute),
                slot,
                0,
                "",
                rule,
                adapt(j["series_start"]) if rule else None,
                now,
                now,
                traced,
            )
        )
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
            fields = (
                str(pk),
                _copy_text(j["topic"]),
                _copy_text(j["biz_type"]),
                _copy_text(j["biz_id"]),
                str(Status.PENDING),
                when,
                _copy_text(json.dumps(attribute)) if attribute else "{}",
                str(slot),
                "0",
                "",
                _copy_text(rule),
                j["series_start"].isoformat() if rule else "\\N",
                now,
                now,
                traced,
            )
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
        value = (
            value.replace("\\", "\\\\")
            .replace("\t", "\\t")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
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
                topic=topic,
                biz_type=biz_type,
                biz_id__in=ids[start : start + BULK_CHUNK],
                status=Status.PENDING,
            )
            found.update({(j.topic, j.biz_type, j.biz_id): j for j in rows})
    return found
