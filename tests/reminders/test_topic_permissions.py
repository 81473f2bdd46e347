"""What a timeout topic kept as data may call, and who may pause it.

A ``callable`` topic's target must be one of ``settings.TIMEOUT_CALLABLE_TARGETS``, whoever
creates or changes it (the staff API, the admin, a superuser); a row outside the list is never
used. The admin's pause and resume actions need the change permission, as its change page does.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from reminders.models import TimeoutTopic
from reminders.selectors.timeout_topics import timeout_topic_spec
from reminders.services import timeout_topic_save
from tests.support.factories import UserFactory, api_user

pytestmark = pytest.mark.django_db
TOPICS = "/api/timeout-topics/"
ALLOWED = "tests.reminders.test_timeouts_handlers.record_call"
CHANGELIST = "/admin/reminders/timeouttopic/"


@pytest.fixture(autouse=True)
def allowed_callables(settings):
    settings.TIMEOUT_CALLABLE_TARGETS = [ALLOWED]


@pytest.fixture
def superuser_api() -> APIClient:
    token = Token.objects.create(user=UserFactory(is_staff=True, is_superuser=True))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def _admin(*perms: str, superuser: bool = False) -> Client:
    """A signed-in admin: a superuser, or staff holding ``perms``."""
    if superuser:
        user = UserFactory(is_staff=True, is_superuser=True)
    else:
        user, _ = api_user(staff=True, staff_perms=perms)
    client = Client()
    client.force_login(user)
    return client


# --- the allow-list -------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["builtins.print", "os.system", f"{ALLOWED}_not", "x"])
def test_the_api_refuses_a_callable_outside_the_allow_list_even_for_a_superuser(
    superuser_api, target
):
    body = {"name": "t.call", "type": "callable", "target": target}
    refused = superuser_api.post(TOPICS, body, format="json")
    assert refused.status_code == 400, refused.content
    assert "TIMEOUT_CALLABLE_TARGETS" in " ".join(refused.json()["errors"]["target"])
    assert not TimeoutTopic.objects.exists()


def test_the_api_creates_a_callable_topic_on_the_list(superuser_api):
    body = {"name": "t.call", "type": "callable", "target": ALLOWED}
    created = superuser_api.post(TOPICS, body, format="json")
    assert created.status_code == 201, created.content
    assert timeout_topic_spec("t.call").path == ALLOWED


def test_a_topic_is_not_changed_into_a_callable_outside_the_list(superuser_api):
    timeout_topic_save(topic=TimeoutTopic(name="t.log"), type="log")
    timeout_topic_save(topic=TimeoutTopic(name="t.call"), type="callable", target=ALLOWED)
    for name, change in [("t.log", {"type": "callable", "target": "os.system"}),
                         ("t.call", {"target": "builtins.exec"})]:  # fmt: skip
        refused = superuser_api.patch(f"{TOPICS}{name}/", change, format="json")
        assert refused.status_code == 400 and "target" in refused.json()["errors"]
    assert TimeoutTopic.objects.get(name="t.log").type == "log"
    assert TimeoutTopic.objects.get(name="t.call").target == ALLOWED


def test_the_admin_refuses_a_callable_outside_the_allow_list():
    client = _admin(superuser=True)
    form = {"name": "t.admin", "type": "callable", "target": "os.system", "slots": 8,
            "max_attempts": 16, "backoff_base_ms": 1000, "backoff_cap_ms": 300000,
            "visibility_ms": 30000, "concurrency": 8, "timeout_ms": 5000,
            "rate_limit_per_s": 0, "fair_key": ""}  # fmt: skip
    refused = client.post(f"{CHANGELIST}add/", form)
    assert refused.status_code == 200 and "TIMEOUT_CALLABLE_TARGETS" in refused.content.decode()
    assert not TimeoutTopic.objects.exists()
    added = client.post(f"{CHANGELIST}add/", {**form, "target": ALLOWED})
    assert added.status_code == 302
    assert TimeoutTopic.objects.get(name="t.admin").target == ALLOWED


def test_a_callable_row_taken_off_the_list_is_no_longer_used(settings):
    timeout_topic_save(topic=TimeoutTopic(name="t.call"), type="callable", target=ALLOWED)
    assert timeout_topic_spec("t.call") is not None
    settings.TIMEOUT_CALLABLE_TARGETS = []  # as after a restart with the function taken off
    timeout_topic_save(topic=TimeoutTopic(name="t.other"), type="log")  # the rows read again
    assert timeout_topic_spec("t.call") is None  # no worker fires it, no caller schedules on it
    assert timeout_topic_spec("t.other") is not None


def _load_settings(allow_list: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TIMEOUT_CALLABLE_TARGETS": allow_list}
    return subprocess.run([sys.executable, "-c", "import couponcenter.settings"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.mark.parametrize("allow_list", ["builtins.print, os system", "print", "a..b", "1x.y"])
def test_a_malformed_allow_list_stops_the_settings_from_loading(allow_list):
    done = _load_settings(allow_list)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and "TIMEOUT_CALLABLE_TARGETS" in done.stderr


def test_a_well_formed_allow_list_loads():
    done = _load_settings(" os.path.join ,, tests.reminders.test_timeouts_handlers.record_call,")
    assert done.returncode == 0, done.stderr


# --- the admin's actions --------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["pause", "resume"])
def test_the_admins_pause_and_resume_need_the_change_permission(action):
    topic = timeout_topic_save(topic=TimeoutTopic(name="t.pausable"), type="log",
                               paused=action == "resume")  # fmt: skip
    form = {"action": action, "_selected_action": [topic.pk]}
    viewer = _admin("reminders.view_timeouttopic")
    assert f'value="{action}"' not in viewer.get(CHANGELIST).content.decode()
    viewer.post(CHANGELIST, form)
    topic.refresh_from_db()
    assert topic.paused is (action == "resume")  # unchanged
    changer = _admin("reminders.view_timeouttopic", "reminders.change_timeouttopic")
    assert f'value="{action}"' in changer.get(CHANGELIST).content.decode()
    assert changer.post(CHANGELIST, form).status_code == 302
    topic.refresh_from_db()
    assert topic.paused is (action == "pause")
