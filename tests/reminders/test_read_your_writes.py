"""Read your own writes in one process: every write of the reminders' live configuration (the
settings row, the timeout topics, their owners) moves one change marker in its own transaction,
and a request checks that marker once, after it began, before it validates anything against the
configuration it keeps. Against several real processes: tests/e2e/test_read_your_writes.py.

"Another process" here is a write committed without this process's caches being told: the rows
and the marker, as any process's write commits them.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.models import ReminderSettings, TimeoutJob, TimeoutTopic
from reminders.services import timeout_topic_delete, timeout_topic_save
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db
TIMEOUTS = "/api/timeouts/"


@pytest.fixture
def staff() -> APIClient:
    _, token = api_user(staff=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _marker() -> tuple:
    return ReminderSettings.objects.values_list("pk", "version", "updated_at").get()


def _job(topic: str, biz_id: str) -> dict:
    at = timezone.now() + timedelta(hours=1)
    return {"topic": topic, "biz_type": "order", "biz_id": biz_id, "action_time": at.isoformat()}


def _committed_elsewhere(write) -> None:
    """``write()`` and the marker's move in one transaction, as another process commits them."""
    with transaction.atomic():
        write()
        ReminderSettings.objects.update(version=F("version") + 1, updated_at=timezone.now())


def test_each_write_of_a_topic_moves_the_marker_in_its_own_transaction(reminder_settings):
    seen = [_marker()]
    topic = timeout_topic_save(topic=TimeoutTopic(name="m.t"), type="log")
    seen.append(_marker())
    timeout_topic_save(topic=topic, concurrency=2)
    seen.append(_marker())
    timeout_topic_save(topic=topic, paused=True)
    seen.append(_marker())
    timeout_topic_delete(topic=topic)
    seen.append(_marker())
    assert len(set(seen)) == len(seen), seen  # every write moved it

    with pytest.raises(RuntimeError), transaction.atomic():  # a write that rolls back
        timeout_topic_save(topic=TimeoutTopic(name="m.undone"), type="log")
        raise RuntimeError
    assert _marker() == seen[-1]


def test_a_topic_committed_elsewhere_is_usable_by_the_next_request(staff, reminder_settings):
    assert staff.get(TIMEOUTS, {"topic": "m.new"}).status_code == 400  # kept: no such topic
    _committed_elsewhere(lambda: TimeoutTopic.objects.create(name="m.new", type="log"))

    created = staff.post(TIMEOUTS, _job("m.new", "1"), format="json")
    assert created.status_code == 201, created.content
    bulk = staff.post(f"{TIMEOUTS}bulk/", {"jobs": [_job("m.new", "2")]}, format="json")
    assert bulk.status_code == 201, bulk.content


def test_a_topic_deleted_elsewhere_is_refused_by_the_next_request(staff, reminder_settings):
    timeout_topic_save(topic=TimeoutTopic(name="m.gone"), type="log")
    assert staff.get(TIMEOUTS, {"topic": "m.gone"}).status_code == 200  # kept: it exists
    _committed_elsewhere(lambda: TimeoutTopic.objects.filter(name="m.gone").delete())

    refused = staff.post(TIMEOUTS, _job("m.gone", "1"), format="json")
    assert refused.status_code == 400 and "Unknown topic" in str(refused.json())
    assert not TimeoutJob.objects.filter(topic="m.gone").exists()


def test_a_request_checks_the_marker_once_and_reads_no_topic_again(staff, reminder_settings):
    timeout_topic_save(topic=TimeoutTopic(name="m.hot"), type="log")
    assert staff.post(TIMEOUTS, _job("m.hot", "warm"), format="json").status_code == 201

    for path, body in [
        (TIMEOUTS, _job("m.hot", "1")),
        (f"{TIMEOUTS}bulk/", {"jobs": [_job("m.hot", "2")]}),
    ]:
        with CaptureQueriesContext(connection) as queries:
            assert staff.post(path, body, format="json").status_code == 201
        config = [q["sql"] for q in queries if "reminders_remindersettings" in q["sql"]]
        topics = [q["sql"] for q in queries if "reminders_timeouttopic" in q["sql"]]
        assert len(config) == 1 and '"version"' in config[0], config
        assert topics == []


def test_topics_follow_the_marker_while_the_settings_row_is_refused(staff, reminder_settings):
    # A settings row written invalid behind the services' back is skipped (the last good one is
    # kept), but its marker still moves with every write, and the topics with it.
    ReminderSettings.objects.update(slots=3, version=F("version") + 1, updated_at=timezone.now())
    assert staff.get(TIMEOUTS, {"topic": "m.late"}).status_code == 400  # kept: no such topic
    _committed_elsewhere(lambda: TimeoutTopic.objects.create(name="m.late", type="log"))

    created = staff.post(TIMEOUTS, _job("m.late", "1"), format="json")
    assert created.status_code == 201, created.content
