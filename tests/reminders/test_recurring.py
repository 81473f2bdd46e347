"""Recurring timeout jobs (``reminders.recurrence``): the next occurrence is created in the
transaction that records the firing, indexed once it commits, and only by the worker whose take
the row records; rules are validated on the way in. Real database, real Redis, inline executors.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import queue, topic_model
from reminders.engine.clock import epoch_ms
from reminders.engine.scripts import Claimed
from reminders.handlers import timeout_jobs
from reminders.handlers.timeout_jobs import Fired
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.runtime.worker import build_worker
from reminders.selectors.timeout_topics import timeout_topic_spec
from reminders.services import timeout_job_create, timeout_topic_save
from reminders.services.firing import timeout_jobs_take_rows
from tests.support.factories import UserFactory, api_user

pytestmark = pytest.mark.django_db
Status = TimeoutJob.Status
TOPIC = "t.recurring"


@pytest.fixture(autouse=True)
def topic():
    row = timeout_topic_save(topic=TimeoutTopic(name=TOPIC), type="log", slots=2)
    yield row
    topic_model.unregister_topic(TOPIC)


def _series(capture, rule: str, *, start: datetime | None = None) -> TimeoutJob:
    start = start or timezone.now() + timedelta(hours=1)
    with capture(execute=True):
        return timeout_job_create(topic=TOPIC, biz_type="report", biz_id="r1",
                                  action_time=start, recurrence=rule)  # fmt: skip


def _rows():
    return list(TimeoutJob.objects.filter(topic=TOPIC).order_by("action_time"))


def _fire_pending(capture) -> dict[str, int]:
    """Take the series' pending job as a worker does and settle it as fired (its due time
    need not have come: the next occurrence follows the one that fired)."""
    job = TimeoutJob.objects.get(topic=TOPIC, status=Status.PENDING)
    spec = timeout_topic_spec(TOPIC)
    [taken], _ = timeout_jobs_take_rows({job.pk: Claimed(str(job.pk), 0, 1)})
    with capture(execute=True):
        return timeout_jobs.settle_fired(spec, [Fired(job.slot, taken, 1, None, 0)])


def test_each_firing_creates_the_next_occurrence_until_the_rule_ends(
    django_capture_on_commit_callbacks,
):
    first = _series(django_capture_on_commit_callbacks, "FREQ=MINUTELY;COUNT=5")
    for _ in range(5):
        assert _fire_pending(django_capture_on_commit_callbacks)["acked"] == 1
    rows = _rows()
    # An RRULE counts in whole seconds: the occurrences after the first fall on them.
    whole = first.action_time.replace(microsecond=0)
    assert [r.action_time for r in rows] == [first.action_time] + [
        whole + timedelta(minutes=n) for n in range(1, 5)
    ]
    assert {r.status for r in rows} == {Status.PROCESSED}
    assert {r.series_start for r in rows} == {first.action_time}
    assert {r.recurrence for r in rows} == {"FREQ=MINUTELY;COUNT=5"}


def test_the_worker_fires_an_occurrence_and_indexes_the_next(django_capture_on_commit_callbacks):
    start = timezone.now() + timedelta(seconds=1)
    _series(django_capture_on_commit_callbacks, "0 * * * *", start=start)  # hourly, cron
    clock = lambda: epoch_ms(start) + 10  # noqa: E731 - the worker's clock, past its due
    worker = build_worker([TOPIC], clock=clock)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            worker.run_until_idle()
    finally:
        worker.shutdown()
    fired, successor = _rows()
    assert fired.status == Status.PROCESSED and successor.status == Status.PENDING
    assert successor.action_time == (start + timedelta(hours=1)).replace(
        minute=0, second=0, microsecond=0
    )
    assert queue.stats(TOPIC, [successor.slot], now_ms=0)[0].store == 1


def test_a_stale_settlement_creates_no_second_successor(django_capture_on_commit_callbacks):
    # The first worker fires occurrence 1 but stalls before recording it; another takes the
    # job over (attempt 2), fires and records it, creating occurrence 2. The stalled worker then
    # settles: the row says attempt 2, so nothing moves and no other successor is made.
    job = _series(django_capture_on_commit_callbacks, "FREQ=MINUTELY;COUNT=3")
    spec = timeout_topic_spec(TOPIC)
    [mine], _ = timeout_jobs_take_rows({job.pk: Claimed(str(job.pk), 0, 1)})
    [theirs], _ = timeout_jobs_take_rows({job.pk: Claimed(str(job.pk), 0, 2, suspect=True)})
    with django_capture_on_commit_callbacks(execute=True):
        late = timeout_jobs.settle_fired(spec, [Fired(job.slot, theirs, 2, None, 0)])
        stale = timeout_jobs.settle_fired(spec, [Fired(job.slot, mine, 1, None, 0)])
    assert late["acked"] == 1 and stale["acked"] == 0
    rows = _rows()
    assert len(rows) == 2 and rows[0].attempts == 2
    assert rows[1].action_time == job.action_time.replace(microsecond=0) + timedelta(minutes=1)


def test_a_dead_occurrence_still_continues_the_series(django_capture_on_commit_callbacks):
    job = _series(django_capture_on_commit_callbacks, "FREQ=HOURLY;COUNT=2")
    spec = timeout_topic_spec(TOPIC)
    [taken], _ = timeout_jobs_take_rows({job.pk: Claimed(str(job.pk), 0, spec.max_attempts)})
    with django_capture_on_commit_callbacks(execute=True):
        counts = timeout_jobs.settle_fired(
            spec, [Fired(job.slot, taken, spec.max_attempts, "boom", 0)]
        )
    assert counts["dead"] == 1
    dead, successor = _rows()
    assert (dead.status, successor.status) == (Status.DEAD, Status.PENDING)


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ("FREQ=FORTNIGHTLY", "not a valid RRULE"),
        ("DTSTART:20200101T000000Z\nRRULE:FREQ=DAILY", "cron expression of 5 fields"),
        ("FREQ=DAILY;DTSTART=20200101", "without DTSTART"),
        ("61 * * * *", "not a valid cron expression"),
        ("every day", "cron expression of 5 fields"),
    ],
)
def test_a_bad_rule_is_a_400_and_creates_nothing(rule, words):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_user(staff=True)[1]}")
    body = {"topic": TOPIC, "biz_type": "report", "biz_id": "x", "recurrence": rule,
            "action_time": datetime(2031, 1, 1, tzinfo=UTC).isoformat()}  # fmt: skip
    response = client.post("/api/timeouts/", body, format="json")
    assert response.status_code == 400
    assert words in " ".join(response.json()["errors"]["recurrence"])
    bulk = client.post("/api/timeouts/bulk/", {"jobs": [body]}, format="json")
    assert bulk.status_code == 400 and "jobs.0.recurrence" in bulk.json()["errors"]
    assert not TimeoutJob.objects.exists()


def test_the_api_creates_and_shows_a_recurring_job():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_user(staff=True)[1]}")
    body = {"topic": TOPIC, "biz_type": "store", "biz_id": "42", "recurrence": "FREQ=DAILY",
            "action_time": "2031-01-01T09:00:00Z"}  # fmt: skip
    created = client.post("/api/timeouts/", body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["recurrence"] == "FREQ=DAILY"
    assert created.json()["series_start"] == "2031-01-01T09:00:00Z"


def test_the_admin_finds_jobs_by_business_key_and_requeues_dead_ones(
    django_capture_on_commit_callbacks, settings
):
    settings.TIMEOUT_CALLABLE_TARGETS = ["tests.reminders.test_timeouts_handlers.record_call"]
    failing = timeout_topic_save(
        topic=TimeoutTopic(name="t.failing"), type="callable", max_attempts=1,
        target="tests.reminders.test_timeouts_handlers.record_call",
    )  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        job = timeout_job_create(topic=failing.name, biz_type="report", biz_id="r9",
                                 action_time=timezone.now(), attribute={"fail": True})  # fmt: skip
    worker = build_worker([failing.name])
    try:
        assert worker.run_until_idle().dead == 1
    finally:
        worker.shutdown()
        topic_model.unregister_topic(failing.name)
    assert TimeoutJob.objects.get(pk=job.pk).status == Status.DEAD
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    found = client.get("/admin/reminders/timeoutjob/", {"q": "report:r9"})
    assert found.status_code == 200 and f">{job.pk}<" in found.content.decode()
    none = client.get("/admin/reminders/timeoutjob/", {"q": "report:nope"})
    assert f">{job.pk}<" not in none.content.decode()
    error = TimeoutJob.objects.get(pk=job.pk).last_error[:12]
    by_error = client.get("/admin/reminders/timeoutjob/", {"q": f"error:{error}"})
    assert f">{job.pk}<" in by_error.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        form = {"action": "requeue_dead_jobs", "_selected_action": [job.pk], "post": "yes"}
        done = client.post("/admin/reminders/timeoutjob/", form)
    assert done.status_code == 302
    assert TimeoutJob.objects.get(pk=job.pk).status == Status.PENDING
    stats = queue.stats(failing.name, [job.slot], now_ms=0)[0]
    assert (stats.store, stats.dead) == (1, 0)
