"""Outbound calls as the Standard Webhooks libraries see them: real deliveries of ``http`` timeout
topics and of the webhook gateway, captured by a real HTTP receiver on 127.0.0.1 and verified
with the official libraries, PyPI ``standardwebhooks`` and npm ``standardwebhooks``.

Each library must accept the genuine delivery and refuse a tampered body, a replay past its five
minutes and a wrong secret; while a secret is rotated, the old and the new one both verify."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from reminders.engine import topic_model
from reminders.gateways import Message, WebhookGateway
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.runtime.worker import build_worker
from reminders.services import timeout_job_create, timeout_topic_save
from tests.support.standard_webhooks import Check, verify_both
from tests.support.webhook import Webhook, serving_webhook

pytestmark = pytest.mark.django_db

SECRET = "whsec_FrZYC7H/Ecx7GLSPMN94ShGzuXBhLPMwwp1kUned6ug="
OLD_SECRET = "whsec_SQHzyVkBdlZ1sEbXaH8jRzY+T+ZPXUFnEShkpsd6dUs="
WRONG_SECRET = "whsec_EFuBmqxG0ImguHL5wGKaDvqLhfPsLhyqGsKFGQXA8Ko="
# A secret set before the whsec_ form: its UTF-8 bytes are the key.
TEXT_SECRET = "test-webhook-secret-of-thirty-two-bytes"
REPLAY_S = 6 * 60  # past the libraries' five minutes
LIBRARIES = ("python", "node")
README = Path(__file__).parents[2] / "README.md"


@pytest.fixture(autouse=True)
def local_http(settings):
    settings.WEBHOOK_ALLOW_HTTP = True  # the receiver is plain HTTP on loopback


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with serving_webhook() as hook:
        yield hook


@pytest.fixture
def topic(settings, webhook) -> Iterator:
    """``topic(**spec)``: the http topic ``t.hook`` in settings, posting to ``webhook``."""

    def configure(**spec) -> None:
        settings.TIMEOUT_TOPICS = {
            "t.hook": {"type": "http", "url": webhook.url, "slots": 1, **spec}
        }

    yield configure
    topic_model.unregister_topic("t.hook")


@pytest.fixture
def fire(django_capture_on_commit_callbacks):
    """``fire(topic)``: a job due now on ``topic``, fired by a worker; returns the job."""

    def make(topic: str) -> TimeoutJob:
        with django_capture_on_commit_callbacks(execute=True):
            job = timeout_job_create(
                topic=topic,
                biz_type="order",
                biz_id=f"O-{time.monotonic_ns()}",
                action_time=timezone.now() - timedelta(seconds=1),
            )
        worker = build_worker([topic])
        try:
            worker.run_until_idle()
        finally:
            worker.shutdown()
        return job

    return make


def tampered(body: bytes) -> bytes:
    payload = json.loads(body)
    payload["biz_id"] = payload.get("biz_id", "") + "-forged"
    return json.dumps(payload, sort_keys=True).encode()


def assert_genuine_only(headers, body: bytes, secret: str) -> None:
    """Both libraries accept the delivery, and refuse it tampered, replayed later, or checked
    with another secret."""
    answers = verify_both(
        [
            Check(secret, headers, body),
            Check(secret, headers, tampered(body)),
            Check(secret, headers, body, later_s=REPLAY_S),
            Check(WRONG_SECRET, headers, body),
        ]
    )
    for library in LIBRARIES:
        genuine, forged, replayed, wrong = answers[library]
        assert genuine is None, (library, genuine)
        assert "No matching signature" in forged, (library, forged)
        assert "too old" in replayed, (library, replayed)
        assert "No matching signature" in wrong, (library, wrong)


# --- http timeout topics -----------------------------------------------------------------------


def test_an_http_delivery_verifies_with_both_libraries_and_forgeries_do_not(topic, fire, webhook):
    topic(secret=SECRET)
    job = fire("t.hook")
    [(headers, body)] = webhook.requests
    assert headers["webhook-id"] == headers["Idempotency-Key"] == f"t.hook:{job.pk}"
    assert headers["webhook-timestamp"].isdigit()  # integer seconds
    assert headers["webhook-signature"].startswith("v1,")
    assert not any(name.startswith("X-Coupon-Center") for name in headers)  # not asked for
    assert json.loads(body)["action_time"].endswith("Z")
    assert_genuine_only(headers, body, SECRET)


def test_the_webhook_id_is_the_jobs_key_on_every_retry(
    topic, webhook, django_capture_on_commit_callbacks
):
    topic(secret=SECRET, backoff_base_ms=100, backoff_cap_ms=100)
    webhook.status = 500
    with django_capture_on_commit_callbacks(execute=True):
        job = timeout_job_create(
            topic="t.hook",
            biz_type="order",
            biz_id="R-1",
            action_time=timezone.now() - timedelta(seconds=1),
        )
    worker = build_worker(["t.hook"])
    now = [int(time.time() * 1000)]  # the worker's clock: the test moves it, nothing sleeps
    worker.clock = lambda: now[0]
    try:
        assert worker.run_until_idle().retried == 1
        webhook.status = 200
        now[0] += 60_000  # well past the backoff (set from the real clock when it failed)
        assert worker.run_until_idle().acked == 1
    finally:
        worker.shutdown()
    first, second = webhook.requests
    assert first[0]["webhook-id"] == second[0]["webhook-id"] == f"t.hook:{job.pk}"
    answers = verify_both([Check(SECRET, *first), Check(SECRET, *second)])
    assert answers == {library: [None, None] for library in LIBRARIES}


def test_during_a_rotation_both_secrets_verify_and_after_it_only_the_new(fire, webhook, settings):
    row = timeout_topic_save(
        topic=TimeoutTopic(name="t.rotate"),
        type="http",
        target=webhook.url,
        secret=OLD_SECRET,
        allow_http=True,
        slots=1,
    )
    try:
        before = timezone.now()
        timeout_topic_save(topic=row, secret=SECRET)
        row.refresh_from_db()
        assert (row.secret, row.previous_secret) == (SECRET, OLD_SECRET)
        overlap = timedelta(seconds=settings.WEBHOOK_SECRET_OVERLAP_S)
        assert before + overlap <= row.previous_secret_until <= timezone.now() + overlap

        fire("t.rotate")
        headers, body = webhook.requests[-1]
        assert len(headers["webhook-signature"].split(" ")) == 2
        assert_genuine_only(headers, body, SECRET)
        assert_genuine_only(headers, body, OLD_SECRET)

        # The overlap is over: the old secret signs no more.
        timeout_topic_save(topic=row, previous_secret_until=timezone.now() - timedelta(seconds=1))
        fire("t.rotate")
        headers, body = webhook.requests[-1]
        assert len(headers["webhook-signature"].split(" ")) == 1
        answers = verify_both([Check(SECRET, headers, body), Check(OLD_SECRET, headers, body)])
        for library in LIBRARIES:
            new, old = answers[library]
            assert new is None and "No matching signature" in old, (library, answers)
    finally:
        topic_model.unregister_topic("t.rotate")


def test_saving_a_topic_without_a_new_secret_starts_no_rotation(webhook):
    row = timeout_topic_save(
        topic=TimeoutTopic(name="t.same"),
        type="http",
        target=webhook.url,
        secret=SECRET,
        allow_http=True,
    )
    timeout_topic_save(topic=row, secret=SECRET, paused=True)
    row.refresh_from_db()
    assert (row.previous_secret, row.previous_secret_until) == ("", None)


def test_a_text_secret_is_its_bytes_and_legacy_headers_come_when_asked(topic, fire, webhook):
    topic(secret=TEXT_SECRET, legacy_signature=True)
    fire("t.hook")
    [(headers, body)] = webhook.requests
    # A receiver hands the libraries the text as raw bytes, or its whsec_ form: the same key.
    assert_genuine_only(headers, body, TEXT_SECRET)
    as_whsec = "whsec_" + base64.b64encode(TEXT_SECRET.encode()).decode()
    assert verify_both([Check(as_whsec, headers, body)]) == {lib: [None] for lib in LIBRARIES}
    # The older headers, for receivers not yet moved: same timestamp, the text as the key.
    stamp = headers["X-Coupon-Center-Timestamp"]
    assert stamp == headers["webhook-timestamp"]
    expected = hmac.new(TEXT_SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256)
    assert headers["X-Coupon-Center-Signature"] == f"sha256={expected.hexdigest()}"


# --- the webhook gateway -----------------------------------------------------------------------


def message(n: int) -> Message:
    return Message(
        user_id=100 + n,
        dedup_key=f"reminder:{n}",
        title=f"t{n}",
        body="b",
        payload={"coupons": [{"id": n, "claim_opens_at": "2031-03-01T09:00:00Z"}]},
    )


def test_a_gateway_delivery_verifies_with_both_libraries_and_both_secrets(webhook):
    gateway = WebhookGateway(url=webhook.url, secret=SECRET, previous_secret=OLD_SECRET)
    assert [r.ok for r in gateway.deliver([message(0), message(1)])] == [True, True]
    for (headers, _), key in zip(webhook.requests, ["reminder:0", "reminder:1"], strict=True):
        assert headers["webhook-id"] == headers["Idempotency-Key"] == key
        assert not any(name.startswith("X-Coupon-Center") for name in headers)
    headers, body = webhook.requests[0]
    assert_genuine_only(headers, body, SECRET)
    assert_genuine_only(headers, body, OLD_SECRET)


def test_the_gateway_adds_the_legacy_headers_when_asked(webhook, settings):
    settings.NOTIFY_WEBHOOK_LEGACY_SIGNATURE = True
    WebhookGateway(url=webhook.url, secret=SECRET, previous_secret="").deliver([message(0)])
    [(headers, body)] = webhook.requests
    stamp = headers["X-Coupon-Center-Timestamp"]
    expected = hmac.new(SECRET.encode(), stamp.encode() + b"." + body, hashlib.sha256)
    assert headers["X-Coupon-Center-Signature"] == f"sha256={expected.hexdigest()}"
    assert verify_both([Check(SECRET, headers, body)]) == {lib: [None] for lib in LIBRARIES}


# --- the upgrade -------------------------------------------------------------------------------

BEFORE = [("reminders", "0015_timeout_topic_knob_help")]


@pytest.fixture
def latest_schema_after():
    """The database back at the latest migrations afterwards (later ones partition tables), for
    the tests that follow."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_http_topics_kept_as_data_keep_the_legacy_headers_on_upgrade(latest_schema_after):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps.get_model("reminders", "TimeoutTopic")
        old.objects.create(name="old.http", type="http", target="https://h.example.com/x",
                           secret=TEXT_SECRET)  # fmt: skip
        old.objects.create(name="old.log", type="log")
    finally:
        # Through 0016 (which marks the topics) to the latest: the models below are today's.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    legacy = dict(TimeoutTopic.objects.values_list("name", "legacy_signature"))
    assert legacy == {"old.http": True, "old.log": False}
    new = timeout_topic_save(topic=TimeoutTopic(name="new.http"), type="http",
                             target="https://h.example.com/y", secret=SECRET)  # fmt: skip
    assert new.legacy_signature is False  # a new topic sends the standard headers only


def test_the_readmes_receiver_accepts_a_delivery_and_refuses_a_forgery(topic, fire, webhook):
    """The Python block of README's "Verifying a webhook", run as printed (with the secret)."""
    section = README.read_text().split("### Verifying a webhook", 1)[1].split("\n## ", 1)[0]
    block = "\n".join(
        line.removeprefix("    ")
        for line in section.splitlines()
        if line.startswith("    ") or not line.strip()
    ).strip()
    assert "Webhook(" in block
    namespace: dict = {}
    exec(block.replace('"whsec_..."', repr(SECRET)), namespace)  # noqa: S102 - our own README
    topic(secret=SECRET)
    job = fire("t.hook")
    [(headers, body)] = webhook.requests
    assert namespace["receive"](body, headers)["job_id"] == job.pk
    with pytest.raises(namespace["WebhookVerificationError"]):
        namespace["receive"](tampered(body), headers)
