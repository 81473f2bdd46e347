"""Retention: removing what has aged out of the tables that grow forever (docs/retention.md).

Invariants:
- nothing a user or a client can still see or act on is removed: each app states, per table, which
  rows are past their retention (``expiry.retention``, ``reminders.services.retention``); this
  module only runs those passes;
- a retention of 0 keeps everything: no statement runs;
- a table's rows go one of two ways, chosen by one check (``table_partitioned``): whole
  partitions dropped (a partitioned table on PostgreSQL) or a batched DELETE, one batch per
  transaction, in primary-key order resumed after the last key (no OFFSET), stopping on a short
  batch; either way it stops when asked to between two drops or batches (the one in flight
  commits), and a stopped pass resumes on the next one;
- each batch re-checks its condition in the DELETE itself and locks its rows with ``SKIP
  LOCKED``: a row a hot path holds (a job firing, a notification being read, a coupon being
  redeemed) is left for the next pass, and a row that changed since it was chosen is not removed;
- one process in the fleet runs an app's retention at a time, at most once per
  ``RETENTION_EVERY_S`` (``RetentionTurn``: a turn key that lapses after the interval, and a
  lease held while the pass runs, renewed between batches);
- each table's last run (when, how many removed, how long, which way) is kept in Redis for the
  console: it is worthless after a restart and changes every pass, as the sweeper's last run.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from couponcenter.core.db.partitions import DropReport, partitioned
from couponcenter.core.durations import MaxDurationValidator, MinDurationValidator
from couponcenter.core.redis import get_redis

logger = logging.getLogger(__name__)

# The longest retention the settings accept (ten years): far beyond any need, and "now - it" stays
# a valid time.
RETENTION_MAX = timedelta(days=3650)
# Ids per DELETE statement inside a batch (the IN list stays a reasonable size).
_IN_CHUNK = 1000


def retention_field(*, days: int, help_text: str = "") -> models.DurationField:
    """A live setting holding a retention: ``days`` by default, 0 (keep forever) to
    ``RETENTION_MAX``."""
    return models.DurationField(
        default=timedelta(days=days),
        validators=[MinDurationValidator(timedelta(0)), MaxDurationValidator(RETENTION_MAX)],
        help_text=help_text,
    )


# --- the way a table's rows go -------------------------------------------------------------------


def table_partitioned(table: str) -> bool:
    """Whether ``table`` is partitioned by time, so its retention drops whole partitions (on
    PostgreSQL, once migrated: docs/partitioning.md). The one place the choice is made."""
    return partitioned(table)


# --- one table's pass ----------------------------------------------------------------------------


@dataclass
class RetentionRun:
    """One retention's pass (a table's, or one of its retentions): what the console shows."""

    name: str
    retention: timedelta
    removed: int = 0
    seconds: float = 0.0
    way: str = "delete"  # "delete" (batches), "drop" (partitions) or "kept" (retention 0)
    stopped: bool = False  # asked to stop with rows left: the next pass goes on
    error: str = ""
    finished_at: datetime = field(default_factory=timezone.now)


def retention_run(
    name: str,
    *,
    retention: timedelta,
    delete: Callable[[], tuple[int, bool]],
    drop: Callable[[], DropReport] | None = None,
    table: str = "",
) -> RetentionRun:
    """Run one retention and record it under ``name``: ``drop`` (whole partitions) when
    ``table`` (default: ``name``) is partitioned and the app gave one, else ``delete`` (batches,
    returns the rows deleted and whether it was stopped). A retention of 0 runs neither. A
    database error propagates after it is recorded (the caller's pass logs it and goes on)."""
    run = RetentionRun(name=name, retention=retention)
    started = time.perf_counter()
    try:
        if not retention:
            run.way = "kept"
        elif drop is not None and table_partitioned(table or name):
            report = drop()
            run.way, run.removed, run.stopped = "drop", report.rows, report.stopped
        else:
            run.removed, run.stopped = delete()
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}".strip()
        raise
    finally:
        run.seconds = time.perf_counter() - started
        run.finished_at = timezone.now()
        retention_run_record(run)
    if run.removed or run.stopped:
        logger.info(
            "retention: %s removed %d (%s) in %.2fs%s",
            name,
            run.removed,
            run.way,
            run.seconds,
            ", stopped" if run.stopped else "",
        )
    return run


def delete_in_batches(
    queryset: models.QuerySet,
    *,
    batch_size: int,
    should_stop: Callable[[], bool] = lambda: False,
) -> tuple[int, bool]:
    """Delete every row of ``queryset`` (a filter: the rows past their retention), at most
    ``batch_size`` per transaction; returns (rows deleted, stopped with rows maybe left).

    Each batch takes the next ids after the last one's (primary-key order: old rows first in
    these tables, and never an OFFSET) with ``FOR UPDATE SKIP LOCKED``, then deletes them with
    the filter applied again, in the same transaction: a row that stopped matching meanwhile
    (a notification read, a job requeued) stays. A batch shorter than ``batch_size`` ends it.
    """
    deleted, last = 0, None
    while True:
        if should_stop():
            return deleted, True
        with transaction.atomic():
            page = queryset if last is None else queryset.filter(pk__gt=last)
            ids = list(
                page.select_for_update(skip_locked=True)
                .order_by("pk")
                .values_list("pk", flat=True)[:batch_size]
            )
            for start in range(0, len(ids), _IN_CHUNK):
                _, per_model = queryset.filter(pk__in=ids[start : start + _IN_CHUNK]).delete()
                deleted += per_model.get(queryset.model._meta.label, 0)  # not its cascades
        if len(ids) < batch_size:
            return deleted, False
        last = ids[-1]


# --- the last runs, for the console --------------------------------------------------------------


def last_run_key(name: str) -> str:
    """Redis hash with the latest pass of the retention ``name`` (any process)."""
    return f"{settings.REDIS_KEY_PREFIX}:retention:last:{name}"


def retention_run_record(run: RetentionRun) -> None:
    """Store a retention's pass in Redis; losing it (Redis down) never fails the pass."""
    fields = {
        "finished_at": run.finished_at.isoformat(),
        "retention_s": int(run.retention.total_seconds()),
        "removed": run.removed,
        "seconds": f"{run.seconds:.3f}",
        "way": run.way,
        "stopped": int(run.stopped),
        "error": run.error,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
    }
    try:
        get_redis().hset(last_run_key(run.name), mapping=fields)
    except redis.RedisError:
        logger.warning("retention: could not record the last run of %s", run.name, exc_info=True)


def retention_last_runs(names: list[str]) -> dict[str, dict[str, str]]:
    """The latest pass of each retention as stored ({} for one never run; all {} when Redis is
    down)."""
    try:
        pipe = get_redis().pipeline(transaction=False)
        for name in names:
            pipe.hgetall(last_run_key(name))
        raw = pipe.execute()
    except redis.RedisError:
        return {name: {} for name in names}
    return {
        name: {_text(k): _text(v) for k, v in row.items()}
        for name, row in zip(names, raw, strict=True)
    }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# --- one process at a time -----------------------------------------------------------------------


class RetentionTurn:
    """Whether this process runs ``name``'s retention now: one process in the fleet, once per
    ``every_s``.

    ``take()``: the turn key (set NX, lapsing after the interval) says nobody started one within
    the interval; the lease (a Redis lock with our token) says nobody is still running one that
    began earlier. ``keep()`` renews the lease between batches (False once it was lost: stop);
    ``release()`` ends it. A process that dies holding the lease holds it at most ``lease_s``.
    """

    def __init__(self, name: str, *, every_s: float, lease_s: float = 300.0) -> None:
        prefix = f"{settings.REDIS_KEY_PREFIX}:retention:{name}"
        self.turn_key, self.lease_key = f"{prefix}:turn", f"{prefix}:lease"
        self.every_s, self.lease_s = every_s, lease_s
        self._lock: redis.lock.Lock | None = None

    def take(self) -> bool:
        """Whether to run now (Redis unreachable: not now; rows wait for a later turn)."""
        try:
            client = get_redis()
            if not client.set(self.turn_key, os.getpid(), nx=True, px=int(self.every_s * 1000)):
                return False
            # Not thread-local: a worker takes the turn in its loop and runs the pass (renewing
            # and releasing the lease) in a thread of its own.
            lock = client.lock(self.lease_key, timeout=self.lease_s, thread_local=False)
            if not lock.acquire(blocking=False):
                return False
        except redis.RedisError:
            logger.warning("retention: Redis unreachable, no pass this turn", exc_info=True)
            return False
        self._lock = lock
        return True

    def keep(self) -> bool:
        if self._lock is None:
            return False
        try:
            self._lock.extend(self.lease_s, replace_ttl=True)
        except (redis.exceptions.LockError, redis.RedisError):
            logger.warning("retention: lost the lease %s; stopping", self.lease_key)
            self._lock = None
            return False
        return True

    def release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            try:
                lock.release()
            except (redis.exceptions.LockError, redis.RedisError):
                logger.warning("retention: could not release %s (it lapses)", self.lease_key)

    def give_back(self) -> None:
        """Release a turn taken but not used (background work held back for the urgent paths,
        docs/operations.md): the next ``take()``, here or elsewhere, may run the pass at once."""
        self.release()
        try:
            get_redis().delete(self.turn_key)
        except redis.RedisError:
            logger.warning("retention: could not give back %s (it lapses)", self.turn_key)
