"""The partitioned layout of the reminders' tables that keep a live set and a growing history
(``TimeoutJob``, ``ReminderSubscription``) on PostgreSQL, and the online move of an existing
table into it (docs/timeouts.md, "Partitioned tables").

Layout: the table is partitioned by LIST on its status. The *live* leaf holds the rows a client
or the engine can still act on (pending and running jobs; scheduled and failed subscriptions): it
is a plain table, so it keeps a primary key and the unique index of the business key on its own.
The *done* leaf holds the finished rows, partitioned by RANGE on the moment they finished (the
row's modification time) into one partition per UTC day (``couponcenter.core.db.partitions``),
which retention drops whole. A status change that finishes a row moves it from one leaf to the
other (PostgreSQL's row movement); ``couponcenter.core.db.row_movement`` covers the statement that
meets a row a concurrent transaction moved.

The move of an existing table (``partition_*`` steps, one migration operation each):

1. ``index_live``: an index of the live rows, built concurrently (no lock on writes);
2. ``switch`` (one short transaction, the only one the hot paths wait for, for as long as it takes
   to copy the live rows): the table is renamed ``<table>_legacy``, the partitioned table takes
   its name, the live rows are copied into the live leaf and deleted from the legacy table;
3. ``prepare_legacy`` (no lock the hot paths take): the legacy table, now finished rows only, gets
   the constraint and indexes of a done partition;
4. ``attach`` (short: the done leaf is locked while the few rows that finished since 2 move out of
   its DEFAULT partition; statements finishing rows wait for it, those on live rows do not): the
   legacy table becomes the done leaf's partition of today, ``FROM (MINVALUE)``: no row is
   copied, and retention drops it whole once today is past the retention.
Between 2 and 4 the finished rows of the legacy table are out of sight (seconds per million).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone

from couponcenter.core.db.partitions import (
    Partitioned,
    default_name,
    partition_name,
    partitions_ensure,
)

logger = logging.getLogger(__name__)

LIVE_SUFFIX = "_live"
DONE_SUFFIX = "_done"
LEGACY_SUFFIX = "_legacy"
# The done leaf's days exist this far ahead: its key is the moment a row finished, never in the
# future, so tomorrow's partition is all that must be there before midnight.
DONE_AHEAD = timedelta(days=2)


@dataclass(frozen=True)
class StatusLayout:
    table: str
    pk: str
    live: tuple[int | str, ...]  # statuses of the live leaf
    done: tuple[int | str, ...]  # statuses of the done leaf
    finished_at: str  # the done leaf's range key: when the row last changed
    # The live leaf's own indexes, by the names the model gives them (the legacy table's
    # indexes of these names are renamed first): (name, SQL after "ON <leaf>").
    live_indexes: tuple[tuple[str, str], ...]
    unique_live: tuple[str, ...]  # which of ``live_indexes`` are UNIQUE
    # Indexes of the whole table, created on the parent (each leaf and partition gets one); the
    # legacy table's index of the same definition is attached, not built again.
    parent_indexes: tuple[tuple[str, str, str], ...]  # (name, legacy index name, SQL)
    # Indexes of the done leaf only (the legacy table builds its own in ``prepare_legacy``).
    done_indexes: tuple[tuple[str, str], ...]
    # Other statements for the new parent (foreign keys), with {table}.
    parent_extra: tuple[str, ...] = ()
    # The way back (``partition_undo``): the plain table's constraints as Django named them.
    plain_extra: tuple[str, ...] = ()

    @property
    def live_leaf(self) -> str:
        return self.table + LIVE_SUFFIX

    @property
    def done_leaf(self) -> str:
        return self.table + DONE_SUFFIX

    @property
    def legacy(self) -> str:
        return self.table + LEGACY_SUFFIX

    @property
    def default(self) -> str:
        return default_name(self.done_leaf)

    @property
    def done_days(self) -> Partitioned:
        """The done leaf as the partition kernel keeps it: nothing in it is kept past its
        retention (every row is finished)."""
        return Partitioned(table=self.done_leaf, column=self.finished_at, ahead=DONE_AHEAD)

    def values(self, statuses: tuple[int | str, ...]) -> str:
        return ", ".join(str(s) if isinstance(s, int) else f"'{s}'" for s in statuses)


def timeout_job_layout(table: str = "reminders_timeoutjob") -> StatusLayout:
    return StatusLayout(
        table=table,
        pk="job_id",
        live=(0, 1),  # pending, running
        done=(2, 3, 4),  # processed, cancelled, dead
        finished_at="gmt_modified",
        live_indexes=(
            (f"{table}_pkey", "PRIMARY KEY"),
            ("timeoutjob_one_pending_per_biz", "(topic, biz_type, biz_id) WHERE status = 0"),
            ("timeoutjob_due", "(action_time) WHERE status = 0"),
        ),
        unique_live=("timeoutjob_one_pending_per_biz",),
        parent_indexes=(("timeoutjob_biz", "timeoutjob_biz", "(biz_type, biz_id)"),),
        done_indexes=((f"{table}_done_pk", "(job_id)"),),
    )


def subscription_layout(table: str = "reminders_remindersubscription") -> StatusLayout:
    return StatusLayout(
        table=table,
        pk="id",
        live=("scheduled", "failed"),
        done=("sent", "cancelled", "dropped"),
        finished_at="updated_at",
        live_indexes=(
            (f"{table}_pkey", "PRIMARY KEY"),
            ("subscription_one_per_user", "(user_id, coupon_id)"),
            ("subscription_due", "(remind_at) WHERE status = 'scheduled'"),
        ),
        unique_live=("subscription_one_per_user",),
        parent_indexes=(("subscription_coupon", f"{table}_coupon_id_9e9ade1a", "(coupon_id)"),),
        done_indexes=(
            (f"{table}_done_pk", "(id)"),
            ("subscription_done_user", "(user_id, coupon_id)"),
        ),
        parent_extra=(
            # As Django declares its foreign keys, so the legacy table's own is attached to it.
            "ALTER TABLE {table} ADD CONSTRAINT subscription_coupon_fk FOREIGN KEY (coupon_id) "
            "REFERENCES couponcenter_coupon (id) DEFERRABLE INITIALLY DEFERRED",
        ),
        plain_extra=(
            "ALTER TABLE {table} ADD CONSTRAINT "
            "reminders_remindersu_coupon_id_9e9ade1a_fk_couponcen "
            "FOREIGN KEY (coupon_id) REFERENCES couponcenter_coupon (id) "
            "DEFERRABLE INITIALLY DEFERRED",
        ),
    )


def is_partitioned(cursor, table: str) -> bool:
    cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table])
    row = cursor.fetchone()
    return row is not None and row[0] == "p"


def partition_index_live(cursor, layout: StatusLayout) -> None:
    """Step 1, outside a transaction: the index ``switch`` finds the live rows by."""
    if is_partitioned(cursor, layout.table):
        return
    cursor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {layout.table}_live_rows ON {layout.table} "
        f"({layout.pk}) WHERE status IN ({layout.values(layout.live)})"
    )


def partition_switch(cursor, layout: StatusLayout) -> None:
    """Step 2, in the caller's transaction: the partitioned table takes the table's place."""
    t, legacy = layout.table, layout.legacy
    if is_partitioned(cursor, t):
        return
    cursor.execute(f"LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE")
    cursor.execute("SELECT pg_get_serial_sequence(%s, %s)", [t, layout.pk])
    (old_sequence,) = cursor.fetchone()
    cursor.execute(f"ALTER TABLE {t} RENAME TO {legacy}")
    cursor.execute(f"ALTER SEQUENCE {old_sequence} RENAME TO {legacy}_{layout.pk}_seq")
    # The index names the new tables take (renaming a constraint's index renames it too).
    cursor.execute(f"ALTER INDEX {t}_pkey RENAME TO {legacy}_pkey")
    taken = [name for name, _ in layout.live_indexes[1:]]
    taken += [name for name, old, _ in layout.parent_indexes if name == old]
    for name in taken:
        cursor.execute(f"ALTER INDEX {name} RENAME TO {name}_legacy")
    # No identity on a partitioned table (PostgreSQL 15): a sequence owned by the column, going
    # on from the legacy one's, as a serial column has.
    cursor.execute(
        f"CREATE TABLE {t} (LIKE {legacy} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
        "PARTITION BY LIST (status)"
    )
    sequence = f"{t}_{layout.pk}_seq"
    cursor.execute(f"CREATE SEQUENCE {sequence} OWNED BY {t}.{layout.pk}")
    cursor.execute(
        f"SELECT setval('{sequence}', GREATEST((SELECT last_value FROM {legacy}_{layout.pk}_seq),"
        f" (SELECT COALESCE(max({layout.pk}), 0) FROM {legacy}), 1))"
    )
    cursor.execute(f"ALTER TABLE {t} ALTER COLUMN {layout.pk} SET DEFAULT nextval('{sequence}')")
    cursor.execute(
        f"CREATE TABLE {layout.live_leaf} PARTITION OF {t} "
        f"FOR VALUES IN ({layout.values(layout.live)})"
    )
    for name, definition in layout.live_indexes:
        if definition == "PRIMARY KEY":
            cursor.execute(
                f"ALTER TABLE {layout.live_leaf} ADD CONSTRAINT {name} PRIMARY KEY ({layout.pk})"
            )
            continue
        unique = "UNIQUE " if name in layout.unique_live else ""
        cursor.execute(f"CREATE {unique}INDEX {name} ON {layout.live_leaf} {definition}")
    cursor.execute(
        f"CREATE TABLE {layout.done_leaf} PARTITION OF {t} "
        f"FOR VALUES IN ({layout.values(layout.done)}) PARTITION BY RANGE ({layout.finished_at})"
    )
    for name, definition in layout.done_indexes:
        cursor.execute(f"CREATE INDEX {name} ON {layout.done_leaf} {definition}")
    cursor.execute(f"CREATE TABLE {layout.default} PARTITION OF {layout.done_leaf} DEFAULT")
    for name, _, definition in layout.parent_indexes:
        cursor.execute(f"CREATE INDEX {name} ON {t} {definition}")
    live = f"status IN ({layout.values(layout.live)})"
    cursor.execute(f"INSERT INTO {layout.live_leaf} SELECT * FROM {legacy} WHERE {live}")
    cursor.execute(f"DELETE FROM {legacy} WHERE {live}")
    for statement in layout.parent_extra:  # after the copy: checked in one pass, not per row
        cursor.execute(statement.format(table=t))


def legacy_upper(now: datetime) -> datetime:
    """The upper bound of the legacy partition: the end of ``now``'s UTC day."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day + timedelta(days=1)


def partition_prepare_legacy(cursor, layout: StatusLayout, *, upper: datetime) -> None:
    """Step 3, in the caller's transaction: the legacy table (finished rows only, read by no
    one) gets a done partition's checked constraint and indexes, so ``attach`` scans nothing."""
    legacy = layout.legacy
    if not _exists(cursor, legacy) or _attached(cursor, legacy):
        return
    cursor.execute(f"ALTER TABLE {legacy} ALTER COLUMN {layout.pk} DROP IDENTITY IF EXISTS")
    cursor.execute(f"DROP INDEX IF EXISTS {layout.table}_live_rows")
    for name, definition in layout.live_indexes[1:]:
        if "WHERE" in definition:  # partial indexes of live rows: empty from now on
            cursor.execute(f"DROP INDEX IF EXISTS {name}_legacy")
    check = f"{legacy}_finished"
    cursor.execute(
        f"ALTER TABLE {legacy} DROP CONSTRAINT IF EXISTS {check}, ADD CONSTRAINT {check} "
        f"CHECK (status IN ({layout.values(layout.done)}) AND {layout.finished_at} IS NOT NULL "
        f"AND {layout.finished_at} < %s) NOT VALID",
        [upper],
    )
    cursor.execute(f"ALTER TABLE {legacy} VALIDATE CONSTRAINT {check}")
    for name, definition in layout.done_indexes:
        cursor.execute(f"CREATE INDEX IF NOT EXISTS {name}_legacy ON {legacy} {definition}")


def partition_attach(cursor, layout: StatusLayout, *, upper: datetime) -> str:
    """Step 4, in the caller's transaction: the legacy table becomes the done leaf's partition
    of the day before ``upper``, named as ``couponcenter.core.db.partitions`` names a day's.
    Rows that finished since ``switch`` (in the DEFAULT partition) move into it first."""
    legacy = layout.legacy
    name = partition_name(layout.done_leaf, upper - timedelta(days=1))
    if not _exists(cursor, legacy) or _attached(cursor, legacy):
        return name
    # The done leaf itself, not only DEFAULT: a statement that had routed a finishing row to
    # DEFAULT before the attach narrowed it would fail its partition check; held off here, it
    # routes the row once the attach is committed, into the attached table.
    cursor.execute(f"LOCK TABLE {layout.done_leaf} IN ACCESS EXCLUSIVE MODE")
    cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {legacy})")
    if not cursor.fetchone()[0]:
        # Nothing finished to keep (a new database): no partition from MINVALUE, which no
        # retention could drop before its day ends. The days start today; an older key goes to
        # DEFAULT, which the retention clears.
        cursor.execute(f"DROP TABLE {legacy}")
        return name
    key = layout.finished_at
    cursor.execute(f"INSERT INTO {legacy} SELECT * FROM {layout.default} WHERE {key} < %s", [upper])
    cursor.execute(f"DELETE FROM {layout.default} WHERE {key} < %s", [upper])
    cursor.execute(
        f"ALTER TABLE {layout.done_leaf} ATTACH PARTITION {legacy} "
        "FOR VALUES FROM (MINVALUE) TO (%s)",
        [upper],
    )
    cursor.execute(f"ALTER TABLE {legacy} RENAME TO {name}")
    return name


def _exists(cursor, table: str) -> bool:
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
    return cursor.fetchone()[0]


def _attached(cursor, table: str) -> bool:
    cursor.execute("SELECT relispartition FROM pg_class WHERE oid = to_regclass(%s)", [table])
    row = cursor.fetchone()
    return bool(row and row[0])


def partition_online(connection, layout: StatusLayout) -> dict[str, float]:
    """All four steps, each in its own transaction (the migrations' one operation; idempotent:
    a step done already is skipped, so a migration stopped halfway is run again). Returns each
    step's seconds; ``switch`` is how long the hot paths waited."""
    if connection.vendor != "postgresql":
        return {}
    seconds: dict[str, float] = {}

    def timed(name: str, step, *, atomic: bool = True) -> None:
        started = time.perf_counter()
        if atomic:
            with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
                step(cursor)
        else:
            with connection.cursor() as cursor:
                step(cursor)
        seconds[name] = round(time.perf_counter() - started, 3)

    timed("index_live", lambda c: partition_index_live(c, layout), atomic=False)
    timed("switch", lambda c: partition_switch(c, layout))
    upper = legacy_upper(timezone.now())
    timed("prepare_legacy", lambda c: partition_prepare_legacy(c, layout, upper=upper))
    # A later bound than the check's is still implied by it: nothing is scanned.
    timed("attach", lambda c: partition_attach(c, layout, upper=legacy_upper(timezone.now())))
    partitions_ensure(layout.done_days, now=timezone.now())
    logger.info("%s partitioned: %s", layout.table, seconds)
    return seconds


def partition_undo(connection, layout: StatusLayout) -> None:
    """The way back to one plain table (a migration unapplied): every row copied into it, under
    an exclusive lock for as long as that takes, with the indexes and constraints Django made."""
    if connection.vendor != "postgresql":
        return
    t, pk, plain = layout.table, layout.pk, f"{layout.table}_plain"
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        if not is_partitioned(cursor, t):
            return
        cursor.execute(f"LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE")
        cursor.execute(f"CREATE TABLE {plain} (LIKE {t} INCLUDING CONSTRAINTS INCLUDING DEFAULTS)")
        cursor.execute(f"ALTER TABLE {plain} ALTER COLUMN {pk} DROP DEFAULT")
        cursor.execute(f"INSERT INTO {plain} SELECT * FROM {t}")
        cursor.execute(f"SELECT last_value FROM {t}_{pk}_seq")
        (last,) = cursor.fetchone()
        cursor.execute(f"DROP TABLE {t} CASCADE")  # its partitions and its sequence
        cursor.execute(f"ALTER TABLE {plain} RENAME TO {t}")
        cursor.execute(f"ALTER TABLE {t} ALTER COLUMN {pk} ADD GENERATED BY DEFAULT AS IDENTITY")
        cursor.execute(
            f"SELECT setval(pg_get_serial_sequence(%s, %s), GREATEST(%s, "
            f"(SELECT COALESCE(max({pk}), 0) FROM {t}), 1))",
            [t, pk, last],
        )
        cursor.execute(f"ALTER TABLE {t} ADD CONSTRAINT {t}_pkey PRIMARY KEY ({pk})")
        for name, definition in layout.live_indexes[1:]:
            if name in layout.unique_live and "WHERE" not in definition:
                cursor.execute(f"ALTER TABLE {t} ADD CONSTRAINT {name} UNIQUE {definition}")
                continue
            unique = "UNIQUE " if name in layout.unique_live else ""
            cursor.execute(f"CREATE {unique}INDEX {name} ON {t} {definition}")
        for _, old, definition in layout.parent_indexes:
            cursor.execute(f"CREATE INDEX {old} ON {t} {definition}")
        for statement in layout.plain_extra:
            cursor.execute(statement.format(table=t))
