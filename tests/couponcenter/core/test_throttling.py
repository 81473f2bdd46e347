"""Throttles on the token endpoint (login guessing) and on claims (a runaway caller)."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from couponcenter.coupons.models import UserCoupon
from tests.couponcenter.conftest import client_with
from tests.support.factories import CouponFactory, api_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def rates(settings):
    """Set the throttle rates of this test; DRF reads them once, so reload after the change."""
    from rest_framework.settings import api_settings
    from rest_framework.throttling import SimpleRateThrottle

    def set_rates(**new: str) -> None:
        settings.REST_FRAMEWORK = {
            **settings.REST_FRAMEWORK,
            "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], **new},
        }
        api_settings.reload()
        SimpleRateThrottle.THROTTLE_RATES = api_settings.DEFAULT_THROTTLE_RATES

    yield set_rates
    api_settings.reload()
    SimpleRateThrottle.THROTTLE_RATES = api_settings.DEFAULT_THROTTLE_RATES


def test_the_token_endpoint_answers_429_past_the_rate(rates, anon):
    rates(token="3/min")
    cache.delete_pattern("*throttle_token_*")
    for _ in range(3):
        assert anon.post("/api/auth/token/", {"username": "x", "password": "y"}).status_code == 400
    response = anon.post("/api/auth/token/", {"username": "x", "password": "y"})
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    # Per client address: another address still gets in.
    assert client_with().post("/api/auth/token/", {"username": "x"}).status_code == 400
    cache.delete_pattern("*throttle_token_*")
    assert anon.post("/api/auth/token/", {"username": "x", "password": "y"}).status_code == 400


def test_claims_answer_429_past_the_rate_per_caller(rates):
    rates(claim="3/min")
    coupon = CouponFactory()
    service = client_with(api_user(perms=["couponcenter.act_for_any_user"])[1])
    for user_id in range(1, 4):
        response = service.post(f"/api/users/{user_id}/coupons/", {"coupon": coupon.pk},
                                format="json")  # fmt: skip
        assert response.status_code == 201
    refused = service.post("/api/users/9/coupons/", {"coupon": coupon.pk}, format="json")
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= 61
    coupon.refresh_from_db()
    assert coupon.claimed_count == 3  # the refused claim changed nothing
    # Another caller has its own budget, and reading is not throttled.
    other = client_with(api_user(perms=["couponcenter.act_for_any_user"])[1])
    assert (
        other.post("/api/users/9/coupons/", {"coupon": coupon.pk}, format="json").status_code == 201
    )
    assert service.get("/api/users/1/coupons/").status_code == 200


def test_the_claim_throttle_lets_claims_through_when_redis_is_down(rates, settings):
    from couponcenter.coupons.bench.http import free_port

    rates(claim="3/min")
    coupon = CouponFactory()
    service = client_with(api_user(perms=["couponcenter.act_for_any_user"])[1])
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_EMBEDDED = False
    for user_id in range(1, 6):
        response = service.post(f"/api/users/{user_id}/coupons/", {"coupon": coupon.pk},
                                format="json")  # fmt: skip
        assert response.status_code == 201


@pytest.fixture
def batched(settings, rates):
    """The claim throttle at a rate of 5 per window, counting locally for a whole minute."""
    from couponcenter.core.api import throttling

    rates(claim="5/min")
    settings.THROTTLE_CLAIM_SYNC_MS = 60_000
    throttling.throttle_windows_clear()
    yield throttling
    throttling.throttle_windows_clear()


def _claims(client, coupon, users) -> list[int]:
    return [
        client.post(f"/api/users/{u}/coupons/", {"coupon": coupon.pk}, format="json").status_code
        for u in users
    ]


def _redis_count(user) -> int:
    from django.conf import settings

    from couponcenter.core.redis import get_redis

    keys = get_redis().keys(f"{settings.REDIS_KEY_PREFIX}:throttle:throttle_claim_{user.pk}:*")
    return sum(int(get_redis().get(key)) for key in keys)


def test_the_batched_claim_throttle_is_exact_within_one_process(batched):
    coupon = CouponFactory()
    user, token = api_user(perms=["couponcenter.act_for_any_user"])
    service = client_with(token)
    assert _claims(service, coupon, range(1, 6)) == [201] * 5
    # One round trip for the first claim; the other four were counted here only.
    assert _redis_count(user) == 1
    refused = _claims(service, coupon, [6, 7])
    assert refused == [429, 429]
    # At the limit every request asks Redis, carrying what was counted here.
    assert _redis_count(user) == 7


def test_the_batched_claim_throttle_overshoot_is_what_other_processes_counted(
    batched, monkeypatch, settings
):
    """The documented approximation: a process does not see what another let through since its
    last sync, so together they may pass the rate by that much, and no more."""
    coupon = CouponFactory()
    user, token = api_user(perms=["couponcenter.act_for_any_user"])
    service = client_with(token)
    assert _claims(service, coupon, [1, 2, 3]) == [201] * 3  # process A: 1 synced, 2 local
    monkeypatch.setattr(batched, "_windows", {})  # process B, its own counts
    # B sees 2 in Redis (A's first and its own), so it lets 3 more through locally: 7 in all,
    # 2 over the rate, which are A's 2 not synced yet.
    assert _claims(service, coupon, [4, 5, 6, 7, 8]) == [201, 201, 201, 201, 429]
    assert _redis_count(user) == 6  # B's 5th request synced B's counts: 2 + 4
    # With no local counting (THROTTLE_CLAIM_SYNC_MS=0) every request asks Redis: exact.
    settings.THROTTLE_CLAIM_SYNC_MS = 0
    monkeypatch.setattr(batched, "_windows", {})
    assert _claims(service, coupon, [9]) == [429]
    assert _redis_count(user) == 7
    assert UserCoupon.objects.filter(coupon=coupon).count() == 7
