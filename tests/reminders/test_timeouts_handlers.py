"""Generic timeout jobs fired end to end: service → Redis → dispatcher → topic action → database.

Every topic type runs for real: ``log``, ``callable``, ``celery`` (eager) and ``http`` against a
local HTTP server on 127.0.0.1, whose requests are checked for their signature.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from couponcenter.core.errors import BusinessError
from reminders.engine import queue, topic_model
from reminders.models import TimeoutJob
from reminders.runtime.worker import build_worker
from reminders.services import timeout_job_cancel, timeout_job_create
from tests.support.standard_webhooks import Check, verify_python
from tests.support.webhook import Webhook, serving_webhook

pytestmark = pytest.mark.django_db

SECRET = "test-webhook-secret-of-thirty-two-bytes"
CALLS: list[int] = []  # job ids the ``record_call`` action saw, in order


CANCELS: list[str] = []  # what cancelling a sibling from inside an action answered


def record_call(jobs: list[TimeoutJob]) -> dict[int, str]:
    """A ``callable`` topic action (called with the batch): remember each job; cancel a
    sibling when asked to; fail the jobs whose attribute says so."""
    failed = {}
    for job in jobs:
        CALLS.append(job.pk)
        if job.attribute.get("fail"):
            failed[job.pk] = "told to fail"
        sibling = job.attribute.get("cancel_job")
        if sibling:
            try:
                timeout_job_cancel(job=TimeoutJob.objects.get(pk=sibling))
                CANCELS.append("cancelled")
            except BusinessError as refused:
                CANCELS.append(refused.code)
    return failed


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with serving_webhook() as hook:
        yield hook


@pytest.fixture
def topics(settings):
    """``topics(**specs)``: set settings.TIMEOUT_TOPICS; unregistered from the engine after."""
    names: list[str] = []

    def configure(**specs: dict) -> None:
        settings.TIMEOUT_TOPICS = {name.replace("_", "."): spec for name, spec in specs.items()}
        names.extend(settings.TIMEOUT_TOPICS)

    yield configure
    for name in names:
        topic_model.unregister_topic(name)


@pytest.fixture(autouse=True)
def calls() -> Iterator[list[int]]:
    CALLS.clear()
    yield CALLS
    CALLS.clear()


@pytest.fixture
def make_job(django_capture_on_commit_callbacks):
    """Create a job through the service and run its on-commit Redis index."""
    counter = iter(range(1, 10_000))

    def make(topic: str, *, in_s: float = -1, **fields) -> TimeoutJob:
        fields.setdefault("biz_type", "order")
        fields.setdefault("biz_id", f"B-{next(counter)}")
        with django_capture_on_commit_callbacks(execute=True):
            return timeout_job_create(
                topic=topic, action_time=timezone.now() + timedelta(seconds=in_s), **fields
            )

    return make


def drain(topic: str):
    worker = build_worker([topic])
    try:
        return worker.run_until_idle()
    finally:
        worker.shutdown()


def in_redis(job: TimeoutJob) -> dict[str, int]:
    """Where the job is in its slot: {"store": n, "prepare": n, "dead": n} (non-zero only)."""
    s = queue.stats(job.topic, [job.slot], now_ms=0)[0]
    return {k: v for k, v in (("store", s.store), ("prepare", s.prepare), ("dead", s.dead)) if v}


def status(job: TimeoutJob) -> int:
    job.refresh_from_db()
    return job.status


# --- log -------------------------------------------------------------------------------------


def test_due_log_job_is_processed_and_leaves_redis(topics, make_job, caplog):
    topics(t_log={"type": "log", "slots": 4})
    job = make_job("t.log", attribute={"k": "v"})
    assert in_redis(job) == {"store": 1}
    with caplog.at_level("INFO", logger="reminders.services.timeouts"):
        report = drain("t.log")
    assert (report.claimed, report.acked) == (1, 1)
    assert status(job) == TimeoutJob.Status.PROCESSED
    assert job.attempts == 1
    assert in_redis(job) == {}
    fired = [r for r in caplog.records if r.getMessage().startswith("timeout fired: ")]
    assert [(r.job_id, r.attribute) for r in fired] == [(job.pk, {"k": "v"})]
    # The ids are in the line itself, not only in the JSON extras.
    assert f"t.log {job.biz_type}:{job.biz_id} (job {job.pk}," in fired[0].getMessage()


def test_future_job_waits(topics, make_job):
    topics(t_log={"type": "log", "slots": 4})
    job = make_job("t.log", in_s=3600)
    assert drain("t.log").claimed == 0
    assert status(job) == TimeoutJob.Status.PENDING
    assert in_redis(job) == {"store": 1}
    assert queue.earliest_due("t.log", [job.slot]) == int(job.action_time.timestamp() * 1000)


def test_redelivered_processed_job_is_dropped(topics, make_job, calls):
    topics(t_call={"type": "callable", "path": f"{__name__}.record_call", "slots": 2})
    job = make_job("t.call")
    drain("t.call")
    queue.schedule("t.call", str(job.pk), 0, slot=job.slot)  # e.g. a rebuild raced the ack
    report = drain("t.call")
    assert (report.claimed, report.dropped) == (1, 1)
    assert calls == [job.pk]
    assert in_redis(job) == {}


# --- callable and celery -------------------------------------------------------------------------


def test_callable_topic_runs_the_function_once_per_job(topics, make_job, calls):
    topics(t_call={"type": "callable", "path": f"{__name__}.record_call", "slots": 2})
    jobs = [make_job("t.call") for _ in range(5)]
    assert drain("t.call").acked == 5
    assert sorted(calls) == sorted(j.pk for j in jobs)
    assert all(in_redis(j) == {} for j in jobs)
    assert {status(j) for j in jobs} == {TimeoutJob.Status.PROCESSED}


def test_celery_topic_runs_the_task(topics, make_job, eager_celery, caplog):
    topics(order_close={"type": "celery", "task": "reminders.tasks.log_timeout_job", "slots": 2})
    job = make_job("order.close", biz_id="O-77", attribute={"total": 10})
    with caplog.at_level("INFO", logger="reminders.tasks"):
        assert drain("order.close").acked == 1
    assert in_redis(job) == {}
    fired = [r.job for r in caplog.records if r.getMessage() == "order.close fired"]
    assert len(fired) == 1
    assert (fired[0]["job_id"], fired[0]["biz_id"], fired[0]["attribute"]) == (
        job.pk, "O-77", {"total": 10},
    )  # fmt: skip
    assert status(job) == TimeoutJob.Status.PROCESSED


def test_a_job_taken_for_firing_can_no_longer_be_cancelled(topics, make_job, calls):
    # One slot: both jobs come in one batch, taken from pending to running together. Running
    # the first tries to cancel the second: refused (not_pending), and the second fires. Either
    # the cancel wins (before the take) or the firing does, never both, never neither.
    CANCELS.clear()
    topics(t_call={"type": "callable", "path": f"{__name__}.record_call", "slots": 1})
    second = make_job("t.call", in_s=-1)
    first = make_job("t.call", in_s=-2, attribute={"cancel_job": second.pk})
    report = drain("t.call")
    assert report.claimed == 2
    assert calls == [first.pk, second.pk]
    assert CANCELS == ["not_pending"]
    assert (status(first), status(second)) == (
        TimeoutJob.Status.PROCESSED, TimeoutJob.Status.PROCESSED,
    )  # fmt: skip
    assert in_redis(first) == {} and in_redis(second) == {}


def test_a_job_cancelled_before_the_take_is_dropped_not_run(topics, make_job, calls):
    topics(t_call={"type": "callable", "path": f"{__name__}.record_call", "slots": 1})
    job = make_job("t.call", in_s=-1)
    # The cancel commits while the job's entry is still indexed (as when the engine claimed it
    # just before): the handler finds the row cancelled and drops the entry.
    timeout_job_cancel(job=job)
    queue.schedule("t.call", str(job.pk), 0, slot=job.slot)
    report = drain("t.call")
    assert calls == []
    assert status(job) == TimeoutJob.Status.CANCELLED
    assert report.dropped == 1


# --- http --------------------------------------------------------------------------------------


def _http_topic(topics, webhook: Webhook, **extra) -> None:
    spec = {"type": "http", "url": webhook.url, "secret": SECRET, "slots": 2, **extra}
    topics(t_http=spec)


def test_http_topic_posts_a_signed_body(topics, make_job, webhook, settings):
    settings.WEBHOOK_ALLOW_HTTP = True
    _http_topic(topics, webhook)
    job = make_job("t.http", biz_id="H-1", attribute={"amount": 5})
    assert drain("t.http").acked == 1
    assert in_redis(job) == {}
    assert len(webhook.requests) == 1
    headers, body = webhook.requests[0]
    # Standard Webhooks (tests/reminders/test_standard_webhooks.py verifies with the libraries).
    assert verify_python(Check(SECRET, headers, body)) is None
    assert headers["webhook-id"] == headers["Idempotency-Key"] == f"t.http:{job.pk}"
    assert "X-Coupon-Center-Signature" not in headers  # only for a topic that asks for it
    assert headers["Content-Type"] == "application/json"
    payload = json.loads(body)
    assert payload["job_id"] == job.pk
    assert (payload["topic"], payload["biz_type"], payload["biz_id"]) == ("t.http", "order", "H-1")
    assert payload["attribute"] == {"amount": 5}
    assert payload["action_time"].endswith("Z")  # as the API writes times
    assert datetime.fromisoformat(payload["action_time"]) == job.action_time
    assert status(job) == TimeoutJob.Status.PROCESSED
    assert in_redis(job) == {}


def test_http_500_retries_with_backoff_then_goes_dead(topics, make_job, webhook, settings):
    settings.WEBHOOK_ALLOW_HTTP = True
    webhook.status = 500
    _http_topic(topics, webhook, max_attempts=3, backoff_base_ms=200, backoff_cap_ms=200)
    job = make_job("t.http")
    worker = build_worker(["t.http"])
    now = [int(time.time() * 1000)]  # the worker's clock: the test moves it, nothing sleeps
    worker.clock = lambda: now[0]
    try:
        assert worker.run_once().retried == 1
        job.refresh_from_db()
        assert (job.status, job.attempts) == (TimeoutJob.Status.PENDING, 1)
        assert "500" in job.last_error
        assert in_redis(job) == {"store": 1}
        assert queue.earliest_due("t.http", [job.slot]) >= now[0] + 200  # backed off
        assert worker.run_until_idle().claimed == 0  # not due again yet
        for _ in range(2):  # each backoff over: the next attempt
            now[0] += 200
            worker.run_until_idle()
    finally:
        worker.shutdown()
    job.refresh_from_db()
    assert (job.status, job.attempts) == (TimeoutJob.Status.DEAD, 3)
    assert "500" in job.last_error
    assert len(webhook.requests) == 3
    assert in_redis(job) == {"dead": 1}
    [dead] = queue.list_dead("t.http", job.slot)
    assert (dead.job_id, dead.attempts) == (str(job.pk), 3)
    assert "500" in dead.last_error
    # Every attempt is in the row's history, with its time, outcome and error.
    assert [(e["attempt"], e["outcome"]) for e in job.history] == [
        (1, "failed"),
        (2, "failed"),
        (3, "dead"),
    ]
    assert all("500" in e["error"] and e["at"] for e in job.history)
    assert queue.place("t.http", job.slot, str(job.pk)).where == "dead"


def test_plain_http_is_refused_unless_allowed(topics, make_job, webhook, settings):
    settings.WEBHOOK_ALLOW_HTTP = False
    _http_topic(topics, webhook, max_attempts=1)
    job = make_job("t.http")
    assert drain("t.http").dead == 1
    assert webhook.requests == []
    assert status(job) == TimeoutJob.Status.DEAD
    assert "plain-HTTP target refused" in job.last_error
    [dead] = queue.list_dead("t.http", job.slot)
    assert "plain-HTTP target refused" in dead.last_error


def test_the_failure_log_line_and_the_alert_name_the_topic_and_the_error(
    topics, make_job, webhook, settings, caplog
):
    """Read in a plain-text log or a chat notification, the headline alone says where to look."""
    settings.WEBHOOK_ALLOW_HTTP = True
    webhook.status = 500
    _http_topic(topics, webhook, max_attempts=1)
    make_job("t.http")
    with caplog.at_level(logging.WARNING):
        assert drain("t.http").dead == 1
    [failed] = [r.getMessage() for r in caplog.records if "timeout jobs failed" in r.getMessage()]
    [alert] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT")]
    for line in (failed, alert):
        assert " on t.http: " in line and "500" in line, line


def test_unreachable_http_target_is_retried(topics, make_job, webhook, settings):
    settings.WEBHOOK_ALLOW_HTTP = True
    _http_topic(topics, webhook, backoff_base_ms=60_000)
    webhook.server.shutdown()
    webhook.server.server_close()  # nothing listens on the port any more
    job = make_job("t.http")
    assert drain("t.http").retried == 1
    job.refresh_from_db()
    assert (job.status, job.attempts) == (TimeoutJob.Status.PENDING, 1)
    assert "ConnectionError" in job.last_error
    assert in_redis(job) == {"store": 1}


def test_a_failed_http_job_stores_the_targets_scheme_and_host_only(
    topics, make_job, webhook, settings
):
    settings.WEBHOOK_ALLOW_HTTP = True
    webhook.status = 500
    url = f"{webhook.url}/SECRETPATH?api_key=SECRETQUERY"
    topics(t_http={"type": "http", "url": url, "secret": SECRET, "slots": 2})
    job = make_job("t.http")
    assert drain("t.http").retried == 1
    job.refresh_from_db()
    assert "500" in job.last_error and webhook.url.rsplit("/", 1)[0] in job.last_error
    assert "SECRET" not in job.last_error
