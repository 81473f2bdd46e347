"""The generic timeout API: create, read, cancel, refusals, bad input and permissions.

Every write goes through ``django_capture_on_commit_callbacks(execute=True)`` so the Redis index
that follows the commit really happens, and each test asserts on the real Redis keyspace.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import queue, topic_model
from reminders.engine.keys import slot_for
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.services import timeout_topic_save
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db

CREATE = reverse("timeout-list")
TOPIC = "timeout.default"  # a `log` topic with 8 slots in settings.TIMEOUT_TOPICS
SLOTS = 8
ACTION_TIME = "2031-03-01T09:00:00+08:00"
ACTION_MS = int(datetime(2031, 3, 1, 1, tzinfo=UTC).timestamp() * 1000)


def detail(job_id: int) -> str:
    return reverse("timeout-detail", kwargs={"job_id": job_id})


def body(**overrides) -> dict:
    data = {
        "topic": TOPIC,
        "biz_type": "order",
        "biz_id": "A-1001",
        "action_time": ACTION_TIME,
        "attribute": {"reason": "unpaid", "amount": 42},
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not ...}


def client_with(token: str | None = None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def redis_backlog(topic: str = TOPIC) -> dict[int, int]:
    """Slot -> entries (store + prepare + dead) for every non-empty slot of ``topic``."""
    rows = queue.stats(topic, range(SLOTS), now_ms=0)
    return {s.slot: s.store + s.prepare + s.dead for s in rows if s.store + s.prepare + s.dead}


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff(db) -> APIClient:
    return client_with(api_user(staff=True)[1])


@pytest.fixture
def post(staff, django_capture_on_commit_callbacks):
    """POST a job as staff, running the on-commit Redis index as a real commit would."""

    def send(client: APIClient | None = None, **overrides):
        with django_capture_on_commit_callbacks(execute=True):
            return (client or staff).post(CREATE, body(**overrides), format="json")

    return send


@pytest.fixture
def delete(staff, django_capture_on_commit_callbacks):
    def send(job_id: int):
        with django_capture_on_commit_callbacks(execute=True):
            return staff.delete(detail(job_id))

    return send


# --- create, read, cancel --------------------------------------------------------------------


def test_create_returns_the_job_and_indexes_it_in_its_slot(post):
    response = post()
    assert response.status_code == 201, response.data
    data = response.data
    job = TimeoutJob.objects.get()
    assert data["job_id"] == job.pk
    assert (data["topic"], data["biz_type"], data["biz_id"]) == (TOPIC, "order", "A-1001")
    assert (data["status"], data["status_code"]) == ("pending", 0)
    assert data["attribute"] == {"reason": "unpaid", "amount": 42}
    assert datetime.fromisoformat(data["action_time"]) == datetime(2031, 3, 1, 1, tzinfo=UTC)
    assert data["attempts"] == 0 and data["last_error"] == ""
    slot = slot_for("A-1001", SLOTS)
    assert job.slot == slot
    assert redis_backlog() == {slot: 1}
    assert queue.earliest_due(TOPIC, [slot]) == ACTION_MS
    assert queue.stats(TOPIC, [slot], now_ms=ACTION_MS)[0].due == 1


def test_jobs_spread_over_slots_by_biz_id(post):
    ids = [f"order-{n}" for n in range(20)]
    for biz_id in ids:
        assert post(biz_id=biz_id).status_code == 201
    expected: dict[int, int] = {}
    for biz_id in ids:
        expected[slot_for(biz_id, SLOTS)] = expected.get(slot_for(biz_id, SLOTS), 0) + 1
    assert redis_backlog() == expected
    assert len(expected) > 1


def test_get_returns_the_job(post, staff):
    job_id = post().data["job_id"]
    response = staff.get(detail(job_id))
    assert response.status_code == 200
    assert response.data["job_id"] == job_id
    assert response.data["status"] == "pending"


def test_delete_cancels_and_removes_from_redis(post, delete):
    job_id = post().data["job_id"]
    assert sum(redis_backlog().values()) == 1
    response = delete(job_id)
    assert response.status_code == 200, response.data
    assert (response.data["status"], response.data["status_code"]) == ("cancelled", 3)
    assert TimeoutJob.objects.get(pk=job_id).status == TimeoutJob.Status.CANCELLED
    assert redis_backlog() == {}
    again = delete(job_id)
    assert again.status_code == 409
    assert again.data["code"] == "not_pending"
    assert TimeoutJob.objects.get(pk=job_id).status == TimeoutJob.Status.CANCELLED


def test_a_cancelled_biz_key_may_be_scheduled_again(post, delete):
    first = post().data["job_id"]
    delete(first)
    response = post()
    assert response.status_code == 201
    assert response.data["job_id"] != first
    assert sum(redis_backlog().values()) == 1


def test_unknown_job_is_404(staff):
    assert staff.get(detail(987654321)).status_code == 404
    assert staff.delete(detail(987654321)).status_code == 404


# --- refusals and bad input --------------------------------------------------------------------


def test_create_is_idempotent_while_a_job_is_pending(post):
    first = post()
    assert first.status_code == 201
    response = post(action_time="2032-01-01T00:00:00Z")
    assert response.status_code == 200
    assert response.data["job_id"] == first.data["job_id"]
    assert response.data["action_time"] == first.data["action_time"]  # a retry moves nothing
    assert TimeoutJob.objects.count() == 1
    assert queue.earliest_due(TOPIC, range(SLOTS)) == ACTION_MS  # the first one is untouched


def test_same_biz_id_in_another_topic_or_type_is_fine(post):
    assert post().status_code == 201
    assert post(biz_type="invoice").status_code == 201
    assert post(topic="order.close").status_code == 201
    assert TimeoutJob.objects.count() == 3


def test_unknown_topic_is_400(post):
    response = post(topic="no.such.topic")
    assert response.status_code == 400
    assert "topic" in response.data["errors"]
    assert not TimeoutJob.objects.exists()
    assert redis_backlog("no.such.topic") == {}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"topic": ...}, "topic"),
        ({"biz_type": ...}, "biz_type"),
        ({"biz_id": ...}, "biz_id"),
        ({"action_time": ...}, "action_time"),
        ({"biz_id": ""}, "biz_id"),
        ({"action_time": "2031-03-01T09:00:00"}, "action_time"),  # naive: no time zone
        ({"action_time": "tomorrow"}, "action_time"),
        ({"action_time": "2031-13-45T99:00:00Z"}, "action_time"),
        ({"action_time": 1_750_000_000}, "action_time"),
        ({"action_time": "99999-01-01T00:00:00Z"}, "action_time"),
        ({"attribute": [1, 2, 3]}, "attribute"),
        ({"attribute": "text"}, "attribute"),
        ({"attribute": 7}, "attribute"),
        ({"attribute": {"blob": "x" * 20_000}}, "attribute"),
        ({"attribute": {"nul": "a\u0000b"}}, "attribute"),
        ({"biz_id": "x" * 129}, "biz_id"),
        ({"biz_type": "t" * 10_000}, "biz_type"),
        ({"topic": "t" * 10_000}, "topic"),
        ({"biz_id": "a\u0000b"}, "biz_id"),
    ],
)
def test_bad_input_is_400_and_writes_nothing(post, overrides, field):
    response = post(**overrides)
    assert response.status_code == 400, response.data
    assert field in response.data["errors"]
    assert not TimeoutJob.objects.exists()
    assert redis_backlog() == {}


def test_body_that_is_not_an_object_is_400(staff):
    for payload in ([body()], "job", None):
        response = staff.post(CREATE, payload, format="json")
        assert response.status_code == 400, payload
    response = staff.post(CREATE, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert not TimeoutJob.objects.exists()


# --- permissions -------------------------------------------------------------------------------


def test_anonymous_is_refused(post):
    anon = client_with()
    assert anon.post(CREATE, body(), format="json").status_code in (401, 403)
    job_id = post().data["job_id"]
    assert anon.get(detail(job_id)).status_code in (401, 403)
    assert anon.delete(detail(job_id)).status_code in (401, 403)
    assert TimeoutJob.objects.get().status == TimeoutJob.Status.PENDING


def test_linked_end_user_account_is_forbidden(post):
    user = client_with(api_user(end_user_id=501)[1])
    assert user.post(CREATE, body(biz_id="B-1"), format="json").status_code == 403
    job_id = post().data["job_id"]
    assert user.get(detail(job_id)).status_code == 403
    assert user.delete(detail(job_id)).status_code == 403
    assert TimeoutJob.objects.get().status == TimeoutJob.Status.PENDING


def test_manage_timeouts_permission_is_enough_on_a_topic_of_its_own(
    post, django_capture_on_commit_callbacks
):
    user, token = api_user(perms=["reminders.manage_timeouts"])
    service = client_with(token)
    timeout_topic_save(topic=TimeoutTopic(name="svc.close"), type="log", owner_user=user)
    assert post(client=service).status_code == 400  # the settings topic has no owner: staff's
    response = post(client=service, topic="svc.close")
    assert response.status_code == 201
    job_id = response.data["job_id"]
    assert service.get(detail(job_id)).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        assert service.delete(detail(job_id)).status_code == 200
    assert redis_backlog("svc.close") == {}
    assert not TimeoutJob.objects.filter(topic=TOPIC).exists()
    topic_model.unregister_topic("svc.close")


def test_past_action_time_is_accepted_and_due_now(post):
    past = (timezone.now() - timedelta(minutes=5)).isoformat()
    response = post(action_time=past)
    assert response.status_code == 201
    slot = TimeoutJob.objects.get().slot
    now_ms = int(timezone.now().timestamp() * 1000)
    assert queue.stats(TOPIC, [slot], now_ms=now_ms)[0].due == 1
