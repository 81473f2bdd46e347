"""Daily range partitions of a PostgreSQL table (docs/partitioning.md): create ahead, drop whole.

A partitioned table (``PARTITION BY RANGE (<timestamptz column>)``) holds one partition per UTC
day, named ``<table>_pYYYYMMDD`` for ``[day, day + 1 day)``, and a DEFAULT partition
(``<table>_default``) that catches keys beyond the days created so far. Retention drops whole
partitions, so old rows leave without a ``DELETE`` and without dead rows for vacuum to clean.

Invariants:
- ``partitions_ensure`` is idempotent: a day already covered, by its own partition or by any other
  (say the old table of a migration, attached whole), is left alone; a day partly covered gets a
  partition for the rest of it.
- A new partition takes over the rows of its range that were waiting in DEFAULT, in the
  transaction that attaches it: a key is never in two partitions nor in none.
- A partition is created empty and standalone, with a CHECK matching its bound, then attached:
  ``ATTACH PARTITION`` locks the parent ``SHARE UPDATE EXCLUSIVE`` (reads and writes go on) and
  skips scanning the new partition. It scans DEFAULT under an exclusive lock of DEFAULT alone,
  which is why each table's ``ahead`` is chosen to keep DEFAULT small.
- A partition is dropped only when its upper bound is at or before ``now - retention`` and it
  holds no row matching ``keep``. ``keep`` is checked again after the partition is detached, while
  it is locked, so a row that came to match it a moment before (a task rescheduled, a message
  marked unread) keeps the partition: the drop rolls back.
- DEFAULT is never dropped; the rows it holds from before ``now - retention`` (keys that came
  when their day had no partition) are deleted in batches, ``keep`` rows excepted, and rows a hot
  path holds skipped until the next pass.
- Every DDL statement waits at most ``DDL_LOCK_TIMEOUT_MS`` for its locks. A drop needs the
  parent's exclusive lock, and waiting for it would queue every query of the table behind it:
  after the timeout it gives up (``DropReport.busy``) and the next maintenance pass tries again.
- Call these outside a transaction: each creation and each drop commits on its own.
- On any other database (SQLite), or on a table that is not partitioned, they do nothing:
  ``partitioned()`` is how callers choose between dropping partitions and a batched ``DELETE``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.backends.utils import CursorWrapper

T = TypeVar("T")

logger = logging.getLogger(__name__)

# How long partition DDL waits for a table lock before it gives up until the next pass.
DDL_LOCK_TIMEOUT_MS = 500
# A migration's step under a hot table's lock waits this long for it, and is tried this often.
MIGRATION_LOCK_TIMEOUT_MS = 2000
MIGRATION_ATTEMPTS = 30
DAY = timedelta(days=1)
# SQLSTATE lock_not_available (lock_timeout), deadlock_detected.
_BUSY = {"55P03", "40P01"}
_BOUND = re.compile(r"FOR VALUES FROM \((?P<lo>[^)]*)\) TO \((?P<hi>[^)]*)\)")


@dataclass(frozen=True)
class Partitioned:
    """A table partitioned by day on ``column``, and how its partitions are kept."""

    table: str  # the partitioned (parent) table
    column: str  # the timestamptz range key
    keep: str = ""  # SQL condition: a partition holding any row matching it is never dropped
    ahead: timedelta = timedelta(days=3)  # partitions exist from today to today + ahead


@dataclass
class DropReport:
    dropped: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # old enough, but holding a ``keep`` row
    busy: list[str] = field(default_factory=list)  # the lock did not come in time: next pass
    rows: int = 0  # rows removed: those of the dropped partitions and those deleted from DEFAULT
    stopped: bool = False  # asked to stop with partitions or rows maybe left: the next pass goes on


@dataclass(frozen=True)
class _Child:
    name: str
    lo: datetime | None  # None: MINVALUE
    hi: datetime | None  # None: MAXVALUE
    default: bool = False


def partitioned(table: str) -> bool:
    """True when ``table`` is a partitioned table on PostgreSQL."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    return bool(row and row[0])


@contextmanager
def maintenance_turn(key: tuple[int, int]) -> Iterator[bool]:
    """Whether this process maintains now: a session advisory lock on ``key`` for the duration,
    so one process of the fleet runs a table's maintenance at a time (False: another has it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", key)
        mine = bool(cursor.fetchone()[0])
    try:
        yield mine
    finally:
        if mine:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", key)


def migration_step(step: Callable[[CursorWrapper], T], *, what: str) -> T:
    """Run ``step(cursor)`` in a transaction that waits at most ``MIGRATION_LOCK_TIMEOUT_MS`` for
    each lock, again while a lock does not come (a long query on the table): a lock request
    queues every later statement of the table behind it, so it must never wait long.
    Raises after ``MIGRATION_ATTEMPTS``."""
    for attempt in range(1, MIGRATION_ATTEMPTS + 1):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('lock_timeout', %s, true)",
                    [f"{MIGRATION_LOCK_TIMEOUT_MS}ms"],
                )
                return step(cursor)
        except DatabaseError as error:
            if _pgcode(error) != "55P03" or attempt == MIGRATION_ATTEMPTS:
                raise
            logger.info("partitions: %s: lock busy, attempt %d", what, attempt)
    raise AssertionError("unreachable")


def partition_name(table: str, day: datetime) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


def day_of(moment: datetime) -> datetime:
    """The UTC midnight at or before ``moment``."""
    return datetime.combine(moment.astimezone(UTC).date(), time(), tzinfo=UTC)


def partitions_ensure(spec: Partitioned, *, now: datetime) -> list[str]:
    """Create the missing partitions from today to today + ``spec.ahead`` (and DEFAULT if it is
    missing); returns the names created. A creation that cannot get its locks in time is left
    to the next pass."""
    if not partitioned(spec.table):
        return []
    created: list[str] = []
    children = _children(spec.table)
    default = next((child.name for child in children if child.default), None)
    if default is None and _ddl(
        f"CREATE TABLE {_q(default_name(spec.table))} PARTITION OF {_q(spec.table)} DEFAULT"
    ):
        default = default_name(spec.table)
        created.append(default)
    day, last = day_of(now), day_of(now + spec.ahead)
    while day <= last:
        gap = _gap(children, day, day + DAY)
        if gap is not None:
            name = partition_name(spec.table, day)
            if any(child.name == name for child in children):  # the day's other part has it
                name = f"{name}_{gap[0]:%H%M%S}"
            if _create(spec, name, *gap, default=default):
                created.append(name)
                children.append(_Child(name, *gap))
        day += DAY
    return created


def partitions_drop_expired(
    spec: Partitioned,
    *,
    retention: timedelta,
    now: datetime,
    batch_size: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> DropReport:
    """Drop the partitions whose upper bound is at or before ``now - retention`` and that hold no
    ``spec.keep`` row, then delete DEFAULT's rows from before then, ``batch_size`` (default
    ``RETENTION_BATCH_SIZE``) per transaction. ``should_stop`` is asked before each drop and each
    batch: the retention yields to the urgent paths between them. ``retention`` 0 keeps
    everything."""
    report = DropReport()
    if retention <= timedelta(0) or not partitioned(spec.table):
        return report
    cutoff = now - retention
    children = _children(spec.table)
    for child in sorted(children, key=lambda c: c.hi or datetime.max.replace(tzinfo=UTC)):
        if child.default or child.hi is None or child.hi > cutoff:
            continue
        if spec.keep and _holds(child.name, spec.keep):
            report.kept.append(child.name)
            continue
        if should_stop():
            report.stopped = True
            return _logged(spec, report)
        rows = _count(child.name)
        outcome = _drop(spec, child.name)
        getattr(report, outcome).append(child.name)
        if outcome == "dropped":
            report.rows += rows
    default = next((child.name for child in children if child.default), None)
    if default is not None:
        deleted, report.stopped = _delete_old_from_default(
            spec,
            default,
            cutoff,
            batch_size=batch_size or settings.RETENTION_BATCH_SIZE,
            should_stop=should_stop,
        )
        report.rows += deleted
    return _logged(spec, report)


def _logged(spec: Partitioned, report: DropReport) -> DropReport:
    if report.rows or report.busy:
        logger.info(
            "partitions %s: dropped %s, kept %s, busy %s, %d rows removed",
            spec.table,
            report.dropped,
            report.kept,
            report.busy,
            report.rows,
        )
    return report


def partitions_list(table: str) -> list[str]:
    """The names of ``table``'s partitions, oldest first, DEFAULT last ([] when not partitioned)."""
    if not partitioned(table):
        return []
    children = _children(table)
    ranged = sorted(
        (c for c in children if not c.default),
        key=lambda c: c.lo or datetime.min.replace(tzinfo=UTC),
    )
    return [c.name for c in ranged] + [c.name for c in children if c.default]


# --- internals -----------------------------------------------------------------------------------


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _children(table: str) -> list[_Child]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [table],
        )
        rows = cursor.fetchall()
    children = []
    for name, bound in rows:
        if bound == "DEFAULT":
            children.append(_Child(name, None, None, default=True))
            continue
        match = _BOUND.search(bound or "")
        if match is None:  # not a range partition (a LIST leaf above a ranged one): no day
            continue
        children.append(_Child(name, _bound_value(match["lo"]), _bound_value(match["hi"])))
    return children


def _bound_value(text: str) -> datetime | None:
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    return datetime.fromisoformat(text.strip("'")).astimezone(UTC)


def _gap(children: list[_Child], lo: datetime, hi: datetime) -> tuple[datetime, datetime] | None:
    """The part of ``[lo, hi)`` from its start that no partition covers yet, or None. A day is
    only ever partly covered by a range someone else chose (a migration's first partition)."""
    earliest = datetime.min.replace(tzinfo=UTC)
    for child in sorted(children, key=lambda c: c.lo or earliest):
        if child.default:
            continue
        starts_before = child.lo is None or child.lo <= lo
        if starts_before and (child.hi is None or child.hi > lo):
            lo = hi if child.hi is None else max(lo, child.hi)
    for child in children:
        if not child.default and child.lo is not None and lo < child.lo < hi:
            hi = child.lo
    return (lo, hi) if lo < hi else None


def _set_lock_timeout(cursor) -> None:
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{DDL_LOCK_TIMEOUT_MS}ms"])


class _Busy(Exception):
    """A lock did not come within ``DDL_LOCK_TIMEOUT_MS``; the transaction rolled back."""


@contextmanager
def _ddl_transaction(what: str) -> Iterator[CursorWrapper]:
    """A transaction whose statements wait at most ``DDL_LOCK_TIMEOUT_MS`` for a lock; raises
    ``_Busy`` when one did not come."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            _set_lock_timeout(cursor)
            yield cursor
    except DatabaseError as error:
        if _pgcode(error) not in _BUSY:
            raise
        logger.info("partitions: %s busy, next pass", what)
        raise _Busy(what) from error


def _ddl(sql: str, params: list | None = None) -> bool:
    """One DDL statement in its own transaction under the DDL lock timeout; False when busy."""
    try:
        with _ddl_transaction(sql.split("(")[0]) as cursor:
            cursor.execute(sql, params)
        return True
    except _Busy:
        return False


def _create(
    spec: Partitioned, name: str, lo: datetime, hi: datetime, *, default: str | None
) -> bool:
    """Create partition ``name`` for ``[lo, hi)``, moving into it the rows of that range that
    ``default`` (the DEFAULT partition, if any) holds, in one transaction. False when a lock did
    not come in time."""
    table, column = _q(spec.table), _q(spec.column)
    new, bound = _q(name), _q(f"{name}_bound")
    try:
        with _ddl_transaction(f"creating {name}") as cursor:
            cursor.execute(
                f"CREATE TABLE {new} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                "INCLUDING STORAGE INCLUDING COMMENTS)"
            )
            cursor.execute(
                f"ALTER TABLE {new} ADD CONSTRAINT {bound} "
                f"CHECK ({column} IS NOT NULL AND {column} >= %s AND {column} < %s)",
                [lo, hi],
            )
            if default is not None:
                # The columns by name: a partition attached whole may order them differently.
                columns = ", ".join(_q(c) for c in _columns(cursor, spec.table))
                in_range = f"{column} >= %s AND {column} < %s"
                cursor.execute(
                    f"WITH moved AS (DELETE FROM {_q(default)} WHERE {in_range} "
                    f"RETURNING {columns}) "
                    f"INSERT INTO {new} ({columns}) SELECT {columns} FROM moved",
                    [lo, hi],
                )
                if cursor.rowcount:
                    logger.info("partitions: %s takes %d rows from DEFAULT", name, cursor.rowcount)
            cursor.execute(
                f"ALTER TABLE {table} ATTACH PARTITION {new} FOR VALUES FROM (%s) TO (%s)", [lo, hi]
            )
            cursor.execute(f"ALTER TABLE {new} DROP CONSTRAINT {bound}")
        logger.info("partitions: created %s [%s, %s)", name, lo.isoformat(), hi.isoformat())
        return True
    except _Busy:
        return False


def _drop(spec: Partitioned, name: str) -> str:
    """Detach and drop partition ``name`` unless, once it is locked, it holds a ``keep`` row:
    ``dropped``, ``kept`` or ``busy``."""
    try:
        with _ddl_transaction(f"dropping {name}") as cursor:
            cursor.execute(f"ALTER TABLE {_q(spec.table)} DETACH PARTITION {_q(name)}")
            if spec.keep and _holds(name, spec.keep, cursor=cursor):
                transaction.set_rollback(True)
                return "kept"
            cursor.execute(f"DROP TABLE {_q(name)}")
        return "dropped"
    except _Busy:
        return "busy"


def _count(name: str) -> int:
    # Before the drop and without a lock: only rows past the retention are there, and a row
    # coming to match ``keep`` meanwhile keeps the partition anyway.
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {_q(name)}")
        return cursor.fetchone()[0]


def _delete_old_from_default(
    spec: Partitioned,
    default: str,
    cutoff: datetime,
    *,
    batch_size: int,
    should_stop: Callable[[], bool],
) -> tuple[int, bool]:
    """Delete, in batches, the rows DEFAULT holds from before ``cutoff``: keys that arrived when
    their day had no partition (a day not created yet, or already dropped). Few, so a DELETE.
    The rows deleted, and whether it stopped when asked with rows maybe left."""
    keep = f"AND NOT ({spec.keep})" if spec.keep else ""
    deleted = 0
    while True:
        if should_stop():
            return deleted, True
        try:
            with _ddl_transaction(f"deleting from {default}") as cursor:
                # A row a hot path holds is skipped (left for the next pass), and the condition
                # is checked again on the row as it is when deleted.
                aged = f"{_q(spec.column)} < %s {keep}"
                cursor.execute(
                    f"DELETE FROM {_q(default)} WHERE ctid = ANY(ARRAY(SELECT ctid "
                    f"FROM {_q(default)} WHERE {aged} LIMIT %s FOR UPDATE SKIP LOCKED)) "
                    f"AND {aged}",
                    [cutoff, batch_size, cutoff],
                )
                count = cursor.rowcount
        except _Busy:
            return deleted, False
        deleted += count
        if count < batch_size:
            return deleted, False


def _holds(name: str, condition: str, *, cursor=None) -> bool:
    sql = f"SELECT EXISTS (SELECT 1 FROM {_q(name)} WHERE {condition})"
    if cursor is not None:
        cursor.execute(sql)
        return bool(cursor.fetchone()[0])
    with connection.cursor() as own:
        own.execute(sql)
        return bool(own.fetchone()[0])


def _columns(cursor, table: str) -> list[str]:
    cursor.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped ORDER BY attnum",
        [table],
    )
    return [row[0] for row in cursor.fetchall()]


def _pgcode(error: DatabaseError) -> str | None:
    return getattr(error.__cause__, "pgcode", None)
