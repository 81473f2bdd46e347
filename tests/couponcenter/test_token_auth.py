"""Token authentication beyond the happy path: a permission granted through a group, a user made
inactive, a token revoked. The answers are cached per process for AUTH_TOKEN_CACHE_SECONDS; these
tests set it to 0 so every request asks the database, and one test shows the cache's bound."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
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
