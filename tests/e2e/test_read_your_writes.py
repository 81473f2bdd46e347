"""Read your own writes against real processes: gunicorn with several worker processes, as
deployed, each process keeping its own copy of the timeout topics. A change made through the API
is seen by the next request, whichever process serves it.

- twenty topics, each created and used at once (a single job and a bulk of two right after its
  topic's 201, each request on a new connection), as a client's set-up script does: every job
  accepted;
- a topic paused, then deleted: after the pause every process reads it paused, after the delete
  every process refuses a job on it.

Every process is reached on purpose: a worker process names itself in each answer
(``tests.support.pid_app``), and a check is repeated until each of them has answered it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
from django.utils import timezone

from reminders.models import TimeoutJob, TimeoutTopic
from tests.e2e.conftest import wait_for
from tests.support.factories import api_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
WORKERS = 4
TOPICS = 20
REACH_ALL_TIMEOUT_S = 60


class Web:
    """The staff API of a gunicorn started for the test; each request on a new connection."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict, int]:
        """(status, JSON body, pid of the worker process that answered)."""
        request = urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw, pid = response.status, response.read(), response.headers
        except urllib.error.HTTPError as exc:
            status, raw, pid = exc.code, exc.read(), exc.headers
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:  # not the API's JSON: shown as it came
            data = {"not_json": raw.decode(errors="replace")[:2000]}
        return status, data, int(pid["X-Served-By"])

    def on_every_process(
        self, method: str, path: str, body: dict | None = None
    ) -> dict[int, list[tuple[int, dict]]]:
        """The request sent again and again until each worker process has answered it: every
        answer, by the process that gave it."""
        answers: dict[int, list[tuple[int, dict]]] = {}

        def every_process_answered() -> bool:
            status, data, pid = self.call(method, path, body)
            answers.setdefault(pid, []).append((status, data))
            return len(answers) >= WORKERS

        what = f"each of {WORKERS} processes to answer {method} {path}"
        wait_for(every_process_answered, timeout=REACH_ALL_TIMEOUT_S, interval=0, what=what)
        return answers


@pytest.fixture
def web(stack) -> Web:
    _, token = api_user(staff=True)
    return Web(stack.start_web(workers=WORKERS, app="tests.support.pid_app"), token)


def _job(topic: str, biz_id: str) -> dict:
    at = timezone.now() + timedelta(hours=1)  # nothing fires while the test runs
    return {"topic": topic, "biz_type": "order", "biz_id": biz_id, "action_time": at.isoformat()}


def test_twenty_topics_each_created_and_used_at_once_every_job_accepted(web):
    # As a client's set-up script does it: each topic used as soon as its 201 is back, while
    # every process keeps the topics it read for the requests before.
    web.on_every_process("GET", "/api/timeout-topics/")
    answers: dict[int, list[tuple[str, int, dict, int]]] = {}
    for i in range(TOPICS):
        name = f"ryw.{i}"
        topic = web.call("POST", "/api/timeout-topics/", {"name": name, "type": "log"})
        steps = [("topic", *topic)]
        steps.append(("job", *web.call("POST", "/api/timeouts/", _job(name, f"{i}-one"))))
        bulk = {"jobs": [_job(name, f"{i}-two"), _job(name, f"{i}-three")]}
        steps.append(("bulk", *web.call("POST", "/api/timeouts/bulk/", bulk)))
        answers[i] = steps

    refused = {i: s for i, steps in answers.items() for s in steps if s[1] != 201}
    assert not refused, refused
    assert TimeoutTopic.objects.filter(name__startswith="ryw.").count() == TOPICS
    assert TimeoutJob.objects.filter(topic__startswith="ryw.").count() == 3 * TOPICS
    # The premise: jobs were scheduled on processes that had not created their topic.
    elsewhere = [i for i, steps in answers.items() if {s[3] for s in steps[1:]} - {steps[0][3]}]
    assert elsewhere, answers


def test_a_topic_paused_then_deleted_each_change_seen_by_the_next_request_everywhere(web):
    assert web.call("POST", "/api/timeout-topics/", {"name": "ryw.t", "type": "log"})[0] == 201
    # Each process takes the topic (a filter by it is valid) and keeps it, not paused.
    known = web.on_every_process("GET", "/api/timeouts/?topic=ryw.t")
    assert {status for each in known.values() for status, _ in each} == {200}, known
    web.on_every_process("GET", "/api/timeout-topics/ryw.t/")

    status, data, _ = web.call("PATCH", "/api/timeout-topics/ryw.t/", {"paused": True})
    assert (status, data["paused"]) == (200, True)
    answers = web.on_every_process("GET", "/api/timeout-topics/ryw.t/")
    seen = {(status, data.get("paused")) for each in answers.values() for status, data in each}
    assert seen == {(200, True)}, answers

    assert web.call("DELETE", "/api/timeout-topics/ryw.t/")[0] == 204
    answers = web.on_every_process("POST", "/api/timeouts/", _job("ryw.t", "late"))
    refusals = {
        (status, "Unknown topic" in json.dumps(data))
        for each in answers.values()
        for status, data in each
    }
    assert refusals == {(400, True)}, answers
    assert not TimeoutJob.objects.filter(topic="ryw.t").exists()
