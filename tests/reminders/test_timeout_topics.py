"""Generic timeout topics kept as data (``TimeoutTopic``): validation shared by the admin and
the staff API, owners, pauses, changes picked up by a running worker, the per-topic rate limit
(a token bucket in Redis) and per-key fairness, against the real database and Redis."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import keys, queue, rates, topic_model
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.runtime.worker import build_worker
from reminders.selectors.timeout_topics import timeout_topic_spec
from reminders.services import timeout_job_create, timeout_topic_save
from tests.support.factories import api_user

pytestmark = pytest.mark.django_db
SECRET = "a-topic-secret-of-at-least-thirty-two-bytes"
TOPICS = "/api/timeout-topics/"
Status = TimeoutJob.Status


@pytest.fixture(autouse=True)
def fast_password_hasher(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def forget_registered_topics():
    before = {t.name for t in topic_model.all_topics()}
    yield
    for topic in topic_model.all_topics():
        if topic.name not in before:
            topic_model.unregister_topic(topic.name)


def _client(*, staff: bool = False, perms=()) -> tuple:
    user, token = api_user(staff=staff, perms=perms)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return user, client


def _topic(name: str, **fields) -> TimeoutTopic:
    fields.setdefault("type", "log")
    return timeout_topic_save(topic=TimeoutTopic(name=name), **fields)


def _job(topic: str, biz_id: str, *, in_s: float = -1, capture=None, **fields) -> TimeoutJob:
    fields.setdefault("biz_type", "order")
    at = timezone.now() + timedelta(seconds=in_s)
    with capture(execute=True):
        return timeout_job_create(topic=topic, biz_id=biz_id, action_time=at, **fields)


# --- validation: one set of rules for the admin, the API and the workers -------------------------


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"type": "http", "target": "http://hooks.example.com/x", "secret": SECRET}, "target",
         "plain-HTTP"),
        ({"type": "http", "target": "HTTP://hooks.example.com/x", "secret": SECRET}, "target",
         "plain-HTTP"),
        ({"type": "http", "target": "https://hooks.example.com/x", "secret": "short"}, "secret",
         "at least 32 bytes"),
        ({"type": "http", "target": "https://hooks.example.com/x"}, "secret", "is empty"),
        ({"type": "http", "target": "ftp://hooks.example.com/x", "secret": SECRET}, "target",
         "https://"),
        ({"type": "celery"}, "target", "task name"),
        ({"type": "log", "slots": 999}, "slots", "power of two"),
        ({"type": "log", "slots": 4096}, "slots", "1024"),
        ({"type": "http", "target": "https://h.example.com/", "secret": SECRET,
          "timeout_ms": 10_000, "visibility_ms": 30_000}, "visibility_ms", "4 x the timeout"),
        ({"type": "log", "fair_key": "tenant"}, "fair_key", "attribute.<name>"),
        ({"type": "log", "concurrency": 0}, "concurrency", "greater than or equal to 1"),
    ],
)  # fmt: skip
def test_a_bad_topic_is_refused_by_field_and_nothing_is_saved(settings, fields, field, words):
    settings.WEBHOOK_ALLOW_HTTP = False
    with pytest.raises(ValidationError) as refused:
        timeout_topic_save(topic=TimeoutTopic(name="t.bad"), **fields)
    assert words in " ".join(refused.value.message_dict[field])
    assert not TimeoutTopic.objects.filter(name="t.bad").exists()


def test_plain_http_only_when_the_topic_or_the_service_allows_it(settings):
    """One rule for saving a topic and for calling it (``webhooks.plain_http_allowed``): the
    topic's own ``allow_http``, or ``WEBHOOK_ALLOW_HTTP`` for every target (``make run``)."""
    settings.WEBHOOK_ALLOW_HTTP = False
    with pytest.raises(ValidationError) as refused:
        _topic("t.local", type="http", target="http://127.0.0.1:9/x", secret=SECRET)
    assert "WEBHOOK_ALLOW_HTTP" in " ".join(refused.value.message_dict["target"])
    settings.WEBHOOK_ALLOW_HTTP = True
    assert _topic("t.local", type="http", target="http://127.0.0.1:9/x", secret=SECRET).pk
    assert timeout_topic_spec("t.local").allow_http is False
    settings.WEBHOOK_ALLOW_HTTP = False
    topic = _topic("t.plain", type="http", target="http://127.0.0.1:9/x", secret=SECRET,
                   allow_http=True)  # fmt: skip
    assert timeout_topic_spec("t.plain").allow_http is True
    assert topic.pk


def test_a_settings_topic_name_cannot_be_taken_and_a_built_in_neither(settings):
    with pytest.raises(ValidationError) as refused:
        _topic("timeout.default")  # in settings.TIMEOUT_TOPICS
    assert "settings.TIMEOUT_TOPICS" in str(refused.value)
    with pytest.raises(ValidationError):
        _topic("coupon.reminder")


# --- the staff API --------------------------------------------------------------------------------


def test_staff_create_read_change_pause_and_delete_a_topic():
    _, staff = _client(staff=True)
    body = {"name": "pay.close", "type": "http", "target": "https://orders.example.com/t",
            "secret": SECRET, "concurrency": 4, "rate_limit_per_s": 50}  # fmt: skip
    created = staff.post(TOPICS, body, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["secret_set"] is True and "secret" not in body
    assert (body["concurrency"], body["rate_limit_per_s"], body["read_only"]) == (4, 50, False)
    listed = {t["name"]: t for t in staff.get(TOPICS).json()}
    assert listed["timeout.default"]["read_only"] is True  # from settings
    assert "pay.close" in listed
    paused = staff.patch(f"{TOPICS}pay.close/", {"paused": True}, format="json")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert timeout_topic_spec("pay.close").paused is True
    refused = staff.patch(f"{TOPICS}pay.close/", {"slots": 3}, format="json")
    assert refused.status_code == 400 and "slots" in refused.json()["errors"]
    assert TimeoutTopic.objects.get(name="pay.close").slots == 8  # unchanged
    renamed = staff.patch(f"{TOPICS}pay.close/", {"name": "other"}, format="json")
    assert renamed.status_code == 400
    settings_topic = staff.patch(f"{TOPICS}timeout.default/", {"paused": True}, format="json")
    assert settings_topic.status_code == 400 and "read-only" in str(settings_topic.json())
    assert staff.delete(f"{TOPICS}pay.close/").status_code == 204
    assert staff.get(f"{TOPICS}pay.close/").status_code == 404


def test_a_topic_with_live_jobs_cannot_be_deleted(django_capture_on_commit_callbacks):
    _, staff = _client(staff=True)
    _topic("t.busy")
    job = _job("t.busy", "1", in_s=60, capture=django_capture_on_commit_callbacks)
    refused = staff.delete(f"{TOPICS}t.busy/")
    assert refused.status_code == 409 and refused.json()["code"] == "topic_in_use"
    assert TimeoutTopic.objects.filter(name="t.busy").exists()
    assert TimeoutJob.objects.get(pk=job.pk).status == Status.PENDING


def test_only_staff_manage_topics():
    _, caller = _client(perms=("reminders.manage_timeouts",))
    assert caller.get(TOPICS).status_code == 403
    assert caller.post(TOPICS, {"name": "x.y", "type": "log"}, format="json").status_code == 403
    assert not TimeoutTopic.objects.exists()


# --- owners ---------------------------------------------------------------------------------------


def test_a_caller_sees_and_uses_only_the_topics_it_owns(django_capture_on_commit_callbacks):
    owner, owner_client = _client(perms=("reminders.manage_timeouts",))
    team = Group.objects.create(name="payments")
    member, member_client = _client(perms=("reminders.manage_timeouts",))
    member.groups.add(team)
    _, stranger = _client(perms=("reminders.manage_timeouts",))
    _topic("mine.close", owner_user=owner)
    _topic("team.close", owner_group=team)
    mine = _job("mine.close", "1", in_s=60, capture=django_capture_on_commit_callbacks)
    body = {"topic": "mine.close", "biz_type": "order", "biz_id": "2",
            "action_time": (timezone.now() + timedelta(minutes=5)).isoformat()}  # fmt: skip

    assert owner_client.post("/api/timeouts/", body, format="json").status_code == 201
    refused = stranger.post("/api/timeouts/", body, format="json")
    assert refused.status_code == 400 and "mine.close" not in str(refused.json()["errors"])
    team_body = {**body, "topic": "team.close"}
    assert member_client.post("/api/timeouts/", team_body, format="json").status_code == 201
    assert stranger.post("/api/timeouts/", team_body, format="json").status_code == 400

    assert stranger.get(f"/api/timeouts/{mine.pk}/").status_code == 404
    assert stranger.delete(f"/api/timeouts/{mine.pk}/").status_code == 404
    key = "?topic=mine.close&biz_type=order&biz_id=1"
    assert stranger.delete(f"/api/timeouts/by-key/{key}").status_code == 400
    assert TimeoutJob.objects.get(pk=mine.pk).status == Status.PENDING
    assert stranger.get("/api/timeouts/").json()["results"] == []  # no topic is shared
    assert {j["job_id"] for j in owner_client.get("/api/timeouts/").json()["results"]} >= {mine.pk}
    assert owner_client.delete(f"/api/timeouts/by-key/{key}").status_code == 200


NEW_SECRET = "whsec_FrZYC7H/Ecx7GLSPMN94ShGzuXBhLPMwwp1kUned6ug="


def test_a_new_secret_over_the_api_starts_a_rotation_and_legacy_headers_are_a_setting():
    _, staff = _client(staff=True)
    body = {"name": "pay.rotate", "type": "http", "target": "https://orders.example.com/t",
            "secret": SECRET}  # fmt: skip
    created = staff.post(TOPICS, body, format="json").json()
    assert (created["previous_secret_until"], created["legacy_signature"]) == (None, False)
    changed = staff.patch(f"{TOPICS}pay.rotate/", {"secret": NEW_SECRET, "legacy_signature": True},
                          format="json")  # fmt: skip
    assert changed.status_code == 200, changed.content
    assert changed.json()["legacy_signature"] is True
    until = changed.json()["previous_secret_until"]
    assert until is not None and until.endswith("Z")
    spec = timeout_topic_spec("pay.rotate")
    assert spec.signing_secrets(timezone.now()) == (NEW_SECRET, SECRET)
    assert spec.signing_secrets(spec.previous_secret_until) == (NEW_SECRET,)  # the overlap ends
    assert not {"secret", "previous_secret"} & set(changed.json())  # never shown


def test_a_settings_topic_rotates_until_its_previous_secret_is_removed(settings):
    spec = {"type": "http", "url": "https://h.example.com/x", "secret": NEW_SECRET}
    settings.TIMEOUT_TOPICS = {"t.rot": {**spec, "previous_secret": SECRET}}
    far = timezone.now() + timedelta(days=3650)
    assert timeout_topic_spec("t.rot").signing_secrets(far) == (NEW_SECRET, SECRET)
    settings.TIMEOUT_TOPICS = {"t.rot": spec}
    assert timeout_topic_spec("t.rot").signing_secrets(far) == (NEW_SECRET,)
    settings.TIMEOUT_TOPICS = {"t.rot": {**spec, "previous_secret": "x" * 40}}
    with pytest.raises(ImproperlyConfigured, match="previous_secret"):
        timeout_topic_spec("t.rot")


# --- the admin ------------------------------------------------------------------------------------


def test_the_admin_adds_a_topic_keeps_its_secret_and_refuses_bad_values(admin_user):
    client = Client()
    client.force_login(admin_user)
    form = {"name": "t.admin", "type": "http", "target": "https://h.example.com/x",
            "secret": SECRET, "slots": 8, "max_attempts": 16, "backoff_base_ms": 1000,
            "backoff_cap_ms": 300000, "visibility_ms": 30000, "concurrency": 8,
            "timeout_ms": 5000, "rate_limit_per_s": 0, "fair_key": ""}  # fmt: skip
    added = client.post("/admin/reminders/timeouttopic/add/", form)
    assert added.status_code == 302, added.content.decode()[:2000]
    topic = TimeoutTopic.objects.get(name="t.admin")
    change = f"/admin/reminders/timeouttopic/{topic.pk}/change/"
    kept = client.post(change, {**form, "secret": "", "concurrency": 2})  # secret left empty
    assert kept.status_code == 302
    topic.refresh_from_db()
    assert (topic.secret, topic.concurrency) == (SECRET, 2)
    bad = client.post(change, {**form, "slots": 999})
    assert bad.status_code == 200 and "power of two" in bad.content.decode()
    topic.refresh_from_db()
    assert topic.slots == 8
    # A new secret: the old one signs too for the overlap, until an operator ends it.
    assert client.post(change, {**form, "secret": NEW_SECRET}).status_code == 302
    topic.refresh_from_db()
    assert (topic.secret, topic.previous_secret) == (NEW_SECRET, SECRET)
    assert client.get(change).status_code == 200  # the overlap's end shows, read-only
    action = {"action": "end_rotation", "_selected_action": [topic.pk]}
    assert client.post("/admin/reminders/timeouttopic/", action).status_code == 302
    topic.refresh_from_db()
    assert (topic.previous_secret, topic.previous_secret_until) == ("", None)


# --- a running worker picks changes up ------------------------------------------------------------


def test_a_topic_created_while_the_worker_runs_fires_and_a_paused_one_waits(
    django_capture_on_commit_callbacks, caplog
):
    worker = build_worker()
    try:
        worker.run_once()
        _topic("t.later")
        job = _job("t.later", "1", capture=django_capture_on_commit_callbacks)
        with caplog.at_level("INFO", logger="reminders.handlers.timeout_jobs"):
            worker.run_until_idle()
        assert TimeoutJob.objects.get(pk=job.pk).status == Status.PROCESSED

        timeout_topic_save(topic=TimeoutTopic.objects.get(name="t.later"), paused=True)
        held = _job("t.later", "2", capture=django_capture_on_commit_callbacks)
        assert worker.run_until_idle().claimed == 0
        assert TimeoutJob.objects.get(pk=held.pk).status == Status.PENDING
        timeout_topic_save(topic=TimeoutTopic.objects.get(name="t.later"), paused=False)
        assert worker.run_until_idle().claimed == 1
        assert TimeoutJob.objects.get(pk=held.pk).status == Status.PROCESSED
    finally:
        worker.shutdown()


def test_a_slot_count_changed_while_jobs_wait_loses_none(django_capture_on_commit_callbacks):
    topic = _topic("t.resize", slots=8)
    jobs = [_job("t.resize", str(i), in_s=-1, capture=django_capture_on_commit_callbacks)
            for i in range(40)]  # fmt: skip
    worker = build_worker()
    try:
        worker.run_once()  # serves the 8-slot layout (nothing due yet is left unclaimed: all due)
        timeout_topic_save(topic=topic, slots=2)
        later = [_job("t.resize", f"n{i}", in_s=-1, capture=django_capture_on_commit_callbacks)
                 for i in range(10)]  # fmt: skip
        worker.run_until_idle()
    finally:
        worker.shutdown()
    assert {j.slot for j in later} <= {0, 1}
    done = TimeoutJob.objects.filter(pk__in=[j.pk for j in jobs + later], status=Status.PROCESSED)
    assert done.count() == 50


# --- rate limits ----------------------------------------------------------------------------------


def test_the_token_bucket_grants_the_burst_then_refills_at_the_rate():
    now = 1_000_000
    assert rates.take("t.rate", 100, 50, now_ms=now) == 10  # burst: a tenth of a second
    assert rates.take("t.rate", 100, 50, now_ms=now) == 0
    assert rates.take("t.rate", 100, 50, now_ms=now + 50) == 5  # 50 ms at 100/s
    rates.give_back("t.rate", 100, 3, now_ms=now + 50)
    assert rates.take("t.rate", 100, 50, now_ms=now + 50) == 3
    assert rates.take("t.rate", 100, 50, now_ms=now + 60_000) == 10  # never above the burst
    # Tokens asked for and refused are not jobs held back: only a claim's due jobs count.
    assert rates.state("t.rate", 100, now_ms=now + 60_000).throttled == 0


def test_the_bucket_state_is_as_of_now_not_as_of_the_last_take():
    now = 1_000_000
    assert rates.take("t.fresh", 100, 10, now_ms=now) == 10  # emptied
    assert rates.state("t.fresh", 100, now_ms=now).tokens == 0
    assert rates.state("t.fresh", 100, now_ms=now + 50).tokens == 5  # refilled since
    assert rates.state("t.fresh", 100, now_ms=now + 60_000).tokens == 10  # the burst at most
    assert rates.state("t.never", 100, now_ms=now).tokens == 10  # an idle bucket is full


def test_a_job_that_got_its_token_is_not_counted_as_throttled(django_capture_on_commit_callbacks):
    # A batch asks for many tokens and one job is due: the limit holds nothing back.
    _topic("t.one", rate_limit_per_s=10, slots=1)  # burst 1
    _job("t.one", "only", capture=django_capture_on_commit_callbacks)
    worker = build_worker(["t.one"])
    try:
        assert worker.run_once().claimed == 1
    finally:
        worker.shutdown()
    assert rates.state("t.one", 10, now_ms=0).throttled == 0


def test_a_rate_limited_topic_fires_no_more_than_its_tokens(django_capture_on_commit_callbacks):
    # 10 a second, a bucket of 1: claiming all 60 would take a tick of six seconds.
    _topic("t.limited", rate_limit_per_s=10, slots=4)
    jobs = [_job("t.limited", str(i), capture=django_capture_on_commit_callbacks)
            for i in range(60)]  # fmt: skip
    worker = build_worker(["t.limited"])
    try:
        started = time.monotonic()
        first = worker.run_once()
        elapsed = time.monotonic() - started
    finally:
        worker.shutdown()
    # One tick on a fresh bucket: the burst plus what refilled while the tick ran (a loaded
    # machine runs a longer tick, and the bucket refills for longer: the bound is the tick's).
    state = rates.state("t.limited", 10, now_ms=0)
    assert rates.burst_for(10) <= first.claimed <= rates.burst_for(10) + 10 * elapsed + 1
    assert first.claimed < 60, f"a tick of {elapsed:.2f} s: nothing was left to throttle"
    assert TimeoutJob.objects.filter(status=Status.PROCESSED).count() == first.claimed
    assert state.throttled > 0  # due jobs were left in a slot whose claim the limit cut
    left = sum(s.store for s in queue.stats("t.limited", range(4), now_ms=0))
    assert left == 60 - first.claimed
    assert len(jobs) == 60


# --- fairness -------------------------------------------------------------------------------------


def test_one_flooding_key_does_not_starve_the_others(django_capture_on_commit_callbacks):
    # 400 jobs of tenant "big" and 5 of tenant "small", all due, at 100 jobs/s: without
    # fairness the small tenant's jobs wait behind the flood wherever they land; with the
    # topic's fair key each tenant has its slot, and the round-robin over due slots reaches
    # the small tenant's within two ticks.
    _topic("t.fair", rate_limit_per_s=100, slots=16, fair_key="attribute.tenant")
    flood = [_job("t.fair", f"big-{i}", attribute={"tenant": "big"},
                  capture=django_capture_on_commit_callbacks) for i in range(400)]  # fmt: skip
    small = [_job("t.fair", f"small-{i}", attribute={"tenant": "small"},
                  capture=django_capture_on_commit_callbacks) for i in range(5)]  # fmt: skip
    assert len({j.slot for j in flood}) == 1 and len({j.slot for j in small}) == 1
    assert flood[0].slot != small[0].slot
    worker = build_worker(["t.fair"])
    ticks = 0
    try:
        while TimeoutJob.objects.filter(pk__in=[j.pk for j in small],
                                        status=Status.PROCESSED).count() < 5:  # fmt: skip
            ticks += 1
            assert ticks <= 500, "the small tenant starved"
            worker.run_once()
    finally:
        worker.shutdown()
    fired_big = TimeoutJob.objects.filter(pk__in=[j.pk for j in flood], status=Status.PROCESSED)
    assert fired_big.count() < 200, "the small tenant waited for half the flood"
    assert keys.rate_bucket("t.fair")
