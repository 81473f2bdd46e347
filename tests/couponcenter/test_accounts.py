"""API accounts made by staff (``POST /api/accounts/``) or by ``create_api_account``: the token
they hand out works for what was granted and nothing more; a person's sign-in is never taken
over."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from couponcenter.models import Account
from tests.support.factories import CouponFactory, api_user

pytestmark = pytest.mark.django_db


def _client(token: str | None = None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def staff() -> APIClient:
    return _client(api_user(staff=True)[1])


def test_an_end_user_account_acts_for_its_user_only(staff):
    response = staff.post("/api/accounts/", {"username": "app-4242", "user_id": 4242})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["user_id"] == 4242 and body["permissions"] == []
    app = _client(body["token"])
    assert app.get("/api/users/4242/coupons/").status_code == 200
    assert app.get("/api/users/4243/coupons/").status_code == 403
    assert app.post("/api/timeouts/", {}).status_code == 403
    user = get_user_model().objects.get(username="app-4242")
    assert not user.has_usable_password() and not user.is_staff


def test_again_keeps_the_token_and_sets_exactly_the_permissions_asked(staff):
    first = staff.post("/api/accounts/", {"username": "orders-svc",
                                          "permissions": ["manage_timeouts"]}).json()  # fmt: skip
    service = _client(first["token"])
    assert service.get("/api/timeouts/").status_code == 200
    again = staff.post("/api/accounts/", {"username": "orders-svc",
                                          "permissions": ["manage_coupons"]})  # fmt: skip
    assert again.status_code == 200
    assert again.json()["token"] == first["token"]
    assert again.json()["permissions"] == ["manage_coupons"]
    assert service.get("/api/timeouts/").status_code == 403
    coupon = CouponFactory()
    assert service.post(f"/api/coupons/{coupon.pk}/cancel/").status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"username": ""}, "username"),
        ({"username": "has space"}, "username"),
        ({"username": "x" * 151}, "username"),
        ({"username": "ok", "user_id": 0}, "user_id"),
        ({"username": "ok", "user_id": 10**18}, "user_id"),
        ({"username": "ok", "permissions": ["superuser"]}, "permissions"),
        ({"username": "ok", "user_id": 5, "permissions": ["act_for_any_user"]}, "permissions"),
    ],
)
def test_bad_input_is_400_and_makes_nothing(staff, body, field):
    before = get_user_model().objects.count()
    response = staff.post("/api/accounts/", body)
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert get_user_model().objects.count() == before


def test_a_persons_sign_in_or_staff_is_never_taken_over(staff):
    person = get_user_model().objects.create_user("alice", password="a-long-password-1")
    admin, _ = api_user(staff=True)
    for username in ("alice", admin.username):
        response = staff.post("/api/accounts/", {"username": username, "user_id": 1})
        assert response.status_code == 409
        assert response.json()["code"] == "not_an_api_account"
    person.refresh_from_db()
    assert person.check_password("a-long-password-1")
    assert not Account.objects.filter(user__username__in=["alice", admin.username]).exists()


def test_only_staff_may_make_accounts():
    linked = _client(api_user(end_user_id=1)[1])
    service = _client(api_user(perms=["couponcenter.act_for_any_user"])[1])
    for client in (_client(), linked, service):
        assert client.post("/api/accounts/", {"username": "x"}).status_code in (401, 403)
    assert not get_user_model().objects.filter(username="x").exists()


def test_the_command_prints_a_working_token():
    out, err = io.StringIO(), io.StringIO()
    call_command("create_api_account", "svc-1", "--permission", "act_for_any_user",
                 stdout=out, stderr=err)  # fmt: skip
    token = out.getvalue().strip()
    assert "created svc-1" in err.getvalue() and "act_for_any_user" in err.getvalue()
    assert _client(token).get("/api/users/77/coupons/").status_code == 200
    with pytest.raises(CommandError, match="cannot act for any user"):
        call_command("create_api_account", "svc-2", "--user-id", "3",
                     "--permission", "act_for_any_user")  # fmt: skip
    assert not get_user_model().objects.filter(username="svc-2").exists()
