"""API accounts made by staff (``POST /api/accounts/``) or by ``create_api_account``: the token
they hand out works for what was granted and nothing more; a person's sign-in is never taken
over."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from couponcenter.coupons import accounts
from couponcenter.coupons.models import Account
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


def test_account_ensure_is_idempotent_and_passwordless():
    user, token = accounts.account_ensure(username="svc", act_for_any_user=True)
    again, same_token = accounts.account_ensure(username="svc", act_for_any_user=True)
    assert (again.pk, same_token) == (user.pk, token)
    user = get_user_model().objects.get(pk=user.pk)
    assert not user.has_usable_password()
    assert user.has_perm("couponcenter.act_for_any_user")
    linked, _ = accounts.account_ensure(username="u1", end_user_id=1)
    assert linked.coupon_account.end_user_id == 1
    assert not get_user_model().objects.get(pk=linked.pk).has_perm("couponcenter.act_for_any_user")


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
    assert body["id"] == user.pk  # what a timeout topic's owner_user takes


def test_an_update_keeps_the_token_and_sets_exactly_the_permissions_asked(staff):
    first = staff.post("/api/accounts/", {"username": "orders-svc",
                                          "permissions": ["manage_timeouts"]}).json()  # fmt: skip
    service = _client(first["token"])
    assert service.get("/api/timeouts/").status_code == 200
    again = staff.post("/api/accounts/", {"username": "orders-svc", "update": True,
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


def test_only_staff_with_manage_accounts_may_make_accounts():
    linked = _client(api_user(end_user_id=1)[1])
    service = _client(api_user(perms=["couponcenter.act_for_any_user"])[1])
    bare_staff = _client(api_user(staff=True, staff_perms=())[1])
    viewer = _client(api_user(staff=True, staff_perms="view")[1])
    not_staff = _client(api_user(perms=["couponcenter.manage_accounts"])[1])
    for client in (_client(), linked, service, bare_staff, viewer, not_staff):
        assert client.post("/api/accounts/", {"username": "x"}).status_code in (401, 403)
    assert not get_user_model().objects.filter(username="x").exists()


def test_an_existing_username_is_refused_without_update_and_its_token_never_shown(staff):
    first = staff.post("/api/accounts/", {"username": "tenant-a",
                                          "permissions": ["manage_timeouts"]}).json()  # fmt: skip
    again = staff.post("/api/accounts/", {"username": "tenant-a", "user_id": 9})
    assert again.status_code == 409 and again.json()["code"] == "account_exists"
    assert first["token"] not in again.content.decode()
    user = get_user_model().objects.get(username="tenant-a")
    assert user.coupon_account.end_user_id is None
    assert user.has_perm("reminders.manage_timeouts")  # kept
    assert _client(first["token"]).get("/api/timeouts/").status_code == 200


def _account_manager(*perms: str) -> APIClient:
    """Staff allowed to make accounts, holding ``perms`` besides."""
    return _client(api_user(staff=True, staff_perms=("couponcenter.manage_accounts", *perms))[1])


def test_an_account_gets_no_permission_its_maker_does_not_hold(staff):
    maker = _account_manager("couponcenter.manage_coupons")
    refused = maker.post("/api/accounts/", {"username": "svc-any",
                                            "permissions": ["act_for_any_user"]})  # fmt: skip
    assert refused.status_code == 403
    assert not get_user_model().objects.filter(username="svc-any").exists()
    made = maker.post("/api/accounts/", {"username": "svc-coupons",
                                         "permissions": ["manage_coupons"]})  # fmt: skip
    assert made.status_code == 201 and made.json()["permissions"] == ["manage_coupons"]
    # An account holding more than the maker: neither changed nor its token shown.
    strong = staff.post("/api/accounts/", {"username": "svc-strong",
                                           "permissions": ["act_for_any_user"]}).json()  # fmt: skip
    update = {"username": "svc-strong", "update": True, "permissions": []}
    taken = maker.post("/api/accounts/", update, format="json")
    assert taken.status_code == 403 and strong["token"] not in taken.content.decode()
    user = get_user_model().objects.get(username="svc-strong")
    assert user.has_perm("couponcenter.act_for_any_user")


def test_an_account_whose_rights_come_from_a_group_is_not_handed_over(staff):
    # A group gives its members permissions and the topics it owns; a manager outside it took
    # such an account's token back with update: true (it saw no permission held "directly").
    from django.contrib.auth.models import Group, Permission

    team = Group.objects.create(name="acme")
    team.permissions.add(Permission.objects.get(codename="manage_timeouts"))
    made = staff.post("/api/accounts/", {"username": "svc-acme"}).json()
    get_user_model().objects.get(username="svc-acme").groups.add(team)
    maker = _account_manager("couponcenter.manage_coupons")
    update = {"username": "svc-acme", "update": True, "permissions": []}
    taken = maker.post("/api/accounts/", update, format="json")
    assert taken.status_code == 403 and made["token"] not in taken.content.decode()
    maker_with_it = _account_manager("reminders.manage_timeouts")
    still = maker_with_it.post("/api/accounts/", update, format="json")
    assert still.status_code == 403  # it holds the permission, but is not in the group
    assert "groups" in still.json()["detail"]


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
