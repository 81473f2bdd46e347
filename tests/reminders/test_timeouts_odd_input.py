"""Odd input on the timeout API: attributes nested deep or grown large, and strings that are not
valid Unicode (a lone surrogate such as ``"\\ud800"``). Each gets a 400 that says what is wrong
and stores nothing; a job stored deeply nested before the bound existed still reads back.

Bodies are written as JSON text by hand: a lone surrogate can only travel as its ``\\u`` escape,
and a body nested hundreds deep is built without recursion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import queue
from reminders.models import TimeoutJob
from tests.support.factories import UserFactory, api_user

pytestmark = pytest.mark.django_db

CREATE = reverse("timeout-list")
BULK = reverse("timeout-bulk")
TOPIC = "timeout.default"  # a `log` topic with 8 slots in settings.TIMEOUT_TOPICS
SLOTS = 8
ACTION_TIME = "2031-03-01T09:00:00Z"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_user(staff=True)[1]}")
    return client


def nested(depth: int) -> str:
    """An object ``depth`` levels deep as JSON text: ``{"a":{"a":...{"a":1}...}}``."""
    return '{"a":' * (depth - 1) + '{"a":1' + "}" * depth


def job_text(*, attribute: str = "{}", biz_id: str = '"A-1"', biz_type: str = '"order"') -> str:
    return (
        f'{{"topic":"{TOPIC}","biz_type":{biz_type},"biz_id":{biz_id},'
        f'"action_time":"{ACTION_TIME}","attribute":{attribute}}}'
    )


def send(client: APIClient, path: str, text: str, captured):
    with captured(execute=True):
        return client.post(path, text, content_type="application/json")


def nothing_stored() -> bool:
    stats = queue.stats(TOPIC, range(SLOTS), now_ms=0)
    return not TimeoutJob.objects.exists() and not any(s.store + s.prepare for s in stats)


def messages(response) -> str:
    return json.dumps(response.json()["errors"])


# --- nesting and size ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CREATE, BULK], ids=["create", "bulk"])
def test_an_attribute_nested_past_the_bound_is_a_400(
    staff, django_capture_on_commit_callbacks, path
):
    text = job_text(attribute=nested(33))
    if path == BULK:
        text = f'{{"jobs":[{text}]}}'
    response = send(staff, path, text, django_capture_on_commit_callbacks)
    assert response.status_code == 400, response.content[:300]
    assert "nested deeper than 32 levels" in messages(response)
    assert nothing_stored()


def served(client: APIClient, path: str, text: str):
    """The request served on a fresh thread, whose stack starts as shallow as a server worker's
    (under pytest the stack is deep enough that the JSON parser itself gives up first)."""
    out: dict = {}

    def run():
        try:
            out["response"] = client.post(path, text, content_type="application/json")
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    if "error" in out:
        raise out["error"]
    return out["response"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", [CREATE, BULK], ids=["create", "bulk"])
def test_an_attribute_nested_940_deep_is_a_400_on_a_server_stack(staff, path):
    text = job_text(attribute=nested(940))
    if path == BULK:
        text = f'{{"jobs":[{text}]}}'
    response = served(staff, path, text)
    assert response.status_code == 400, response.content[:300]
    assert "the body is nested too deeply (200 levels at most)" in messages(response)
    assert nothing_stored()


@pytest.mark.parametrize("path", [CREATE, BULK], ids=["create", "bulk"])
def test_an_attribute_within_the_body_s_bound_meets_its_own(
    staff, django_capture_on_commit_callbacks, path
):
    text = job_text(attribute=nested(190))
    if path == BULK:
        text = f'{{"jobs":[{text}]}}'
    response = send(staff, path, text, django_capture_on_commit_callbacks)
    assert response.status_code == 400, response.content[:300]
    assert "nested deeper than 32 levels" in messages(response)
    assert nothing_stored()


@pytest.mark.parametrize("path", [CREATE, BULK], ids=["create", "bulk"])
def test_an_attribute_at_the_bound_is_taken(staff, django_capture_on_commit_callbacks, path):
    text = job_text(attribute=nested(32))
    if path == BULK:
        text = f'{{"jobs":[{text}]}}'
    response = send(staff, path, text, django_capture_on_commit_callbacks)
    assert response.status_code == 201, response.content[:300]
    assert TimeoutJob.objects.get().attribute == json.loads(nested(32))


def test_the_depth_bound_is_a_setting(staff, django_capture_on_commit_callbacks, settings):
    settings.TIMEOUT_ATTRIBUTE_MAX_DEPTH = 3
    refused = send(staff, CREATE, job_text(attribute=nested(4)), django_capture_on_commit_callbacks)
    assert refused.status_code == 400
    assert "nested deeper than 3 levels" in messages(refused)
    taken = send(staff, CREATE, job_text(attribute=nested(3)), django_capture_on_commit_callbacks)
    assert taken.status_code == 201


@pytest.mark.parametrize("path", [CREATE, BULK], ids=["create", "bulk"])
def test_an_attribute_over_the_size_bound_is_a_400(
    staff, django_capture_on_commit_callbacks, settings, path
):
    settings.TIMEOUT_ATTRIBUTE_MAX_BYTES = 100
    fits = json.dumps({"note": "x" * (100 - len('{"note": ""}'))})
    over = json.dumps({"note": "x" * (101 - len('{"note": ""}'))})
    for attribute, status, biz_id in ((over, 400, '"A-1"'), (fits, 201, '"A-2"')):
        text = job_text(attribute=attribute, biz_id=biz_id)
        if path == BULK:
            text = f'{{"jobs":[{text}]}}'
        response = send(staff, path, text, django_capture_on_commit_callbacks)
        assert response.status_code == status, response.content[:300]
        if status == 400:
            assert "100 bytes of JSON at most" in messages(response)
            assert nothing_stored()
    assert TimeoutJob.objects.get().biz_id == "A-2"


@pytest.mark.parametrize(
    "name, bad, bounds",
    [("TIMEOUT_ATTRIBUTE_MAX_DEPTH", "101", "1..100"),
     ("TIMEOUT_ATTRIBUTE_MAX_BYTES", "16k", "2..1000000")],
)  # fmt: skip
def test_the_bounds_are_whole_numbers_within_their_range(name, bad, bounds):
    """A bad value stops the settings from loading, with a message naming the range."""
    env = {**os.environ, name: bad, "DJANGO_SETTINGS_MODULE": "couponcenter.settings"}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"{name} must be a whole number within {bounds}, got '{bad}'" in done.stderr


# --- invalid Unicode ----------------------------------------------------------------------------

SURROGATES = {
    "attribute value": {"attribute": '{"note":"\\ud800"}'},
    "attribute key": {"attribute": '{"\\udfff":1}'},
    "deep in the attribute": {"attribute": '{"a":[1,{"b":["ok","x\\udbff"]}]}'},
    "biz_id": {"biz_id": '"A-\\ud800"'},
    "biz_type": {"biz_type": '"\\udc00"'},
}


@pytest.mark.parametrize("path", [CREATE, BULK], ids=["create", "bulk"])
@pytest.mark.parametrize("where", sorted(SURROGATES))
def test_a_lone_surrogate_anywhere_is_a_400(staff, django_capture_on_commit_callbacks, path, where):
    text = job_text(**SURROGATES[where])
    if path == BULK:
        first = job_text(biz_id='"A-0"')  # a good job ahead of the bad one: not stored either
        text = f'{{"jobs":[{first},{text}]}}'
    response = send(staff, path, text, django_capture_on_commit_callbacks)
    assert response.status_code == 400, response.content[:300]
    assert "not valid Unicode: a lone surrogate U+D" in messages(response)
    assert nothing_stored()


def test_a_surrogate_pair_is_a_character_and_is_taken(staff, django_capture_on_commit_callbacks):
    """``"\\ud83d\\ude00"`` is one character (U+1F600) written as its UTF-16 pair: valid JSON."""
    text = job_text(attribute='{"mood":"\\ud83d\\ude00"}', biz_id='"A-\\ud83d\\ude00"')
    response = send(staff, CREATE, text, django_capture_on_commit_callbacks)
    assert response.status_code == 201, response.content[:300]
    job = TimeoutJob.objects.get()
    assert (job.biz_id, job.attribute) == ("A-\U0001f600", {"mood": "\U0001f600"})


# --- jobs stored deeply nested before the bound -------------------------------------------------


@pytest.fixture
def deep_job() -> TimeoutJob:
    """A row written straight to the table, as one stored before attributes were bounded."""
    now = timezone.now()
    job = TimeoutJob.objects.create(topic=TOPIC, biz_type="order", biz_id="old-1",
                                    action_time=now, attribute={})  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TimeoutJob._meta.db_table} SET attribute = %s::jsonb WHERE job_id = %s",
            [nested(920), job.pk],
        )
    return job


@pytest.fixture
def admin() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


@pytest.mark.postgres
def test_the_admin_change_page_of_a_deeply_nested_job_renders(admin, deep_job):
    response = admin.get(reverse("admin:reminders_timeoutjob_change", args=[deep_job.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "{&quot;a&quot;: {&quot;a&quot;: " in page  # the stored text, cut
    assert f"the first 4000 of {len(nested(920).replace(':', ': '))} characters" in page


@pytest.mark.postgres
def test_the_admin_list_and_cancel_of_a_deeply_nested_job_work(admin, deep_job):
    changelist = reverse("admin:reminders_timeoutjob_changelist")
    listed = admin.get(changelist)
    assert listed.status_code == 200
    change = reverse("admin:reminders_timeoutjob_change", args=[deep_job.pk])
    assert f'href="{change}"' in listed.content.decode()
    cancel = {"action": "cancel_jobs", "_selected_action": [deep_job.pk], "post": "yes"}
    assert admin.post(changelist, cancel).status_code == 302
    deep_job.refresh_from_db(fields=["status"])
    assert deep_job.status == TimeoutJob.Status.CANCELLED


def test_the_admin_change_page_shows_a_small_attribute_whole(admin):
    job = TimeoutJob.objects.create(
        topic=TOPIC, biz_type="order", biz_id="A-1", action_time=timezone.now(),
        attribute={"tenant": "acme"},
    )  # fmt: skip
    response = admin.get(reverse("admin:reminders_timeoutjob_change", args=[job.pk]))
    assert response.status_code == 200
    assert '<pre id="tj-attribute">{&quot;tenant&quot;: &quot;acme&quot;}</pre>' in (
        response.content.decode()
    )


@pytest.mark.parametrize(
    "attribute, message",
    [(nested(940), "Nested too deeply"), (nested(33), "nested deeper than 32 levels"),
     ('{"note": "\\ud800"}', "Not valid Unicode: a lone surrogate U+D800")],
    ids=["940 deep", "33 deep", "lone surrogate"],
)  # fmt: skip
def test_the_admin_add_page_refuses_an_odd_attribute(admin, attribute, message):
    data = {"topic": TOPIC, "biz_type": "order", "biz_id": "A-1", "action_time_0": "2031-03-01",
            "action_time_1": "09:00:00", "attribute": attribute}  # fmt: skip
    response = admin.post(reverse("admin:reminders_timeoutjob_add"), data)
    assert response.status_code == 200  # the form again, with the error
    assert message in response.content.decode()
    assert nothing_stored()
