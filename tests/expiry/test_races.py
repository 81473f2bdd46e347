"""Concurrency on a real PostgreSQL: sweepers against each other, redeem against the sweeper.

Every worker is a thread with its own Django connection (connections are per thread), so rows are
really locked and committed; nothing about the database is mocked.
"""

import random
import threading
from datetime import timedelta

import psycopg2
import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from couponcenter.coupons.models import UserCoupon
from couponcenter.coupons.rules import RedeemRefused
from couponcenter.coupons.services import coupon_redeem
from expiry import services
from expiry.bench.sweep import BENCH_NOW, bench_data_load
from expiry.models import ExpiryTask
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def run_threads(targets) -> list:
    """Run each callable in its own thread (own DB connection), together; return their results."""
    barrier = threading.Barrier(len(targets))
    results: list = [None] * len(targets)
    errors: list = []

    def runner(index, target):
        try:
            barrier.wait()
            results[index] = target()
        except Exception as exc:  # surfaced below, with the thread's own traceback
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner, args=item) for item in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def sweeper_batches(*, now, batch_size):
    """One sweeper's pass; returns each batch's processed task ids."""
    totals = services.expiry_sweep_due(
        now=now, batch_size=batch_size, keep_results=True, collect_ids=True
    )
    return [result.task_ids for result in totals.results]


def test_two_sweepers_over_50000_due_tasks_expire_each_coupon_exactly_once():
    count = 50_000
    coupon = CouponFactory(total_stock=count)
    bench_data_load(coupon=coupon, count=count, progress=False)

    first, second = run_threads(
        [lambda: sweeper_batches(now=BENCH_NOW, batch_size=1000)] * 2
    )  # fmt: skip

    ids_first = [task_id for batch in first for task_id in batch]
    ids_second = [task_id for batch in second for task_id in batch]
    assert len(ids_first) + len(ids_second) == count
    assert len(set(ids_first) | set(ids_second)) == count  # no task claimed twice
    assert not set(ids_first) & set(ids_second)
    assert ids_first and ids_second, "both sweepers should have taken a share"
    assert UserCoupon.objects.filter(coupon=coupon, status="expired").count() == count
    assert ExpiryTask.objects.filter(status="processed").count() == count
    assert not ExpiryTask.objects.filter(status="pending").exists()


def test_redeem_and_sweep_at_the_expiry_boundary_exactly_one_wins():
    count = 400
    boundary = timezone.now().replace(microsecond=0) + timedelta(days=1)
    coupon = CouponFactory(total_stock=count)
    claims = [
        UserCoupon.objects.create(
            coupon=coupon, user_id=i, claimed_at=boundary - timedelta(days=1), expires_at=boundary
        )
        for i in range(count)
    ]
    ExpiryTask.objects.bulk_create(
        ExpiryTask(user_coupon=claim, expire_at=boundary) for claim in claims
    )
    order = [(claim.pk, claim.user_id) for claim in claims]
    random.Random(3).shuffle(order)
    just_before = boundary - timedelta(microseconds=1)

    def redeemer(part):
        won = refused = 0
        for pk, user_id in part:
            try:
                coupon_redeem(user_coupon_id=pk, user_id=user_id, now=just_before)
                won += 1
            except RedeemRefused as exc:
                assert exc.code == "expired"
                refused += 1
        return won, refused

    sweeper = lambda: sweeper_batches(now=boundary, batch_size=7)  # noqa: E731
    results = run_threads(
        [lambda: redeemer(order[0::2]), lambda: redeemer(order[1::2]), sweeper, sweeper]
    )
    services.expiry_sweep_due(now=boundary, batch_size=100)  # tasks skipped behind a redeem lock

    redeemed = results[0][0] + results[1][0]
    rows = UserCoupon.objects.filter(coupon=coupon)
    assert rows.filter(status="used").count() == redeemed
    assert rows.filter(status="expired").count() == count - redeemed
    assert not rows.filter(status="unused").exists()
    assert not rows.filter(status="used", used_at__gte=boundary).exists()
    assert not ExpiryTask.objects.filter(status="pending").exists()
    assert 0 < redeemed < count, "the race should have gone both ways"


def test_a_batch_that_cannot_get_its_lock_fails_and_leaves_its_rows_pending(monkeypatch):
    coupon = CouponFactory(total_stock=20)
    bench_data_load(coupon=coupon, count=20, progress=False)
    monkeypatch.setattr(services, "LOCK_TIMEOUT_MS", 200)
    db = connection.settings_dict
    blocker = psycopg2.connect(
        dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"] or 5432
    )
    try:
        with blocker.cursor() as cursor:  # e.g. a migration holding the table
            cursor.execute("LOCK TABLE couponcenter_usercoupon IN EXCLUSIVE MODE")
        with pytest.raises(OperationalError, match="lock timeout"):
            services.expiry_sweep_batch(now=BENCH_NOW, batch_size=10)
        assert ExpiryTask.objects.filter(status="pending").count() == 20
    finally:
        blocker.rollback()
        blocker.close()

    totals = services.expiry_sweep_due(now=BENCH_NOW, batch_size=10)
    assert totals.expired == 20
