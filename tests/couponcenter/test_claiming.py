"""The claim as a request makes it (``couponcenter.coupons.claiming``): the gate, the grouped
commit, and the holds settled or given back. Real PostgreSQL and Redis; transactions commit
(``transactional_db``), as the gate needs."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, connections

from couponcenter.coupons import claim_groups, claiming, gate
from couponcenter.coupons.models import CouponStockShard, UserCoupon
from couponcenter.coupons.rules import ClaimRefused
from tests.couponcenter.test_claim_gate import new_coupon

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'"),
]


def gate_state(redis_client, coupon_id: int) -> tuple[int, dict[int, int], int]:
    """(taken, users -> claims, holds in flight)."""
    keys = gate._keys(coupon_id)
    users = {int(k): int(v) for k, v in redis_client.hgetall(keys[1]).items()}
    return int(redis_client.hget(keys[0], "taken")), users, redis_client.zcard(keys[2])


def claim(coupon_id: int, user_id: int):
    try:
        return claiming.coupon_claim_gated(coupon_id=coupon_id, user_id=user_id)
    except ClaimRefused as refused:
        return refused.code
    finally:
        connections.close_all()


def test_a_rush_through_the_gate_sells_the_stock_exactly_in_groups(redis_client, settings):
    settings.CLAIM_GROUP_WAIT_MS = 20  # groups form on a loaded machine too
    coupon = new_coupon(total_stock=40, per_user_limit=2)
    statements = sum(claim_groups.claims_per_statement.values())
    barrier = threading.Barrier(16)

    def claimer(first: int) -> list:
        barrier.wait(timeout=60)
        # Each user claims three times: twice within the limit, the third refused.
        return [claim(coupon.pk, first + n % 5) for n in range(15)]

    with ThreadPoolExecutor(16) as pool:
        outcomes = [
            o for f in [pool.submit(claimer, i * 10) for i in range(16)] for o in f.result()
        ]

    won = [o for o in outcomes if isinstance(o, UserCoupon)]
    assert len(won) == 40
    assert Counter(o for o in outcomes if isinstance(o, str)) == {"sold_out": 240 - 40}
    rows = UserCoupon.objects.filter(coupon=coupon)
    assert sorted(rows.values_list("pk", flat=True)) == sorted(u.pk for u in won)
    per_user = Counter(rows.values_list("user_id", flat=True))
    assert max(per_user.values()) <= 2
    shards = CouponStockShard.objects.filter(coupon=coupon)
    assert sum(s.claimed for s in shards) == 40
    # Every hold of a committed claim was settled; the gate counts what PostgreSQL holds.
    taken, users, held = gate_state(redis_client, coupon.pk)
    assert (taken, held) == (40, 0)
    assert {u: n for u, n in users.items() if n} == dict(per_user)
    grouped = {n: c for n, c in claim_groups.claims_per_statement.items() if n > 1}
    assert sum(claim_groups.claims_per_statement.values()) > statements
    assert grouped, "no statement carried more than one claim"


def test_a_refusal_of_postgresql_after_the_gate_gives_the_unit_back_and_teaches_the_gate(
    redis_client,
):
    coupon = new_coupon(total_stock=5)
    # PostgreSQL has no stock left, the gate does not know it yet.
    CouponStockShard.objects.filter(coupon=coupon).update(stock=0)
    with pytest.raises(ClaimRefused) as refused:
        claiming.coupon_claim_gated(coupon_id=coupon.pk, user_id=1)
    assert refused.value.code == "sold_out"
    taken, users, held = gate_state(redis_client, coupon.pk)
    assert (taken, users.get(1, 0), held) == (5, 0, 0)


def test_without_a_gate_the_claim_goes_to_postgresql_and_the_gate_is_built_again(redis_client):
    coupon = new_coupon(total_stock=3)
    redis_client.delete(*gate._keys(coupon.pk))
    assert gate.gate_claim(coupon_id=coupon.pk, user_id=9, now_ms=0) is None

    user_coupon = claiming.coupon_claim_gated(coupon_id=coupon.pk, user_id=1)
    assert UserCoupon.objects.filter(pk=user_coupon.pk).exists()
    # The rebuild runs in a thread of its own: wait for the gate it builds.
    for thread in [
        t for t in threading.enumerate() if t.name == f"{gate.BUILD_THREAD_PREFIX}{coupon.pk}"
    ]:
        thread.join(timeout=60)
    taken, users, held = gate_state(redis_client, coupon.pk)
    assert (taken, users, held) == (1, {1: 1}, 0)
    assert isinstance(claiming.coupon_claim_gated(coupon_id=coupon.pk, user_id=2), UserCoupon)
    assert gate_state(redis_client, coupon.pk)[0] == 2


def test_inside_a_transaction_the_gate_is_not_asked(redis_client):
    coupon = new_coupon(total_stock=3)
    from django.db import transaction

    with transaction.atomic():
        claiming.coupon_claim_gated(coupon_id=coupon.pk, user_id=1)
    assert gate_state(redis_client, coupon.pk)[0] == 0
    assert connection.vendor == "postgresql"
