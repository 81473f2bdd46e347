"""Staff end a job stuck ``running`` (its worker stalled or died mid-firing), which a cancel
refuses: from the API and from the admin, with the reason kept in the job's history. Real
database, real Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import queue, topic_model
from reminders.engine.scripts import Claimed
from reminders.handlers import timeout_jobs
from reminders.handlers.timeout_jobs import Fired
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.selectors.timeout_topics import timeout_topic_spec
from reminders.services import timeout_job_create, timeout_topic_save
from reminders.services.firing import timeout_jobs_take_rows
from tests.support.factories import UserFactory, api_user

pytestmark = pytest.mark.django_db
Status = TimeoutJob.Status
TOPIC = "t.stuck"


@pytest.fixture(autouse=True)
def topic():
    row = timeout_topic_save(topic=TimeoutTopic(name=TOPIC), type="log", slots=1)
    yield row
    topic_model.unregister_topic(TOPIC)


def _running(capture, biz_id: str = "o1", **fields) -> TimeoutJob:
    """A job a worker took (pending to running) and never settled."""
    with capture(execute=True):
        job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id=biz_id,
                                 action_time=timezone.now() + timedelta(minutes=2),
                                 **fields)  # fmt: skip
    [taken], _ = timeout_jobs_take_rows({job.pk: Claimed(str(job.pk), 0, 1)})
    assert TimeoutJob.objects.get(pk=job.pk).status == Status.RUNNING
    return taken


def _client(**kw) -> tuple[APIClient, object]:
    user, token = api_user(**kw)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client, user


def test_staff_end_a_running_job_that_a_cancel_refuses(django_capture_on_commit_callbacks):
    taken = _running(django_capture_on_commit_callbacks, recurrence="0 * * * *")
    staff, user = _client(staff=True)
    refused = staff.delete(f"/api/timeouts/{taken.pk}/")
    assert refused.status_code == 409 and refused.json()["code"] == "not_pending"
    with django_capture_on_commit_callbacks(execute=True):
        ended = staff.post(f"/api/timeouts/{taken.pk}/end/",
                           {"reason": "its receiver\nis gone"}, format="json")  # fmt: skip
    assert ended.status_code == 200, ended.content
    assert ended.json()["status"] == "cancelled"
    job = TimeoutJob.objects.get(pk=taken.pk)
    assert job.last_error == f"ended by {user.username}: its receiver is gone"
    assert job.history[-1]["outcome"] == "ended" and job.history[-1]["attempt"] == 1
    assert queue.stats(TOPIC, [0], now_ms=0)[0].store == 0  # out of the schedule
    # The worker that took it comes back and settles: nothing moves, no next occurrence.
    with django_capture_on_commit_callbacks(execute=True):
        late = timeout_jobs.settle_fired(timeout_topic_spec(TOPIC),
                                         [Fired(0, taken, 1, None, 0)])  # fmt: skip
    assert late["acked"] == 0
    assert list(TimeoutJob.objects.values_list("status", flat=True)) == [Status.CANCELLED]
    again = staff.post(f"/api/timeouts/{taken.pk}/end/", {"reason": "twice"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "not_live"


def test_ending_a_job_needs_a_reason_staff_and_the_change_permission(
    django_capture_on_commit_callbacks,
):
    taken = _running(django_capture_on_commit_callbacks)
    url = f"/api/timeouts/{taken.pk}/end/"
    staff, _ = _client(staff=True)
    assert staff.post(url, {"reason": "  "}, format="json").status_code == 400
    assert staff.post(url, {}, format="json").status_code == 400
    viewer, _ = _client(staff=True, staff_perms="view")
    assert viewer.post(url, {"reason": "no"}, format="json").status_code == 403
    tenant, _ = _client(perms=["reminders.manage_timeouts"])
    assert tenant.post(url, {"reason": "no"}, format="json").status_code == 403
    assert (
        staff.post("/api/timeouts/999999/end/", {"reason": "x"}, format="json").status_code == 404
    )
    assert TimeoutJob.objects.get(pk=taken.pk).status == Status.RUNNING


def test_the_admin_ends_stuck_jobs_with_a_reason(django_capture_on_commit_callbacks):
    taken = _running(django_capture_on_commit_callbacks)
    client = Client()
    user = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(user)
    url = "/admin/reminders/timeoutjob/"
    asked = client.post(url, {"action": "end_jobs", "_selected_action": [taken.pk]})
    assert asked.status_code == 200 and 'name="reason"' in asked.content.decode()
    empty = client.post(url, {"action": "end_jobs", "_selected_action": [taken.pk],
                              "post": "yes", "reason": " "})  # fmt: skip
    assert 'id="tj-reason-missing"' in empty.content.decode()
    assert TimeoutJob.objects.get(pk=taken.pk).status == Status.RUNNING
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(url, {"action": "end_jobs", "_selected_action": [taken.pk],
                                 "post": "yes", "reason": "worker died mid-call"})  # fmt: skip
    assert done.status_code == 302
    job = TimeoutJob.objects.get(pk=taken.pk)
    assert job.status == Status.CANCELLED
    assert job.last_error == f"ended by {user.username}: worker died mid-call"
    viewer = UserFactory(is_staff=True)
    viewer.user_permissions.add(*_perms("view_timeoutjob"))
    client.force_login(viewer)
    page = client.get(url)
    assert page.status_code == 200 and "end_jobs" not in page.content.decode()


def _perms(*codenames):
    from django.contrib.auth.models import Permission

    return Permission.objects.filter(content_type__app_label="reminders", codename__in=codenames)
