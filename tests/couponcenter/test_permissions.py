"""Who may do what: anonymous callers, linked accounts, service accounts, coupon managers."""

from __future__ import annotations

import re

import pytest
import yaml
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from couponcenter.coupons import services
from couponcenter.coupons.models import Coupon, UserCoupon
from tests.couponcenter.conftest import client_with
from tests.support.factories import CouponFactory, UserFactory

pytestmark = pytest.mark.django_db

ME, OTHER = 501, 502
OPEN_TO_ANONYMOUS = {"/api/auth/token/", "/api/schema/", "/api/docs/"}


def api_operations() -> list[tuple[str, str]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return [
        (method.upper(), re.sub(r"\{[^}]+\}", "1", path))
        for path, item in schema["paths"].items()
        for method in item
    ]


# --- anonymous -------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), api_operations())
def test_anonymous_is_refused_everywhere_but_token(anon, method, path):
    response = anon.generic(method, path, "{}", content_type="application/json")
    if path in OPEN_TO_ANONYMOUS:
        assert response.status_code != 401
    else:
        assert response.status_code in (401, 403), (method, path, response.status_code)


def test_anonymous_may_read_schema_docs_and_health(anon):
    schema = anon.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi")
    assert schema.status_code == 200
    validate_schema(yaml.safe_load(schema.content))
    docs = anon.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger-ui" in docs.content
    health = anon.get("/healthz/")  # PostgreSQL and Redis are up in the tests: ready
    assert health.status_code == 200, health.content


def test_schema_as_json(anon):
    response = anon.get("/api/schema/?format=json")
    assert response.status_code == 200
    assert "/api/users/{user_id}/coupons/" in response.json()["paths"]


# --- token -----------------------------------------------------------------------------------


def test_token_for_username_and_password(anon):
    user = UserFactory(username="alice")
    response = anon.post(
        "/api/auth/token/", {"username": "alice", "password": "correct-horse-battery"}
    )
    assert response.status_code == 200
    token = response.data["token"]
    assert token == user.auth_token.key
    client = client_with(token)
    assert client.get("/api/coupons/").status_code == 200


@pytest.mark.parametrize(
    "payload",
    [
        {"username": "alice", "password": "wrong"},
        {"username": "nobody", "password": "x"},
        {"username": "alice"},
        {},
        [1, 2],
        {"username": None, "password": None},
        {"username": ["alice"], "password": "correct-horse-battery"},
    ],
)
def test_token_refusals_are_400(anon, payload):
    UserFactory(username="alice")
    response = anon.post("/api/auth/token/", payload, format="json")
    assert response.status_code == 400
    assert response.data["errors"]
    assert "token" not in response.data


def test_token_ignores_a_bad_authorization_header(anon):
    UserFactory(username="alice")
    anon.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    response = anon.post(
        "/api/auth/token/", {"username": "alice", "password": "correct-horse-battery"}
    )
    assert response.status_code == 200


def test_token_is_throttled(anon):
    for _ in range(30):
        anon.post("/api/auth/token/", {"username": "x", "password": "y"})
    response = anon.post("/api/auth/token/", {"username": "x", "password": "y"})
    assert response.status_code == 429


def test_a_bad_token_is_401(anon):
    anon.credentials(HTTP_AUTHORIZATION="Token 0123456789abcdef")
    assert anon.get("/api/coupons/").status_code == 401


# --- acting for end users --------------------------------------------------------------------


@pytest.fixture
def me(client_for):
    return client_for(end_user_id=ME)


def test_a_linked_account_acts_for_its_user(me):
    coupon = CouponFactory()
    response = me.post(f"/api/users/{ME}/coupons/", {"coupon": coupon.pk}, format="json")
    assert response.status_code == 201
    assert me.get(f"/api/users/{ME}/coupons/").data["count"] == 1
    redeemed = me.post(f"/api/users/{ME}/coupons/{response.data['id']}/redeem/")
    assert redeemed.status_code == 200


def test_a_linked_account_cannot_act_for_another_user(me):
    coupon = CouponFactory()
    theirs = services.coupon_claim(coupon_id=coupon.pk, user_id=OTHER)
    other = CouponFactory()
    assert me.get(f"/api/users/{OTHER}/coupons/").status_code == 403
    response = me.post(f"/api/users/{OTHER}/coupons/", {"coupon": other.pk}, format="json")
    assert response.status_code == 403
    assert me.post(f"/api/users/{OTHER}/coupons/{theirs.pk}/redeem/").status_code == 403
    # Even a bad body or an unknown id is refused before it is looked at.
    assert me.post(f"/api/users/{OTHER}/coupons/", [1], format="json").status_code == 403
    assert me.post(f"/api/users/{OTHER}/coupons/999999/redeem/").status_code == 403
    assert UserCoupon.objects.get(pk=theirs.pk).status == UserCoupon.Status.UNUSED
    assert not UserCoupon.objects.filter(coupon=other).exists()


def test_an_unlinked_account_without_permission_acts_for_no_one(client_for):
    client = client_for()
    assert client.get(f"/api/users/{ME}/coupons/").status_code == 403
    assert client.get("/api/coupons/").status_code == 200


def test_a_service_account_acts_for_anyone(service_client):
    coupon = CouponFactory(per_user_limit=1)
    for user_id in (ME, OTHER, 1):
        response = service_client.post(
            f"/api/users/{user_id}/coupons/", {"coupon": coupon.pk}, format="json"
        )
        assert response.status_code == 201
        assert service_client.get(f"/api/users/{user_id}/coupons/").data["count"] == 1
        redeem = f"/api/users/{user_id}/coupons/{response.data['id']}/redeem/"
        assert service_client.post(redeem).status_code == 200


# --- managing coupons ------------------------------------------------------------------------


NEW_COUPON = {
    "name": "Flash",
    "claim_opens_at": "2031-01-01T00:00:00Z",
    "total_stock": 5,
    "valid_for": "P1D",
}


@pytest.mark.parametrize("kind", ["linked", "service", "plain"])
def test_only_managers_manage_coupons(client_for, kind):
    perms = {"linked": {"end_user_id": ME}, "service": {"perms": ["couponcenter.act_for_any_user"]}}
    client = client_for(**perms.get(kind, {}))
    coupon = CouponFactory(name="Before")
    assert client.post("/api/coupons/", NEW_COUPON, format="json").status_code == 403
    assert (
        client.patch(f"/api/coupons/{coupon.pk}/", {"name": "x"}, format="json").status_code == 403
    )
    assert client.post(f"/api/coupons/{coupon.pk}/cancel/").status_code == 403
    # Refused before the body or the id is looked at.
    assert client.post("/api/coupons/", [1], format="json").status_code == 403
    assert client.post("/api/coupons/999999/cancel/").status_code == 403
    assert list(Coupon.objects.values_list("name", "status")) == [("Before", "active")]
    assert client.get(f"/api/coupons/{coupon.pk}/").status_code == 200


@pytest.mark.parametrize("who", [{"perms": ["couponcenter.manage_coupons"]}, {"staff": True}])
def test_managers_and_staff_manage_coupons(client_for, who):
    client = client_for(**who)
    created = client.post("/api/coupons/", NEW_COUPON, format="json")
    assert created.status_code == 201
    path = f"/api/coupons/{created.data['id']}/"
    assert client.patch(path, {"name": "Renamed"}, format="json").status_code == 200
    assert client.post(f"{path}cancel/").data["status"] == "cancelled"
