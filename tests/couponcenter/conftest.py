"""Fixtures for the coupon domain tests: API clients by role, and a fast password hasher."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from tests.support.factories import api_user

# Random start: the throttle counters live in the shared cache and outlive a test run.
_addresses = itertools.count(random.randrange(1, 2**24 - 100_000))


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def unique_address() -> str:
    """A client address of its own, so the shared throttle counters never meet another test's."""
    n = next(_addresses)
    return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"


def client_with(token: str | None = None) -> APIClient:
    client = APIClient(REMOTE_ADDR=unique_address())
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def anon() -> APIClient:
    return client_with()


@pytest.fixture
def client_for() -> Callable[..., APIClient]:
    """``client_for(end_user_id=..., staff=..., perms=...)``: an API client for a new account."""

    def make(**kwargs) -> APIClient:
        _, token = api_user(**kwargs)
        return client_with(token)

    return make


@pytest.fixture
def service_client(db) -> APIClient:
    """A service account: may act for any end user."""
    _, token = api_user(perms=["couponcenter.act_for_any_user"])
    return client_with(token)


@pytest.fixture
def manager_client(db) -> APIClient:
    """A non-staff account with the manage_coupons permission."""
    _, token = api_user(perms=["couponcenter.manage_coupons"])
    return client_with(token)
