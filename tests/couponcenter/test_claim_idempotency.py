"""``Idempotency-Key`` on ``POST /api/users/{id}/coupons/``: a retried claim gets its first answer.

Against real PostgreSQL and Redis, through both the lean path and DRF's (a query string sends a
request to DRF). The coupons allow a user several claims where it matters, so that a retry that
claimed again would show as a second user coupon.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from couponcenter.coupons import services, stock
from couponcenter.coupons.api import claims as claims_api
from couponcenter.coupons.models import CouponStockShard, UserCoupon
from couponcenter.coupons.rules import ClaimRefused
from tests.couponcenter.conftest import client_with
from tests.support.factories import CouponFactory, api_user

pytestmark = pytest.mark.django_db

PATHS = [pytest.param(False, id="lean"), pytest.param(True, id="drf")]


@pytest.fixture
def lean_calls(monkeypatch) -> list[bool]:
    """One entry per claim request: whether the lean path answered it."""
    calls: list[bool] = []
    original = claims_api.UserCouponListApi.claim_lean

    def spy(self, request, user_id):
        response = original(self, request, user_id)
        calls.append(response is not None)
        return response

    monkeypatch.setattr(claims_api.UserCouponListApi, "claim_lean", spy)
    return calls


def service_token() -> str:
    return api_user(perms=["couponcenter.act_for_any_user"])[1]


def claim(client, user_id: int, coupon_id: int, key: str | None, *, drf: bool = False):
    query = "?via=drf" if drf else ""
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    return client.post(
        f"/api/users/{user_id}/coupons/{query}", {"coupon": coupon_id}, format="json", **headers
    )


def records(redis_client, prefix: str) -> list[bytes]:
    return list(redis_client.scan_iter(match=f"{prefix}:idem:*"))


@pytest.mark.parametrize("drf", PATHS)
def test_a_retry_after_success_gets_the_same_201(lean_calls, drf):
    client = client_with(service_token())
    coupon = CouponFactory(per_user_limit=3)
    first = claim(client, 7, coupon.pk, "order-1", drf=drf)
    again = claim(client, 7, coupon.pk, "order-1", drf=drf)
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert first.get("Idempotent-Replayed") is None
    assert again["Idempotent-Replayed"] == "true"
    assert UserCoupon.objects.filter(coupon=coupon, user_id=7).count() == 1
    assert lean_calls == [not drf, not drf]
    # Without the key the same request claims again: the key is what made the retry safe.
    assert claim(client, 7, coupon.pk, None, drf=drf).status_code == 201
    assert UserCoupon.objects.filter(coupon=coupon, user_id=7).count() == 2


@pytest.mark.parametrize("drf", PATHS)
def test_a_refusal_is_the_answer_a_retry_gets(drf):
    client = client_with(service_token())
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1))
    first = claim(client, 7, coupon.pk, "k", drf=drf)
    assert first.status_code == 409 and first.json()["code"] == "not_open"
    services.coupon_update(coupon=coupon, claim_opens_at=timezone.now() - timedelta(minutes=1))
    again = claim(client, 7, coupon.pk, "k", drf=drf)
    assert (again.status_code, again.json()) == (409, first.json())
    assert again["Idempotent-Replayed"] == "true"
    assert not UserCoupon.objects.filter(coupon=coupon).exists()
    assert claim(client, 7, coupon.pk, "k2", drf=drf).status_code == 201  # a new key, a new try


@pytest.mark.parametrize("drf", PATHS)
@pytest.mark.parametrize(
    "key",
    [
        pytest.param("", id="empty"),
        pytest.param("k" * 256, id="256-chars"),
        pytest.param("café", id="non-ascii"),
        pytest.param("a\tb", id="tab"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\x7fb", id="del"),
    ],
)
def test_a_malformed_key_is_a_400_and_claims_nothing(redis_client, redis_prefix, drf, key):
    client = client_with(service_token())
    coupon = CouponFactory()
    response = claim(client, 7, coupon.pk, key, drf=drf)
    assert response.status_code == 400
    assert response.json()["errors"]["Idempotency-Key"] == [claims_api.idempotency.KEY_ERROR]
    assert not UserCoupon.objects.filter(coupon=coupon).exists()
    assert records(redis_client, redis_prefix) == []


def test_a_key_of_255_printable_characters_is_taken(lean_calls):
    client = client_with(service_token())
    coupon = CouponFactory()
    key = "".join(chr(32 + i % 95) for i in range(255))
    assert claim(client, 7, coupon.pk, key).status_code == 201
    again = claim(client, 7, coupon.pk, key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert lean_calls == [True, True]


def test_bad_body_and_bad_key_are_both_reported():
    client = client_with(service_token())
    response = claim(client, 7, 0, "", drf=True)
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"coupon", "Idempotency-Key"}


@pytest.mark.parametrize("drf", PATHS)
def test_the_same_key_for_another_coupon_is_a_422(drf):
    client = client_with(service_token())
    coupon, other = CouponFactory(), CouponFactory()
    assert claim(client, 7, coupon.pk, "k", drf=drf).status_code == 201
    response = claim(client, 7, other.pk, "k", drf=drf)
    assert response.status_code == 422
    assert response.json()["code"] == "idempotency_key_reused"
    assert not UserCoupon.objects.filter(coupon=other).exists()


def test_an_unknown_coupon_is_not_kept(redis_client, redis_prefix):
    client = client_with(service_token())
    assert claim(client, 7, 999_999_999, "k").status_code == 404
    assert records(redis_client, redis_prefix) == []
    coupon = CouponFactory()
    assert claim(client, 7, coupon.pk, "k").status_code == 201  # not a 422: the key was free


def test_a_failed_claim_frees_the_key(monkeypatch, redis_client, redis_prefix):
    client = client_with(service_token())
    coupon = CouponFactory()
    real_claim = services.coupon_claim

    def fails(**kwargs):
        raise DatabaseError("the database went away")

    monkeypatch.setattr(services, "coupon_claim", fails)
    with pytest.raises(DatabaseError):
        claim(client, 7, coupon.pk, "k")
    assert records(redis_client, redis_prefix) == []
    monkeypatch.setattr(services, "coupon_claim", real_claim)
    response = claim(client, 7, coupon.pk, "k")
    assert response.status_code == 201 and response.get("Idempotent-Replayed") is None


@pytest.mark.parametrize("limit", [1, 3])
@pytest.mark.parametrize("drf", PATHS)
def test_a_retry_after_redis_lost_the_answer_gets_the_first_201(
    redis_client, redis_prefix, drf, limit
):
    client = client_with(service_token())
    coupon = CouponFactory(per_user_limit=limit)
    first = claim(client, 7, coupon.pk, "k", drf=drf)
    assert first.status_code == 201
    (record,) = records(redis_client, redis_prefix)
    redis_client.delete(record)
    again = claim(client, 7, coupon.pk, "k", drf=drf)
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert UserCoupon.objects.filter(coupon=coupon, user_id=7).count() == 1
    claimed = CouponStockShard.objects.filter(coupon=coupon).values_list("claimed", flat=True)
    assert sum(claimed) == 1  # the retry's failed insert took no unit


def test_a_limit_reached_before_the_database_still_gets_the_first_201(
    monkeypatch, redis_client, redis_prefix
):
    """A refusal that does not reach the insert (the Redis gate in front of the claim answers
    ``limit_reached`` from its own counts) must not hide the key's own first claim."""
    client = client_with(service_token())
    coupon = CouponFactory()
    first = claim(client, 7, coupon.pk, "k")
    (record,) = records(redis_client, redis_prefix)
    redis_client.delete(record)

    def gate_refuses(**kwargs):
        raise ClaimRefused("limit_reached", "over the limit")

    monkeypatch.setattr(services, "coupon_claim", gate_refuses)
    again = claim(client, 7, coupon.pk, "k")
    assert (again.status_code, again.json()) == (201, first.json())
    other_key = claim(client, 7, coupon.pk, "other")
    assert other_key.status_code == 409 and other_key.json()["code"] == "limit_reached"


def test_two_users_with_the_same_key_are_independent():
    client = client_with(service_token())
    coupon = CouponFactory()
    one, two = claim(client, 1, coupon.pk, "k"), claim(client, 2, coupon.pk, "k")
    assert one.status_code == two.status_code == 201
    assert two.get("Idempotent-Replayed") is None
    assert (one.json()["user_id"], two.json()["user_id"]) == (1, 2)


@pytest.mark.parametrize("redis_lost", [False, True])
def test_a_key_does_not_answer_for_another_caller(redis_client, redis_prefix, redis_lost):
    alice, bob = client_with(service_token()), client_with(service_token())
    coupon = CouponFactory()
    assert claim(alice, 7, coupon.pk, "k").status_code == 201
    if redis_lost:
        redis_client.delete(*records(redis_client, redis_prefix))
    response = claim(bob, 7, coupon.pk, "k")
    # Bob's own claim ran: the user's one claim is taken, and Alice's 201 is not Bob's answer.
    assert response.status_code == 409 and response.json()["code"] == "limit_reached"
    assert response.get("Idempotent-Replayed") is None


def test_redis_unreachable_the_claim_runs_and_the_column_guards_it(settings):
    client = client_with(service_token())
    coupon = CouponFactory(per_user_limit=3)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: connection refused
    first = claim(client, 7, coupon.pk, "k")
    again = claim(client, 7, coupon.pk, "k")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json()
    assert UserCoupon.objects.filter(coupon=coupon, user_id=7).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_request_while_the_first_is_in_flight_is_a_409(redis_client, redis_prefix):
    token = service_token()
    coupon = CouponFactory()
    # Sharded now: a factory's coupon is sharded by its first claim, which the lock below would
    # not hold back (no shard to lock), and the first claim would answer before the second came.
    stock.stock_shards_ensure(coupon_id=coupon.pk)
    locked, release = threading.Event(), threading.Event()
    answers = {}

    def hold_the_shards():
        # Every shard locked: the first claim waits in PostgreSQL until it is released.
        try:
            with transaction.atomic():
                shards = CouponStockShard.objects.select_for_update().filter(coupon=coupon)
                assert len(shards) == stock.shard_count()
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    def first_claim():
        try:
            answers["first"] = claim(client_with(token), 7, coupon.pk, "k")
        finally:
            connection.close()

    holder, first = threading.Thread(target=hold_the_shards), threading.Thread(target=first_claim)
    holder.start()
    assert locked.wait(30)
    first.start()
    try:
        deadline = time.monotonic() + 30
        while not records(redis_client, redis_prefix):  # the first request's reservation
            assert time.monotonic() < deadline, "the first claim never reserved its key"
            time.sleep(0.01)
        during = claim(client_with(token), 7, coupon.pk, "k")
    finally:
        release.set()
        holder.join(30)
        first.join(30)
    assert during.status_code == 409
    assert during.json()["code"] == "idempotency_key_in_use"
    assert during["Retry-After"] == "1"
    assert answers["first"].status_code == 201
    after = claim(client_with(token), 7, coupon.pk, "k")
    assert (after.status_code, after.json()) == (201, answers["first"].json())
    assert UserCoupon.objects.filter(coupon=coupon).count() == 1


@pytest.mark.postgres
def test_the_key_index_is_unique_and_partial():
    """Claims without a key (most) add no entry to it; it holds no ``status`` (HOT updates)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'usercoupon_one_per_idempotency_key'"
        )
        (ddl,) = cursor.fetchone()
    assert ddl.startswith("CREATE UNIQUE INDEX"), ddl
    assert "(coupon_id, user_id, idempotency_key)" in ddl
    assert "WHERE (idempotency_key IS NOT NULL)" in ddl
