"""Tenant quotas on timeout jobs (``reminders.services.quotas``): pending jobs per topic, creations
per second and attribute size, live in ``ReminderSettings``, checked by the single and the bulk
create for every account that is not staff, against the real database and Redis.

The creations bucket is given the time by the caller; the tests hold the service's clock still
(``frozen_ms``) so a slow run cannot drain it between two requests.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import connection, keys, queue, quotas
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.services import quotas as quota_services
from reminders.services import timeout_topic_save
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db
CREATE, BULK = "/api/timeouts/", "/api/timeouts/bulk/"
TOPIC = "tenant.close"
SLOTS = 8
# How long the tests keep a topic's pending count: longer than any run, so a slow one cannot see
# it expire and be taken again between two requests.
KEEP_MS = 3_600_000
# A full topic's Retry-After: until its pending count is taken from the database again.
RECOUNT_S = range(1, KEEP_MS // 1000 + 1)


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def clock(monkeypatch):
    """The quota service's clock, held at ``clock.ms`` until a test moves it; a pending count
    kept ``KEEP_MS``."""

    class Clock:
        ms = 1_900_000_000_000

    monkeypatch.setattr(quota_services, "epoch_ms", lambda: Clock.ms)
    monkeypatch.setattr(quota_services, "PENDING_RECOUNT_MS", KEEP_MS)
    return Clock


def _client(*, staff: bool = False) -> tuple:
    user, token = api_user(staff=staff, perms=() if staff else ("reminders.manage_timeouts",))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return user, client


@pytest.fixture
def tenant():
    """An account with a topic of its own: (user, client)."""
    user, client = _client()
    timeout_topic_save(topic=TimeoutTopic(name=TOPIC), type="log", slots=SLOTS, owner_user=user)
    return user, client


def _job(biz_id: str, **extra) -> dict:
    at = timezone.now() + timedelta(hours=1)
    return {
        "topic": TOPIC,
        "biz_type": "order",
        "biz_id": biz_id,
        "action_time": at.isoformat(),
        **extra,
    }


def _send(client, capture, path, body):
    with capture(execute=True):
        return client.post(path, body, format="json")


def _indexed() -> int:
    return sum(s.store + s.prepare for s in queue.stats(TOPIC, range(SLOTS), now_ms=0))


def _assert_quota_429(response, quota: str, retry_after: range) -> None:
    assert response.status_code == 429, response.content
    assert int(response["Retry-After"]) in retry_after
    body = response.json()
    assert body["code"] == "quota_exceeded" and body["quota"] == quota
    assert body["detail"]


# --- pending jobs per topic -----------------------------------------------------------------------


def test_a_full_topic_refuses_more_with_429_and_keeps_what_it_has(
    tenant, reminder_settings, django_capture_on_commit_callbacks, clock
):
    reminder_settings.change(quota_pending_per_topic=3)
    _, client = tenant
    for n in range(3):
        made = _send(client, django_capture_on_commit_callbacks, CREATE, _job(str(n)))
        assert made.status_code == 201, made.content

    refused = _send(client, django_capture_on_commit_callbacks, CREATE, _job("3"))

    _assert_quota_429(refused, "quota_pending_per_topic", RECOUNT_S)
    assert refused.json()["limit"] == 3
    assert TimeoutJob.objects.filter(topic=TOPIC).count() == 3 and _indexed() == 3
    # A retried create of a key that has its job answers that job, full topic or not.
    again = _send(client, django_capture_on_commit_callbacks, CREATE, _job("1"))
    assert again.status_code == 200 and again.json()["biz_id"] == "1"
    # Staff are not bounded; jobs that left (cancelled) make room once the count is taken again
    # (its key expires then: dropped here).
    _, staff = _client(staff=True)
    assert _send(staff, django_capture_on_commit_callbacks, CREATE, _job("s")).status_code == 201
    key = f"?topic={TOPIC}&biz_type=order&biz_id="
    assert client.delete(f"{CREATE}by-key/{key}0").status_code == 200
    assert client.delete(f"{CREATE}by-key/{key}s").status_code == 200
    assert _send(client, django_capture_on_commit_callbacks, CREATE, _job("4")).status_code == 429
    assert 0 < connection.client().pttl(keys.quota_pending(TOPIC)) <= KEEP_MS
    connection.client().delete(keys.quota_pending(TOPIC))
    assert _send(client, django_capture_on_commit_callbacks, CREATE, _job("4")).status_code == 201


def test_a_bulk_that_would_overfill_the_topic_is_refused_whole(
    tenant, reminder_settings, django_capture_on_commit_callbacks, clock
):
    reminder_settings.change(quota_pending_per_topic=5)
    _, client = tenant
    first = _send(
        client, django_capture_on_commit_callbacks, BULK, {"jobs": [_job("a"), _job("b")]}
    )
    assert first.status_code == 201

    refused = _send(
        client, django_capture_on_commit_callbacks, BULK, {"jobs": [_job(str(n)) for n in range(4)]}
    )

    _assert_quota_429(refused, "quota_pending_per_topic", RECOUNT_S)
    assert set(TimeoutJob.objects.values_list("biz_id", flat=True)) == {"a", "b"}
    assert _indexed() == 2
    # Keys that have their job take no room: 2 pending + 3 new fills the topic exactly.
    fits = _send(
        client,
        django_capture_on_commit_callbacks,
        BULK,
        {"jobs": [_job("a"), _job("b"), *[_job(str(n)) for n in range(3)]]},
    )
    assert fits.status_code == 201, fits.content
    assert (fits.json()["created"], fits.json()["existing"]) == (3, 2)
    assert _indexed() == 5


# --- creations per second -------------------------------------------------------------------------


def test_creations_per_second_answer_429_with_retry_after_until_the_bucket_drains(
    tenant, reminder_settings, django_capture_on_commit_callbacks, clock, redis_prefix
):
    reminder_settings.change(quota_creations_per_s=4)
    user, client = tenant
    bulk = _send(
        client, django_capture_on_commit_callbacks, BULK, {"jobs": [_job(str(n)) for n in range(4)]}
    )
    assert bulk.status_code == 201

    refused = _send(client, django_capture_on_commit_callbacks, CREATE, _job("late"))

    _assert_quota_429(refused, "quota_creations_per_s", range(1, 2))
    assert not TimeoutJob.objects.filter(biz_id="late").exists() and _indexed() == 4
    # Another account has a bucket of its own.
    other, other_client = _client()
    timeout_topic_save(topic=TimeoutTopic(name="other.close"), type="log", owner_user=other)
    elsewhere = _send(
        other_client,
        django_capture_on_commit_callbacks,
        CREATE,
        {**_job("x"), "topic": "other.close"},
    )
    assert elsewhere.status_code == 201
    # A quarter of a second drains one creation.
    clock.ms += 250
    assert (
        _send(client, django_capture_on_commit_callbacks, CREATE, _job("late")).status_code == 201
    )
    # One key per owner, in Redis, with its own hash tag; it expires once drained.
    bucket = keys.quota_bucket(str(user.pk))
    assert bucket == f"{redis_prefix}:quota:{{{user.pk}}}"
    assert connection.client().pttl(bucket) != -1  # it expires
    assert connection.client().pttl(bucket) <= 2000


def test_a_bulk_larger_than_a_second_passes_an_empty_bucket_then_the_owner_waits(
    tenant, reminder_settings, django_capture_on_commit_callbacks, clock
):
    reminder_settings.change(quota_creations_per_s=3)
    _, client = tenant
    big = _send(
        client, django_capture_on_commit_callbacks, BULK, {"jobs": [_job(str(n)) for n in range(9)]}
    )
    assert big.status_code == 201 and big.json()["created"] == 9

    clock.ms += 1000  # 6 still to drain: 2 seconds' worth
    refused = _send(
        client, django_capture_on_commit_callbacks, BULK, {"jobs": [_job("x"), _job("y")]}
    )
    _assert_quota_429(refused, "quota_creations_per_s", range(2, 3))
    assert TimeoutJob.objects.count() == 9

    clock.ms += 2000
    passed = _send(
        client, django_capture_on_commit_callbacks, BULK, {"jobs": [_job("x"), _job("y")]}
    )
    assert passed.status_code == 201


def test_staff_and_code_are_not_bounded(
    reminder_settings, django_capture_on_commit_callbacks, clock
):
    reminder_settings.change(quota_creations_per_s=1, quota_pending_per_topic=1)
    _, staff = _client(staff=True)
    timeout_topic_save(topic=TimeoutTopic(name=TOPIC), type="log", slots=SLOTS)
    made = _send(
        staff, django_capture_on_commit_callbacks, BULK, {"jobs": [_job(str(n)) for n in range(5)]}
    )
    assert made.status_code == 201 and made.json()["created"] == 5
    assert _send(staff, django_capture_on_commit_callbacks, CREATE, _job("6")).status_code == 201


# --- attribute size -------------------------------------------------------------------------------


def test_an_attribute_over_the_accounts_size_is_a_400_that_creates_nothing(
    tenant, reminder_settings, django_capture_on_commit_callbacks, clock
):
    reminder_settings.change(quota_attribute_bytes=100)
    _, client = tenant
    large = {"note": "x" * 120}

    single = _send(client, django_capture_on_commit_callbacks, CREATE, _job("1", attribute=large))
    bulk = _send(
        client,
        django_capture_on_commit_callbacks,
        BULK,
        {"jobs": [_job("2", attribute={"ok": 1}), _job("3", attribute=large)]},
    )

    assert single.status_code == 400 and "100" in single.json()["errors"]["attribute"][0]
    assert bulk.status_code == 400 and list(bulk.json()["errors"]) == ["jobs.1.attribute"]
    assert not TimeoutJob.objects.exists() and _indexed() == 0
    fits = _send(
        client, django_capture_on_commit_callbacks, CREATE, _job("4", attribute={"note": "x" * 80})
    )
    assert fits.status_code == 201


def test_the_attribute_quota_cannot_pass_the_hard_limit(reminder_settings, settings):
    _, staff = _client(staff=True)
    hard = settings.TIMEOUT_ATTRIBUTE_MAX_BYTES
    over = staff.patch(
        "/api/ops/config/", {"reminder": {"quota_attribute_bytes": hard + 1}}, format="json"
    )
    assert over.status_code == 400 and "quota_attribute_bytes" in over.json()["errors"]["reminder"]
    at = staff.patch(
        "/api/ops/config/", {"reminder": {"quota_attribute_bytes": hard}}, format="json"
    )
    assert at.status_code == 200 and at.json()["reminder"]["quota_attribute_bytes"] == hard


# --- the engine's bucket --------------------------------------------------------------------------


def test_the_bucket_takes_all_or_nothing_and_drains_at_the_limit():
    now = 1_000_000
    assert quotas.take("7", 10, 6, now_ms=now) == (0, 6)
    assert quotas.take("7", 10, 5, now_ms=now) == (100, 6)  # one over: 100 ms at 10/s
    assert quotas.take("7", 10, 4, now_ms=now) == (0, 10)
    assert quotas.take("7", 10, 1, now_ms=now + 99) == (1, 9)
    assert quotas.take("7", 10, 1, now_ms=now + 100) == (0, 10)
    assert quotas.levels(["7", "8"], limit_per_s=10, now_ms=now + 600) == {"7": 5, "8": 0}


def test_the_pending_count_is_kept_raised_refused_and_given_back():
    assert quotas.pending_take("t.x", 5, 1, keep_ms=KEEP_MS) is None  # nothing counted yet
    assert quotas.pending_take("t.x", 5, 1, keep_ms=KEEP_MS, counted=3) == (0, 4)
    # A count another caller took meanwhile is not overwritten.
    assert quotas.pending_take("t.x", 5, 1, keep_ms=KEEP_MS, counted=0) == (0, 5)
    wait_ms, _ = quotas.pending_take("t.x", 5, 1, keep_ms=KEEP_MS)
    assert 0 < wait_ms <= KEEP_MS
    assert quotas.pending_take("t.x", 5, -2, keep_ms=KEEP_MS) == (0, 3)
    assert connection.client().get(keys.quota_pending("t.x")) == b"3"
