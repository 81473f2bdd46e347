"""Stock shards (couponcenter.coupons.stock): the stock is cut over rows, claims never exceed it,
sold_out is only answered once every shard is empty, and a stock change re-cuts what is left."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections, transaction
from django.utils import timezone

from couponcenter.coupons import selectors, services
from couponcenter.coupons.models import Coupon, CouponStockShard, UserCoupon
from couponcenter.coupons.rules import ClaimRefused
from expiry.models import ExpiryTask
from tests.couponcenter.test_claim_concurrency import free_connections
from tests.support.factories import CouponFactory


def coupon_fields(**overrides) -> dict:
    fields = {
        "name": "Flash sale",
        "claim_opens_at": timezone.now() - timedelta(minutes=1),
        "total_stock": 10,
        "valid_for": timedelta(days=7),
    }
    return {**fields, **overrides}


def shards(coupon: Coupon) -> list[tuple[int, int]]:
    """(stock, claimed) per shard, in shard order."""
    rows = CouponStockShard.objects.filter(coupon=coupon).order_by("shard")
    return list(rows.values_list("stock", "claimed"))


def claim(coupon: Coupon, user_id: int) -> str:
    try:
        services.coupon_claim(coupon_id=coupon.pk, user_id=user_id)
    except ClaimRefused as exc:
        return exc.code
    return "ok"


@pytest.fixture
def four_shards(settings):
    settings.COUPON_STOCK_SHARDS = 4


@pytest.mark.django_db
def test_create_cuts_the_stock_evenly(four_shards):
    coupon = services.coupon_create(**coupon_fields(total_stock=10))
    assert shards(coupon) == [(3, 0), (3, 0), (2, 0), (2, 0)]


@pytest.mark.django_db
def test_claims_find_the_last_shard_with_stock_and_sold_out_only_when_all_are_empty(four_shards):
    coupon = services.coupon_create(**coupon_fields(total_stock=10))
    # Only shard 3 has stock left: every claim must find it, whichever shard it starts from.
    CouponStockShard.objects.filter(coupon=coupon).exclude(shard=3).update(stock=0)
    CouponStockShard.objects.filter(coupon=coupon, shard=3).update(stock=3)

    assert [claim(coupon, user_id) for user_id in range(1, 6)] == ["ok"] * 3 + ["sold_out"] * 2
    assert shards(coupon) == [(0, 0), (0, 0), (0, 0), (3, 3)]
    assert UserCoupon.objects.filter(coupon=coupon).count() == 3
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 3


@pytest.mark.django_db
def test_the_whole_stock_is_claimable_and_no_more(four_shards):
    coupon = services.coupon_create(**coupon_fields(total_stock=10))
    outcomes = Counter(claim(coupon, user_id) for user_id in range(1, 21))
    assert outcomes == Counter(ok=10, sold_out=10)
    assert shards(coupon) == [(3, 3), (3, 3), (2, 2), (2, 2)]
    assert selectors.coupon_claims_count(coupon=coupon) == 10
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 10


@pytest.mark.django_db
def test_stock_change_recuts_what_is_left(four_shards):
    coupon = services.coupon_create(**coupon_fields(total_stock=8))
    for user_id in range(1, 6):
        assert claim(coupon, user_id) == "ok"
    before = shards(coupon)
    assert sum(claimed for _, claimed in before) == 5

    services.coupon_update(coupon=coupon, total_stock=13)
    after = shards(coupon)
    assert [claimed for _, claimed in after] == [claimed for _, claimed in before]
    assert sum(stock for stock, _ in after) == 13
    left = [stock - claimed for stock, claimed in after]
    assert sorted(left, reverse=True) == [2, 2, 2, 2]  # the 8 left, spread evenly

    services.coupon_update(coupon=coupon, total_stock=6)  # one left
    assert sum(stock for stock, _ in shards(coupon)) == 6
    assert claim(coupon, 100) == "ok"
    assert claim(coupon, 101) == "sold_out"
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 6


@pytest.mark.django_db
def test_more_shards_configured_later_are_added_on_a_stock_change(settings):
    settings.COUPON_STOCK_SHARDS = 2
    coupon = services.coupon_create(**coupon_fields(total_stock=4))
    settings.COUPON_STOCK_SHARDS = 4
    services.coupon_update(coupon=coupon, total_stock=8)
    assert shards(coupon) == [(2, 0), (2, 0), (2, 0), (2, 0)]


@pytest.mark.django_db
def test_cancel_closes_every_shard(four_shards):
    coupon = services.coupon_create(**coupon_fields(total_stock=10))
    assert claim(coupon, 1) == "ok"
    services.coupon_cancel(coupon=coupon)
    assert all(stock == claimed for stock, claimed in shards(coupon))
    assert claim(coupon, 2) == "cancelled"


@pytest.mark.django_db
def test_a_coupon_written_without_the_service_is_sharded_on_its_first_claim(four_shards):
    coupon = CouponFactory(total_stock=6)  # a plain ORM insert: no shards yet
    Coupon.objects.filter(pk=coupon.pk).update(claimed_count=4)  # e.g. claims bulk-loaded
    assert shards(coupon) == []

    assert [claim(coupon, user_id) for user_id in (1, 2, 3)] == ["ok", "ok", "sold_out"]
    assert sum(stock for stock, _ in shards(coupon)) == 6
    assert sum(claimed for _, claimed in shards(coupon)) == 6
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 6


# --- under real concurrency (PostgreSQL) ---------------------------------------------------------


def _a_session_waits_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        # Inside a transaction the statistics views keep their first snapshot: take a new one.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_waits_for_busy_shards_instead_of_answering_sold_out(four_shards):
    coupon = services.coupon_create(**coupon_fields(total_stock=4))
    outcome: list[str] = []
    with transaction.atomic():
        # Another transaction holds every shard, as claims in flight would.
        list(CouponStockShard.objects.select_for_update().filter(coupon=coupon))

        def claimer() -> None:
            try:
                outcome.append(claim(coupon, 7))
            finally:
                connections.close_all()

        thread = threading.Thread(target=claimer)
        thread.start()
        deadline = time.monotonic() + 30
        while not _a_session_waits_on_a_lock():  # observed in PostgreSQL, not guessed by a sleep
            assert thread.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.02)
        assert thread.is_alive() and not outcome  # waiting, not refused
    thread.join(timeout=10)
    assert outcome == ["ok"]
    assert sum(claimed for _, claimed in shards(coupon)) == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_claims_drain_every_shard_exactly_under_concurrency(settings):
    settings.COUPON_STOCK_SHARDS = 16
    coupon = services.coupon_create(**coupon_fields(total_stock=300, per_user_limit=2))
    # 200 users, each trying 3 times: at most 2 each, and 300 in all (of 400 allowed).
    attempts = [user_id for user_id in range(1, 201) for _ in range(3)]
    # PostgreSQL's 100 connections are shared with other test runs (as in test_claim_concurrency).
    gate = threading.BoundedSemaphore(min(24, max(free_connections() - 20, 5)))

    def claimer(user_id: int) -> str:
        with gate:
            try:
                return claim(coupon, user_id)
            finally:
                connections.close_all()

    with ThreadPoolExecutor(max_workers=48) as pool:
        outcomes = Counter(pool.map(claimer, attempts))

    assert outcomes["ok"] == 300
    assert set(outcomes) <= {"ok", "sold_out", "limit_reached"}
    per_user = Counter(UserCoupon.objects.filter(coupon=coupon).values_list("user_id", flat=True))
    assert sum(per_user.values()) == 300 and max(per_user.values()) <= 2
    assert all(stock == claimed for stock, claimed in shards(coupon))
    assert ExpiryTask.objects.filter(user_coupon__coupon=coupon).count() == 300
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 300


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_stock_cut_while_claims_run_is_never_oversold(four_shards):
    coupon = services.coupon_create(**coupon_fields(total_stock=1000))
    stop = threading.Event()

    def claimer(first: int) -> None:
        user_id = first
        try:
            while not stop.is_set():
                claim(coupon, user_id)
                user_id += 8
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=8) as pool:
        try:
            for first in range(8):
                pool.submit(claimer, first)
            time.sleep(0.3)
            # Cut the stock to a little above what is claimed by now, while claims go on (if
            # more than 20 were claimed between the count and the cut, the cut is refused:
            # count again).
            for _ in range(20):
                claimed = selectors.coupon_claims_count(coupon=coupon)
                try:
                    services.coupon_update(coupon=coupon, total_stock=claimed + 20)
                    break
                except ValidationError:
                    continue
            else:
                pytest.fail("the claims always outran the cut")
            time.sleep(0.5)
        finally:
            stop.set()
    connection.close()

    coupon = Coupon.objects.get(pk=coupon.pk)
    made = UserCoupon.objects.filter(coupon=coupon).count()
    assert made == coupon.total_stock == sum(stock for stock, _ in shards(coupon))
    assert coupon.claimed_count == made == sum(claimed for _, claimed in shards(coupon))


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_leaves_the_fold_to_a_claim_still_running_in_its_process(settings):
    from couponcenter.coupons import stock

    settings.COUPON_FOLD_INTERVAL_MS = 60_000
    coupon = services.coupon_create(**coupon_fields(total_stock=100))

    def count() -> int:
        return Coupon.objects.get(pk=coupon.pk).claimed_count

    services.coupon_claim(coupon_id=coupon.pk, user_id=1)  # alone: folds at once
    assert count() == 1
    with stock.claimed_count_folding(coupon_id=coupon.pk):  # another claim, still running
        services.coupon_claim(coupon_id=coupon.pk, user_id=2)
        # Returned, but the claim still running here folds it when it ends.
        assert count() == 1
        assert selectors.coupon_claims_count(coupon=coupon) == 2
    assert count() == 2
    # Once the last fold is older than the interval, a claim folds even if others are running.
    settings.COUPON_FOLD_INTERVAL_MS = 0
    with stock.claimed_count_folding(coupon_id=coupon.pk):
        services.coupon_claim(coupon_id=coupon.pk, user_id=3)
        assert count() == 3
    # A refused claim folds what others left to it.
    settings.COUPON_FOLD_INTERVAL_MS = 60_000
    with stock.claimed_count_folding(coupon_id=coupon.pk):
        with stock.claimed_count_folding(coupon_id=coupon.pk):
            services.coupon_claim(coupon_id=coupon.pk, user_id=4)
        assert count() == 3
        with pytest.raises(ClaimRefused):
            services.coupon_claim(coupon_id=coupon.pk, user_id=4)
    assert count() == 4
