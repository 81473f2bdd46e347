"""The mass-expiry sweeper (docs/expiry.md): batched, lock-skipping, restartable.

Invariants:
- The sweeper reads only ``expiry_expirytask`` (due pending rows, through the partial index
  ``expirytask_pending_due``); it touches ``couponcenter_usercoupon`` by primary key only.
- One batch is one transaction over at most ``batch_size`` due pending tasks: it expires those
  user coupons that are still ``unused`` and marks the tasks ``processed``. If anything fails the
  transaction rolls back and the rows stay pending for the next pass.
- A batch first goes the fast way: no explicit row locks (they would add a fifth to a batch's
  time, and the conditional updates keep the invariants on their own), just the two UPDATEs,
  coupons first and then tasks, each in primary-key order, which is the order a redeem takes
  them in (coupon, then task), so the two can wait on each other but never deadlock.
  Sweepers split the work by batch: a batch is theirs when they take a transaction-level
  advisory lock named after its first task; a sweeper that finds it taken moves on past that
  batch. Two sweepers that still meet on a row (a batch read just before the other committed)
  find it no longer pending when the first commits, and leave it.
- The fast way waits at most ``FAST_LOCK_WAIT_MS`` for a row lock (a redeem holds one for a
  millisecond); a longer holder (a long-open transaction, a forgotten session) rolls the batch
  back, and the same batch then goes the careful way: the tasks with their user coupons are
  locked ``FOR NO KEY UPDATE SKIP LOCKED``, so the sweeper passes over what is held and takes it
  on a later pass, never waiting on it.
- A redeem and the sweeper both flip ``status`` with a condition on ``status = 'unused'``: exactly
  one of them wins, and a coupon is never both used and expired.
- No OFFSET anywhere: a pass walks the index once. Each batch resumes after the previous one's
  last ``(expire_at, id)`` (keyset), so the entries of tasks it already processed are not walked
  again batch after batch (at 10M due tasks that walk grew with every batch). A task skipped because
  another sweeper or a redeem held it is left to that holder or to the next pass (which starts at
  the head again); a pass stops on a short batch.
- Timing and logging happen outside the transactions.

Cost (BENCHMARKS.md): per coupon, the user-coupon update (a HOT update: no index of
``couponcenter_usercoupon`` contains ``status`` and its pages keep half their room free) and the
task update (not HOT: ``expirytask_due`` contains ``status``; four index entries). The WAL those
write, full-page images mostly, is the limit; the bare SQL loop of the bench writes the same.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings
from django.db import Error as DbError
from django.db import OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from couponcenter.core.db import prepared
from couponcenter.core.live_settings import LiveSettingsReader, live_settings_save
from couponcenter.core.redis import get_redis
from couponcenter.coupons.models import UserCoupon

from .models import ExpirySettings, ExpiryTask

logger = logging.getLogger(__name__)

# Rows per batch when neither the caller nor ExpirySettings says otherwise.
DEFAULT_BATCH_SIZE = 2000
# A batch gives up on a table lock (say, a migration) after this long instead of queueing behind it.
LOCK_TIMEOUT_MS = 5000
# The fast way of a batch waits this long for a row lock before it rolls back and goes the careful
# way (module docstring); a redeem holds its coupon for about a millisecond.
FAST_LOCK_WAIT_MS = 200
# Advisory lock classes: the sweepers' batches (the object is the batch's first task id) and the
# lanes of their passes (``expiry_sweep_due``).
BATCH_LOCK_CLASS = 0x5E1A
LANE_LOCK_CLASS = 0x5E1B
# Row-lock waits that send a batch the careful way: lock_not_available, deadlock_detected.
_CAREFUL_AFTER = {"55P03", "40P01"}
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

# The fast way (module docstring), one statement. ``gate`` takes the batch's advisory lock; the
# UPDATEs run only with it. ``done`` reads ``expired``, so the coupons are updated before the
# tasks whatever order the executor would choose.
# - The batch is read once, straight into one aggregate (``span``): no copy of it is kept and
#   walked again (keeping one, then sorting it for the first and last task, cost a third of a
#   batch's own overhead, ``EXPLAIN ANALYZE``). The batch's lock is named after its first task in
#   walk order, found by one descent of the same index in the statement's snapshot: two sweepers
#   reading the same batch name the same lock, and batches that only overlap never do.
# - The coupons: claims made together (one campaign's rush) fall due together, so a batch's user
#   coupons are often one run of ids with none missing (``span.whole``); then one walk of that key
#   range updates exactly them. Otherwise ``= ANY`` finds each by primary key (a join let the
#   planner pick a merge join that walked the whole key every batch). Exactly one of the two
#   runs: they never meet on a row.
# - The tasks: by the ``ctid`` the batch read them at, no index descent per task. A task updated
#   by someone else since (a redeem, the other sweeper) is followed to its new version and taken
#   only if that is still pending, as by id.
# - Where the next batch starts (``last``, the batch's greatest ``(expire_at, id)`` in walk order):
#   when the whole batch is due at one moment (a campaign's coupons expiring together), that moment
#   and its furthest id; otherwise the batch's index walk once more, with the statement's own
#   snapshot, so it sees the very rows the batch read.
_FAST_TEMPLATE = """
WITH span AS (
    SELECT count(*) AS n, min(user_coupon_id) AS lo, max(user_coupon_id) AS hi,
           max(user_coupon_id) - min(user_coupon_id) + 1 = count(*) AS whole,
           array_agg(ctid) AS ctids, array_agg(user_coupon_id) AS coupons,
           {near}(expire_at) AS near_at, {far}(expire_at) AS far_at, {far}(id) AS far_id
    FROM (
        SELECT id, expire_at, user_coupon_id, ctid FROM expiry_expirytask
        WHERE {due}
        ORDER BY {order}
        LIMIT %(limit)s
    ) batch
), gate AS (
    SELECT pg_try_advisory_xact_lock(%(lock_class)s, (
        SELECT mod(id, 2147483647)::integer FROM expiry_expirytask
        WHERE {due}
        ORDER BY {order}
        LIMIT 1
    )) AS ok
), expired_run AS (
    UPDATE couponcenter_usercoupon SET status = 'expired'
    WHERE id BETWEEN (SELECT lo FROM span) AND (SELECT hi FROM span)
      AND (SELECT whole FROM span) AND (SELECT ok FROM gate)
      AND status = 'unused'
    RETURNING id
), expired_each AS (
    UPDATE couponcenter_usercoupon SET status = 'expired'
    WHERE id = ANY((SELECT coupons FROM span WHERE NOT whole AND (SELECT ok FROM gate))::bigint[])
      AND status = 'unused'
    RETURNING id
), expired AS (
    SELECT id FROM expired_run UNION ALL SELECT id FROM expired_each
), done AS (
    UPDATE expiry_expirytask SET status = 'processed', updated_at = %(now)s
    WHERE ctid = ANY((SELECT ctids FROM span WHERE (SELECT count(*) >= 0 FROM expired)
                                             AND (SELECT ok FROM gate))::tid[])
      AND status = 'pending'
    RETURNING id
)
SELECT
    (SELECT n FROM span),
    (SELECT count(*) FROM done),
    (SELECT count(*) FROM expired),
    CASE WHEN %(ids)s THEN (SELECT array_agg(id) FROM done) END,
    (SELECT far_at FROM span),
    CASE WHEN (SELECT near_at = far_at FROM span) THEN (SELECT far_id FROM span) ELSE (
        SELECT id FROM (
            SELECT expire_at, id FROM expiry_expirytask
            WHERE {due}
            ORDER BY {order}
            LIMIT %(limit)s
        ) again
        ORDER BY {backwards}
        LIMIT 1
    ) END,
    coalesce((SELECT ok FROM gate), true)
"""

# The careful way, one statement. ``batch`` locks each due task together with its user coupon
# and skips the pair when either row is locked (by a redeem, or by any long-open transaction), so
# the LIMIT fills up with rows it can take: locking the coupons in a second step would let a head
# of the queue whose coupons are locked be claimed, skipped and re-claimed by every batch of a
# pass, a busy loop that expires nothing else (tests/chaos holds it). With ORDER BY and a
# small LIMIT the plan is the partial index in due order with a primary-key probe per coupon.
_CAREFUL_TEMPLATE = """
WITH batch AS (
    SELECT t.id, t.expire_at, t.user_coupon_id, c.status AS coupon_status
    FROM expiry_expirytask t JOIN couponcenter_usercoupon c ON c.id = t.user_coupon_id
    WHERE t.status = 'pending' AND t.expire_at <= %(now)s
      AND (t.expire_at, t.id) {past} (%(after_at)s, %(after_id)s)
    ORDER BY {t_order}
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF t, c SKIP LOCKED
), expired AS (
    UPDATE couponcenter_usercoupon SET status = 'expired'
    WHERE id = ANY(ARRAY(SELECT user_coupon_id FROM batch WHERE coupon_status = 'unused'))
      AND status = 'unused'
    RETURNING id
), done AS (
    UPDATE expiry_expirytask SET status = 'processed', updated_at = %(now)s
    WHERE id = ANY(ARRAY(SELECT id FROM batch))
    RETURNING id
), last AS (
    SELECT expire_at, id FROM batch ORDER BY {backwards} LIMIT 1
)
SELECT
    (SELECT count(*) FROM batch),
    (SELECT count(*) FROM done),
    (SELECT count(*) FROM expired),
    CASE WHEN %(ids)s THEN (SELECT array_agg(id) FROM done) END,
    (SELECT expire_at FROM last),
    (SELECT id FROM last),
    true
"""


def _directed(template: str, descending: bool) -> str:
    """The statement for a pass up the due index (oldest first) or down it (newest first)."""
    up = ("expire_at, id", "expire_at DESC, id DESC")
    order, backwards = (up[1], up[0]) if descending else up
    near, far = ("max", "min") if descending else ("min", "max")
    past = "<" if descending else ">"
    # The due tasks after the pass's key, as the fast way reads them (three times, one snapshot).
    due = (
        f"status = 'pending' AND expire_at <= %(now)s "
        f"AND (expire_at, id) {past} (%(after_at)s, %(after_id)s)"
    )
    return template.format(past=past, order=order, backwards=backwards, near=near, far=far, due=due,
                           t_order="t." + order.replace(", id", ", t.id"))  # fmt: skip


# Per direction (False: up the index, True: down it). The fast way runs as a server-side prepared
# statement (``couponcenter.core.db.prepared``) on its generic plan: parsing and planning its CTEs
# cost about 0.3 ms of a 2000-row batch's 15-20 ms, every batch (``EXPLAIN (ANALYZE, SUMMARY)``).
_FAST_PARAMS = (
    ("now", "timestamptz"), ("limit", "integer"), ("ids", "boolean"),
    ("after_at", "timestamptz"), ("after_id", "bigint"), ("lock_class", "integer"),
)  # fmt: skip
_FAST = {
    down: prepared.Prepared(
        f"cc_expiry_{'down' if down else 'up'}", _directed(_FAST_TEMPLATE, down), _FAST_PARAMS
    )
    for down in (False, True)
}
_CAREFUL_SQL = {down: _directed(_CAREFUL_TEMPLATE, down) for down in (False, True)}

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
    params = {"now": now, "limit": limit, "ids": collect_ids, "after_at": after[0],
              "after_id": after[1], "lock_class": BATCH_LOCK_CLASS}  # fmt: skip
    try:
        seen, processed, expired, ids, last, ours = _one_statement(
            _FAST[descending], params, min(FAST_LOCK_WAIT_MS, LOCK_TIMEOUT_MS)
        )
    except OperationalError as exc:
        if getattr(exc.__cause__, "pgcode", None) not in _CAREFUL_AFTER:
            raise
        logger.info("expiry: a row lock held a batch up; taking it the careful way (%s)",
                    str(exc).strip().splitlines()[0])  # fmt: skip
        claimed, processed, expired, ids, last, _ = _one_statement(
            _CAREFUL_SQL[descending], params, LOCK_TIMEOUT_MS
        )
        return claimed, processed, expired, ids, last, 0, True
    if not ours:  # another sweeper holds this batch: move on past it
        return 0, 0, 0, [], last, seen, False
    return seen, processed, expired, ids, last, 0, False


def _one_statement(statement: str | prepared.Prepared, params: dict, lock_timeout_ms: int) -> tuple:
    """One batch in its own transaction; ``statement`` prepared where it may be, as plain SQL
    otherwise (``prepared.execute_in_own_transaction``)."""
    # A batch lost in a crash before its WAL reached disk is simply swept again (the sweep is
    # idempotent), so the commit need not wait for the flush. The prepared statement's generic
    # plan is the one its custom plans all are (the partial index walked in due order, the coupons
    # by key): use it, not plan each batch again. Sent in the batch's round trip.
    settings_sql = (
        f"SELECT set_config('lock_timeout', '{int(lock_timeout_ms)}ms', true), "
        "set_config('synchronous_commit', 'off', true), "
        "set_config('plan_cache_mode', 'force_generic_plan', true)"
    )
    for again in (False, True):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                if isinstance(statement, prepared.Prepared):
                    prepared.execute_in_own_transaction(
                        cursor, statement, params, preamble=settings_sql
                    )
                else:
                    cursor.execute(f"{settings_sql}; {statement}", params)
                seen, processed, expired, ids, last_at, last_id, ours = cursor.fetchone()
            return seen, processed, expired, ids, (last_at, last_id) if last_id else None, ours
        except prepared.RunAgain:
            if again:
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
    lane = _lane_take()
    descending = lane == 1
    try:
        while not should_stop():
            result = expiry_sweep_batch(
                now=now or timezone.now(),
                batch_size=batch_size,
                collect_ids=collect_ids,
                after=after,
                descending=descending,
            )
            after = result.last or after
            totals.add(result)
            if keep_results:
                totals.results.append(result)
            if progress is not None:
                progress(result)
            if result.seen < batch_size:
                break
    finally:
        totals.seconds = time.perf_counter() - started
        _lane_release(lane)
    return totals


def _lane_take() -> int | None:
    """Lane 0 or 1 if one is free (``expiry_sweep_due``), else None; PostgreSQL only, and not
    behind a pooler in transaction mode (``DB_PREPARED_STATEMENTS=0``), where a session lock
    taken on one server connection could not be released from the next and would hold its lane
    until the pooler closed that connection."""
    if connection.vendor != "postgresql" or not settings.DB_PREPARED_STATEMENTS:
        return None
    with connection.cursor() as cursor:
        for lane in (0, 1):
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LANE_LOCK_CLASS, lane])
            if cursor.fetchone()[0]:
                return lane
    return None


def _lane_release(lane: int | None) -> None:
    if lane is None:
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LANE_LOCK_CLASS, lane])
    except DbError:  # the connection went: so did its session lock
        logger.warning("expiry: could not release sweep lane %s", lane, exc_info=True)


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
    """Delete tasks processed more than ``retention`` ago, one batch per transaction.

    Age counts from ``updated_at`` (when the task was processed), served by the partial index
    ``expirytask_processed_age``. Returns the number of rows deleted.
    """
    config = expiry_settings_get()
    now = now or timezone.now()
    cutoff = now - (config.retention if retention is None else retention)
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


def expiry_settings_errors(
    *, batch_size: int | None, interval: timedelta | None, retention: timedelta | None
) -> dict[str, str]:
    """Field errors for a settings change (empty when valid)."""
    errors = {}
    if batch_size is None or batch_size < 1:
        errors["batch_size"] = "Batch size must be at least 1."
    if interval is None or interval <= timedelta(0):
        errors["interval"] = "Interval must be greater than zero."
    if retention is None or retention < timedelta(0):
        errors["retention"] = "Retention cannot be negative."
    return errors


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
