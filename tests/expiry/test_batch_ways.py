"""A batch's two ways on a real PostgreSQL: the fast way (no explicit row locks; sweepers split
the work by an advisory lock per batch) and the careful way it falls back to when a row lock is
held too long (``SKIP LOCKED``)."""

from __future__ import annotations

from datetime import timedelta

import psycopg2
import pytest
from django.db import connection

from couponcenter.coupons.models import UserCoupon
from expiry import services, sql
from expiry.bench.sweep import BENCH_NOW, bench_data_load
from expiry.models import ExpiryTask
from tests.expiry.test_races import run_threads, sweeper_batches
from tests.support.factories import CouponFactory, ExpiryTaskFactory, UserCouponFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def other_session():
    db = connection.settings_dict
    session = psycopg2.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"] or 5432
    )
    yield session
    session.rollback()
    session.close()


def _tasks(count: int) -> list[int]:
    coupon = CouponFactory(total_stock=count)
    bench_data_load(coupon=coupon, count=count, progress=False)
    return list(ExpiryTask.objects.order_by("expire_at", "id").values_list("id", flat=True))


def test_a_batch_another_sweeper_holds_is_passed_over_and_the_pass_goes_on(other_session):
    ids = _tasks(30)
    with other_session.cursor() as cursor:  # another sweeper is working on the first batch
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [sql.BATCH_LOCK_CLASS, ids[0]])

    held = services.expiry_sweep_batch(now=BENCH_NOW, batch_size=10)
    assert (held.claimed, held.processed, held.left_to_others) == (0, 0, 10)
    assert held.last[1] == ids[9]  # the pass resumes after the held batch
    assert ExpiryTask.objects.filter(status="pending").count() == 30

    totals = services.expiry_sweep_due(now=BENCH_NOW, batch_size=10)
    assert (totals.processed, totals.expired) == (20, 20)
    pending = ExpiryTask.objects.filter(status="pending").values_list("id", flat=True)
    assert sorted(pending) == sorted(ids[:10])  # left to its holder

    other_session.rollback()  # the holder went away without finishing: the next pass takes it
    assert services.expiry_sweep_due(now=BENCH_NOW, batch_size=10).expired == 10
    assert UserCoupon.objects.filter(status="expired").count() == 30


def test_a_batch_is_named_after_its_first_task_in_due_order_whatever_its_ids(other_session):
    """Two sweepers reading the same batch name the same lock; here the batch's first task in due
    order is its greatest id, and the lock on it holds the batch."""
    coupon = CouponFactory(total_stock=10)
    moments = [BENCH_NOW - timedelta(minutes=m) for m in range(10)]  # created latest-due first
    tasks = [
        ExpiryTaskFactory(
            user_coupon=UserCouponFactory(
                coupon=coupon, expires_at=at, claimed_at=at - timedelta(days=1)
            )
        )
        for at in moments
    ]
    first_due = tasks[9]  # the first batch: the five due earliest, tasks[9] first
    assert first_due.pk == max(task.pk for task in tasks[5:])
    with other_session.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [sql.BATCH_LOCK_CLASS, first_due.pk])

    held = services.expiry_sweep_batch(now=BENCH_NOW, batch_size=5)

    assert (held.claimed, held.left_to_others) == (0, 5)
    assert held.last == (tasks[5].expire_at, tasks[5].pk)  # the pass goes on after it
    assert not ExpiryTask.objects.exclude(status="pending").exists()


def test_a_coupon_held_by_a_long_transaction_sends_its_batch_the_careful_way(
    other_session, monkeypatch
):
    monkeypatch.setattr(services, "FAST_LOCK_WAIT_MS", 50)
    ids = _tasks(20)
    held_coupon = ExpiryTask.objects.get(pk=ids[3]).user_coupon_id
    with other_session.cursor() as cursor:
        cursor.execute("SELECT id FROM couponcenter_usercoupon WHERE id = %s FOR UPDATE",
                       [held_coupon])  # fmt: skip

    result = services.expiry_sweep_batch(now=BENCH_NOW, batch_size=10)

    assert result.careful
    assert (result.claimed, result.processed, result.expired) == (10, 10, 10)  # past the held one
    assert ExpiryTask.objects.get(pk=ids[3]).status == "pending"
    assert UserCoupon.objects.get(pk=held_coupon).status == "unused"
    other_session.rollback()
    services.expiry_sweep_due(now=BENCH_NOW, batch_size=10)
    assert UserCoupon.objects.filter(status="expired").count() == 20
    assert not ExpiryTask.objects.filter(status="pending").exists()


def test_the_fast_way_takes_no_row_lock_before_its_updates():
    """The point of the fast way: its plan has no LockRows step (the careful way's has)."""
    with connection.cursor() as cursor:
        params = {"now": BENCH_NOW, "limit": 10, "ids": False, "after_at": BENCH_NOW,
                  "after_id": 0, "lock_class": sql.BATCH_LOCK_CLASS}  # fmt: skip
        cursor.execute("EXPLAIN " + sql.FAST[False].sql, params)
        fast = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("EXPLAIN " + sql.CAREFUL[False], params)
        careful = "\n".join(row[0] for row in cursor.fetchall())
    assert "LockRows" not in fast and "LockRows" in careful


def test_a_second_sweeper_takes_the_other_lane_and_walks_down_newest_first(other_session):
    ids = _tasks(30)
    with other_session.cursor() as cursor:  # a first sweeper is in its pass, walking up
        cursor.execute("SELECT pg_try_advisory_lock(%s, 0)", [sql.LANE_LOCK_CLASS])
        assert cursor.fetchone()[0]

    totals = services.expiry_sweep_due(
        now=BENCH_NOW, batch_size=10, keep_results=True, collect_ids=True
    )

    assert totals.processed == 30
    first = totals.results[0].task_ids
    assert sorted(first) == sorted(ids[-10:])  # the newest batch first
    with connection.cursor() as cursor:  # its lane went back at the end of the pass
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s",
            [sql.LANE_LOCK_CLASS],
        )
        assert cursor.fetchone()[0] == 1  # the other session's only


def test_sweepers_going_up_and_down_meet_without_sweeping_a_task_twice():
    ids = _tasks(20_000)
    up, down = run_threads([lambda: sweeper_batches(now=BENCH_NOW, batch_size=500)] * 2)
    taken = [task for batch in up + down for task in batch]
    assert sorted(taken) == sorted(ids)  # every task once
    assert UserCoupon.objects.filter(status="expired").count() == 20_000
