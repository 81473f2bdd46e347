"""Who a timeout topic's jobs belong to: an owner cannot be deleted from under its topics, a topic
without an owner (the ones in settings too) is staff-only, a deleted topic takes its jobs with it
(a topic made later under its name starts empty), and a fair key's slot is the caller's own.
Real requests against the real database and Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db.models import ProtectedError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import keys, queue, scripts, topic_model
from reminders.engine.clock import epoch_ms
from reminders.engine.scripts import Claimed
from reminders.handlers import timeout_jobs
from reminders.handlers.timeout_jobs import Fired
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.selectors.timeout_topics import timeout_topic_spec
from reminders.services import timeout_topic_save
from reminders.services.firing import timeout_jobs_take_rows
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db
TOPICS = "/api/timeout-topics/"
JOBS = "/api/timeouts/"
Status = TimeoutJob.Status


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def forget_registered_topics():
    before = {t.name for t in topic_model.all_topics()}
    yield
    for topic in topic_model.all_topics():
        if topic.name not in before:
            topic_model.unregister_topic(topic.name)


def _client(*, staff: bool = False) -> tuple:
    user, token = api_user(staff=staff, perms=() if staff else ("reminders.manage_timeouts",))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return user, client


def _topic(name: str, **fields) -> TimeoutTopic:
    fields.setdefault("type", "log")
    return timeout_topic_save(topic=TimeoutTopic(name=name), **fields)


def _body(topic: str, biz_id: str = "1", **extra) -> dict:
    at = (timezone.now() + timedelta(minutes=5)).isoformat()
    return {"topic": topic, "biz_type": "order", "biz_id": biz_id, "action_time": at, **extra}


def _post(client, capture, body: dict):
    with capture(execute=True):
        return client.post(JOBS, body, format="json")


def _bury(topic: str, job: TimeoutJob, redis_client) -> None:
    """``job`` dead in Redis and in its row, as a worker leaves one past its attempts."""
    token = scripts.lease_acquire(
        redis_client, keys.slot_keys(topic, job.slot), holder="test", ttl_ms=60_000
    )
    queue.claim(topic, job.slot, now_ms=10**13, limit=10, visibility_ms=60_000, lease_token=token)
    queue.bury(topic, job.slot, [(str(job.pk), "boom")], now_ms=0, lease_token=token)
    TimeoutJob.objects.filter(pk=job.pk).update(status=Status.DEAD)


def _key(topic: str, biz_id: str = "1") -> str:
    return f"{JOBS}by-key/?topic={topic}&biz_type=order&biz_id={biz_id}"


# --- an owner cannot be deleted from under its topics ---------------------------------------------


def test_a_group_or_user_that_owns_a_topic_cannot_be_deleted():
    owner, _ = _client()
    team = Group.objects.create(name="payments")
    _topic("team.close", owner_group=team)
    _topic("mine.close", owner_user=owner)

    with pytest.raises(ProtectedError):
        team.delete()
    with pytest.raises(ProtectedError):
        owner.delete()
    assert TimeoutTopic.objects.get(name="team.close").owner_group_id == team.pk
    assert TimeoutTopic.objects.get(name="mine.close").owner_user_id == owner.pk


def test_the_admin_names_the_topic_that_keeps_a_group_from_being_deleted(admin_user):
    team = Group.objects.create(name="payments")
    _topic("team.close", owner_group=team)
    client = Client()
    client.force_login(admin_user)

    page = client.post(f"/admin/auth/group/{team.pk}/delete/", {"post": "yes"})
    assert page.status_code == 200  # the confirmation page again, saying why: not a redirect
    text = page.content.decode()
    assert "protected" in text and "team.close" in text
    assert Group.objects.filter(pk=team.pk).exists()
    assert TimeoutTopic.objects.get(name="team.close").owner_group_id == team.pk


# --- a topic without an owner is staff-only -------------------------------------------------------


@pytest.mark.parametrize("topic", ["order.close", "t.unowned"])  # from settings, a row
def test_a_topic_without_an_owner_is_staff_only(topic, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    _topic("t.unowned")
    _, staff = _client(staff=True)
    _, tenant = _client()
    made = _post(staff, capture, _body(topic, attribute={"card": "4111"}))
    assert made.status_code == 201, made.content
    job_id = made.json()["job_id"]

    refused = _post(tenant, capture, _body(topic, biz_id="2"))
    assert refused.status_code == 400 and topic not in str(refused.json())
    assert tenant.get(JOBS, {"topic": topic}).status_code == 400
    assert tenant.get(JOBS).json()["results"] == []
    assert tenant.get(f"{JOBS}{job_id}/").status_code == 404
    assert tenant.get(_key(topic)).status_code == 400
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    with capture(execute=True):
        assert tenant.patch(_key(topic), {"action_time": later}, format="json").status_code == 400
        assert tenant.delete(_key(topic)).status_code == 400
        assert tenant.delete(f"{JOBS}{job_id}/").status_code == 404
    bulk = tenant.post(f"{JOBS}bulk/", {"jobs": [_body(topic, biz_id="3")]}, format="json")
    assert bulk.status_code == 400
    job = TimeoutJob.objects.get(topic=topic)  # the staff's, untouched; nothing else made
    assert (job.pk, job.status, job.attribute) == (job_id, Status.PENDING, {"card": "4111"})
    assert staff.get(f"{JOBS}{job_id}/").status_code == 200


# --- a deleted topic takes its jobs with it -------------------------------------------------------


def test_a_topic_made_again_under_a_deleted_ones_name_starts_empty(
    django_capture_on_commit_callbacks, redis_client
):
    capture = django_capture_on_commit_callbacks
    first, first_client = _client()
    second, second_client = _client()
    _, staff = _client(staff=True)
    _topic("pay.close", owner_user=first)
    made = {}
    for biz_id in ("1", "2", "3"):
        made[biz_id] = _post(
            first_client, capture, _body("pay.close", biz_id, attribute={"card": "4111"})
        )
        assert made[biz_id].status_code == 201
    with capture(execute=True):
        assert first_client.delete(_key("pay.close", "1")).status_code == 200  # cancelled
    ids = {biz_id: answer.json()["job_id"] for biz_id, answer in made.items()}
    TimeoutJob.objects.filter(pk=ids["2"]).update(status=Status.PROCESSED)  # its entry stays
    _bury("pay.close", TimeoutJob.objects.get(pk=ids["3"]), redis_client)

    with capture(execute=True):
        assert staff.delete(f"{TOPICS}pay.close/").status_code == 204
    assert not TimeoutJob.objects.filter(topic="pay.close").exists()
    assert (
        staff.post(
            TOPICS, {"name": "pay.close", "type": "log", "owner_user": second.pk}, format="json"
        ).status_code
        == 201
    )

    assert second_client.get(JOBS, {"topic": "pay.close"}).json()["results"] == []
    for job_id in ids.values():
        assert second_client.get(f"{JOBS}{job_id}/").status_code == 404
    assert second_client.get(_key("pay.close", "2")).status_code == 404
    slots = range(TimeoutTopic.objects.get(name="pay.close").slots)
    left = queue.stats("pay.close", slots, now_ms=epoch_ms())
    assert sum(s.store + s.prepare + s.dead for s in left) == 0


def test_a_topic_with_pending_jobs_is_not_deleted_and_keeps_them(
    django_capture_on_commit_callbacks,
):
    owner, owner_client = _client()
    _, staff = _client(staff=True)
    _topic("pay.close", owner_user=owner)
    made = _post(owner_client, django_capture_on_commit_callbacks, _body("pay.close"))

    refused = staff.delete(f"{TOPICS}pay.close/")
    assert refused.status_code == 409 and refused.json()["code"] == "topic_in_use"
    assert "1 job" in refused.json()["detail"]
    assert TimeoutTopic.objects.filter(name="pay.close").exists()
    job = TimeoutJob.objects.get(pk=made.json()["job_id"])
    assert job.status == Status.PENDING


def test_a_name_whose_old_jobs_are_still_pending_is_not_taken_again(
    django_capture_on_commit_callbacks,
):
    # Jobs left under a name no topic has (a topic removed from settings with jobs pending).
    _, staff = _client(staff=True)
    left = TimeoutJob.objects.create(
        topic="gone.close",
        biz_type="order",
        biz_id="1",
        action_time=timezone.now(),
        attribute={"card": "4111"},
    )

    refused = staff.post(TOPICS, {"name": "gone.close", "type": "log"}, format="json")
    assert refused.status_code == 400
    assert "1 job" in " ".join(refused.json()["errors"]["name"])
    assert not TimeoutTopic.objects.filter(name="gone.close").exists()
    assert TimeoutJob.objects.get(pk=left.pk).status == Status.PENDING


def test_a_name_whose_old_jobs_all_finished_is_taken_afresh():
    _, staff = _client(staff=True)
    TimeoutJob.objects.create(
        topic="gone.close",
        biz_type="order",
        biz_id="1",
        action_time=timezone.now(),
        status=Status.PROCESSED,
        attribute={"card": "4111"},
    )

    assert (
        staff.post(TOPICS, {"name": "gone.close", "type": "log"}, format="json").status_code == 201
    )
    assert not TimeoutJob.objects.filter(topic="gone.close").exists()


# --- a fair key's slot is the caller's own --------------------------------------------------------


def test_a_fair_key_value_lands_in_a_slot_of_the_callers_own(django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    team = Group.objects.create(name="shops")
    first, first_client = _client()
    second, second_client = _client()
    first.groups.add(team)
    second.groups.add(team)
    _topic("shop.close", owner_group=team, slots=1024, fair_key="attribute.tenant")

    def slot(client, biz_id: str, tenant: str) -> int:
        answer = _post(client, capture, _body("shop.close", biz_id, attribute={"tenant": tenant}))
        assert answer.status_code == 201, answer.content
        return TimeoutJob.objects.get(pk=answer.json()["job_id"]).slot

    acme = slot(first_client, "1", "acme")
    assert slot(first_client, "2", "acme") == acme  # one value, one slot: fairness still holds
    assert slot(second_client, "3", "acme") != acme  # the other caller's "acme" is its own
    bulk = second_client.post(
        f"{JOBS}bulk/",
        {"jobs": [_body("shop.close", "4", attribute={"tenant": "acme"})]},
        format="json",
    )
    assert bulk.status_code == 201
    assert TimeoutJob.objects.get(biz_id="4").slot == TimeoutJob.objects.get(biz_id="3").slot


def test_a_recurring_jobs_next_occurrence_keeps_its_creators_fair_slot(
    django_capture_on_commit_callbacks,
):
    capture = django_capture_on_commit_callbacks
    owner, owner_client = _client()
    _topic("shop.daily", owner_user=owner, slots=1024, fair_key="attribute.tenant")
    body = _body("shop.daily", attribute={"tenant": "acme"}, recurrence="FREQ=DAILY;COUNT=3")
    first = TimeoutJob.objects.get(pk=_post(owner_client, capture, body).json()["job_id"])
    spec = timeout_topic_spec("shop.daily")
    [taken], _ = timeout_jobs_take_rows({first.pk: Claimed(str(first.pk), 0, 1)})
    with capture(execute=True):
        assert timeout_jobs.settle_fired(spec, [Fired(first.slot, taken, 1, None, 0)])["acked"]

    successor = TimeoutJob.objects.get(topic="shop.daily", status=Status.PENDING)
    assert successor.pk != first.pk and successor.slot == first.slot
