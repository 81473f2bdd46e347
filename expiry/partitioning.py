"""Expiry tasks on PostgreSQL, partitioned (docs/partitioning.md): a pending leaf, and processed
tasks in one partition per day of processing, dropped whole by the retention.

Layout (``PARTITION BY LIST (status)``):
- ``expiry_expirytask_pending`` (``'pending'``): every task still to expire, whatever its
  ``expire_at`` (a coupon may be valid for years). Its own primary key on ``id``, its own unique key
  on ``user_coupon_id`` (at most one pending task per user coupon) and the sweeper's due index
  ``expirytask_pending_due`` on ``(expire_at, id)``. The claim and the sweeper name
  ``status = 'pending'`` in their text, so the planner reads this leaf alone.
- ``expiry_expirytask_processed`` (``'processed'``), ``PARTITION BY RANGE (updated_at)``: the day a
  task was processed, never in the future, so its DEFAULT stays empty. Indexes on ``id`` and
  ``user_coupon_id`` only; no foreign key, so moving a task here costs no check of its coupon.
  The retention drops its partitions whole (``expiry_partitions_drop``).

Invariants:
- A task is written once, pending, by the claim that writes its user coupon, and moves to
  processed once (the sweeper or a redeem); nothing moves it back. So the pending leaf's unique key
  is the "one task per user coupon" that the plain table's unique key was.
- Marking a task processed moves its row to another partition. An UPDATE that meets a row another
  transaction moved meanwhile fails with SQLSTATE 40001 instead of skipping it; the sweeper then
  takes that batch again the careful way, on a fresh snapshot (``services``). A redeem never meets
  one: it touches the task only after winning the user coupon, which a sweeper updates first.

The migration (``partition_expirytask``) swaps the layout in online: the new table is built under a
temporary name, the names are swapped under a lock held for milliseconds, the old table's pending
tasks (and any row the new layout would place elsewhere) move over in small batches, and the old
table, by then only processed tasks, is attached whole as the first processed partition and aged
out with the others.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import connection, transaction

from couponcenter.core.db.partitions import (
    DAY,
    DropReport,
    Partitioned,
    day_of,
    maintenance_turn,
    migration_step,
    partition_name,
    partitioned,
    partitions_drop_expired,
    partitions_ensure,
)

from .models import ExpiryTask

logger = logging.getLogger(__name__)

TABLE = ExpiryTask._meta.db_table
PENDING = ExpiryTask.Status.PENDING.value
PROCESSED_STATUS = ExpiryTask.Status.PROCESSED.value
PENDING_LEAF = f"{TABLE}_pending"
PROCESSED = Partitioned(table=f"{TABLE}_processed", column="updated_at", ahead=timedelta(days=2))
# The migration moves the old table's tasks in batches of this many rows, one transaction each.
MOVE_BATCH = 20_000
# Session advisory lock: one process of the fleet maintains the partitions at a time.
MAINTAIN_LOCK = (0x5E1A, 0x7A57)


def partitioned_tasks() -> bool:
    """Whether expiry tasks are partitioned here (PostgreSQL, once migrated): the retention then
    drops partitions (``expiry_partitions_drop``) instead of deleting rows."""
    return partitioned(TABLE)


def pending_tasks_table() -> str:
    """The table that holds the pending tasks: their partition once partitioned, else the one
    table (what the planner's statistics of the pending tasks are kept on)."""
    return PENDING_LEAF if partitioned_tasks() else TABLE


def expiry_partitions_ensure(*, now: datetime) -> list[str]:
    """Create the processed-task days from today to ``PROCESSED.ahead`` (whatever the retention:
    a task processed today needs its day); the names created. Nothing on SQLite, before the
    migration, or while another process maintains."""
    if not partitioned_tasks():
        return []
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        return partitions_ensure(PROCESSED, now=now) if mine else []


def expiry_partitions_drop(
    *, now: datetime, retention: timedelta, should_stop: Callable[[], bool] = lambda: False
) -> DropReport:
    """Drop the days of tasks processed more than ``retention`` ago (0 keeps everything): the
    partitioned way of ``services.expiry_cleanup``, stopping between days when asked."""
    if not partitioned_tasks():
        return DropReport()
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        if not mine:
            return DropReport()
        return partitions_drop_expired(
            PROCESSED, retention=retention, now=now, should_stop=should_stop
        )


# --- the migration -------------------------------------------------------------------------------


def partition_expirytask(*, table: str = TABLE, user_coupon_table: str, out=sys.stdout) -> dict:
    """Swap ``table`` (a plain expiry-task table) for the partitioned layout, online; returns the
    longest time any step held an exclusive lock on a table the hot paths use, and the rows
    moved. Idempotent: a table already partitioned is left alone."""
    if connection.vendor != "postgresql" or partitioned(table):
        return {}
    names = _names(table)
    _build(names, user_coupon_table)
    swap = _swap(names)
    moved = _move(names, swap["cutover"], out)
    if swap["empty"]:  # a new database: nothing to keep, today's partition is whole
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE {_q(names['legacy'])}")
        attach = 0.0
    else:
        attach = _attach_legacy(names, swap["cutover"])
    processed = Partitioned(names["processed"], PROCESSED.column, ahead=PROCESSED.ahead)
    partitions_ensure(processed, now=swap["cutover"])
    return {"swap_lock_s": swap["seconds"], "attach_s": attach, "moved": moved}


def _names(table: str) -> dict[str, str]:
    return {
        "table": table,
        "new": f"{table}_new",
        "legacy": f"{table}_legacy",
        "pending": f"{table}_pending",
        "processed": f"{table}_processed",
        "seq": f"{table}_id_seq",
        "new_seq": f"{table}_new_id_seq",
        # The sweeper's due index keeps its name (the model's) on the pending leaf.
        "due": "expirytask_pending_due" if table == TABLE else f"{table}_due",
        "new_due": f"{table}_new_due",
    }


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _build(n: dict[str, str], user_coupon_table: str) -> None:
    """The new layout under a temporary name: nothing uses it yet, so no lock matters but the
    foreign key's, which briefly takes the user-coupon table's SHARE ROW EXCLUSIVE lock."""
    pending, processed = PENDING, PROCESSED_STATUS
    with transaction.atomic(), connection.cursor() as c:
        c.execute(f"DROP TABLE IF EXISTS {_q(n['new'])} CASCADE")
        c.execute(f"DROP SEQUENCE IF EXISTS {_q(n['new_seq'])}")
        c.execute(f"CREATE SEQUENCE {_q(n['new_seq'])} AS bigint")
        c.execute(f"CREATE TABLE {_q(n['new'])} (LIKE {_q(n['table'])}) PARTITION BY LIST (status)")
        c.execute(
            f"ALTER TABLE {_q(n['new'])} ALTER COLUMN id SET DEFAULT nextval(%s::regclass)",
            [n["new_seq"]],
        )
        c.execute(f"ALTER SEQUENCE {_q(n['new_seq'])} OWNED BY {_q(n['new'])}.id")
        leaf = _q(n["pending"])
        c.execute(f"CREATE TABLE {leaf} PARTITION OF {_q(n['new'])} FOR VALUES IN ('{pending}')")
        c.execute(
            f"ALTER TABLE {leaf} ADD CONSTRAINT {_q(n['pending'] + '_pkey')} PRIMARY KEY (id)"
        )
        c.execute(
            f"ALTER TABLE {leaf} ADD CONSTRAINT {_q(n['pending'] + '_user_coupon_id_key')} "
            "UNIQUE (user_coupon_id)"
        )
        # Partial although every row of the leaf is pending: the sweeper's text names the
        # status, and the index says what it serves wherever it is read (docs/expiry.md).
        c.execute(
            f"CREATE INDEX {_q(n['new_due'])} ON {leaf} (expire_at, id) WHERE status = '{pending}'"
        )
        c.execute(
            f"CREATE TABLE {_q(n['processed'])} PARTITION OF {_q(n['new'])} "
            f"FOR VALUES IN ('{processed}') PARTITION BY RANGE (updated_at)"
        )
        c.execute(f"CREATE INDEX {_q(n['processed'] + '_id')} ON {_q(n['processed'])} (id)")
        c.execute(
            f"CREATE INDEX {_q(n['processed'] + '_user_coupon_id')} "
            f"ON {_q(n['processed'])} (user_coupon_id)"
        )
        c.execute(
            f"CREATE TABLE {_q(n['processed'] + '_default')} PARTITION OF {_q(n['processed'])} "
            "DEFAULT"
        )
    # Separately, and never waiting long: it takes the user-coupon table's SHARE ROW EXCLUSIVE
    # lock, which the claims writing user coupons would queue behind.
    migration_step(
        lambda c: c.execute(
            f"ALTER TABLE {leaf} ADD CONSTRAINT {_q(n['pending'] + '_user_coupon_id_fk')} "
            f"FOREIGN KEY (user_coupon_id) REFERENCES {_q(user_coupon_table)} (id) "
            "DEFERRABLE INITIALLY DEFERRED"
        ),
        what="expiry tasks: foreign key",
    )


def _swap(n: dict[str, str]) -> dict:
    """Rename the old table away and the new one in, under the old table's exclusive lock, held
    for a few catalog updates (``migration_step``: never waited for long)."""

    def swap(c) -> dict:
        c.execute(f"LOCK TABLE {_q(n['table'])} IN ACCESS EXCLUSIVE MODE")
        started = time.perf_counter()
        c.execute(f"SELECT max(id), clock_timestamp() FROM {_q(n['table'])}")
        max_id, cutover = c.fetchone()
        c.execute(f"ALTER TABLE {_q(n['table'])} RENAME TO {_q(n['legacy'])}")
        c.execute(f"ALTER TABLE {_q(n['new'])} RENAME TO {_q(n['table'])}")
        c.execute(f"ALTER TABLE {_q(n['legacy'])} ALTER COLUMN id DROP IDENTITY IF EXISTS")
        c.execute(f"ALTER SEQUENCE {_q(n['new_seq'])} RENAME TO {_q(n['seq'])}")
        c.execute("SELECT setval(%s::regclass, %s, %s)", [n["seq"], max_id or 1, bool(max_id)])
        c.execute("SELECT to_regclass(%s) IS NOT NULL", [n["due"]])
        if c.fetchone()[0]:
            c.execute(f"ALTER INDEX {_q(n['due'])} RENAME TO {_q(n['legacy'] + '_due')}")
        c.execute(f"ALTER INDEX {_q(n['new_due'])} RENAME TO {_q(n['due'])}")
        # Tasks processed from now on land in today's partition from the cutover; before it
        # lies the old table, attached once it holds only what fits there (an empty one is
        # dropped, and today's partition starts at midnight).
        c.execute(
            f"CREATE TABLE {_q(partition_name(n['processed'], day_of(cutover)))} "
            f"PARTITION OF {_q(n['processed'])} FOR VALUES FROM (%s) TO (%s)",
            [day_of(cutover) if max_id is None else cutover, day_of(cutover) + DAY],
        )
        seconds = time.perf_counter() - started
        return {"cutover": cutover, "seconds": seconds, "empty": max_id is None}

    result = migration_step(swap, what="expiry tasks: swap")
    logger.info("expiry tasks: layout swapped in %.3f s", result["seconds"])
    return result


def _move(n: dict[str, str], cutover: datetime, out) -> int:
    """Move from the old table, most urgent first, every row that is not a task processed before
    the cutover: pending tasks (which the sweeper only sees once moved), then any processed at
    or after the cutover (a clock ahead of the database's). One short transaction per batch."""
    legacy, table = _q(n["legacy"]), _q(n["table"])
    with connection.cursor() as c:
        c.execute(
            "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            [n["table"]],
        )
        columns = c.fetchone()[0]
    returning = ", ".join(f"l.{column}" for column in columns.split(", "))
    phases = (
        (f"status = '{PENDING}'", "expire_at, id"),
        (f"status = '{PROCESSED_STATUS}' AND updated_at >= %(cutover)s", "updated_at"),
    )
    moved, started, last_report = 0, time.monotonic(), 0.0
    for condition, order in phases:
        while True:
            with transaction.atomic(), connection.cursor() as c:
                c.execute(
                    f"WITH batch AS (SELECT id FROM {legacy} WHERE {condition} ORDER BY {order} "
                    f"LIMIT %(limit)s), moved AS (DELETE FROM {legacy} l USING batch "
                    f"WHERE l.id = batch.id RETURNING {returning}) "
                    f"INSERT INTO {table} ({columns}) SELECT {columns} FROM moved",
                    {"limit": MOVE_BATCH, "cutover": cutover},
                )
                count = c.rowcount
            moved += count
            if time.monotonic() - last_report >= 5 and moved:
                last_report = time.monotonic()
                out.write(f"  expiry tasks: {moved:,} moved ({time.monotonic() - started:.0f} s)\n")
            if count < MOVE_BATCH:
                break
    return moved


def _attach_legacy(n: dict[str, str], cutover: datetime) -> float:
    """Attach the old table, now only tasks processed before the cutover, as the processed
    partition ``[MINVALUE, cutover)``. Its CHECK is validated first under a lock that lets every
    other statement run, so the attach itself scans nothing; its indexes are built before, so the
    attach only links them. Nothing but this migration uses the old table any more."""
    legacy, processed = n["legacy"], n["processed"]
    with connection.cursor() as c:
        c.execute(
            f"ALTER TABLE {_q(legacy)} ADD CONSTRAINT {_q(legacy + '_bound')} CHECK "
            f"(status = '{PROCESSED_STATUS}' AND updated_at IS NOT NULL AND updated_at < %s) "
            "NOT VALID",
            [cutover],
        )
        c.execute(f"ALTER TABLE {_q(legacy)} VALIDATE CONSTRAINT {_q(legacy + '_bound')}")
        c.execute(f"CREATE INDEX {_q(legacy + '_id')} ON {_q(legacy)} (id)")
        c.execute(f"CREATE INDEX {_q(legacy + '_user_coupon_id')} ON {_q(legacy)} (user_coupon_id)")
        # The old indexes serve nothing a processed partition is asked.
        c.execute(
            "SELECT i.relname, con.conname FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid LEFT JOIN pg_constraint con "
            "ON con.conindid = x.indexrelid AND con.conrelid = x.indrelid "
            "WHERE x.indrelid = %s::regclass AND i.relname NOT IN (%s, %s)",
            [legacy, f"{legacy}_id", f"{legacy}_user_coupon_id"],
        )
        for index, constraint in c.fetchall():
            if constraint:
                c.execute(f"ALTER TABLE {_q(legacy)} DROP CONSTRAINT {_q(constraint)}")
            else:
                c.execute(f"DROP INDEX {_q(index)}")
        started = time.perf_counter()
    migration_step(
        lambda c: c.execute(
            f"ALTER TABLE {_q(processed)} ATTACH PARTITION {_q(legacy)} "
            "FOR VALUES FROM (MINVALUE) TO (%s)",
            [cutover],
        ),
        what="expiry tasks: attach",
    )
    return time.perf_counter() - started
