"""Claims over the API: claim (201 / 409 codes), list, redeem, and bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.coupons import services
from couponcenter.coupons.models import Coupon, UserCoupon
from expiry.models import ExpiryTask
from tests.support.factories import CouponFactory, UserCouponFactory

pytestmark = pytest.mark.django_db

USER = 501


def claims(user_id: int = USER) -> str:
    return f"/api/users/{user_id}/coupons/"


def redeem(user_coupon_id: int, user_id: int = USER) -> str:
    return f"/api/users/{user_id}/coupons/{user_coupon_id}/redeem/"


def state() -> tuple:
    """Everything a claim or redeem could change."""
    return (
        list(Coupon.objects.order_by("pk").values_list("pk", "claimed_count", "status")),
        list(UserCoupon.objects.order_by("pk").values_list("pk", "status", "used_at")),
        list(ExpiryTask.objects.order_by("pk").values_list("pk", "status")),
    )


@pytest.fixture
def client(client_for):
    return client_for(end_user_id=USER)


def test_claim(client):
    coupon = CouponFactory(valid_for=timedelta(days=2))
    response = client.post(claims(), {"coupon": coupon.pk}, format="json")
    assert response.status_code == 201, response.data
    assert response.data["coupon"] == coupon.pk
    assert response.data["coupon_name"] == coupon.name
    assert response.data["user_id"] == USER
    assert response.data["status"] == "unused"
    user_coupon = UserCoupon.objects.get(pk=response.data["id"])
    assert ExpiryTask.objects.filter(user_coupon=user_coupon).exists()
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 1


def _cancelled() -> Coupon:
    return services.coupon_cancel(coupon=CouponFactory())


def _sold_out() -> Coupon:
    coupon = CouponFactory(total_stock=1)
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    return coupon


def _held() -> Coupon:
    coupon = CouponFactory(per_user_limit=1)
    services.coupon_claim(coupon_id=coupon.pk, user_id=USER)
    return coupon


def _closed() -> Coupon:
    now = timezone.now()
    return CouponFactory(claim_opens_at=now - timedelta(days=2), claim_closes_at=now)


def _not_open() -> Coupon:
    return CouponFactory(claim_opens_at=timezone.now() + timedelta(minutes=5))


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (_sold_out, "sold_out"),
        (_held, "limit_reached"),
        (_not_open, "not_open"),
        (_closed, "closed"),
        (_cancelled, "cancelled"),
    ],
)
def test_claim_refusals_are_409_with_a_code(client, make, code):
    coupon = make()
    before = state()
    response = client.post(claims(), {"coupon": coupon.pk}, format="json")
    assert response.status_code == 409
    assert response.data["code"] == code
    assert response.data["detail"]
    assert state() == before
    # The time a client acts on is written as every answer writes times: UTC, ending in Z.
    when = response.data.get("opens_at") or response.data.get("closed_at")
    if code in ("not_open", "closed"):
        assert when.endswith("Z") and when in response.data["detail"]


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"coupon": None},
        {"coupon": "abc"},
        {"coupon": 0},
        {"coupon": -1},
        {"coupon": 1.5},
        {"coupon": 2**63},
        {"coupon": 10**100},
        {"coupon": [1]},
        {"coupon": {"id": 1}},
    ],
)
def test_claim_bad_input(client, payload):
    CouponFactory()
    before = state()
    response = client.post(claims(), payload, format="json")
    assert response.status_code == 400, response.data
    assert "coupon" in response.data["errors"]
    assert state() == before


@pytest.mark.parametrize("query", ["", "?via=drf"])  # a query string skips the lean path
@pytest.mark.parametrize("coupon_id", [999_999, 2**63 - 1])
def test_claiming_an_unknown_coupon_is_a_404(client, query, coupon_id):
    """As the README says: an unknown id is a 404, in DRF's ``{"detail": ...}`` shape."""
    CouponFactory()
    before = state()
    response = client.post(claims() + query, {"coupon": coupon_id}, format="json")
    assert response.status_code == 404, response.content
    assert response.json() == {"detail": f"No coupon with id {coupon_id}."}
    assert state() == before


@pytest.mark.parametrize(
    ("payload", "content_type", "status"),
    [
        ("[1]", "application/json", 400),
        ("1", "application/json", 400),
        ("{", "application/json", 400),
        ("coupon=1", "text/plain", 415),
    ],
)
def test_claim_odd_bodies(client, payload, content_type, status):
    CouponFactory()
    before = state()
    response = client.post(claims(), payload, content_type=content_type)
    assert response.status_code == status
    assert state() == before


def test_claim_as_a_form_post(client):
    coupon = CouponFactory()
    response = client.post(claims(), {"coupon": str(coupon.pk)})
    assert response.status_code == 201


def test_list_and_filter(client):
    first = services.coupon_claim(coupon_id=CouponFactory().pk, user_id=USER)
    second = services.coupon_claim(coupon_id=CouponFactory().pk, user_id=USER)
    services.coupon_claim(coupon_id=CouponFactory().pk, user_id=USER + 1)
    services.coupon_redeem(user_coupon_id=first.pk, user_id=USER)
    response = client.get(claims())
    assert response.status_code == 200
    assert response.data["count"] == 2
    assert [row["id"] for row in response.data["results"]] == [second.pk, first.pk]
    used = client.get(claims(), {"status": "used"}).data["results"]
    assert [row["id"] for row in used] == [first.pk]
    assert client.get(claims(), {"status": "expired"}).data["count"] == 0


@pytest.mark.parametrize("status", ["gone", "USED", "unused,used"])
def test_list_bad_status_filter(client, status):
    response = client.get(claims(), {"status": status})
    assert response.status_code == 400
    assert "status" in response.data["errors"]


# --- redeem ----------------------------------------------------------------------------------


def test_redeem(client):
    user_coupon = services.coupon_claim(coupon_id=CouponFactory().pk, user_id=USER)
    response = client.post(redeem(user_coupon.pk))
    assert response.status_code == 200, response.data
    assert response.data["status"] == "used"
    assert response.data["used_at"]
    task = ExpiryTask.objects.get(user_coupon=user_coupon)
    assert task.status == ExpiryTask.Status.PROCESSED


def test_redeem_already_used(client):
    user_coupon = services.coupon_claim(coupon_id=CouponFactory().pk, user_id=USER)
    client.post(redeem(user_coupon.pk))
    before = state()
    response = client.post(redeem(user_coupon.pk))
    assert (response.status_code, response.data["code"]) == (409, "already_used")
    assert state() == before


def test_redeem_expired(client):
    past = timezone.now() - timedelta(days=1)
    late = UserCouponFactory(user_id=USER, claimed_at=past, expires_at=past + timedelta(hours=1))
    swept = UserCouponFactory(user_id=USER, status=UserCoupon.Status.EXPIRED)
    before = state()
    for user_coupon in (late, swept):
        response = client.post(redeem(user_coupon.pk))
        assert (response.status_code, response.data["code"]) == (409, "expired")
    assert state() == before


def test_redeem_someone_elses_coupon_is_404(service_client):
    user_coupon = services.coupon_claim(coupon_id=CouponFactory().pk, user_id=USER)
    before = state()
    assert service_client.post(redeem(user_coupon.pk, user_id=USER + 1)).status_code == 404
    assert state() == before


@pytest.mark.parametrize("path_id", ["999999", "0", "9" * 18, "9" * 19, "abc"])
def test_redeem_unknown_ids_are_404(client, path_id):
    assert client.post(f"/api/users/{USER}/coupons/{path_id}/redeem/").status_code == 404


@pytest.mark.parametrize("user_id", ["9" * 18, "0"])
def test_service_may_use_any_valid_user_id(service_client, user_id):
    coupon = CouponFactory()
    response = service_client.post(f"/api/users/{user_id}/coupons/", {"coupon": coupon.pk})
    assert response.status_code == 201
    assert service_client.get(f"/api/users/{user_id}/coupons/").data["count"] == 1


@pytest.mark.parametrize("user_id", ["9" * 19, "-1", "abc", "1e3"])
def test_malformed_user_ids_are_404(service_client, user_id):
    assert service_client.get(f"/api/users/{user_id}/coupons/").status_code == 404
