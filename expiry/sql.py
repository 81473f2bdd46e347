"""The sweeper's PostgreSQL: its two batch statements, how a batch runs, and the pass lanes.

``services`` decides what a batch and a pass do (its module docstring holds the invariants); this
module holds the SQL that does it on PostgreSQL, where one batch is one statement in one round
trip. Each statement comes in two directions, up the due index (oldest first) and down it (newest
first), for the two lanes of a pass (``services.expiry_sweep_due``).

The status values are written into the statements' text from the models' choices, never passed
as parameters: the planner matches a query to the partial index ``expirytask_pending_due`` only
when it sees ``status = 'pending'`` itself, and the fast way runs on a generic plan, which knows
no parameter values.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import NamedTuple

from django.conf import settings
from django.db import Error as DbError
from django.db import connection, transaction

from couponcenter.core.db import prepared
from couponcenter.coupons.models import UserCoupon

from .models import ExpiryTask
from .partitioning import pending_tasks_table

logger = logging.getLogger(__name__)

# Advisory lock classes: the sweepers' batches (the object is the batch's first task id) and the
# lanes of their passes (``lane_take``).
BATCH_LOCK_CLASS = 0x5E1A
LANE_LOCK_CLASS = 0x5E1B
# How long a pass waits for the lock of the ANALYZE that brings its plans up to date
# (``statistics_catch_up``) before it sweeps on without it.
ANALYZE_LOCK_WAIT_MS = 5000


class BatchRow(NamedTuple):
    """What one batch statement answers."""

    seen: int  # due tasks read (the careful way: the ones it could lock)
    processed: int  # tasks marked processed
    expired: int  # user coupons expired
    ids: list[int] | None  # the processed task ids, when asked for
    last: tuple[datetime, int] | None  # the greatest (expire_at, id) read, in walk order
    ours: bool  # False: another sweeper held the batch's lock and nothing was written


# The fast way (``services`` docstring), one statement. ``gate`` takes the batch's advisory lock;
# the UPDATEs run only with it. ``done`` reads ``expired``, so the coupons are updated before the
# tasks whatever order the executor would choose.
# - The batch is read once, straight into one aggregate (``span``): nothing is kept and walked
#   again, nor sorted for its first and last task. The batch's lock is named after its first task
#   in walk order, found by one descent of the same index in the statement's snapshot: two
#   sweepers reading the same batch name the same lock, and batches that only overlap never do.
# - The coupons: claims made together (one campaign's rush) fall due together, so a batch's user
#   coupons are often one run of ids with none missing (``span.whole``); then one walk of that key
#   range updates exactly them. Otherwise ``= ANY`` finds each by primary key (a join would leave
#   the planner free to choose a merge join that walks the whole key every batch). Exactly one of
#   the two runs: they never meet on a row.
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
    UPDATE couponcenter_usercoupon SET status = {expired}
    WHERE id BETWEEN (SELECT lo FROM span) AND (SELECT hi FROM span)
      AND (SELECT whole FROM span) AND (SELECT ok FROM gate)
      AND status = {unused}
    RETURNING id
), expired_each AS (
    UPDATE couponcenter_usercoupon SET status = {expired}
    WHERE id = ANY((SELECT coupons FROM span WHERE NOT whole AND (SELECT ok FROM gate))::bigint[])
      AND status = {unused}
    RETURNING id
), expired AS (
    SELECT id FROM expired_run UNION ALL SELECT id FROM expired_each
), done AS (
    UPDATE expiry_expirytask SET status = {processed}, updated_at = %(now)s
    WHERE ctid = ANY((SELECT ctids FROM span WHERE (SELECT count(*) >= 0 FROM expired)
                                             AND (SELECT ok FROM gate))::tid[])
      AND status = {pending}
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

# The careful way, one statement. ``done`` names the pending status although every task of the
# batch is locked pending: on the partitioned table (``expiry.partitioning``) that is what keeps the
# UPDATE to the pending leaf. ``batch`` locks each due task together with its user coupon
# and skips the pair when either row is locked (by a redeem, or by any long-open transaction), so
# the LIMIT fills up with rows it can take. Were the coupons locked in a second step, a head of
# the queue whose coupons are held would be claimed, skipped and claimed again by every batch of a
# pass, expiring nothing else (the chaos suite, tests/chaos, holds such locks). With ORDER BY and
# a small LIMIT the plan is the partial index in due order with a primary-key probe per coupon.
_CAREFUL_TEMPLATE = """
WITH batch AS (
    SELECT t.id, t.expire_at, t.user_coupon_id, c.status AS coupon_status
    FROM expiry_expirytask t JOIN couponcenter_usercoupon c ON c.id = t.user_coupon_id
    WHERE t.status = {pending} AND t.expire_at <= %(now)s
      AND (t.expire_at, t.id) {past} (%(after_at)s, %(after_id)s)
    ORDER BY {t_order}
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF t, c SKIP LOCKED
), expired AS (
    UPDATE couponcenter_usercoupon SET status = {expired}
    WHERE id = ANY(ARRAY(SELECT user_coupon_id FROM batch WHERE coupon_status = {unused}))
      AND status = {unused}
    RETURNING id
), done AS (
    UPDATE expiry_expirytask SET status = {processed}, updated_at = %(now)s
    WHERE id = ANY(ARRAY(SELECT id FROM batch)) AND status = {pending}
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

# The status values the statements write and test, as SQL literals (module docstring).
_STATUSES = {
    "unused": UserCoupon.Status.UNUSED,
    "expired": UserCoupon.Status.EXPIRED,
    "pending": ExpiryTask.Status.PENDING,
    "processed": ExpiryTask.Status.PROCESSED,
}


def _directed(template: str, descending: bool) -> str:
    """The statement for a pass up the due index (oldest first) or down it (newest first)."""
    up = ("expire_at, id", "expire_at DESC, id DESC")
    order, backwards = (up[1], up[0]) if descending else up
    near, far = ("max", "min") if descending else ("min", "max")
    past = "<" if descending else ">"
    literals = {name: f"'{value}'" for name, value in _STATUSES.items()}
    # The due tasks after the pass's key, as the fast way reads them (three times, one snapshot).
    due = (
        f"status = {literals['pending']} AND expire_at <= %(now)s "
        f"AND (expire_at, id) {past} (%(after_at)s, %(after_id)s)"
    )
    return template.format(
        past=past,
        order=order,
        backwards=backwards,
        near=near,
        far=far,
        due=due,
        t_order="t." + order.replace(", id", ", t.id"),
        **literals,
    )


# Per direction (False: up the index, True: down it). The fast way runs as a server-side prepared
# statement (``couponcenter.core.db.prepared``) on its generic plan, so a batch does not parse and
# plan its CTEs again every time.
_FAST_PARAMS = (
    ("now", "timestamptz"),
    ("limit", "integer"),
    ("ids", "boolean"),
    ("after_at", "timestamptz"),
    ("after_id", "bigint"),
    ("lock_class", "integer"),
)
FAST = {
    down: prepared.Prepared(
        f"cc_expiry_{'down' if down else 'up'}", _directed(_FAST_TEMPLATE, down), _FAST_PARAMS
    )
    for down in (False, True)
}
CAREFUL = {down: _directed(_CAREFUL_TEMPLATE, down) for down in (False, True)}


def batch_run(
    *,
    careful: bool,
    descending: bool,
    now: datetime,
    limit: int,
    collect_ids: bool,
    after: tuple[datetime, int],
    lock_timeout_ms: int,
) -> BatchRow:
    """One batch, the fast or the careful way, in its own transaction; the fast way prepared
    where it may be, as plain SQL otherwise (``prepared.execute_in_own_transaction``)."""
    statement = CAREFUL[descending] if careful else FAST[descending]
    params = {
        "now": now,
        "limit": limit,
        "ids": collect_ids,
        "after_at": after[0],
        "after_id": after[1],
        "lock_class": BATCH_LOCK_CLASS,
    }
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
            last = (last_at, last_id) if last_id else None
            return BatchRow(seen, processed, expired, ids, last, ours)
        except prepared.RunAgain:
            if again:
                raise
    raise AssertionError("unreachable")


def statistics_catch_up(*, seen: int, batch_size: int) -> bool:
    """ANALYZE the pending tasks when the planner's belief of how many there are is far behind;
    True when it did. A pass calls it before its first batch, and once more after its first full
    batch until it has analyzed (``services.expiry_sweep_due``).

    The batch statements' plans hang on that belief. A night empties the pending tasks and
    autovacuum then records them as empty; the next night's tasks can arrive and fall due before
    it looks again, while the table's pages and its due index still hold the dead versions of the
    tasks that moved out. Planned on that "empty" table, a batch read its tasks with a scan of the
    whole due index and a sort, and marked them processed with another such scan instead of by
    TID: every batch read every entry, dead ones too, and a round of 90,000 coupons took minutes
    instead of a second (BENCHMARKS.md, session 29). The ANALYZE invalidates those plans in every
    session, so each sweeper plans its next batch on what is there.

    Far behind: fewer than the ``seen`` due tasks a batch just read (the catalog's ``reltuples``
    against what the pass saw itself: no lag), or, before any batch, fewer than half the live
    tasks the statistics collector counts when those are at least a batch (a second or so behind
    a load, hence the second look). Its lock is waited for at most ``ANALYZE_LOCK_WAIT_MS``
    (autovacuum working on the table holds it and is cancelled for a waiter after
    ``deadlock_timeout``); a pass that cannot have it sweeps on with the plans it has."""
    if connection.vendor != "postgresql":
        return False
    table = pending_tasks_table()
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT c.reltuples, coalesce(s.n_live_tup, 0)
               FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
               WHERE c.oid = %s::regclass""",
            [table],
        )
        believed, live = cursor.fetchone()
    if believed >= seen and (live < batch_size or 2 * believed >= live):
        return False
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{ANALYZE_LOCK_WAIT_MS}ms'")
            cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
    except DbError as exc:
        logger.warning("expiry: could not ANALYZE %s (%s); sweeping on", table, exc)
        return False
    logger.info(
        "expiry: %s analyzed (the planner believed %d rows; %d live, a batch read %d)",
        table,
        max(believed, 0),
        live,
        seen,
    )
    return True


def lane_take() -> int | None:
    """Lane 0 or 1 if one is free (``services.expiry_sweep_due``), else None; PostgreSQL only,
    and not behind a pooler in transaction mode (``DB_PREPARED_STATEMENTS=0``), where a session
    lock taken on one server connection could not be released from the next and would hold its
    lane until the pooler closed that connection."""
    if connection.vendor != "postgresql" or not settings.DB_PREPARED_STATEMENTS:
        return None
    with connection.cursor() as cursor:
        for lane in (0, 1):
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [LANE_LOCK_CLASS, lane])
            if cursor.fetchone()[0]:
                return lane
    return None


def lane_release(lane: int | None) -> None:
    if lane is None:
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [LANE_LOCK_CLASS, lane])
    except DbError:  # the connection went: so did its session lock
        logger.warning("expiry: could not release sweep lane %s", lane, exc_info=True)
