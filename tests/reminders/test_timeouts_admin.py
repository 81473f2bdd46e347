"""The timeout job admin writes through the services (the reproduced defect: a new action time
saved on the change page said "changed successfully", but the job fired at the old time)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from reminders.engine import queue
from reminders.models import TimeoutJob
from reminders.services import timeout_job_create
from tests.support.console import kill_timeout_jobs
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
    where = queue.place(TOPIC, job.slot, str(job.pk))
    return where.at_ms if where.where == "scheduled" else None


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
    form = {"action": "cancel_jobs", "_selected_action": [j.pk for j in jobs]}
    url = reverse("admin:reminders_timeoutjob_changelist")
    confirm = admin.post(url, form)  # first the confirmation page: nothing changes yet
    assert confirm.status_code == 200
    assert 'id="tj-confirm-count">3<' in confirm.content.decode()
    assert TimeoutJob.objects.filter(status=TimeoutJob.Status.PENDING).count() == 2
    response = admin.post(url, {**form, "post": "yes"})
    assert response.status_code == 302
    statuses = [TimeoutJob.objects.get(pk=j.pk).status for j in jobs]
    assert statuses == [TimeoutJob.Status.CANCELLED, TimeoutJob.Status.CANCELLED,
                        TimeoutJob.Status.RUNNING]  # fmt: skip
    assert _due(jobs[0]) is None and _due(jobs[2]) is not None


def test_the_job_page_shows_its_place_in_redis_and_its_attempts(admin):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="D-1", action_time=WHEN)
    url = reverse("admin:reminders_timeoutjob_change", args=[job.pk])
    page = admin.get(url).content.decode()
    assert '<span id="tj-place">scheduled</span>' in page and "2031-03-01 09:00:00" in page
    assert "none settled yet" in page
    TimeoutJob.objects.filter(pk=job.pk).update(history=[
        {"attempt": 1, "at": "2031-03-01T09:00:01+00:00", "outcome": "failed", "error": "HTTP 503"}
    ])  # fmt: skip
    queue.cancel(TOPIC, str(job.pk), slot=job.slot)
    page = admin.get(url).content.decode()
    assert 'id="tj-history"' in page and "HTTP 503" in page and "failed" in page
    assert "absent from timeout.default" in page


def test_the_console_counts_what_is_due_in_the_next_hour(admin):
    soon = datetime.now(UTC) + timedelta(minutes=15)
    for i in range(3):
        timeout_job_create(topic=TOPIC, biz_type="order", biz_id=f"S-{i}", action_time=soon)
    timeout_job_create(topic=TOPIC, biz_type="order", biz_id="L-1",
                       action_time=soon + timedelta(hours=2))  # fmt: skip
    page = admin.get("/admin/console/?partial=1").content.decode()
    row = page.split(f'<tr data-topic="{TOPIC}"><td>{TOPIC}</td>', 1)[1].split("</tr>", 1)[0]
    cells = [c.split("</td>")[0] for c in row.split("<td>")[1:]]
    assert cells[:6] == ["0", "3", "0", "0", "0", "0"], cells  # the 10-20 min window
    assert "<strong>3</strong>" in row


# --- the job page: read-only history, its own buttons --------------------------------------------


def test_a_finished_job_page_is_read_only_with_plain_labels(admin):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="R-1", action_time=WHEN)
    TimeoutJob.objects.filter(pk=job.pk).update(status=TimeoutJob.Status.PROCESSED)
    page = admin.get(reverse("admin:reminders_timeoutjob_change", args=[job.pk])).content.decode()
    for offered in ('name="_save"', 'name="_addanother"', 'name="_continue"', "deletelink"):
        assert offered not in page
    assert "Gmt create" not in page and "Gmt modified" not in page
    assert "Created" in page and "Last changed" in page
    assert 'id="tj-cancel"' not in page and 'id="tj-requeue"' not in page


def test_a_pending_job_can_be_moved_and_cancelled_from_its_page(admin):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="R-2", action_time=WHEN)
    url = reverse("admin:reminders_timeoutjob_change", args=[job.pk])
    page = admin.get(url).content.decode()
    assert 'name="_save"' in page and 'name="_addanother"' not in page
    assert "deletelink" not in page and 'id="tj-requeue"' not in page
    assert 'id="tj-cancel"' in page
    assert admin.get(reverse("admin:reminders_timeoutjob_cancel", args=[job.pk])).status_code == 403
    response = admin.post(reverse("admin:reminders_timeoutjob_cancel", args=[job.pk]))
    assert response.status_code == 302 and response["Location"] == url
    job.refresh_from_db()
    assert job.status == TimeoutJob.Status.CANCELLED and _due(job) is None


def test_a_dead_job_is_requeued_from_its_page(admin):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="R-3", action_time=WHEN)
    kill_timeout_jobs([job], error="HTTP 503")
    url = reverse("admin:reminders_timeoutjob_change", args=[job.pk])
    page = admin.get(url).content.decode()
    assert 'id="tj-requeue"' in page and 'id="tj-cancel"' not in page
    assert '<span id="tj-error">HTTP 503</span>' in page  # current: the job is dead of it
    admin.post(reverse("admin:reminders_timeoutjob_requeue", args=[job.pk]))
    job.refresh_from_db()
    assert job.status == TimeoutJob.Status.PENDING
    assert queue.place(TOPIC, job.slot, str(job.pk)).where == "scheduled"


def test_an_error_before_a_success_reads_as_history(admin):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="R-4", action_time=WHEN)
    TimeoutJob.objects.filter(pk=job.pk).update(
        status=TimeoutJob.Status.PROCESSED, attempts=2, last_error="HTTP 503"
    )
    page = admin.get(reverse("admin:reminders_timeoutjob_change", args=[job.pk])).content.decode()
    assert "none now (processed); before that: HTTP 503" in page
    listing = admin.get(reverse("admin:reminders_timeoutjob_changelist")).content.decode()
    assert '<span class="tj-earlier">earlier: HTTP 503</span>' in listing
