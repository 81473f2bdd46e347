"""Token authentication beyond the happy path: a permission granted through a group, a user made
inactive, a token revoked. The answers are cached per process for AUTH_TOKEN_CACHE_SECONDS; these
tests set it to 0 so every request asks the database, and one test shows the cache's bound."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.utils import timezone
from rest_framework.authtoken.models import Token

from couponcenter.core.api.authentication import token_cache_clear
from tests.couponcenter.conftest import client_with
from tests.support.factories import CouponFactory, api_user

pytestmark = pytest.mark.django_db
CLAIM = "/api/users/{}/coupons/"


@pytest.fixture(autouse=True)
def no_token_cache(settings):
    settings.AUTH_TOKEN_CACHE_SECONDS = 0
    token_cache_clear()
    yield
    token_cache_clear()


def _claim(client, coupon, user_id=701):
    return client.post(CLAIM.format(user_id), {"coupon": coupon.pk}, format="json")


def test_act_for_any_user_granted_through_a_group_is_honoured():
    user, token = api_user()
    coupon = CouponFactory()
    client = client_with(token)
    assert _claim(client, coupon).status_code == 403
    group = Group.objects.create(name="claim services")
    group.permissions.add(Permission.objects.get(codename="act_for_any_user"))
    user.groups.add(group)
    assert _claim(client, coupon).status_code == 201
    user.groups.remove(group)
    assert _claim(client, coupon, user_id=702).status_code == 403  # taken back: refused again


def test_an_inactive_user_is_refused_with_401():
    user, token = api_user(perms=["couponcenter.act_for_any_user"])
    client = client_with(token)
    coupon = CouponFactory()
    assert _claim(client, coupon).status_code == 201
    user.is_active = False
    user.save(update_fields=["is_active"])
    response = _claim(client, coupon, user_id=703)
    assert response.status_code == 401
    assert coupon.claims.count() == 1  # nothing more was claimed


def test_a_revoked_token_is_refused_with_401():
    _, token = api_user(perms=["couponcenter.act_for_any_user"])
    client = client_with(token)
    coupon = CouponFactory()
    assert _claim(client, coupon).status_code == 201
    Token.objects.filter(key=token).delete()
    assert _claim(client, coupon, user_id=704).status_code == 401
    assert coupon.claims.count() == 1


def test_a_revocation_takes_effect_within_the_cache_interval(settings):
    """With the cache on, a revoked token still works until the interval ends: the documented
    bound, shown by clearing the cache as the interval's end would."""
    settings.AUTH_TOKEN_CACHE_SECONDS = 3600
    _, token = api_user(perms=["couponcenter.act_for_any_user"])
    client = client_with(token)
    coupon = CouponFactory()
    assert _claim(client, coupon).status_code == 201
    Token.objects.filter(key=token).delete()
    assert _claim(client, coupon, user_id=705).status_code == 201  # still cached
    token_cache_clear()  # the interval is over
    assert _claim(client, coupon, user_id=706).status_code == 401


# --- revocation and lifetime (issue 25, item 5) ------------------------------------------------

PASSWORD = "correct-horse-battery"  # the factories' password


def _sign_in(user, password: str = PASSWORD):
    return client_with().post(
        "/api/auth/token/", {"username": user.username, "password": password}, format="json"
    )


def _person_with_token(**kwargs):
    """A person who signs in with a password and may claim for anyone, and the token it got."""
    user, _ = api_user(perms=["couponcenter.act_for_any_user"], **kwargs)
    Token.objects.filter(user=user).delete()  # the factory's own token: sign in for a real one
    response = _sign_in(user)
    assert response.status_code == 200, response.content
    return user, response.json()["token"]


def test_a_password_change_revokes_the_users_tokens():
    user, token = _person_with_token()
    client = client_with(token)
    coupon = CouponFactory()
    assert _claim(client, coupon).status_code == 201
    user.set_password("a-new-password-2")
    user.save()
    assert _claim(client, coupon, user_id=710).status_code == 401
    assert coupon.claims.count() == 1
    fresh = _sign_in(user, "a-new-password-2").json()["token"]
    assert fresh != token
    assert _claim(client_with(fresh), coupon, user_id=710).status_code == 201


def test_a_deactivated_user_stays_revoked_once_active_again():
    user, token = _person_with_token()
    user.is_active = False
    user.save()
    user.is_active = True
    user.save()
    assert _claim(client_with(token), CouponFactory()).status_code == 401


def test_other_saves_of_the_user_keep_its_token():
    user, token = _person_with_token()
    user.email = "someone@example.test"
    user.save()
    user.last_login = None
    user.save(update_fields=["last_login"])
    assert _claim(client_with(token), CouponFactory()).status_code == 201


def test_a_token_past_its_lifetime_is_refused_with_401_and_signing_in_again_replaces_it(settings):
    settings.API_TOKEN_LIFETIME = timedelta(hours=1)
    user, token = _person_with_token()
    client = client_with(token)
    coupon = CouponFactory()
    assert _claim(client, coupon).status_code == 201
    Token.objects.filter(key=token).update(created=timezone.now() - timedelta(minutes=61))
    refused = _claim(client, coupon, user_id=711)
    assert refused.status_code == 401 and "expired" in refused.json()["detail"].lower()
    assert coupon.claims.count() == 1
    signed_in = _sign_in(user).json()
    assert signed_in["token"] != token and signed_in["expires_at"]
    assert _claim(client_with(signed_in["token"]), coupon, user_id=711).status_code == 201


def test_an_expired_token_is_refused_from_the_cache_too(settings):
    settings.AUTH_TOKEN_CACHE_SECONDS = 3600
    settings.API_TOKEN_LIFETIME = timedelta(hours=1)
    _, token = _person_with_token()
    client = client_with(token)
    coupon = CouponFactory()
    assert _claim(client, coupon).status_code == 201  # cached now, created just now
    settings.API_TOKEN_LIFETIME = timedelta(microseconds=1)  # the lifetime is over
    assert _claim(client, coupon, user_id=712).status_code == 401


def test_without_a_lifetime_a_token_does_not_expire(settings):
    settings.API_TOKEN_LIFETIME = None
    user, token = _person_with_token()
    Token.objects.filter(key=token).update(created=timezone.now() - timedelta(days=3650))
    assert _claim(client_with(token), CouponFactory()).status_code == 201
    assert _sign_in(user).json() == {"token": token, "expires_at": None}


def test_a_caller_revokes_its_own_token_at_once(settings):
    settings.AUTH_TOKEN_CACHE_SECONDS = 3600  # the revoking process forgets it at once
    _, token = _person_with_token()
    client = client_with(token)
    coupon = CouponFactory()
    assert _claim(client, coupon).status_code == 201
    response = client.post("/api/auth/token/revoke/")
    assert response.status_code == 204, response.content
    assert not Token.objects.filter(key=token).exists()
    assert _claim(client, coupon, user_id=713).status_code == 401
    assert client_with().post("/api/auth/token/revoke/").status_code == 401


def test_an_account_manager_revokes_another_accounts_token():
    _, token = api_user(perms=["couponcenter.act_for_any_user"])
    target = Token.objects.get(key=token).user
    manager = client_with(api_user(staff=True, staff_perms=("couponcenter.manage_accounts",))[1])
    outsiders = [
        client_with(api_user(perms=["couponcenter.act_for_any_user"])[1]),
        client_with(api_user(staff=True, staff_perms=())[1]),
        client_with(),
    ]
    for outsider in outsiders:
        refused = outsider.post("/api/accounts/token/revoke/", {"username": target.username})
        assert refused.status_code in (401, 403)
    assert _claim(client_with(token), CouponFactory()).status_code == 201  # still works
    revoked = manager.post("/api/accounts/token/revoke/", {"username": target.username})
    assert revoked.status_code == 204, revoked.content
    assert _claim(client_with(token), CouponFactory(), user_id=714).status_code == 401


@pytest.mark.parametrize(
    ("body", "status"),
    [({}, 400), ({"username": "has space"}, 400), ({"username": ["x"]}, 400),
     ({"username": "nobody-here"}, 404)],
)  # fmt: skip
def test_revoking_by_a_bad_or_unknown_username_is_a_4xx_and_revokes_nothing(body, status):
    manager = client_with(api_user(staff=True)[1])
    before = Token.objects.count()
    response = manager.post("/api/accounts/token/revoke/", body, format="json")
    assert response.status_code == status, response.content
    assert Token.objects.count() == before
