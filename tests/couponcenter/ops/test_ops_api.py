"""``/api/ops/``: staff only; backlog, dead letters, requeue and live config."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from expiry.models import ExpirySettings
from reminders.members import REMINDER_TOPIC
from reminders.models import ReminderSettings, ReminderSubscription
from tests.support.console import dead_members, kill_reminders, member, overdue_reminders
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db

ENDPOINTS = [
    ("get", "/api/ops/backlog/"),
    ("get", "/api/ops/dead-letters/"),
    ("post", "/api/ops/dead-letters/requeue/"),
    ("get", "/api/ops/config/"),
    ("patch", "/api/ops/config/"),
]


def client_for(*, staff: bool) -> APIClient:
    _, token = api_user(staff=staff)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def staff() -> APIClient:
    return client_for(staff=True)


@pytest.fixture
def dead(reminder_settings, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        subs = overdue_reminders(range(7000, 7006))
    kill_reminders(subs[:4])
    return subs[:4]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_anonymous_gets_401_and_non_staff_403(method, path, reminder_settings):
    assert getattr(APIClient(), method)(path, {}, format="json").status_code == 401
    assert getattr(client_for(staff=False), method)(path, {}, format="json").status_code == 403


def test_backlog(staff, dead):
    body = staff.get("/api/ops/backlog/").json()
    (topic,) = [t for t in body["topics"] if t["topic"] == REMINDER_TOPIC]
    assert (topic["store"], topic["due"], topic["dead"]) == (2, 2, 4)
    assert sum(s["dead"] for s in topic["slots"]) == 4
    assert body["totals"]["dead"] == 4 and body["workers"] == [] and "pending_due" in body["expiry"]
    only = staff.get("/api/ops/backlog/", {"topic": REMINDER_TOPIC}).json()
    assert [t["topic"] for t in only["topics"]] == [REMINDER_TOPIC]


def test_dead_letter_list_and_filters(staff, dead):
    body = staff.get("/api/ops/dead-letters/").json()
    assert body["total"] == 4 and {r["job_id"] for r in body["results"]} == {
        member(s) for s in dead
    }
    assert body["results"][0]["last_error"] == "gateway said 503"
    one = dead[0]
    body = staff.get("/api/ops/dead-letters/", {"topic": REMINDER_TOPIC, "slot": one.slot}).json()
    assert {r["slot"] for r in body["results"]} == {one.slot}
    assert len(staff.get("/api/ops/dead-letters/", {"limit": 1}).json()["results"]) == 1
    for bad in ({"topic": "nope"}, {"slot": 1}, {"limit": 0}, {"topic": REMINDER_TOPIC,
                                                                "slot": 99999}):  # fmt: skip
        assert staff.get("/api/ops/dead-letters/", bad).status_code == 400


def test_requeue_by_ids_and_all(staff, dead, django_capture_on_commit_callbacks):
    one = dead[0]
    with django_capture_on_commit_callbacks(execute=True):
        response = staff.post("/api/ops/dead-letters/requeue/",
                              {"topic": REMINDER_TOPIC, "slot": one.slot,
                               "job_ids": [member(one)]}, format="json")  # fmt: skip
    assert response.status_code == 200, response.content
    assert response.json()["rows_fixed"] == 1
    one.refresh_from_db()
    assert one.status == ReminderSubscription.Status.SCHEDULED
    assert member(one) not in dead_members()
    with django_capture_on_commit_callbacks(execute=True):
        response = staff.post("/api/ops/dead-letters/requeue/",
                              {"topic": REMINDER_TOPIC, "all": True, "limit": 2},
                              format="json")  # fmt: skip
    assert response.json()["requested"] == 2
    assert len(dead_members()) == 1


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"topic": REMINDER_TOPIC},
        {"topic": REMINDER_TOPIC, "job_ids": ["1:2:3"]},  # no slot
        {"topic": REMINDER_TOPIC, "all": True, "job_ids": ["1:2:3"], "slot": 0},
        {"topic": "nope", "all": True},
        {"topic": REMINDER_TOPIC, "all": True, "limit": 10_001},
    ],
)
def test_requeue_bad_input_is_400_and_changes_nothing(staff, dead, body):
    response = staff.post("/api/ops/dead-letters/requeue/", body, format="json")
    assert response.status_code == 400
    assert len(dead_members()) == 4


def test_config_get_and_patch(staff, reminder_settings):
    before = staff.get("/api/ops/config/").json()
    assert before["reminder"]["slots"] == reminder_settings.slots and "expiry" in before
    response = staff.patch("/api/ops/config/",
                           {"reminder": {"batch_size": 321}, "expiry": {"interval": "PT30S"}},
                           format="json")  # fmt: skip
    assert response.status_code == 200, response.content
    after = response.json()
    assert after["reminder"]["batch_size"] == 321
    assert after["reminder"]["version"] == before["reminder"]["version"] + 1
    assert ExpirySettings.objects.get().interval.total_seconds() == 30


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reminder": {"slots": 12}}, "slots"),
        ({"reminder": {"batch_size": 0}}, "batch_size"),
        ({"reminder": {"tick_interval_ms": -1}}, "tick_interval_ms"),
        ({"expiry": {"batch_size": 0}}, "batch_size"),
        ({"expiry": {"interval": "-PT5S"}}, "interval"),
        ({"reminder": {"batch_size": 10}, "expiry": {"retention": "-P1D"}}, "retention"),
    ],
)
def test_config_patch_bad_input_is_400_with_field_errors_and_saves_nothing(
    staff, reminder_settings, body, field
):
    row = ReminderSettings.objects.get()
    response = staff.patch("/api/ops/config/", body, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    section = next(k for k in body if k in errors)
    assert field in errors[section]
    after = ReminderSettings.objects.get()
    assert (after.version, after.batch_size) == (row.version, row.batch_size)
    assert not ExpirySettings.objects.exclude(batch_size=2000).exists()


@pytest.mark.parametrize(
    ("perms", "body"),
    [
        ((), {"reminder": {"paused": True}}),  # staff and nothing else
        (("reminders.view_remindersettings", "expiry.view_expirysettings"),
         {"reminder": {"paused": True}}),
        (("reminders.view_remindersettings", "expiry.view_expirysettings",
          "expiry.change_expirysettings"), {"reminder": {"paused": True}}),
        (("reminders.view_remindersettings", "expiry.view_expirysettings",
          "reminders.change_remindersettings"),
         {"reminder": {"paused": True}, "expiry": {"batch_size": 10}}),
    ],
)  # fmt: skip
def test_config_patch_needs_the_change_permission_of_each_section_sent(
    reminder_settings, perms, body
):
    _, token = api_user(staff=True, staff_perms=perms)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    before = ReminderSettings.objects.get()
    assert client.patch("/api/ops/config/", body, format="json").status_code == 403
    after = ReminderSettings.objects.get()
    assert (after.paused, after.version) == (before.paused, before.version)
    assert not ExpirySettings.objects.filter(batch_size=10).exists()


def test_config_patch_of_one_section_needs_only_its_change_permission(reminder_settings):
    perms = ("reminders.view_remindersettings", "expiry.view_expirysettings",
             "reminders.change_remindersettings")  # fmt: skip
    _, token = api_user(staff=True, staff_perms=perms)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    paused = client.patch("/api/ops/config/", {"reminder": {"paused": True}}, format="json")
    assert paused.status_code == 200, paused.content
    assert ReminderSettings.objects.get().paused is True


def test_ops_endpoints_are_in_the_schema(staff):
    schema = staff.get("/api/schema/", HTTP_ACCEPT="application/json").content.decode()
    for path in ("/api/ops/backlog/", "/api/ops/dead-letters/requeue/", "/api/ops/config/"):
        assert path in schema
