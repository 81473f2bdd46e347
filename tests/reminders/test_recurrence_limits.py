"""A tenant's recurrence rule must never stop the timeout center (``reminders.recurrence``):
rules that never end, come too often or cost too much are refused when the job is created; a
back-dated series does not replay its past; a rule evaluated when a job fires runs in a child
process under a hard budget, outside any transaction, and one that runs past it ends its series
(the job marked, an alert raised) while the worker goes on. Real database, real Redis.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import pytest
from dateutil.rrule import rrulestr
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import topic_model
from reminders.engine.scripts import Claimed
from reminders.handlers import timeout_jobs
from reminders.handlers.timeout_jobs import Fired
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.recurrence import budget, rules, vetting
from reminders.runtime.worker import build_worker
from reminders.selectors.timeout_topics import timeout_topic_spec
from reminders.services import timeout_job_create, timeout_topic_save
from reminders.services.firing import timeout_jobs_take_rows
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db
Status = TimeoutJob.Status
TOPIC = "t.rules"


@pytest.fixture(autouse=True)
def topic():
    row = timeout_topic_save(topic=TimeoutTopic(name=TOPIC), type="log", slots=2)
    yield row
    topic_model.unregister_topic(TOPIC)


@pytest.fixture
def staff_client():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_user(staff=True)[1]}")
    return client


def _body(rule: str, *, at: datetime | None = None, biz_id: str = "x") -> dict:
    at = at or timezone.now() + timedelta(days=1)
    return {"topic": TOPIC, "biz_type": "report", "biz_id": biz_id, "recurrence": rule,
            "action_time": at.isoformat()}  # fmt: skip


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ("FREQ=DAILY;INTERVAL=0", "INTERVAL must be 1 or more"),
        ("FREQ=SECONDLY", "may come 1 s apart"),
        ("FREQ=MINUTELY;BYSECOND=0,30", "may come 30 s apart"),
        ("FREQ=DAILY;BYHOUR=9;BYSECOND=0,59", "may come 1 s apart; at least 60 s"),
        ("FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=30", "cannot pick days"),
        ("FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=30", "cannot be found within"),
        ("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "cannot be found within"),
        ("FREQ=DAILY;INTERVAL=7;BYDAY=MO", "cannot be found within"),  # never on a Monday
        ("FREQ=DAILY;UNTIL=20200101T000000Z", "UNTIL is past"),
        ("FREQ=DAILY;COUNT=1", "no occurrence after action_time"),
        ("FREQ=MINUTELY;COUNT=100000000", "cannot be found within"),
    ],
)
def test_a_rule_that_never_ends_comes_too_often_or_costs_too_much_is_refused(
    staff_client, rule, words
):
    # A first-use trial posted FREQ=DAILY;INTERVAL=0 and got 201; its first firing spun a core
    # forever with the row locked.
    # From a Tuesday, whatever today is: from a Monday, 7 days apart on Mondays is every Monday.
    at = timezone.now() + timedelta(days=1)
    at += timedelta(days=(1 - at.weekday()) % 7)
    response = staff_client.post("/api/timeouts/", _body(rule, at=at), format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["errors"]["recurrence"])
    bulk = staff_client.post("/api/timeouts/bulk/", {"jobs": [_body(rule, at=at)]}, format="json")
    assert bulk.status_code == 400, bulk.content
    assert not TimeoutJob.objects.exists()


def test_the_minimum_interval_is_a_setting_checked_on_the_rule(staff_client, settings):
    settings.RECURRENCE_MIN_INTERVAL_S = 3600
    refused = staff_client.post("/api/timeouts/", _body("*/30 * * * *"), format="json")
    assert refused.status_code == 400
    assert "may come 30 min apart; at least 60 min" in refused.json()["errors"]["recurrence"][0]
    # Every hour, but twice at 9: 9:00 and 9:30 are 30 minutes apart.
    twice = staff_client.post("/api/timeouts/", _body("0,30 9 * * *"), format="json")
    assert twice.status_code == 400
    ok = staff_client.post("/api/timeouts/", _body("0 * * * *", biz_id="h"), format="json")
    assert ok.status_code == 201, ok.content
    settings.RECURRENCE_MIN_INTERVAL_S = 1
    every_second = staff_client.post("/api/timeouts/", _body("FREQ=SECONDLY", biz_id="s"),
                                     format="json")  # fmt: skip
    assert every_second.status_code == 201, every_second.content


def test_a_bulk_request_carries_a_bounded_number_of_distinct_rules(staff_client):
    jobs = [_body(f"FREQ=DAILY;BYHOUR={h % 24};BYMINUTE={h // 24}", biz_id=str(h))
            for h in range(vetting.BULK_MAX_RULES + 1)]  # fmt: skip
    response = staff_client.post("/api/timeouts/bulk/", {"jobs": jobs}, format="json")
    assert response.status_code == 400
    assert "distinct recurrence rules" in str(response.json())
    assert not TimeoutJob.objects.exists()


def test_a_back_dated_series_starts_at_its_next_occurrence_from_now(staff_client):
    # Ten months back, every minute: it used to replay 400,000 occurrences, one a second.
    start = (timezone.now() - timedelta(days=300)).replace(second=0, microsecond=0)
    before = timezone.now()
    created = staff_client.post("/api/timeouts/", _body("* * * * *", at=start), format="json")
    assert created.status_code == 201, created.content
    job = TimeoutJob.objects.get()
    assert before < job.action_time <= before + timedelta(minutes=1)
    assert job.action_time.second == 0 and job.series_start == start
    bulk = staff_client.post(
        "/api/timeouts/bulk/", {"jobs": [_body("FREQ=HOURLY", at=start, biz_id="b")]},
        format="json",
    )  # fmt: skip
    assert bulk.status_code == 201, bulk.content
    hourly = TimeoutJob.objects.get(biz_id="b")
    assert before < hourly.action_time <= before + timedelta(hours=1)
    assert hourly.series_start == start and hourly.action_time.minute == start.minute


def test_an_occurrence_that_fired_late_is_followed_by_the_next_from_now(
    django_capture_on_commit_callbacks,
):
    # The worker was down for three hours: the overdue occurrence fires once, and the series
    # goes on from now instead of firing the 179 it missed one after another.
    with django_capture_on_commit_callbacks(execute=True):
        job = timeout_job_create(topic=TOPIC, biz_type="report", biz_id="late",
                                 action_time=timezone.now() + timedelta(minutes=5),
                                 recurrence="FREQ=MINUTELY")  # fmt: skip
    late = job.action_time - timedelta(hours=3)
    TimeoutJob.objects.filter(pk=job.pk).update(action_time=late, series_start=late)
    job.refresh_from_db()
    [taken], _ = timeout_jobs_take_rows({job.pk: Claimed(str(job.pk), 0, 1)})
    before = timezone.now()
    with django_capture_on_commit_callbacks(execute=True):
        timeout_jobs.settle_fired(timeout_topic_spec(TOPIC), [Fired(job.slot, taken, 1, None, 0)])
    successor = TimeoutJob.objects.get(status=Status.PENDING)
    assert before < successor.action_time <= before + timedelta(minutes=1)
    assert successor.series_start == late
    assert (successor.action_time - late.replace(microsecond=0)).total_seconds() % 60 == 0


@pytest.mark.timeout(120)  # before the budget, the first of these firings never returned
def test_a_rule_past_its_budget_ends_its_series_and_the_worker_goes_on(
    django_capture_on_commit_callbacks, monkeypatch, caplog
):
    # Rows from before rules were checked: INTERVAL=0 made dateutil loop forever, and a
    # minutely rule for a day that never comes walks minute by minute to the year 9999.
    bad = {"FREQ=DAILY;INTERVAL=0": "series ended: its recurrence no longer parses",
           "FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=30":
               "series ended: its next occurrence was not found within 250 ms"}  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        jobs = {rule: timeout_job_create(topic=TOPIC, biz_type="report", biz_id=rule,
                                         action_time=timezone.now()) for rule in bad}  # fmt: skip
        good = timeout_job_create(topic=TOPIC, biz_type="report", biz_id="good",
                                  action_time=timezone.now(), recurrence="0 * * * *")  # fmt: skip
    for rule, job in jobs.items():
        TimeoutJob.objects.filter(pk=job.pk).update(recurrence=rule, series_start=job.action_time)
    depth = []  # transactions open around each evaluation, beyond the test's own
    evaluate = budget.Calculator.next_after
    outside = len(connection.atomic_blocks)

    def recording(self, *args):
        depth.append(len(connection.atomic_blocks) - outside)
        return evaluate(self, *args)

    monkeypatch.setattr(budget.Calculator, "next_after", recording)
    caplog.set_level(logging.ERROR, logger="reminders.alerts")
    worker = build_worker([TOPIC])
    try:
        with django_capture_on_commit_callbacks(execute=True):
            report = worker.run_until_idle()
    finally:
        worker.shutdown()
    assert report.acked == 3
    for rule, job in jobs.items():
        job.refresh_from_db()
        assert job.status == Status.PROCESSED
        assert job.last_error.startswith(bad[rule]), job.last_error
        assert [e["outcome"] for e in job.history] == ["fired", "series_ended"]
        assert not TimeoutJob.objects.filter(biz_id=rule, status=Status.PENDING).exists()
    # The other series goes on, and no rule was evaluated inside a transaction.
    assert TimeoutJob.objects.filter(biz_id="good", status=Status.PENDING).count() == 1
    assert good.status == Status.PENDING
    assert depth == [0, 0, 0]
    alerts = [r for r in caplog.records if "recurring series ended" in r.getMessage()]
    assert sorted(pk for r in alerts for pk in r.jobs) == sorted(j.pk for j in jobs.values())


def test_the_next_occurrence_costs_the_same_at_any_series_age():
    # Every minute since 2000: dateutil alone walks 14 million occurrences (minutes of CPU).
    start = datetime(2000, 1, 1, 0, 0, 30, tzinfo=UTC)
    now = timezone.now()
    answer = budget.calculator().next_after("FREQ=MINUTELY", start, now)
    assert now < answer.at <= now + timedelta(minutes=1) and answer.at.second == 30
    # Moving the start by whole periods keeps every occurrence: the same answers as dateutil
    # walking from the true start, wherever that walk is cheap enough to compare.
    cases = [
        ("FREQ=DAILY;BYHOUR=9,17", timedelta(days=3000)),
        ("FREQ=WEEKLY;INTERVAL=3;BYDAY=MO,FR", timedelta(days=5000)),
        ("FREQ=MONTHLY;BYMONTHDAY=31", timedelta(days=20000)),
        ("FREQ=MONTHLY;INTERVAL=5;BYDAY=-1FR", timedelta(days=20000)),
        ("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29", timedelta(days=40000)),
        ("FREQ=YEARLY;INTERVAL=3", timedelta(days=40000)),
        ("FREQ=HOURLY;INTERVAL=7;BYMINUTE=15", timedelta(days=400)),
        ("FREQ=MINUTELY;INTERVAL=13", timedelta(days=20)),
    ]
    for rule, age in cases:
        for start in (datetime(1996, 2, 29, 7, 45, 12, tzinfo=UTC),
                      datetime(2001, 1, 31, 23, 59, 59, tzinfo=UTC)):  # fmt: skip
            for k in range(5):
                after = start + age * (k + 1) / 5
                walked = rrulestr(rule, dtstart=start).after(after)
                assert rules.next_after(rule, start, after) == walked, (rule, start, after)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)  # before, the dispatch loop waited on the row lock for good
def test_a_suspect_whose_row_is_locked_does_not_stop_the_dispatch_loop():
    job = timeout_job_create(topic=TOPIC, biz_type="report", biz_id="locked",
                             action_time=timezone.now())  # fmt: skip
    locked, release = threading.Event(), threading.Event()

    def hold_the_row():
        from django.db import connections, transaction

        with transaction.atomic(using="default"):
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1 FROM reminders_timeoutjob WHERE job_id = %s FOR UPDATE",
                               [job.pk])  # fmt: skip
            locked.set()
            release.wait(60)
        connections["default"].close()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(30)
        executors = _Executors()
        results = timeout_jobs.timeout_jobs_handle(
            TOPIC, [Claimed(str(job.pk), 0, 2, suspect=True)], job.slot, executors=executors
        )
        assert results[str(job.pk)].outcome == topic_model.Outcome.RETRY
        assert results[str(job.pk)].error == timeout_jobs.BUSY
        assert executors.submitted == [[]]  # nothing fired while another transaction holds it
    finally:
        release.set()
        holder.join()
    job.refresh_from_db()
    assert job.status == Status.PENDING  # untouched: retried later, not lost


class _Executors:
    """Stands in for the worker's executors: the test asks what the take decided, not what
    firing does (the job must not be fired while another transaction holds its row)."""

    holds = False

    def __init__(self) -> None:
        self.submitted: list = []

    def get(self, topic: str):
        return self

    def submit(self, slot, jobs, *, suspect):
        self.submitted.append(jobs)
