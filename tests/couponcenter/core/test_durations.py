"""One duration format everywhere: ISO 8601 in its shortest form, in answers, the live config,
validation messages and the admin's inputs."""

from __future__ import annotations

from datetime import timedelta

import jsonschema_rs
import pytest
from django.utils.dateparse import parse_duration

from couponcenter.core.durations import iso_duration
from expiry.models import ExpirySettings
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "PT0S"),
        (timedelta(seconds=30), "PT30S"),
        (timedelta(minutes=5), "PT5M"),
        (timedelta(days=7), "P7D"),
        (timedelta(days=1, hours=2, minutes=30), "P1DT2H30M"),
        (timedelta(milliseconds=500), "PT0.5S"),
        (timedelta(seconds=90061, microseconds=250_000), "P1DT1H1M1.25S"),
        (-timedelta(minutes=5), "-PT5M"),
        (timedelta(days=3660), "P3660D"),
        # Seconds after hours carry the minutes: RFC 3339's grammar (the OpenAPI schema's
        # "duration" format) has no hours-then-seconds form.
        (timedelta(days=146, hours=1, seconds=31), "P146DT1H0M31S"),
        (timedelta(hours=2, seconds=1), "PT2H0M1S"),
    ],
)
def test_iso_duration_is_the_shortest_form_and_reads_back(value, text):
    assert iso_duration(value) == text
    assert parse_duration(text) == value


@pytest.mark.parametrize("seconds", [0, 1, 59, 60, 61, 3599, 3600, 3601, 3660, 3661, 86399, 86400,
                                     86401, 86460, 90000, 90001, 12_618_031])  # fmt: skip
def test_whole_seconds_fit_the_schemas_duration_format(seconds):
    """What the API answers for a whole number of seconds (all its inputs allow) is valid under
    the ``format: duration`` its OpenAPI schema declares, as a schema validator checks it."""
    validator = jsonschema_rs.Draft202012Validator(
        {"type": "string", "format": "duration"}, validate_formats=True
    )
    text = iso_duration(timedelta(seconds=seconds))
    assert validator.is_valid(text), text


@pytest.fixture
def staff(client):
    _, token = api_user(staff=True)
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {token}"
    return client


def _post(client, path, data):
    return client.post(path, data, content_type="application/json")


def test_coupons_answer_short_iso_durations(staff):
    response = _post(staff, "/api/coupons/", {
        "name": "Spring", "claim_opens_at": "2031-03-01T09:00:00Z", "total_stock": 10,
        "valid_for": "P0DT00H00M30S", "reminder_lead": "PT90S",
    })  # fmt: skip
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["valid_for"], body["reminder_lead"]) == ("PT30S", "PT1M30S")


def test_a_bound_in_an_error_is_an_iso_duration(staff):
    response = _post(staff, "/api/coupons/", {
        "name": "Spring", "claim_opens_at": "2031-03-01T09:00:00Z", "total_stock": 10,
        "valid_for": "P4000D",
    })  # fmt: skip
    assert response.status_code == 400
    message = response.json()["errors"]["valid_for"][0]
    assert "P3660D" in message and "days," not in message, message


def test_the_live_config_speaks_iso_durations(staff, reminder_settings):
    body = staff.get("/api/ops/config/").json()
    assert body["reminder"]["late_limit"] == iso_duration(reminder_settings.late_limit)
    expiry = ExpirySettings.objects.get()
    assert body["expiry"]["interval"] == iso_duration(expiry.interval)
    assert body["expiry"]["retention"] == iso_duration(expiry.retention)
    assert ":" not in body["expiry"]["retention"] and ":" not in body["reminder"]["late_limit"]
    changed = staff.patch("/api/ops/config/", {"reminder": {"late_limit": "PT10M"}},
                          content_type="application/json")  # fmt: skip
    assert changed.status_code == 200, changed.content
    assert changed.json()["reminder"]["late_limit"] == "PT10M"
    too_long = staff.patch("/api/ops/config/", {"expiry": {"interval": "P2D"}},
                           content_type="application/json")  # fmt: skip
    assert too_long.status_code == 400
    assert "P1D" in too_long.json()["errors"]["expiry"]["interval"][0]
    assert ExpirySettings.objects.get().interval == expiry.interval


def test_the_admin_shows_and_reads_iso_durations(admin_client, reminder_settings):
    page = admin_client.get(f"/admin/reminders/remindersettings/{reminder_settings.pk}/change/")
    assert page.status_code == 200
    assert f'value="{iso_duration(reminder_settings.late_limit)}"' in page.content.decode()
