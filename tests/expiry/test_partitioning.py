"""Expiry tasks partitioned on PostgreSQL (expiry.partitioning): the sweeper's due claim reads the
pending leaf alone, a sweep moves tasks to the day they were processed, one pending task per user
coupon, and the maintenance keeps processed days by the retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from couponcenter.core.db.partitions import partitions_ensure, partitions_list
from expiry import partitioning, services, sql
from expiry.bench.sweep import CLAIMS_LOAD_SQL
from expiry.models import ExpiryTask
from tests.support.factories import CouponFactory, ExpiryTaskFactory, UserCouponFactory
from tests.support.plans import relations, scans

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

JAN1 = datetime(2026, 1, 1, tzinfo=UTC)
PROCESSED = partitioning.PROCESSED.table


@pytest.fixture(autouse=True)
def own_partitions():
    """Processed partitions this test creates go with it (a TRUNCATE leaves them)."""
    before = set(partitions_list(PROCESSED))
    yield
    with connection.cursor() as cursor:
        for name in set(partitions_list(PROCESSED)) - before:
            cursor.execute(f"DROP TABLE {connection.ops.quote_name(name)}")


def tasks(count: int, *, expires_at: datetime) -> list[ExpiryTask]:
    return [
        ExpiryTaskFactory(
            user_coupon=UserCouponFactory(
                expires_at=expires_at, claimed_at=expires_at - timedelta(days=1)
            )
        )
        for _ in range(count)
    ]


def explain(statement: str, params) -> set[str]:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {statement}", params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    return relations(plan)


def where(task_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM expiry_expirytask WHERE id = %s", [task_id]
        )
        return cursor.fetchone()[0]


def batch_params(now: datetime, descending: bool) -> dict:
    return {
        "now": now,
        "limit": 100,
        "ids": False,
        "after_at": services._END[0] if descending else services._START[0],
        "after_id": services._END[1] if descending else services._START[1],
        "lock_class": sql.BATCH_LOCK_CLASS,
    }


def test_the_layout_is_a_pending_leaf_and_processed_days():
    assert partitioning.partitioned_tasks()
    assert partitions_list(ExpiryTask._meta.db_table) == []  # LIST leaves: no days up here
    assert all(
        name.startswith(f"{PROCESSED}_p") or name == f"{PROCESSED}_default"
        for name in partitions_list(PROCESSED)
    )


def test_a_swept_task_moves_to_the_day_it_was_processed():
    partitions_ensure(partitioning.PROCESSED, now=JAN1)
    task = tasks(1, expires_at=JAN1)[0]
    assert where(task.pk) == partitioning.PENDING_LEAF

    services.expiry_sweep_due(now=JAN1 + timedelta(hours=3), batch_size=10)

    assert where(task.pk) == f"{PROCESSED}_p20260101"
    assert ExpiryTask.objects.get(pk=task.pk).status == "processed"


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("careful", [False, True])
def test_the_due_claim_reads_only_the_pending_leaf(careful, descending):
    partitions_ensure(partitioning.PROCESSED, now=JAN1)
    tasks(3, expires_at=JAN1)
    services.expiry_sweep_due(now=JAN1 + timedelta(hours=1), batch_size=10)  # some processed
    tasks(3, expires_at=JAN1)
    statement = sql.CAREFUL[descending] if careful else sql.FAST[descending].sql

    read = explain(statement, batch_params(JAN1 + timedelta(hours=2), descending))

    tables = {"expiry_expirytask_pending", "couponcenter_usercoupon"}
    assert read - {"expiry_expirytask"} == tables, read


def generic_plan(descending: bool = False, now: datetime = JAN1):
    """The fast batch statement's generic plan, as a sweeper's session would make it now."""
    statement = sql.FAST[descending]
    params = batch_params(now, descending)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(statement._prepare.replace(statement.key, "cc_test_due", 1))
        try:
            arguments = ", ".join(["%s"] * len(statement.params))
            cursor.execute(
                f"EXPLAIN (FORMAT JSON) EXECUTE cc_test_due({arguments})",
                [params[name] for name, _ in statement.params],
            )
            return cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE cc_test_due")


def test_the_prepared_due_claim_on_its_generic_plan_reads_only_the_pending_leaf():
    plan = generic_plan()

    tables = {"expiry_expirytask_pending", "couponcenter_usercoupon"}
    assert relations(plan) - {"expiry_expirytask"} == tables, relations(plan)


NIGHT = 20_000


def load_night(*, expires_at: datetime) -> None:
    """A night's tasks loaded in bulk, as a rush of claims makes them."""
    with connection.cursor() as cursor:
        cursor.execute(
            CLAIMS_LOAD_SQL,
            {
                "coupon": CouponFactory(total_stock=NIGHT).pk,
                "claimed": expires_at - timedelta(days=1),
                "due": expires_at,
                "lo": 1,
                "hi": NIGHT,
            },
        )


def a_night_on_a_leaf_recorded_as_empty(*, expires_at: datetime) -> None:
    """The night before swept (its tasks moved out of the pending leaf, their dead versions
    left in its pages and its due index), the leaf then analyzed while empty, as autovacuum
    records it after a night, and the next night loaded before anything looks again."""
    load_night(expires_at=expires_at - timedelta(days=1))
    services.expiry_sweep_due(now=expires_at - timedelta(days=1), batch_size=2_000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {partitioning.PENDING_LEAF}")
    load_night(expires_at=expires_at)


def leaf_scans(plan) -> set[str]:
    return {node for node, table in scans(plan) if table == partitioning.PENDING_LEAF}


def test_a_leaf_recorded_as_empty_is_analyzed_so_batches_walk_the_index_and_update_by_tid():
    partitions_ensure(partitioning.PROCESSED, now=JAN1 - timedelta(days=1))
    a_night_on_a_leaf_recorded_as_empty(expires_at=JAN1)
    stale = leaf_scans(generic_plan(now=JAN1 + timedelta(hours=1)))
    # The defect's plan: the whole leaf (or its whole due index) read for the batch, and again
    # for its update, rather than the due index walked in order and the tasks taken by TID.
    assert "Tid Scan" not in stale, stale

    assert sql.statistics_catch_up(seen=2_000, batch_size=2_000) is True

    fresh = leaf_scans(generic_plan(now=JAN1 + timedelta(hours=1)))
    assert "Tid Scan" in fresh and fresh <= {"Index Scan", "Index Only Scan", "Tid Scan"}, fresh
    assert sql.statistics_catch_up(seen=2_000, batch_size=2_000) is False  # once is enough


def test_a_pass_over_a_leaf_recorded_as_empty_brings_its_statistics_up_to_date():
    partitions_ensure(partitioning.PROCESSED, now=JAN1 - timedelta(days=1))
    a_night_on_a_leaf_recorded_as_empty(expires_at=JAN1)

    totals = services.expiry_sweep_due(now=JAN1 + timedelta(hours=1), batch_size=2_000)

    assert totals.expired == NIGHT
    assert not ExpiryTask.objects.filter(status=ExpiryTask.Status.PENDING).exists()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [partitioning.PENDING_LEAF]
        )
        # Analyzed after the pass's first batch: the rest of the night was still there.
        assert cursor.fetchone()[0] >= NIGHT - 2_000 * 2  # give or take ANALYZE's sample


def test_a_redeem_touches_only_the_pending_leaf():
    queryset = ExpiryTask.objects.filter(user_coupon_id=1, status=ExpiryTask.Status.PENDING)
    query, params = queryset.query.sql_with_params()
    assert explain(query, params) == {"expiry_expirytask_pending"}


def test_one_pending_task_per_user_coupon():
    task = tasks(1, expires_at=JAN1)[0]

    with pytest.raises(IntegrityError), transaction.atomic():
        ExpiryTask.objects.create(user_coupon_id=task.user_coupon_id, expire_at=JAN1)


def test_maintenance_creates_days_ahead_and_drops_processed_days_past_the_retention():
    partitions_ensure(partitioning.PROCESSED, now=JAN1)
    processed = tasks(2, expires_at=JAN1)
    services.expiry_sweep_due(now=JAN1 + timedelta(hours=1), batch_size=10)
    pending = tasks(2, expires_at=JAN1 - timedelta(days=30))  # overdue, not swept yet
    now = JAN1 + timedelta(days=9)

    created = partitioning.expiry_partitions_ensure(now=now)
    assert {f"{PROCESSED}_p202601{d}" for d in (10, 11, 12)} <= set(created)
    assert partitioning.expiry_partitions_drop(now=now, retention=timedelta(0)).rows == 0
    assert partitioning.expiry_partitions_ensure(now=now) == []

    removed = partitioning.expiry_partitions_drop(now=now, retention=timedelta(days=7)).rows

    # Jan 1 ended Jan 2 00:00 = now - retention: gone with its two tasks; Jan 3 not yet.
    assert removed == 2
    assert f"{PROCESSED}_p20260101" not in partitions_list(PROCESSED)
    assert f"{PROCESSED}_p20260103" in partitions_list(PROCESSED)
    assert not ExpiryTask.objects.filter(pk__in=[t.pk for t in processed]).exists()
    assert ExpiryTask.objects.filter(pk__in=[t.pk for t in pending], status="pending").count() == 2
