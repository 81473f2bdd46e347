"""Claims under real concurrency on PostgreSQL: never oversold, never over a user's limit.

Every claimer is a thread with its own database connection. PostgreSQL here allows 100 connections
shared with other test runs, so a semaphore caps how many claims are in flight at once
(``IN_FLIGHT``); each claim opens and closes its own connection.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections

from couponcenter.coupons import services
from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.coupons.rules import ClaimRefused
from expiry.models import ExpiryTask
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

THREADS = 200
IN_FLIGHT = 40


def free_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int - count(*) FROM pg_stat_activity"
        )
        return cursor.fetchone()[0]


def run_claimers(coupon_id: int, work: list[list[int]]) -> Counter:
    """Each thread claims for its list of user ids; returns outcome counts (ok or refusal)."""
    gate = threading.BoundedSemaphore(min(IN_FLIGHT, max(free_connections() - 20, 5)))
    start = threading.Barrier(len(work))

    def claimer(user_ids: list[int]) -> Counter:
        outcomes: Counter = Counter()
        start.wait()
        for user_id in user_ids:
            with gate:
                try:
                    services.coupon_claim(coupon_id=coupon_id, user_id=user_id)
                    outcomes["ok"] += 1
                except ClaimRefused as exc:
                    outcomes[exc.code] += 1
                finally:
                    connections.close_all()
        return outcomes

    with ThreadPoolExecutor(max_workers=len(work)) as pool:
        return sum(pool.map(claimer, work), Counter())


def test_stock_and_per_user_limit_hold_under_200_claimers():
    coupon = CouponFactory(total_stock=1000, per_user_limit=1)
    rng = random.Random(3)
    # 1,500 users for 1,000 coupons, and 500 of them try twice (often at the same moment).
    attempts = list(range(1, 1501)) + rng.sample(range(1, 1501), 500)
    rng.shuffle(attempts)
    work = [attempts[i::THREADS] for i in range(THREADS)]

    outcomes = run_claimers(coupon.pk, work)

    coupon = Coupon.objects.get(pk=coupon.pk)
    per_user = Counter(UserCoupon.objects.filter(coupon=coupon).values_list("user_id", flat=True))
    assert coupon.claimed_count == UserCoupon.objects.filter(coupon=coupon).count() == 1000
    assert max(per_user.values()) == 1
    assert ExpiryTask.objects.filter(user_coupon__coupon=coupon).count() == 1000
    assert ExpiryTask.objects.count() == 1000
    assert outcomes["ok"] == 1000
    assert set(outcomes) <= {"ok", "sold_out", "limit_reached"}
    assert sum(outcomes.values()) == len(attempts)
    assert outcomes["sold_out"] > 0 and outcomes["limit_reached"] > 0


def test_one_user_racing_for_a_limit_of_three():
    coupon = CouponFactory(total_stock=1000, per_user_limit=3)

    outcomes = run_claimers(coupon.pk, [[42]] * 50)

    assert outcomes == Counter(ok=3, limit_reached=47)
    seqs = sorted(
        UserCoupon.objects.filter(coupon=coupon, user_id=42).values_list("seq", flat=True)
    )
    assert seqs == [1, 2, 3]
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 3
    assert ExpiryTask.objects.count() == 3


def test_last_coupons_go_to_exactly_that_many_users():
    coupon = CouponFactory(total_stock=7, per_user_limit=2)

    outcomes = run_claimers(coupon.pk, [[user_id, user_id] for user_id in range(1, 101)])

    assert outcomes["ok"] == 7
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 7
    assert UserCoupon.objects.filter(coupon=coupon).count() == 7
