"""The partition kernel on a real PostgreSQL table: days created ahead, dropped whole, DEFAULT
emptied into new days, ``keep`` honoured, a busy lock skipped (couponcenter.core.db.partitions)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
from django.db import connection

from couponcenter.core.db.partitions import (
    Partitioned,
    _drop,
    partitioned,
    partitions_drop_expired,
    partitions_ensure,
    partitions_list,
)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TABLE = "cc_test_parts"
SPEC = Partitioned(table=TABLE, column="at", keep="status = 'pending'", ahead=timedelta(days=3))
NOV27 = datetime(2026, 11, 27, tzinfo=UTC)


@pytest.fixture
def parts():
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {TABLE} (id bigserial, at timestamptz NOT NULL, status text NOT NULL, "
            "PRIMARY KEY (id, at)) PARTITION BY RANGE (at)"
        )
        cursor.execute(f"CREATE INDEX {TABLE}_pending ON {TABLE} (at) WHERE status = 'pending'")
    yield SPEC
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {TABLE} CASCADE")


def insert(at: datetime, status: str = "done") -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {TABLE} (at, status) VALUES (%s, %s)", [at, status])


def where(at: datetime) -> str:
    """The partition that holds the row keyed ``at``."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {TABLE} WHERE at = %s", [at])
        return cursor.fetchone()[0]


def count() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE}")
        return cursor.fetchone()[0]


def days(*names: str) -> list[str]:
    return [f"{TABLE}_p{name}" for name in names]


def test_partitioned_tells_a_partitioned_table(parts):
    assert partitioned(TABLE)
    assert not partitioned("couponcenter_coupon")
    assert not partitioned("no_such_table")


def test_ensure_creates_today_to_ahead_and_default_then_nothing(parts):
    created = partitions_ensure(parts, now=NOV27 + timedelta(hours=23, minutes=59, seconds=59))

    assert sorted(created) == sorted(
        [f"{TABLE}_default", *days("20261127", "20261128", "20261129", "20261130")]
    )
    assert partitions_list(TABLE) == [
        *days("20261127", "20261128", "20261129", "20261130"),
        f"{TABLE}_default",
    ]
    assert partitions_ensure(parts, now=NOV27 + timedelta(hours=23)) == []


def test_ensure_across_midnight_adds_the_next_day_only(parts):
    partitions_ensure(parts, now=NOV27 + timedelta(hours=23, minutes=59, seconds=59))

    assert partitions_ensure(parts, now=NOV27 + timedelta(days=1)) == days("20261201")


def test_rows_land_in_their_day_and_beyond_the_horizon_in_default(parts):
    partitions_ensure(parts, now=NOV27)
    insert(NOV27 + timedelta(hours=1))
    insert(NOV27 + timedelta(days=1))  # exactly midnight: the next day's partition
    insert(NOV27 + timedelta(days=8))

    assert where(NOV27 + timedelta(hours=1)) == f"{TABLE}_p20261127"
    assert where(NOV27 + timedelta(days=1)) == f"{TABLE}_p20261128"
    assert where(NOV27 + timedelta(days=8)) == f"{TABLE}_default"


def test_a_new_day_takes_its_rows_out_of_default(parts):
    partitions_ensure(parts, now=NOV27)
    early, late = NOV27 + timedelta(days=5, hours=3), NOV27 + timedelta(days=9)
    insert(early, "pending")
    insert(early + timedelta(hours=20))
    insert(late)
    assert where(early) == f"{TABLE}_default"

    created = partitions_ensure(parts, now=NOV27 + timedelta(days=3))

    assert created == days("20261201", "20261202", "20261203")
    assert where(early) == f"{TABLE}_p20261202"
    assert where(early + timedelta(hours=20)) == f"{TABLE}_p20261202"
    assert where(late) == f"{TABLE}_default"
    assert count() == 3


def test_drop_at_and_across_the_day_boundary(parts):
    partitions_ensure(parts, now=NOV27)
    insert(NOV27 + timedelta(hours=5))
    retention = timedelta(days=1)
    # Nov 27's partition ends at Nov 28 00:00: it may go once now - retention reaches that.
    just_before = NOV27 + timedelta(days=2) - timedelta(microseconds=1)

    assert partitions_drop_expired(parts, retention=retention, now=just_before).dropped == []
    assert f"{TABLE}_p20261127" in partitions_list(TABLE)

    report = partitions_drop_expired(parts, retention=retention, now=NOV27 + timedelta(days=2))

    assert report.dropped == days("20261127")
    assert f"{TABLE}_p20261127" not in partitions_list(TABLE)
    assert f"{TABLE}_p20261128" in partitions_list(TABLE)
    assert count() == 0


def test_a_keep_row_blocks_the_drop(parts):
    partitions_ensure(parts, now=NOV27)
    insert(NOV27 + timedelta(hours=1), "pending")
    insert(NOV27 + timedelta(days=1, hours=1))

    report = partitions_drop_expired(
        parts, retention=timedelta(days=1), now=NOV27 + timedelta(days=5)
    )

    assert report.kept == days("20261127")
    assert report.dropped == days("20261128", "20261129", "20261130")
    assert count() == 1

    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET status = 'done'")
    later = partitions_drop_expired(
        parts, retention=timedelta(days=1), now=NOV27 + timedelta(days=5)
    )
    assert later.dropped == days("20261127")


def test_a_drop_stops_between_days_and_batches_when_asked_and_the_next_goes_on(parts):
    partitions_ensure(parts, now=NOV27)
    for day in range(3):
        insert(NOV27 + timedelta(days=day, hours=1))
    for minute in range(3):  # a day with no partition then: in DEFAULT
        insert(NOV27 - timedelta(days=1, minutes=minute))
    asked = []

    def after_one_step() -> bool:
        asked.append(1)
        return len(asked) > 1

    now = NOV27 + timedelta(days=5)
    first = partitions_drop_expired(
        parts, retention=timedelta(days=1), now=now, should_stop=after_one_step
    )

    assert first.stopped and first.dropped == days("20261127") and count() == 5
    asked.clear()
    second = partitions_drop_expired(
        parts, retention=timedelta(days=1), now=now, batch_size=1, should_stop=lambda: False
    )
    assert not second.stopped and second.dropped == days("20261128", "20261129", "20261130")
    assert second.rows == 5 and count() == 0


def test_retention_zero_drops_nothing(parts):
    partitions_ensure(parts, now=NOV27)
    insert(NOV27 + timedelta(hours=1))

    report = partitions_drop_expired(parts, retention=timedelta(0), now=NOV27 + timedelta(days=400))

    assert report.dropped == report.kept == report.busy == []
    assert count() == 1


def test_default_is_never_dropped(parts):
    partitions_ensure(parts, now=NOV27)
    insert(NOV27 + timedelta(days=30))

    report = partitions_drop_expired(
        parts, retention=timedelta(days=1), now=NOV27 + timedelta(days=400)
    )

    assert partitions_list(TABLE) == [f"{TABLE}_default"]
    assert report.rows == 1 and count() == 0  # DEFAULT's old row deleted, DEFAULT itself kept


def test_a_drop_that_cannot_get_its_lock_gives_up_and_succeeds_next_pass(parts):
    partitions_ensure(parts, now=NOV27)
    holding, release = threading.Event(), threading.Event()

    def reader() -> None:
        # Another session reading the table (a long query) holds its lock until released.
        params = connection.get_connection_params()
        other = psycopg2.connect(**params)
        try:
            with other.cursor() as cursor:
                cursor.execute(f"SELECT count(*) FROM {TABLE}")
                holding.set()
                release.wait(timeout=30)
            other.rollback()
        finally:
            other.close()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert holding.wait(timeout=30)
        report = partitions_drop_expired(
            parts, retention=timedelta(days=1), now=NOV27 + timedelta(days=2)
        )
    finally:
        release.set()
        thread.join()

    assert report.busy == days("20261127")
    assert f"{TABLE}_p20261127" in partitions_list(TABLE)
    report = partitions_drop_expired(
        parts, retention=timedelta(days=1), now=NOV27 + timedelta(days=2)
    )
    assert report.dropped == days("20261127")


def test_a_day_partly_covered_by_another_partition_gets_the_rest(parts):
    # A first partition attached whole by a migration may end at any moment.
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {TABLE}_legacy PARTITION OF {TABLE} "
            "FOR VALUES FROM (MINVALUE) TO ('2026-11-27 15:00+00')"
        )

    created = partitions_ensure(parts, now=NOV27)

    assert days("20261127")[0] in created
    insert(NOV27 + timedelta(hours=14))
    insert(NOV27 + timedelta(hours=15))
    assert where(NOV27 + timedelta(hours=14)) == f"{TABLE}_legacy"
    assert where(NOV27 + timedelta(hours=15)) == f"{TABLE}_p20261127"
    assert partitions_ensure(parts, now=NOV27) == []
    # The first partition goes whole once its upper bound is old enough.
    report = partitions_drop_expired(
        parts, retention=timedelta(days=1), now=NOV27 + timedelta(days=1, hours=15)
    )
    assert report.dropped == [f"{TABLE}_legacy"]


def test_the_part_of_a_day_before_a_partition_that_starts_mid_day(parts):
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE {TABLE}_p20261127 PARTITION OF {TABLE} "
            "FOR VALUES FROM ('2026-11-27 15:00+00') TO ('2026-11-28 00:00+00')"
        )

    created = partitions_ensure(parts, now=NOV27)

    assert f"{TABLE}_p20261127_000000" in created
    insert(NOV27 + timedelta(hours=14))
    assert where(NOV27 + timedelta(hours=14)) == f"{TABLE}_p20261127_000000"
    assert partitions_ensure(parts, now=NOV27) == []


def test_old_keys_in_default_are_deleted_but_keep_rows_stay(parts):
    # Rows keyed on a day that has no partition (not created yet when they came, or dropped).
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TABLE}_default PARTITION OF {TABLE} DEFAULT")
    insert(NOV27 - timedelta(days=10))
    insert(NOV27 - timedelta(days=10, hours=1), "pending")
    insert(NOV27 - timedelta(hours=1))

    report = partitions_drop_expired(parts, retention=timedelta(days=1), now=NOV27)

    assert report.rows == 1
    assert count() == 2
    assert where(NOV27 - timedelta(days=10, hours=1)) == f"{TABLE}_default"


def test_the_report_counts_the_rows_of_dropped_partitions(parts):
    partitions_ensure(parts, now=NOV27)
    for hour in range(3):
        insert(NOV27 + timedelta(hours=hour))

    report = partitions_drop_expired(
        parts, retention=timedelta(days=1), now=NOV27 + timedelta(days=2)
    )

    assert report.rows == 3


def test_a_keep_row_found_once_the_partition_is_locked_keeps_it(parts):
    # The drop itself (after the unlocked look found nothing): a row that came to match ``keep``
    # just before the lock is seen in the detached table, and the detach rolls back.
    partitions_ensure(parts, now=NOV27)
    insert(NOV27 + timedelta(hours=1), "pending")

    assert _drop(parts, f"{TABLE}_p20261127") == "kept"

    assert f"{TABLE}_p20261127" in partitions_list(TABLE)
    assert where(NOV27 + timedelta(hours=1)) == f"{TABLE}_p20261127"
