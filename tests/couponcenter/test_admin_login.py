"""The admin login is throttled (django-axes): per username and client address pair, and at far
higher limits per client address and per username alone; a locked-out login is answered with a
clear message, every lockout is logged and the console counts them (issue 13, item 1; issue 25,
item 5)."""

from __future__ import annotations

import json
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


def test_wrong_passwords_lock_out_their_address_and_the_right_one_no_longer_works_there(
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
    for n in range(settings.AXES_ADDRESS_FAILURE_LIMIT):
        _login(client, f"guess{n}", "wrong", address="203.0.113.9")
    assert _login(client, "root", PASSWORD, address="203.0.113.9").status_code == 429
    # The account itself is not locked for everyone else.
    assert _login(client, "root", PASSWORD, address="198.51.100.7").status_code == 302


def test_a_forged_forwarded_for_header_does_not_dodge_the_address_limit(client, settings):
    for n in range(settings.AXES_ADDRESS_FAILURE_LIMIT):
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


# --- who a lockout locks out (issue 25, item 5) -------------------------------------------------


def _token(client, username: str, password: str, address: str):
    body = json.dumps({"username": username, "password": password})
    return client.post(
        "/api/auth/token/", body, content_type="application/json", REMOTE_ADDR=address
    )


def test_failures_for_the_admins_username_lock_out_that_address_only(client, superuser, settings):
    """Anyone may know the admin's username: past the limit, the address that tried is locked out,
    while the admin signs in from anywhere else."""
    for _ in range(settings.AXES_FAILURE_LIMIT + 5):
        _login(client, "root", "wrong", address="203.0.113.20")
    assert _login(client, "root", PASSWORD, address="203.0.113.20").status_code == 429
    assert _token(client, "root", PASSWORD, "203.0.113.20").status_code == 429
    assert _login(client, "root", PASSWORD, address="198.51.100.20").status_code == 302
    assert _token(client, "root", PASSWORD, "198.51.100.21").status_code == 200


def test_a_username_is_locked_for_everyone_only_past_its_far_higher_limit(
    client, superuser, settings
):
    settings.AXES_FAILURE_LIMIT, settings.AXES_USERNAME_FAILURE_LIMIT = 3, 8
    # Failures from many addresses, each below its own limit: the username tier counts them all.
    for n in range(settings.AXES_USERNAME_FAILURE_LIMIT - 1):
        _login(client, "root", "wrong", address=f"203.0.113.{100 + n // 2}")
    assert _login(client, "root", PASSWORD, address="198.51.100.30").status_code == 302
    client.logout()
    _login(client, "root", "wrong", address="203.0.113.200")  # the username's limit reached
    assert _login(client, "root", PASSWORD, address="198.51.100.31").status_code == 429


def test_a_successful_sign_in_forgets_the_failures_of_its_own_address_only(
    client, superuser, settings
):
    settings.AXES_FAILURE_LIMIT, settings.AXES_USERNAME_FAILURE_LIMIT = 3, 5
    for _ in range(2):
        _login(client, "root", "wrong", address="203.0.113.40")
        _login(client, "root", "wrong", address="198.51.100.40")
    assert _login(client, "root", PASSWORD, address="198.51.100.40").status_code == 302
    client.logout()
    # That address's two failures are forgotten, the other's two still count: three more from a
    # third address make the username's five.
    for _ in range(3):
        _login(client, "root", "wrong", address="203.0.113.41")
    assert _login(client, "root", PASSWORD, address="198.51.100.41").status_code == 429


def test_an_address_or_a_username_locked_out_on_its_own_shows_in_the_console(
    client, superuser, settings
):
    settings.AXES_FAILURE_LIMIT = 3
    settings.AXES_ADDRESS_FAILURE_LIMIT = settings.AXES_USERNAME_FAILURE_LIMIT = 6
    for n in range(6):  # one address, six usernames: below the pair limit every time
        _login(client, f"sprayed{n}", "wrong", address="203.0.113.50")
    for n in range(6):  # one username, three addresses: likewise
        _login(client, "trudy", "wrong", address=f"198.51.100.{60 + n // 2}")
    client.force_login(superuser)
    page = client.get(reverse("ops-console")).content.decode()
    table = page[page.index('id="cc-lockouts"') :]
    table = table[: table.index("</table>")]
    assert "<td>(any)</td><td>203.0.113.50</td><td>6</td>" in table
    assert "<td>trudy</td><td>(any)</td><td>6</td>" in table
