"""Numbers an operator can trust (issue 29, section 3), page by page, without a browser: times
to the second with their zone, lateness past the last bucket, counts that mean what they say.
The browser check of the same pages is tests/e2e/test_console_trust_browser.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import formats, timezone

from reminders.models import TimeoutJob
from reminders.services import timeout_job_create
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db

SECONDS_AND_ZONE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def job(reminder_settings) -> TimeoutJob:
    at = datetime(2031, 3, 4, 12, 37, 45, tzinfo=UTC)
    return timeout_job_create(
        topic="timeout.default", biz_type="order", biz_id="T-1", action_time=at
    )


# --- times ---------------------------------------------------------------------------------------


def test_lists_and_detail_pages_show_seconds_and_the_zone(staff, job):
    listing = staff.get("/admin/reminders/timeoutjob/").content.decode()
    assert "2031-03-04 12:37:45 UTC" in listing
    assert "p.m." not in listing
    detail = staff.get(f"/admin/reminders/timeoutjob/{job.pk}/change/").content.decode()
    # The creation time, read-only on the page, to the second and named.
    assert SECONDS_AND_ZONE.search(detail)
    assert "p.m." not in detail and "a.m." not in detail


def test_a_date_renders_with_seconds_in_the_operators_zone_with_its_name(staff, job):
    with timezone.override("Europe/Paris"):
        shown = formats.localize(timezone.template_localtime(job.action_time))
    assert shown == "2031-03-04 13:37:45 CET"
