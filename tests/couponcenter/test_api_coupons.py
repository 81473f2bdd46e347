"""The coupon catalogue API: list/filters, detail, create, change, cancel, and bad input."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from couponcenter.coupons import services
from couponcenter.coupons.models import Coupon
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db

LIST = reverse("coupon-list")


def detail(pk: int) -> str:
    return f"/api/coupons/{pk}/"


def body(**overrides) -> dict:
    data = {
        "name": "Spring sale",
        "claim_opens_at": "2031-03-01T09:00:00+08:00",
        "total_stock": 100,
        "valid_for": "P7D",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not ...}


def coupon_rows() -> list[tuple]:
    return list(Coupon.objects.order_by("pk").values_list())


# --- reading ---------------------------------------------------------------------------------


def test_list_is_paginated(service_client):
    CouponFactory.create_batch(3)
    response = service_client.get(LIST, {"page_size": 2})
    assert response.status_code == 200
    assert response.data["count"] == 3
    assert len(response.data["results"]) == 2
    assert response.data["next"]


def test_list_filters(client_for):
    now = timezone.now()
    hour = timedelta(hours=1)
    upcoming = CouponFactory(claim_opens_at=now + hour)
    open_now = CouponFactory(claim_opens_at=now - hour)
    sold_out = CouponFactory(claim_opens_at=now - hour, total_stock=1)
    services.coupon_claim(coupon_id=sold_out.pk, user_id=1)
    closed = CouponFactory(claim_opens_at=now - 2 * hour, claim_closes_at=now - hour)
    cancelled = CouponFactory(claim_opens_at=now + hour)
    services.coupon_cancel(coupon=cancelled)
    client = client_for(end_user_id=1)

    def ids(**params) -> set[int]:
        response = client.get(LIST, params)
        assert response.status_code == 200, response.data
        return {row["id"] for row in response.data["results"]}

    everything = {upcoming.pk, open_now.pk, sold_out.pk, closed.pk, cancelled.pk}
    assert ids() == everything
    assert ids(upcoming="true") == {upcoming.pk}
    assert ids(upcoming="false") == everything - {upcoming.pk}
    assert ids(claimable="true") == {open_now.pk}
    assert ids(claimable="false") == everything - {open_now.pk}
    assert ids(upcoming="true", claimable="true") == set()


@pytest.mark.parametrize(
    "params",
    [{"upcoming": "maybe"}, {"claimable": "2"}, {"upcoming": "x" * 10_000}],
)
def test_list_bad_filters(service_client, params):
    response = service_client.get(LIST, params)
    assert response.status_code == 400
    assert set(response.data["errors"]) == set(params)


@pytest.mark.parametrize("params", [{"page": "abc"}, {"page": "999"}, {"page": "-1"}])
def test_list_bad_pages_are_404(service_client, params):
    CouponFactory()
    assert service_client.get(LIST, params).status_code == 404


@pytest.mark.parametrize("page_size", ["-5", "-1", "0", "abc", "1.5"])
def test_list_bad_page_sizes_are_400(service_client, page_size):
    """Not silently ignored (a client asking for 0 would get 50 and not know why)."""
    CouponFactory()
    response = service_client.get(LIST, {"page_size": page_size})
    assert response.status_code == 400
    assert "page_size" in response.data["errors"]


def test_a_page_size_over_the_maximum_is_the_maximum(service_client):
    CouponFactory.create_batch(3)
    response = service_client.get(LIST, {"page_size": "99999999999999999999999"})
    assert response.status_code == 200
    assert len(response.data["results"]) == 3


def test_detail_speaks_iso_8601(service_client):
    coupon = CouponFactory(valid_for=timedelta(days=1, hours=2), reminder_lead=timedelta(0))
    response = service_client.get(detail(coupon.pk))
    assert response.status_code == 200
    assert response.data["valid_for"] == "P1DT2H"
    assert response.data["reminder_lead"] == "PT0S"
    assert response.data["remaining_stock"] == coupon.total_stock
    assert response.data["claim_opens_at"].endswith("Z")


@pytest.mark.parametrize("pk", [999_999, 0, 999_999_999_999_999_999])
def test_detail_unknown_ids_are_404(service_client, pk):
    assert service_client.get(detail(pk)).status_code == 404


@pytest.mark.parametrize("path", ["abc", "-1", "1.5", "9" * 19, "%00"])
def test_detail_malformed_ids_are_404(service_client, path):
    assert service_client.get(f"/api/coupons/{path}/").status_code == 404


# --- create ----------------------------------------------------------------------------------


def test_create(manager_client):
    response = manager_client.post(
        LIST, body(reminder_lead="PT90S", per_user_limit=2, claim_closes_at=None), format="json"
    )
    assert response.status_code == 201, response.data
    coupon = Coupon.objects.get(pk=response.data["id"])
    assert coupon.valid_for == timedelta(days=7)
    assert coupon.reminder_lead == timedelta(seconds=90)
    assert coupon.claim_opens_at.isoformat() == "2031-03-01T01:00:00+00:00"
    assert response.data["valid_for"] == "P7D"
    assert response.data["reminder_lead"] == "PT1M30S"
    assert response.data["claim_opens_at"] == "2031-03-01T01:00:00Z"


@pytest.mark.parametrize("format", ["multipart", None])
def test_create_refuses_a_form_post(manager_client, format):
    """JSON only (a schema offering form bodies too broke generated clients): 415."""
    if format is None:
        form = "application/x-www-form-urlencoded"
        response = manager_client.post(LIST, "name=x&total_stock=1", content_type=form)
    else:
        response = manager_client.post(LIST, body(), format=format)
    assert response.status_code == 415, response.data
    assert not Coupon.objects.exists()


BAD_BODIES = [
    ({"name": ...}, "name"),
    ({"name": None}, "name"),
    ({"name": ""}, "name"),
    ({"name": "x" * 201}, "name"),
    ({"name": {"a": 1}}, "name"),
    ({"claim_opens_at": ...}, "claim_opens_at"),
    ({"claim_opens_at": None}, "claim_opens_at"),
    ({"claim_opens_at": "2031-03-01T09:00:00"}, "claim_opens_at"),
    ({"claim_opens_at": "2031-03-01"}, "claim_opens_at"),
    ({"claim_opens_at": "yesterday"}, "claim_opens_at"),
    ({"claim_opens_at": "2031-02-30T09:00:00Z"}, "claim_opens_at"),
    ({"claim_opens_at": "0001-01-01T00:00:00+05:00"}, "claim_opens_at"),
    ({"claim_opens_at": "9999-12-31T23:59:59Z"}, "claim_opens_at"),
    ({"claim_opens_at": "1960-01-01T00:00:00Z"}, "claim_opens_at"),
    ({"claim_opens_at": 1234567890}, "claim_opens_at"),
    ({"claim_opens_at": ["2031-03-01T09:00:00Z"]}, "claim_opens_at"),
    ({"claim_closes_at": "2031-03-01T08:00:00+08:00"}, "claim_closes_at"),
    ({"claim_closes_at": "2031-03-02T08:00:00"}, "claim_closes_at"),
    ({"total_stock": ...}, "total_stock"),
    ({"total_stock": None}, "total_stock"),
    ({"total_stock": 0}, "total_stock"),
    ({"total_stock": -1}, "total_stock"),
    ({"total_stock": 10**30}, "total_stock"),
    ({"total_stock": "many"}, "total_stock"),
    ({"total_stock": 1.5}, "total_stock"),
    ({"total_stock": True}, "total_stock"),
    ({"per_user_limit": 0}, "per_user_limit"),
    ({"per_user_limit": 1001}, "per_user_limit"),
    ({"per_user_limit": None}, "per_user_limit"),
    ({"valid_for": ...}, "valid_for"),
    ({"valid_for": None}, "valid_for"),
    ({"valid_for": "1 00:00:00"}, "valid_for"),
    ({"valid_for": "86400"}, "valid_for"),
    ({"valid_for": 86400}, "valid_for"),
    ({"valid_for": "-P1D"}, "valid_for"),
    ({"valid_for": "P"}, "valid_for"),
    ({"valid_for": "PT"}, "valid_for"),
    ({"valid_for": "P1DT"}, "valid_for"),
    ({"valid_for": "P1Y"}, "valid_for"),
    ({"valid_for": "PT0S"}, "valid_for"),
    ({"valid_for": "P99999999999D"}, "valid_for"),
    ({"valid_for": "P" + "9" * 400 + "D"}, "valid_for"),
    ({"valid_for": "P100000D"}, "valid_for"),
    ({"valid_for": "P1D", "expires_at": "2031-04-01T00:00:00Z"}, "valid_for"),
    ({"valid_for": None, "expires_at": "2031-02-01T00:00:00Z"}, "expires_at"),
    ({"reminder_lead": "-PT60S"}, "reminder_lead"),
    ({"reminder_lead": "P8D"}, "reminder_lead"),
    ({"reminder_lead": None}, "reminder_lead"),
    ({"reminder_lead": "PT1M", "valid_for": "soon"}, "valid_for"),
    ({"reminder_priority": "urgent"}, "reminder_priority"),
    ({"description": "x" * 10_001}, "description"),
]


@pytest.mark.parametrize(("overrides", "field"), BAD_BODIES)
def test_create_bad_input_is_a_400_that_changes_nothing(manager_client, overrides, field):
    CouponFactory()
    before = coupon_rows()
    response = manager_client.post(LIST, body(**overrides), format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["errors"], response.data
    assert coupon_rows() == before


@pytest.mark.parametrize(
    ("payload", "content_type", "status"),
    [
        ("[1, 2]", "application/json", 400),
        ('"text"', "application/json", 400),
        ("null", "application/json", 400),
        ("{not json", "application/json", 400),
        ("", "application/json", 400),
        ("\xff\xfe", "application/json", 400),
        ('{"name": "x"}', "text/plain", 415),
        ("<coupon/>", "application/xml", 415),
    ],
)
def test_create_odd_bodies(manager_client, payload, content_type, status):
    before = coupon_rows()
    response = manager_client.post(LIST, payload, content_type=content_type)
    assert response.status_code == status, response.content
    if status == 400:
        assert "errors" in response.json()
    assert coupon_rows() == before


# --- change ----------------------------------------------------------------------------------


def test_patch(manager_client):
    coupon = CouponFactory(total_stock=10)
    response = manager_client.patch(
        detail(coupon.pk), {"total_stock": 50, "reminder_lead": "PT2M"}, format="json"
    )
    assert response.status_code == 200, response.data
    coupon.refresh_from_db()
    assert (coupon.total_stock, coupon.reminder_lead) == (50, timedelta(minutes=2))
    assert response.data["reminder_lead"] == "PT2M"


def test_patch_empty_body_changes_nothing(manager_client):
    coupon = CouponFactory()
    before = coupon_rows()
    assert manager_client.patch(detail(coupon.pk), {}, format="json").status_code == 200
    assert [row[:-1] for row in coupon_rows()] == [row[:-1] for row in before]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"total_stock": 0}, "total_stock"),
        ({"total_stock": 1}, "total_stock"),  # below the 2 already claimed
        ({"name": None}, "name"),
        ({"valid_for": None}, "valid_for"),  # would leave no validity
        ({"claim_opens_at": "2031-01-01T00:00:00"}, "claim_opens_at"),
        ({"claim_closes_at": "2000-01-01T00:00:00Z"}, "claim_closes_at"),
        ({"reminder_lead": "P1"}, "reminder_lead"),
        ({"per_user_limit": "x"}, "per_user_limit"),
        ([{"name": "x"}], "non_field_errors"),
    ],
)
def test_patch_bad_input(manager_client, payload, field):
    coupon = CouponFactory(total_stock=10)
    for user_id in (1, 2):
        services.coupon_claim(coupon_id=coupon.pk, user_id=user_id)
    before = coupon_rows()
    response = manager_client.patch(detail(coupon.pk), payload, format="json")
    assert response.status_code == 400, response.data
    assert field in response.data["errors"]
    assert coupon_rows() == before


def test_patch_unknown_coupon(manager_client):
    assert manager_client.patch(detail(999_999), {"name": "x"}, format="json").status_code == 404


def test_patch_a_cancelled_coupon_is_a_409(manager_client):
    coupon = CouponFactory()
    services.coupon_cancel(coupon=coupon)
    response = manager_client.patch(detail(coupon.pk), {"name": "x"}, format="json")
    assert response.status_code == 409
    assert response.data["code"] == "cancelled"
    assert Coupon.objects.get(pk=coupon.pk).name == coupon.name


# --- cancel ----------------------------------------------------------------------------------


def test_cancel_is_idempotent(manager_client):
    coupon = CouponFactory()
    for _ in range(2):
        response = manager_client.post(f"/api/coupons/{coupon.pk}/cancel/")
        assert response.status_code == 200
        assert response.data["status"] == "cancelled"


def test_cancel_unknown_coupon(manager_client):
    assert manager_client.post("/api/coupons/999999/cancel/").status_code == 404


def test_cancel_ignores_a_body(manager_client):
    coupon = CouponFactory()
    response = manager_client.post(f"/api/coupons/{coupon.pk}/cancel/", [1], format="json")
    assert response.status_code == 200


def test_get_on_cancel_is_405(manager_client):
    coupon = CouponFactory()
    assert manager_client.get(f"/api/coupons/{coupon.pk}/cancel/").status_code == 405


def test_the_schema_states_the_validity_rule(service_client):
    """Generated clients see what the 400 below enforces: not both of expires_at and valid_for."""
    schema = service_client.get("/api/schema/", {"format": "json"}).json()
    component = schema["components"]["schemas"]["CouponInputRequest"]
    assert component["not"] == {"required": ["expires_at", "valid_for"]}
    assert "exactly one of `expires_at`" in component["description"]
