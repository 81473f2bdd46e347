"""One tenant's recurring job must never stop the timeout center, against real processes: the
production web server (gunicorn) and a reminder worker, two tenants on their own topics.

Tenant A's rules that once stalled a worker are refused at the API; the worst of them, stored
as rows from before rules were checked (``INTERVAL=0``, which made dateutil loop forever, and a
minutely rule for 30 February, which walks minute by minute to the year 9999), fire and end
their series with the jobs marked. Tenant B's jobs fire meanwhile, the worker keeps its slot
leases and ``/healthz/?require_workers=1`` stays green throughout.

Observed, not timed: the test waits for what the processes write. The one bound on time it
asserts (B's jobs fire within ``LATE_LIMIT_S`` of their due time) is two orders of magnitude
above what a healthy worker needs, and far under the stall it guards against (jobs never fired).
"""

from __future__ import annotations

import json
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone

from reminders.engine import leases
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.services import timeout_job_create, timeout_topic_save
from tests.e2e.conftest import wait_for
from tests.support.factories import api_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
Status = TimeoutJob.Status
SECRET = "e2e-Recurrence-isolation-secret-9f3c1a7b"
LATE_LIMIT_S = 20
WORST = {
    "FREQ=DAILY;INTERVAL=0": "series ended: its recurrence no longer parses",
    "FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=30": "series ended: its next occurrence was not found",
}


def _post(base: str, path: str, token: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _health(base: str) -> int:
    try:
        with urllib.request.urlopen(base + "/healthz/?require_workers=1", timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_a_tenants_worst_rules_leave_the_other_tenant_on_time(stack, receiver_factory):
    stack.env["WEBHOOK_ALLOW_PRIVATE"] = "1"
    receiver_a, receiver_b = receiver_factory(), receiver_factory()
    tenant_a, token_a = api_user(perms=["reminders.manage_timeouts"])
    tenant_b, token_b = api_user(perms=["reminders.manage_timeouts"])
    for name, owner, receiver in (("a.reports", tenant_a, receiver_a),
                                  ("b.orders", tenant_b, receiver_b)):  # fmt: skip
        timeout_topic_save(topic=TimeoutTopic(name=name), type="http", target=receiver.url,
                           secret=SECRET, allow_http=True, owner_user=owner, slots=2)  # fmt: skip
    base = stack.start_web(workers=2)
    soon = (timezone.now() + timedelta(seconds=2)).isoformat()
    for rule in [*WORST, "FREQ=SECONDLY", "FREQ=SECONDLY;BYMONTH=2;BYMONTHDAY=30"]:
        status, body = _post(base, "/api/timeouts/", token_a, {
            "topic": "a.reports", "biz_type": "report", "biz_id": rule, "action_time": soon,
            "recurrence": rule})  # fmt: skip
        assert status == 400 and "recurrence" in body["errors"], (rule, body)
    # The worst rules as rows from before they were checked, due now.
    worst = {}
    for rule in WORST:
        job = timeout_job_create(topic="a.reports", biz_type="report", biz_id=rule,
                                 action_time=timezone.now())  # fmt: skip
        TimeoutJob.objects.filter(pk=job.pk).update(recurrence=rule, series_start=job.action_time)
        worst[rule] = job.pk
    worker = stack.start_reminder_worker()
    assert _health(base) == 200

    due = timezone.now() + timedelta(seconds=3)
    jobs = [{"topic": "b.orders", "biz_type": "order", "biz_id": f"o{i}",
             "action_time": (due + timedelta(milliseconds=250 * i)).isoformat()}
            for i in range(20)]  # fmt: skip
    status, body = _post(base, "/api/timeouts/bulk/", token_b, {"jobs": jobs})
    assert status == 201 and body["created"] == 20, body
    healths = []

    b_jobs = TimeoutJob.objects.filter(topic="b.orders")

    def b_fired() -> bool:
        healths.append(_health(base))
        # Received, then settled: a row is processed a moment after its call was answered.
        return (
            len({r.headers["Idempotency-Key"] for r in receiver_b.snapshot()}) == 20
            and b_jobs.filter(status=Status.PROCESSED).count() == 20
        )

    wait_for(b_fired, timeout=120, what=f"tenant B's 20 jobs\n{stack.logs()}")
    first_call = {}
    for received in receiver_b.snapshot():
        job_id = int(received.headers["Idempotency-Key"].rpartition(":")[2])
        first_call.setdefault(job_id, received.at)
    late = {job.pk: first_call[job.pk] - job.action_time.timestamp() for job in b_jobs}
    assert max(late.values()) < LATE_LIMIT_S, late

    wait_for(lambda: all(TimeoutJob.objects.get(pk=pk).last_error for pk in worst.values()),
             timeout=60, what=f"the worst series to end\n{stack.logs()}")  # fmt: skip
    for rule, pk in worst.items():
        job = TimeoutJob.objects.get(pk=pk)
        assert job.status == Status.PROCESSED and job.last_error.startswith(WORST[rule])
        assert job.history[-1]["outcome"] == "series_ended"
    assert not TimeoutJob.objects.filter(topic="a.reports", status=Status.PENDING).exists()
    assert len(receiver_a.snapshot()) >= 2  # tenant A's jobs fired too, once each series
    # The worker stayed whole: green all along, its leases held, nothing lost or stalled.
    assert healths and set(healths) == {200}, healths
    [info] = leases.list_workers()
    assert info.pid == worker.popen.pid
    assert sorted(info.owned["a.reports"]) == [0, 1] and sorted(info.owned["b.orders"]) == [0, 1]
    assert "lease lost" not in worker.output() and "Traceback" not in worker.output()
    assert "ALERT" in worker.output() and "recurring series ended" in worker.output()
