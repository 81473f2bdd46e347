"""Notifications on PostgreSQL, partitioned by ``visible_at`` (docs/partitioning.md): one partition
per day, dropped whole by the read and unread retentions.

The ledger (a user sees each message once) is unique on ``(user_id, dedup_key, visible_at)``:
a partitioned table's unique key must hold its partition key. That is the same guarantee as
``(user_id, dedup_key)`` because ``visible_at`` is the same for every delivery of one message: the
message's due moment, the earliest ``remind_at`` of the reminders it carries (``dedup_key`` names
those reminders, and a reminder's ``remind_at`` no longer changes once it is sent). A redelivery
therefore lands in the partition of the first delivery and meets its row there, whatever day it
comes on. The inbox write (``reminders.gateways.InboxGateway``) says ``ON CONFLICT DO NOTHING``.

The migration (``partition_notifications``) attaches the old table whole as the first partition,
``[MINVALUE, cutover)``: a CHECK on ``visible_at`` and the new indexes are built on the live table
first (``NOT VALID`` then ``VALIDATE``, ``CREATE INDEX CONCURRENTLY``: neither stops the inbox's
writes), so the swap and the attach, under one lock held for milliseconds, scan nothing. The old
table keeps its unique ``(user_id, dedup_key)``, so a message first written before the upgrade
(with the write time as ``visible_at``) and delivered again after it is still seen once. It is
dropped whole once the cutover is older than the retentions.
"""

from __future__ import annotations

import logging
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
    partitioned,
    partitions_drop_expired,
    partitions_ensure,
)
from reminders.models import Notification

logger = logging.getLogger(__name__)

TABLE = Notification._meta.db_table
# Staged notifications are written at most ``ReminderSettings.prestage_ms`` ahead: days enough.
NOTIFICATIONS = Partitioned(table=TABLE, column="visible_at", ahead=timedelta(days=3))
# The first partition (the old table) covers up to the midnight after the migration's start plus
# this margin: what the inbox writes while the migration runs (before the swap) fits under its
# CHECK, and the old table, with its extra indexes, takes new rows for a day at most.
CUTOVER_MARGIN = timedelta(hours=6)
# Session advisory lock: one process of the fleet maintains the partitions at a time.
MAINTAIN_LOCK = (0x5E1A, 0x1B0C)


def notifications_partitioned() -> bool:
    return partitioned(TABLE)


def notification_partitions_ensure(*, now: datetime) -> list[str]:
    """Create the days from today to ``NOTIFICATIONS.ahead`` (whatever the retentions); the names
    created. Nothing on SQLite, before the migration, or while another process maintains."""
    if not notifications_partitioned():
        return []
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        return partitions_ensure(NOTIFICATIONS, now=now) if mine else []


def notification_partitions_drop(
    *,
    now: datetime,
    read_retention: timedelta,
    unread_retention: timedelta,
    should_stop: Callable[[], bool] = lambda: False,
) -> DropReport:
    """Drop the days every notification of which is past its retention (0: kept forever), by the
    rules of the batched way (``reminders.services.retention``): a read one that long after it was
    read, an unread one that long after it was shown, never one held for a digest. A day holding
    any other row stays whole. Stops between days when asked."""
    shorter = min((r for r in (read_retention, unread_retention) if r), default=timedelta(0))
    if not shorter or not notifications_partitioned():
        return DropReport()
    spec = Partitioned(
        NOTIFICATIONS.table,
        NOTIFICATIONS.column,
        keep=_still_kept(now=now, read=read_retention, unread=unread_retention),
    )
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        if not mine:
            return DropReport()
        return partitions_drop_expired(spec, retention=shorter, now=now, should_stop=should_stop)


def _still_kept(*, now: datetime, read: timedelta, unread: timedelta) -> str:
    """The SQL condition of a notification its retentions still keep at ``now``."""
    read_kept = f"read_at >= '{(now - read).isoformat()}'::timestamptz" if read else "true"
    unread_kept = f"visible_at >= '{(now - unread).isoformat()}'::timestamptz" if unread else "true"
    return f"held OR (read_at IS NOT NULL AND {read_kept}) OR (read_at IS NULL AND {unread_kept})"


# --- the migration -------------------------------------------------------------------------------


def partition_notifications(*, table: str = TABLE, now: datetime) -> dict:
    """Swap ``table`` (the plain notification table) for the partitioned layout, online; returns
    how long the swap held the table's lock. Idempotent: a partitioned table is left alone."""
    if connection.vendor != "postgresql" or partitioned(table):
        return {}
    n = _names(table)
    cutover = day_of(now + CUTOVER_MARGIN) + DAY
    _prepare_old(n, cutover)
    _build(n)
    seconds = _swap(n, cutover)
    spec = Partitioned(table, NOTIFICATIONS.column, ahead=NOTIFICATIONS.ahead)
    partitions_ensure(spec, now=now)
    return {"swap_lock_s": seconds, "cutover": cutover}


def _names(table: str) -> dict[str, str]:
    mine = table == TABLE
    return {
        "table": table,
        "new": f"{table}_new",
        "legacy": f"{table}_legacy",
        "seq": f"{table}_id_seq",
        "new_seq": f"{table}_new_id_seq",
        "bound": f"{table}_legacy_bound",
        # The model's index names stay on the parent's indexes.
        "once": "notification_once" if mine else f"{table}_once",
        "staged": "notification_staged" if mine else f"{table}_staged",
    }


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _prepare_old(n: dict[str, str], cutover: datetime) -> None:
    """On the live table, without stopping its writes: the CHECK that lets it be attached
    without a scan, and the indexes the partitioned table's indexes will take over."""
    table = _q(n["table"])

    def add_check(cursor) -> None:
        cursor.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {_q(n['bound'])} "
            "CHECK (visible_at IS NOT NULL AND visible_at < %s) NOT VALID",
            [cutover],
        )

    migration_step(add_check, what="notifications: CHECK")
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {_q(n['bound'])}")
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {_q(n['legacy'] + '_key')}")
        cursor.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {_q(n['legacy'] + '_key')} "
            f"ON {table} (user_id, dedup_key, visible_at)"
        )
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {_q(n['legacy'] + '_id')}")
        cursor.execute(f"CREATE INDEX CONCURRENTLY {_q(n['legacy'] + '_id')} ON {table} (id)")


def _build(n: dict[str, str]) -> None:
    """The partitioned table under a temporary name, with its indexes and DEFAULT."""
    new = _q(n["new"])
    with transaction.atomic(), connection.cursor() as c:
        c.execute(f"DROP TABLE IF EXISTS {new} CASCADE")
        c.execute(f"DROP SEQUENCE IF EXISTS {_q(n['new_seq'])}")
        c.execute(f"CREATE SEQUENCE {_q(n['new_seq'])} AS bigint")
        c.execute(
            f"CREATE TABLE {new} (LIKE {_q(n['table'])} INCLUDING DEFAULTS) "
            "PARTITION BY RANGE (visible_at)"
        )
        c.execute(
            f"ALTER TABLE {new} ALTER COLUMN id SET DEFAULT nextval(%s::regclass)", [n["new_seq"]]
        )
        c.execute(f"ALTER SEQUENCE {_q(n['new_seq'])} OWNED BY {new}.id")
        c.execute(
            f"CREATE UNIQUE INDEX {_q(n['new'] + '_once')} "
            f"ON {new} (user_id, dedup_key, visible_at)"
        )
        c.execute(f"CREATE INDEX {_q(n['new'] + '_id')} ON {new} (id)")
        c.execute(
            f"CREATE INDEX {_q(n['new'] + '_staged')} ON {new} (user_id) "
            "WHERE visible_at > created_at"
        )
        c.execute(f"CREATE TABLE {_q(n['table'] + '_default')} PARTITION OF {new} DEFAULT")


def _swap(n: dict[str, str], cutover: datetime) -> float:
    """Names swapped, the old table attached as ``[MINVALUE, cutover)``: catalog changes only,
    under the old table's lock."""
    table, legacy, new = _q(n["table"]), _q(n["legacy"]), _q(n["new"])

    def swap(c) -> float:
        c.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        started = time.perf_counter()
        c.execute(f"SELECT max(id) FROM {table}")
        max_id = c.fetchone()[0]
        c.execute(f"ALTER TABLE {table} RENAME TO {legacy}")
        c.execute(f"ALTER TABLE {new} RENAME TO {table}")
        c.execute(f"ALTER TABLE {legacy} ALTER COLUMN id DROP IDENTITY IF EXISTS")
        c.execute(f"ALTER SEQUENCE {_q(n['new_seq'])} RENAME TO {_q(n['seq'])}")
        c.execute("SELECT setval(%s::regclass, %s, %s)", [n["seq"], max_id or 1, bool(max_id)])
        for kind in ("once", "staged"):
            c.execute(
                "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND conname = %s",
                [n["legacy"], n[kind]],
            )
            if c.fetchone():
                c.execute(
                    f"ALTER TABLE {legacy} RENAME CONSTRAINT {_q(n[kind])} "
                    f"TO {_q(n['legacy'] + '_' + kind)}"
                )
            elif _exists(c, n[kind]):
                c.execute(f"ALTER INDEX {_q(n[kind])} RENAME TO {_q(n['legacy'] + '_' + kind)}")
            c.execute(f"ALTER INDEX {_q(n['new'] + '_' + kind)} RENAME TO {_q(n[kind])}")
        c.execute(f"ALTER INDEX {_q(n['new'] + '_id')} RENAME TO {_q(n['table'] + '_id')}")
        if max_id is None:  # a new database: nothing to keep, the days start today
            c.execute(f"DROP TABLE {legacy}")
        else:
            c.execute(
                f"ALTER TABLE {table} ATTACH PARTITION {legacy} FOR VALUES FROM (MINVALUE) TO (%s)",
                [cutover],
            )
        return time.perf_counter() - started

    seconds = migration_step(swap, what="notifications: swap")
    logger.info("notifications: layout swapped in %.3f s", seconds)
    return seconds


def _exists(cursor, name: str) -> bool:
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
    return bool(cursor.fetchone()[0])
