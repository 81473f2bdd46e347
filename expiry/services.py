"""The mass-expiry sweeper (docs/expiry.md): batched, lock-skipping, restartable.

Invariants:
- The sweeper reads only ``expiry_expirytask`` (due pending rows, through the partial index
  ``expirytask_pending_due``); it touches ``couponcenter_usercoupon`` by primary key only.
- One batch is one transaction over at most ``batch_size`` due pending tasks: it expires those
  user coupons that are still ``unused`` and marks the tasks ``processed``. If anything fails the
  transaction rolls back and the rows stay pending for the next pass.
- A batch first goes the fast way: no explicit row locks (a lock is one more write per row, every
  batch), just the two UPDATEs, coupons first and then tasks, each in primary-key order, which is
  the order a redeem takes them in (coupon, then task), so the two can wait on each other but
  never deadlock. Sweepers split the work by batch: a batch is theirs when they take a
  transaction-level advisory lock named after its first task; a sweeper that finds it taken moves
  on past that batch. Two sweepers that still meet on a row (a batch read just before the other
  committed) find it no longer pending when the first commits, and leave it.
- The fast way waits at most ``FAST_LOCK_WAIT_MS`` for a row lock (a redeem holds one for a
  millisecond); a longer holder (a long-open transaction, a forgotten session) rolls the batch
  back, and the same batch then goes the careful way: the tasks with their user coupons are
  locked ``FOR NO KEY UPDATE SKIP LOCKED``, so the sweeper passes over what is held and takes it
  on a later pass, never waiting on it.
- A redeem and the sweeper both flip ``status`` with a condition on ``status = 'unused'``: exactly
  one of them wins, and a coupon is never both used and expired.
- No OFFSET anywhere: a pass walks the index once. Each batch resumes after the previous one's
  last ``(expire_at, id)`` (keyset), so the entries of tasks it already processed are not walked
  again batch after batch, however long the backlog. A task skipped because another sweeper or a
  redeem held it is left to that holder or to the next pass (which starts at the head again); a
  pass stops on a short batch.
- Timing and logging happen outside the transactions.

On PostgreSQL a batch is one statement (``expiry.sql``); elsewhere (SQLite) it goes through the
ORM, whose writers take turns.

Cost (BENCHMARKS.md): per coupon, the user-coupon update (a HOT update: no index of
``couponcenter_usercoupon`` contains ``status`` and its pages keep half their room free) and the
task update (not HOT: ``expirytask_due`` contains ``status``; four index entries). The WAL those
write, full-page images mostly, is the limit; the bare SQL loop of the bench writes the same.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from couponcenter.core.live_settings import LiveSettingsReader, live_settings_save
from couponcenter.core.redis import get_redis
from couponcenter.coupons.models import UserCoupon

from . import sql
from .models import ExpirySettings, ExpiryTask

logger = logging.getLogger(__name__)

# Rows per batch when the caller says nothing: the settings row's own default.
DEFAULT_BATCH_SIZE = ExpirySettings._meta.get_field("batch_size").default
# A batch gives up on a table lock (say, a migration) after this long instead of queueing behind it.
LOCK_TIMEOUT_MS = 5000
# The fast way of a batch waits this long for a row lock before it rolls back and goes the careful
# way (module docstring); a redeem holds its coupon for about a millisecond.
FAST_LOCK_WAIT_MS = 200
# What sends a batch the careful way: a row-lock wait (lock_not_available, deadlock_detected), or
# a task another transaction moved to the processed partition after the batch read it
# (serialization_failure: ``expiry.partitioning``).
_CAREFUL_AFTER = {"55P03", "40P01", "40001"}
# The careful way is taken again on a fresh snapshot this often when a task moved under it.
_CAREFUL_ATTEMPTS = 3
# How long expiry_settings_get() trusts its cached row before re-reading ``updated_at``.
SETTINGS_CACHE_SECONDS = 5.0
# Size of the ``IN (...)`` lists on databases without the single-statement path (SQLite).
_IN_CHUNK = 500

PENDING = ExpiryTask.Status.PENDING
PROCESSED = ExpiryTask.Status.PROCESSED


@dataclass(frozen=True)
class SweepResult:
    """One batch: ``claimed`` tasks locked, ``processed`` marked done, ``expired`` coupons."""

    claimed: int
    processed: int
    expired: int
    seconds: float
    task_ids: tuple[int, ...] = ()
    # The (expire_at, id) of the last task claimed: where the pass's next batch starts.
    last: tuple[datetime, int] | None = None
    # Due tasks left to another sweeper, which held their batch: this one moves on past them.
    left_to_others: int = 0
    careful: bool = False  # the batch went the careful way (a row lock was held too long)

    @property
    def skipped(self) -> int:
        """Claimed tasks left pending because their coupon was locked by a redeem."""
        return self.claimed - self.processed

    @property
    def seen(self) -> int:
        """Due tasks this batch went past: a pass ends on a batch that saw fewer than its size."""
        return self.claimed + self.left_to_others


@dataclass
class SweepTotals:
    """A pass of :func:`expiry_sweep_due`."""

    batches: int = 0
    claimed: int = 0
    processed: int = 0
    expired: int = 0
    seconds: float = 0.0
    results: list[SweepResult] = field(default_factory=list, repr=False)

    def add(self, result: SweepResult) -> None:
        self.batches += 1
        self.claimed += result.claimed
        self.processed += result.processed
        self.expired += result.expired

    @property
    def per_s(self) -> float:
        return self.processed / self.seconds if self.seconds > 0 else 0.0


# --- one batch -----------------------------------------------------------------------------------

# Before every task and after every task: where a pass up or down the index starts.
_START = (datetime(1, 1, 1, tzinfo=UTC), 0)
_END = (datetime(9999, 12, 31, tzinfo=UTC), 2**63 - 1)


def expiry_sweep_batch(
    *,
    now: datetime,
    batch_size: int = DEFAULT_BATCH_SIZE,
    collect_ids: bool = False,
    after: tuple[datetime, int] | None = None,
    descending: bool = False,
) -> SweepResult:
    """Expire one bounded batch of due tasks in one transaction; see the module invariants.

    ``after``: only tasks after this ``(expire_at, id)`` (the previous batch's ``last``);
    ``descending``: newest due first, and ``after`` means before (see ``expiry_sweep_due``).
    ``collect_ids`` returns the processed task ids too (tests prove two sweepers never share one).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    after = after or (_END if descending else _START)
    started = time.perf_counter()
    others, careful = 0, False
    if connection.vendor == "postgresql":
        claimed, processed, expired, ids, last, others, careful = _sweep_batch_postgres(
            now, batch_size, collect_ids, after, descending
        )
    else:
        claimed, processed, expired, ids, last = _sweep_batch_orm(
            now, batch_size, after, descending
        )
    return SweepResult(
        claimed=claimed,
        processed=processed,
        expired=expired,
        seconds=time.perf_counter() - started,
        task_ids=tuple(sorted(ids or ())) if collect_ids else (),
        last=last,
        left_to_others=others,
        careful=careful,
    )


def _sweep_batch_postgres(
    now: datetime, limit: int, collect_ids: bool, after: tuple[datetime, int], descending: bool
) -> tuple:
    """The fast way; the careful way when a row lock held the fast way up too long."""
    batch = functools.partial(
        sql.batch_run,
        descending=descending,
        now=now,
        limit=limit,
        collect_ids=collect_ids,
        after=after,
    )
    try:
        row = batch(careful=False, lock_timeout_ms=min(FAST_LOCK_WAIT_MS, LOCK_TIMEOUT_MS))
    except OperationalError as exc:
        if getattr(exc.__cause__, "pgcode", None) not in _CAREFUL_AFTER:
            raise
        logger.info(
            "expiry: a held row or a moved task stopped a batch; taking it the careful way (%s)",
            str(exc).strip().splitlines()[0],
        )
        row = _careful(batch)
        return row.seen, row.processed, row.expired, row.ids, row.last, 0, True
    if not row.ours:  # another sweeper holds this batch: move on past it
        return 0, 0, 0, [], row.last, row.seen, False
    return row.seen, row.processed, row.expired, row.ids, row.last, 0, False


def _careful(batch: Callable[..., sql.BatchRow]) -> sql.BatchRow:
    """The careful way; again if a task it locked had moved partition since its snapshot."""
    for attempt in range(1, _CAREFUL_ATTEMPTS + 1):
        try:
            return batch(careful=True, lock_timeout_ms=LOCK_TIMEOUT_MS)
        except OperationalError as exc:
            if getattr(exc.__cause__, "pgcode", None) != "40001" or attempt == _CAREFUL_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _sweep_batch_orm(
    now: datetime, limit: int, after: tuple[datetime, int], descending: bool
) -> tuple:
    # SQLite: no row locks, but IMMEDIATE transactions make writers take turns, so the rows read
    # here cannot be claimed by another sweeper before this transaction commits.
    if descending:
        past = Q(expire_at__lt=after[0]) | Q(expire_at=after[0], id__lt=after[1])
        order = ("-expire_at", "-id")
    else:
        past = Q(expire_at__gt=after[0]) | Q(expire_at=after[0], id__gt=after[1])
        order = ("expire_at", "id")
    with transaction.atomic():
        rows = list(
            ExpiryTask.objects.select_for_update(skip_locked=True)
            .filter(past, status=PENDING, expire_at__lte=now)
            .order_by(*order)
            .values_list("id", "user_coupon_id", "expire_at")[:limit]
        )
        expired = 0
        for start in range(0, len(rows), _IN_CHUNK):
            chunk = rows[start : start + _IN_CHUNK]
            expired += UserCoupon.objects.filter(
                id__in=[coupon_id for _, coupon_id, _ in chunk], status=UserCoupon.Status.UNUSED
            ).update(status=UserCoupon.Status.EXPIRED)
            ExpiryTask.objects.filter(id__in=[task_id for task_id, _, _ in chunk]).update(
                status=PROCESSED, updated_at=now
            )
    ids = [task_id for task_id, _, _ in rows]
    last = (rows[-1][2], rows[-1][0]) if rows else None
    return len(rows), len(rows), expired, ids, last


# --- a pass --------------------------------------------------------------------------------------


def expiry_sweep_due(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    progress: Callable[[SweepResult], None] | None = None,
    keep_results: bool = False,
    collect_ids: bool = False,
) -> SweepTotals:
    """Sweep batches until one comes back short (or ``should_stop()``); return the totals.

    ``now=None`` re-reads the clock for every batch, so a long pass also takes what fell due
    meanwhile. An exception ends the pass; the failing batch has rolled back and stays pending.

    Lanes (PostgreSQL): the first sweeper to start a pass takes lane 0 and walks the due index up,
    oldest first; a second one running at the same time takes lane 1 and walks it down, newest
    first, so the two meet once in the middle instead of reaching for the same batch at every
    step (each such meeting costs the loser a batch read for nothing). Any further sweeper walks
    up beside lane 0 and the batch locks keep them apart. A lane is a session advisory lock,
    released when the pass ends (or its connection does).
    """
    batch_size = batch_size or expiry_settings_get().batch_size
    totals = SweepTotals()
    after = None
    started = time.perf_counter()
    lane = sql.lane_take()
    descending = lane == 1
    try:
        # The planner's statistics of the pending tasks: looked at before the first batch, and
        # once more after the first full one unless analyzed already (sql.statistics_catch_up).
        settled = sql.statistics_catch_up(seen=0, batch_size=batch_size)
        while not should_stop():
            result = expiry_sweep_batch(
                now=now or timezone.now(),
                batch_size=batch_size,
                collect_ids=collect_ids,
                after=after,
                descending=descending,
            )
            after = result.last or after
            if not settled and result.seen >= batch_size:
                settled = True
                sql.statistics_catch_up(seen=result.seen, batch_size=batch_size)
            totals.add(result)
            if keep_results:
                totals.results.append(result)
            if progress is not None:
                progress(result)
            if result.seen < batch_size:
                break
    finally:
        totals.seconds = time.perf_counter() - started
        sql.lane_release(lane)
    return totals


def next_due_at() -> datetime | None:
    """When the earliest pending task falls due (the head of the partial index), or None."""
    return (
        ExpiryTask.objects.filter(status=PENDING)
        .order_by("expire_at")
        .values_list("expire_at", flat=True)
        .first()
    )


# --- cleanup -------------------------------------------------------------------------------------


def expiry_cleanup(
    *,
    now: datetime | None = None,
    retention: timedelta | None = None,
    batch_size: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> int:
    """Delete tasks processed more than ``retention`` ago (0: none, kept forever), one batch
    per transaction; the sweeper runs it as the expiry tasks' retention (``expiry.retention``).

    Age counts from ``updated_at`` (when the task was processed), served by the partial index
    ``expirytask_processed_age``. Returns the number of rows deleted.
    """
    config = expiry_settings_get()
    now = now or timezone.now()
    retention = config.retention if retention is None else retention
    if not retention:
        return 0
    cutoff = now - retention
    batch_size = batch_size or config.batch_size
    deleted = 0
    while not should_stop():
        with transaction.atomic():
            ids = list(
                ExpiryTask.objects.select_for_update(skip_locked=True)
                .filter(status=PROCESSED, updated_at__lt=cutoff)
                .order_by("updated_at")
                .values_list("id", flat=True)[:batch_size]
            )
            # Nothing points at a task, so Django deletes each chunk with one plain DELETE.
            for start in range(0, len(ids), _IN_CHUNK):
                ExpiryTask.objects.filter(id__in=ids[start : start + _IN_CHUNK]).delete()
        deleted += len(ids)
        if len(ids) < batch_size:
            break
    return deleted


# --- settings ------------------------------------------------------------------------------------

_settings = LiveSettingsReader(ExpirySettings, max_age_s=SETTINGS_CACHE_SECONDS)


def expiry_settings_get(*, max_age_s: float | None = None) -> ExpirySettings:
    """The single settings row (created with defaults on first use) as of at most ``max_age_s``
    seconds ago (default: ``SETTINGS_CACHE_SECONDS``).

    When the cache is older than that only the change marker (``version``) is re-read; the row
    is reloaded when it moved. The sweeper calls this with ``max_age_s=0`` each pass, so an edit
    in the admin applies from the next pass, without a restart.
    """
    return _settings.get(max_age_s=max_age_s)


def expiry_settings_cache_clear() -> None:
    """Forget the cached row (tests; anything that edits the row behind the services' back)."""
    _settings.clear()


def expiry_settings_save(*, instance: ExpirySettings) -> ExpirySettings:
    """Save the settings row; sweepers pick it up on their next pass (its ``version`` moves).
    Raises ``ValidationError`` (nothing saved) for values the model refuses."""
    live_settings_save(instance=instance)
    _settings.clear()
    return instance


# --- last run, for the console -------------------------------------------------------------------


def last_run_key() -> str:
    """Redis hash with the latest pass of any sweeper (read by ``selectors.expiry_stats``)."""
    return f"{settings.REDIS_KEY_PREFIX}:expiry:last_run"


def expiry_run_record(
    *, totals: SweepTotals, cleaned: int, error: str = "", finished_at: datetime | None = None
) -> None:
    """Store a pass's figures in Redis; losing them (Redis down) never fails a sweep."""
    finished_at = finished_at or timezone.now()
    fields = {
        "finished_at": finished_at.isoformat(),
        "seconds": f"{totals.seconds:.3f}",
        "batches": totals.batches,
        "claimed": totals.claimed,
        "processed": totals.processed,
        "expired": totals.expired,
        "cleaned": cleaned,
        "per_s": f"{totals.per_s:.1f}",
        "error": error,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
    }
    try:
        get_redis().hset(last_run_key(), mapping=fields)
    except redis.RedisError:
        logger.warning("expiry: could not record the last run in Redis", exc_info=True)
