"""The admin login is throttled (django-axes): per username and per client address, a locked-out
login is answered with a clear message, every lockout is logged and the console counts them
(issue 13, item 1)."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/"
PASSWORD = "the-right-password-1"


@pytest.fixture
def superuser():
    return get_user_model().objects.create_superuser("root", "root@example.test", PASSWORD)


def _login(client, username: str, password: str, address: str = "127.0.0.1"):
    return client.post(
        LOGIN, {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=address,
    )  # fmt: skip


def test_wrong_passwords_lock_the_account_and_the_right_one_no_longer_works(
    client, superuser, settings, caplog
):
    statuses = []
    with caplog.at_level(logging.WARNING):
        for _ in range(40):
            statuses.append(_login(client, "root", "wrong").status_code)
    assert statuses[0] == 200  # the form again, with its error
    assert statuses[-1] == 429 and statuses.count(429) >= 40 - settings.AXES_FAILURE_LIMIT
    locked = _login(client, "root", PASSWORD)
    assert locked.status_code == 429
    assert "locked" in locked.content.decode().lower()
    assert "_auth_user_id" not in client.session
    assert "locked out" in caplog.text.lower() and "root" in caplog.text


def test_one_address_trying_many_usernames_is_locked_out(client, superuser, settings):
    for n in range(settings.AXES_FAILURE_LIMIT):
        _login(client, f"guess{n}", "wrong", address="203.0.113.9")
    assert _login(client, "root", PASSWORD, address="203.0.113.9").status_code == 429
    # The account itself is not locked for everyone else.
    assert _login(client, "root", PASSWORD, address="198.51.100.7").status_code == 302


def test_a_forged_forwarded_for_header_does_not_dodge_the_address_limit(client, settings):
    for n in range(settings.AXES_FAILURE_LIMIT):
        client.post(LOGIN, {"username": f"u{n}", "password": "x"}, REMOTE_ADDR="203.0.113.10",
                    HTTP_X_FORWARDED_FOR=f"10.0.0.{n}")  # fmt: skip
    blocked = client.post(LOGIN, {"username": "other", "password": "x"},
                          REMOTE_ADDR="203.0.113.10", HTTP_X_FORWARDED_FOR="10.9.9.9")  # fmt: skip
    assert blocked.status_code == 429


def test_lockouts_show_in_the_console(client, superuser, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _login(client, "mallory", "wrong", address="203.0.113.11")
    client.force_login(superuser)
    page = client.get(reverse("ops-console")).content.decode()
    assert 'id="cc-lockouts"' in page and "mallory" in page
