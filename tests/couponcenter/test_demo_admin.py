"""``make run``'s demo admin: made once, its password kept from run to run (and shown again),
``make admin-password`` (``--reset``) sets a new one."""

from __future__ import annotations

import io
import stat

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from couponcenter.coupons.management.commands.ensure_demo_admin import password_file
from couponcenter.ops.management.commands.welcome import box

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def own_var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ensure_demo_admin", *args, stdout=out)
    return out.getvalue()


def test_the_password_is_made_once_and_kept():
    first = run()
    password = first.split("admin / ")[1].split()[0]
    assert "created" in first
    assert stat.S_IMODE(password_file().stat().st_mode) == 0o600
    again = run()
    assert f"kept: admin / {password}" in again
    assert get_user_model().objects.get(username="admin").check_password(password)


def test_reset_sets_a_new_one():
    old = run().split("admin / ")[1].split()[0]
    new = run("--reset").split("admin / ")[1].split()[0]
    admin = get_user_model().objects.get(username="admin")
    assert new != old and admin.check_password(new) and not admin.check_password(old)


def test_a_password_changed_elsewhere_is_not_shown_or_overwritten():
    run()
    admin = get_user_model().objects.get(username="admin")
    admin.set_password("changed-by-hand-123")
    admin.save()
    text = run()
    assert "unchanged; `make admin-password` sets a new one" in text
    admin.refresh_from_db()
    assert admin.check_password("changed-by-hand-123")


def test_the_welcome_box_is_closed_around_every_line():
    lines = box(["short", "a much longer line"]).splitlines()
    assert len({len(line) for line in lines}) == 1
    assert lines[0].startswith("╔") and lines[-1].startswith("╚")
