"""The timeout center's business-key API against the real database and Redis: bulk create, lookup,
cancel and reschedule by (topic, biz_type, biz_id), the filtered list, and the races with the
firing (exactly one outcome)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import queue
from reminders.handlers import timeout_jobs
from reminders.models import TimeoutJob
from reminders.runtime.worker import build_worker
from reminders.services import (
    TimeoutJobConflict,
    timeout_job_create,
    timeout_job_reschedule,
    timeout_jobs_bulk_create,
)
from reminders.services.timeouts_bulk import BULK_MAX
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db
TOPIC = "timeout.default"  # a `log` topic with 8 slots in settings.TIMEOUT_TOPICS
SLOTS = 8
BULK = "/api/timeouts/bulk/"
BY_KEY = "/api/timeouts/by-key/"
LIST = "/api/timeouts/"
WHEN = datetime(2031, 3, 1, 9, tzinfo=UTC)
Status = TimeoutJob.Status


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def staff(db) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_user(staff=True)[1]}")
    return client


@pytest.fixture
def call(staff, django_capture_on_commit_callbacks):
    """``call(method, url, data)`` as staff, running the on-commit Redis work as a commit would."""

    def send(method: str, url: str, data=None, **extra):
        with django_capture_on_commit_callbacks(execute=True):
            return getattr(staff, method)(url, data, format="json", **extra)

    return send


def job_body(biz_id: str, *, at: datetime = WHEN, **extra) -> dict:
    return {"topic": TOPIC, "biz_type": "order", "biz_id": biz_id,
            "action_time": at.isoformat(), **extra}  # fmt: skip


def key(biz_id: str) -> str:
    return f"{BY_KEY}?topic={TOPIC}&biz_type=order&biz_id={biz_id}"


def due_in_redis(job_id: int, slot: int) -> int | None:
    """The job's due time in its slot's schedule (None: not scheduled)."""
    where = queue.place(TOPIC, slot, str(job_id))
    return where.at_ms if where.where == "scheduled" else None


def backlog() -> int:
    return sum(s.store + s.prepare for s in queue.stats(TOPIC, range(SLOTS), now_ms=0))


# --- bulk create ---------------------------------------------------------------------------------


def test_bulk_create_writes_and_indexes_every_job(call):
    response = call("post", BULK, {"jobs": [job_body(f"B-{i}") for i in range(50)]})
    assert response.status_code == 201, response.data
    assert (response.data["created"], response.data["existing"]) == (50, 0)
    assert [j["biz_id"] for j in response.data["jobs"]] == [f"B-{i}" for i in range(50)]
    assert TimeoutJob.objects.filter(status=Status.PENDING).count() == 50
    assert backlog() == 50
    job = TimeoutJob.objects.get(biz_id="B-7")
    assert due_in_redis(job.pk, job.slot) == int(WHEN.timestamp() * 1000)


def test_bulk_jobs_the_serializers_must_convert_get_the_same_answer(call):
    # The bulk create checks plain jobs itself and sends anything else through the serializers:
    # a number for biz_id, whitespace to trim or an offset other than UTC go the long way, and
    # the answer and the rows are the same as for the plain form.
    local = WHEN.astimezone(timezone.get_fixed_timezone(480))
    plain = call("post", BULK, {"jobs": [job_body("7"), job_body("8")]})
    converted = call("post", BULK, {"jobs": [
        {**job_body("x"), "biz_id": 9, "attribute": {"k": [1, 2]}},
        {**job_body("x"), "biz_id": " 10 ", "action_time": local.isoformat()},
    ]})  # fmt: skip
    assert plain.status_code == converted.status_code == 201, converted.data
    assert plain.data["jobs"][0].keys() == converted.data["jobs"][0].keys()
    assert {j["action_time"] for j in plain.data["jobs"] + converted.data["jobs"]} == {
        WHEN.isoformat().replace("+00:00", "Z")
    }
    rows = {j.biz_id: j for j in TimeoutJob.objects.all()}
    assert set(rows) == {"7", "8", "9", "10"}
    assert rows["9"].attribute == {"k": [1, 2]} and rows["7"].attribute == {}
    assert {j.action_time for j in rows.values()} == {WHEN}
    assert backlog() == 4


def test_bulk_values_with_tabs_newlines_and_backslashes_round_trip(call):
    odd = "a\tb\nc\\d\re"
    body = {"jobs": [job_body(odd, attribute={"note": odd, "path": "C:\\x"}),
                     job_body("plain", recurrence="FREQ=DAILY;COUNT=2")]}  # fmt: skip
    response = call("post", BULK, body)
    assert response.status_code == 201, response.data
    job = TimeoutJob.objects.get(biz_id=odd)
    assert job.attribute == {"note": odd, "path": "C:\\x"}
    assert job.pk == response.data["jobs"][0]["job_id"]
    plain = TimeoutJob.objects.get(biz_id="plain")
    assert (plain.recurrence, plain.series_start) == ("FREQ=DAILY;COUNT=2", WHEN)
    assert due_in_redis(job.pk, job.slot) == int(WHEN.timestamp() * 1000)


@pytest.mark.django_db(transaction=True)
def test_a_bulk_racing_another_create_of_a_key_is_a_conflict_and_writes_nothing(monkeypatch):
    # Another request creates the key's job after this one looked for pending jobs: the
    # database's unique constraint refuses the insert, and the whole request rolls back.
    timeout_job_create(topic=TOPIC, biz_type="order", biz_id="R-1", action_time=WHEN)
    monkeypatch.setattr("reminders.services.timeouts_bulk._pending_by_keys", lambda keys: {})
    jobs = [{"topic": TOPIC, "biz_type": "order", "biz_id": f"R-{i}", "action_time": WHEN}
            for i in range(5)]  # fmt: skip
    with pytest.raises(TimeoutJobConflict):
        timeout_jobs_bulk_create(jobs)
    assert TimeoutJob.objects.count() == 1
    assert backlog() == 1  # only the other request's job


def test_bulk_create_is_idempotent_per_key(call):
    first = call("post", LIST, job_body("B-1")).data
    response = call("post", BULK, {"jobs": [job_body("B-1", at=WHEN + timedelta(hours=1)),
                                            job_body("B-2")]})  # fmt: skip
    assert response.status_code == 201
    jobs = {j["biz_id"]: j for j in response.data["jobs"]}
    assert jobs["B-1"]["job_id"] == first["job_id"] and jobs["B-1"]["created"] is False
    assert jobs["B-2"]["created"] is True
    assert TimeoutJob.objects.get(pk=first["job_id"]).action_time == WHEN  # not moved
    again = call("post", BULK, {"jobs": [job_body("B-1"), job_body("B-2")]})
    assert again.status_code == 200 and again.data["created"] == 0


@pytest.mark.parametrize(
    "jobs, field",
    [
        ([job_body("D-1"), job_body("D-1")], "jobs"),  # the same key twice
        ([job_body("D-1"), {**job_body("D-2"), "topic": "no.such.topic"}], "topic"),
        ([job_body("D-1"), {**job_body("D-2"), "action_time": "soon"}], "jobs"),
        ([], "jobs"),
    ],
)
def test_bad_bulk_is_400_and_writes_nothing(call, jobs, field):
    response = call("post", BULK, {"jobs": jobs})
    assert response.status_code == 400, response.data
    assert field in str(response.data["errors"])
    assert not TimeoutJob.objects.exists() and backlog() == 0


def test_more_than_the_bulk_limit_is_400(call):
    jobs = [job_body(f"L-{i}") for i in range(BULK_MAX + 1)]
    response = call("post", BULK, {"jobs": jobs})
    assert response.status_code == 400
    assert not TimeoutJob.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_bulk_create_indexes_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        created = timeout_jobs_bulk_create(
            [{"topic": TOPIC, "biz_type": "order", "biz_id": f"R-{i}", "action_time": WHEN}
             for i in range(20)]
        )  # fmt: skip
        assert len(created) == 20
        raise RuntimeError("the caller's transaction fails after the bulk create")
    assert not TimeoutJob.objects.exists()
    assert backlog() == 0


# --- by business key ------------------------------------------------------------------------------


def test_get_by_key_answers_the_pending_job(call, staff):
    job_id = call("post", LIST, job_body("K-1")).data["job_id"]
    response = staff.get(key("K-1"))
    assert response.status_code == 200
    assert (response.data["job_id"], response.data["status"]) == (job_id, "pending")
    assert staff.get(key("nope")).status_code == 404
    missing = staff.get(f"{BY_KEY}?topic={TOPIC}&biz_type=order")
    assert missing.status_code == 400 and "biz_id" in missing.data["errors"]


def test_cancel_by_key_cancels_and_unindexes(call, staff):
    job_id = call("post", LIST, job_body("K-2")).data["job_id"]
    response = call("delete", key("K-2"))
    assert response.status_code == 200 and response.data["status"] == "cancelled"
    assert TimeoutJob.objects.get(pk=job_id).status == Status.CANCELLED
    assert backlog() == 0
    again = call("delete", key("K-2"))
    assert again.status_code == 409 and again.data["code"] == "not_pending"
    # The key is free again: a new create is a new job.
    assert call("post", LIST, job_body("K-2")).status_code == 201


def test_reschedule_by_key_moves_the_row_and_the_entry(call):
    job_id = call("post", LIST, job_body("K-3")).data["job_id"]
    later = WHEN + timedelta(minutes=10)
    response = call("patch", key("K-3"), {"action_time": later.isoformat()})
    assert response.status_code == 200, response.data
    job = TimeoutJob.objects.get(pk=job_id)
    assert job.action_time == later and job.status == Status.PENDING
    assert due_in_redis(job.pk, job.slot) == int(later.timestamp() * 1000)
    assert backlog() == 1
    bad = call("patch", key("K-3"), {"action_time": "later"})
    assert bad.status_code == 400 and "action_time" in bad.data["errors"]
    assert TimeoutJob.objects.get(pk=job_id).action_time == later


def test_a_job_being_fired_cannot_be_cancelled_or_moved(call):
    job_id = call("post", LIST, job_body("K-4")).data["job_id"]
    TimeoutJob.objects.filter(pk=job_id).update(status=Status.RUNNING)  # taken by a worker
    cancel = call("delete", key("K-4"))
    move = call("patch", key("K-4"), {"action_time": WHEN.isoformat()})
    assert (cancel.status_code, cancel.data["code"]) == (409, "not_pending")
    assert (move.status_code, move.data["code"]) == (409, "not_pending")
    assert TimeoutJob.objects.get(pk=job_id).status == Status.RUNNING


@pytest.mark.django_db(transaction=True)
def test_a_reschedule_committed_while_the_old_entry_is_claimed_wins(monkeypatch):
    """The entry is claimed at its old due time; a PATCH commits before the handler takes the
    row: the job does not fire now, and fires at its new time."""
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="K-5",
                             action_time=timezone.now() - timedelta(seconds=1))  # fmt: skip
    later = timezone.now() + timedelta(hours=1)
    take = timeout_jobs.timeout_jobs_take_rows

    def reschedule_then_take(due):
        timeout_job_reschedule(job=TimeoutJob.objects.get(pk=job.pk), action_time=later)
        return take(due)

    monkeypatch.setattr(timeout_jobs, "timeout_jobs_take_rows", reschedule_then_take)
    worker = build_worker([TOPIC])
    try:
        report = worker.run_until_idle()
    finally:
        worker.shutdown()
    assert report.claimed == 1 and report.dropped == 1
    job.refresh_from_db()
    assert (job.status, job.action_time) == (Status.PENDING, later)
    assert due_in_redis(job.pk, job.slot) == int(later.timestamp() * 1000)


# --- the list -------------------------------------------------------------------------------------


def test_list_filters_and_pages_with_a_cursor(call, staff):
    jobs = [job_body(f"P-{i}", at=WHEN + timedelta(minutes=i)) for i in range(5)]
    jobs.append({**job_body("I-1"), "biz_type": "invoice"})
    call("post", BULK, {"jobs": jobs})
    call("delete", key("P-0"))
    first = staff.get(LIST, {"topic": TOPIC, "biz_type": "order", "status": "pending",
                             "page_size": 2})  # fmt: skip
    assert first.status_code == 200
    ids = [j["biz_id"] for j in first.data["results"]]
    second = staff.get(first.data["next"])
    ids += [j["biz_id"] for j in second.data["results"]]
    assert ids == ["P-4", "P-3", "P-2", "P-1"]  # newest first, the cancelled one filtered out
    assert second.data["next"] is None
    after, before = WHEN + timedelta(minutes=1), WHEN + timedelta(minutes=3)
    window = staff.get(
        LIST, {"action_time_after": after.isoformat(), "action_time_before": before.isoformat()}
    )
    assert sorted(j["biz_id"] for j in window.data["results"]) == ["P-1", "P-2"]


@pytest.mark.parametrize(
    "params, field",
    [({"topic": "no.such.topic"}, "topic"), ({"status": "sleeping"}, "status"),
     ({"action_time_after": "yesterday"}, "action_time_after"), ({"cursor": "normal"}, "cursor")],
)  # fmt: skip
def test_bad_list_filters_are_400(staff, params, field):
    response = staff.get(LIST, params)
    assert response.status_code == 400 and field in response.data["errors"]


def test_the_business_key_api_needs_the_permission(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_user()[1]}")
    assert client.get(key("X")).status_code == 403
    assert client.post(BULK, {"jobs": [job_body("X")]}, format="json").status_code == 403
    assert client.get(LIST).status_code == 403
    assert not TimeoutJob.objects.exists()


def test_a_bad_job_in_a_bulk_is_named_by_its_place(call):
    jobs = [job_body("E-0"), job_body("E-1"), {**job_body("E-2"), "action_time": "soon"}]
    response = call("post", BULK, {"jobs": jobs})
    assert response.status_code == 400
    errors = response.data["errors"]
    assert list(errors) == ["jobs.2.action_time"]
    assert all(isinstance(m, str) for m in errors["jobs.2.action_time"])
