"""The timeout job admin writes through the services (the reproduced defect: a new action time
saved on the change page said "changed successfully", but the job fired at the old time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from couponcenter.core.redis import get_redis
from reminders.engine import keys
from reminders.models import TimeoutJob
from reminders.services import timeout_job_create
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)
TOPIC = "timeout.default"  # a `log` topic with 8 slots
WHEN = datetime(2031, 3, 1, 9, tzinfo=UTC)


@pytest.fixture
def admin() -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    return client


def _due(job: TimeoutJob) -> int | None:
    score = get_redis().zscore(keys.slot_keys(TOPIC, job.slot).store, str(job.pk))
    return None if score is None else int(score)


def _change(admin: Client, job: TimeoutJob, **fields):
    data = {"action_time_0": "2031-03-01", "action_time_1": "09:00:00", "attribute": "{}",
            **fields}  # fmt: skip
    return admin.post(reverse("admin:reminders_timeoutjob_change", args=[job.pk]), data)


def test_a_new_action_time_moves_the_job_in_redis_too(admin):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="A-1", action_time=WHEN)
    assert _due(job) == int(WHEN.timestamp() * 1000)
    response = _change(admin, job, action_time_0="2031-03-01", action_time_1="10:30:00")
    assert response.status_code == 302
    later = WHEN + timedelta(hours=1, minutes=30)
    job.refresh_from_db()
    assert job.action_time == later
    assert _due(job) == int(later.timestamp() * 1000)  # it fires at the new time


def test_engine_fields_cannot_be_edited(admin):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="A-2", action_time=WHEN)
    _change(admin, job, slot="999", status="2", attempts="7", biz_id="other")
    job.refresh_from_db()
    assert (job.slot < 8, job.status, job.attempts, job.biz_id) == (
        True, TimeoutJob.Status.PENDING, 0, "A-2",
    )  # fmt: skip


def test_a_fired_job_keeps_its_time(admin):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="A-3", action_time=WHEN)
    TimeoutJob.objects.filter(pk=job.pk).update(status=TimeoutJob.Status.PROCESSED)
    _change(admin, job, action_time_1="11:00:00")
    job.refresh_from_db()
    assert job.action_time == WHEN


def test_adding_a_job_indexes_it(admin):
    data = {"topic": TOPIC, "biz_type": "order", "biz_id": "A-4", "action_time_0": "2031-03-01",
            "action_time_1": "09:00:00", "attribute": "{}"}  # fmt: skip
    response = admin.post(reverse("admin:reminders_timeoutjob_add"), data)
    assert response.status_code == 302
    job = TimeoutJob.objects.get(biz_id="A-4")
    assert _due(job) == int(WHEN.timestamp() * 1000)
    bad = admin.post(reverse("admin:reminders_timeoutjob_add"), {**data, "topic": "nope"})
    assert bad.status_code == 200 and "Unknown topic" in bad.content.decode()
    assert TimeoutJob.objects.count() == 1


def test_the_cancel_action_cancels_through_the_service(admin):
    jobs = [timeout_job_create(topic=TOPIC, biz_type="order", biz_id=f"C-{i}", action_time=WHEN)
            for i in range(3)]  # fmt: skip
    TimeoutJob.objects.filter(pk=jobs[2].pk).update(status=TimeoutJob.Status.RUNNING)
    response = admin.post(
        reverse("admin:reminders_timeoutjob_changelist"),
        {"action": "cancel_jobs", "_selected_action": [j.pk for j in jobs]},
    )
    assert response.status_code == 302
    statuses = [TimeoutJob.objects.get(pk=j.pk).status for j in jobs]
    assert statuses == [TimeoutJob.Status.CANCELLED, TimeoutJob.Status.CANCELLED,
                        TimeoutJob.Status.RUNNING]  # fmt: skip
    assert _due(jobs[0]) is None and _due(jobs[2]) is not None
