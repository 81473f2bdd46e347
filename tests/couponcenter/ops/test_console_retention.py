"""The console's retention page: every retention setting with its link to change it, and the last
run of each, on a real database and a real Redis (Django test client)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.text import slugify

from couponcenter.core.retention import table_partitioned
from expiry.retention import RETENTIONS as EXPIRY_RETENTIONS
from expiry.retention import expiry_retention
from reminders.models import Notification, ReminderSettings
from reminders.services.retention import NOTIFICATIONS_READ, reminders_retention
from reminders.services.retention import RETENTIONS as REMINDER_RETENTIONS
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db
PAGE = "/admin/console/retention/"


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def row_of(html: str, name: str) -> str:
    found = re.search(rf'<tr id="cc-retention-{slugify(name)}".*?</tr>', html, re.S)
    assert found, f"no row for {name}"
    return found.group(0)


def test_the_page_lists_every_retention_with_its_value_and_its_link(staff, reminder_settings):
    html = staff.get(PAGE).content.decode()
    for name, field, _ in (*EXPIRY_RETENTIONS, *REMINDER_RETENTIONS):
        row = row_of(html, name)
        assert field in row and "never run" in row
    assert "P180D" in row_of(html, "couponcenter_usercoupon")
    assert "P30D" in row_of(html, NOTIFICATIONS_READ)
    assert 'href="/admin/reminders/remindersettings/"' in row_of(html, NOTIFICATIONS_READ)
    assert 'href="/admin/expiry/expirysettings/"' in row_of(html, "expiry_expirytask")
    assert "Retention" in staff.get("/admin/console/").content.decode()  # linked from the console


def test_a_change_in_the_admin_shows_and_the_next_run_is_listed(staff, reminder_settings):
    now = timezone.now()
    for i in range(3):
        Notification.objects.create(
            user_id=1, dedup_key=f"n{i}", visible_at=now - timedelta(days=3),
            read_at=now - timedelta(days=2),
        )  # fmt: skip
    reminder_settings.change(notification_read_retention=timedelta(days=1))
    reminders_retention()
    expiry_retention()

    row = row_of(staff.get(PAGE).content.decode(), NOTIFICATIONS_READ)
    way = "drop" if table_partitioned(Notification._meta.db_table) else "delete"  # by vendor
    assert "P1D" in row and "3 removed in" in row and f"({way})" in row
    assert "never run" not in row

    reminder_settings.change(notification_read_retention=timedelta(0))
    reminders_retention()
    row = row_of(staff.get(PAGE).content.decode(), NOTIFICATIONS_READ)
    assert "kept forever" in row
    assert ReminderSettings.objects.get().notification_read_retention == timedelta(0)


def test_the_admin_refuses_a_retention_out_of_bounds(staff, reminder_settings):
    url = "/admin/expiry/expirysettings/"
    page = staff.get(url, follow=True)
    change_url = page.redirect_chain[-1][0]
    response = staff.post(
        change_url,
        {"batch_size": 2000, "interval": "PT1M", "retention": "P7D",
         "user_coupon_retention": "P4000D"},
    )  # fmt: skip
    assert response.status_code == 200
    assert "less than or equal to P3650D" in response.content.decode()
    saved = staff.post(
        change_url,
        {"batch_size": 2000, "interval": "PT1M", "retention": "P7D",
         "user_coupon_retention": "P0D"},
    )  # fmt: skip
    assert saved.status_code == 302
    html = staff.get(PAGE).content.decode()
    assert "kept forever" in row_of(html, "couponcenter_usercoupon")
