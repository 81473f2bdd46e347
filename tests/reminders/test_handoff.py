"""Handing reminders to Celery: one task per claim round over all slots, settled per slot.

Real broker (the test Redis), real database; the task is run from the message the dispatcher
published, as a Celery worker would run it.
"""

import base64
import json
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.celery import app as celery_app
from couponcenter.core.redis import broker_client, broker_queue_delete
from reminders import metrics
from reminders.engine import keys, queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.engine.connection import client as engine_client
from reminders.handlers.coupon_reminders import end_round, handle_reminders
from reminders.members import REMINDER_TOPIC, member
from reminders.models import Notification, ReminderSubscription
from reminders.runtime.worker import build_worker
from reminders.services import subscription_subscribe
from reminders.services.delivery import reminders_deliver
from tests.support.factories import CouponFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def delivery_queue(settings):
    """A Celery queue of this test's own on the real broker (non-eager publishing)."""
    name = f"test-delivery-{uuid.uuid4().hex[:8]}"
    # The app reads Django's settings under the CELERY namespace: set the namespaced keys.
    before = celery_app.conf.task_default_queue
    celery_app.conf.CELERY_TASK_DEFAULT_QUEUE = name
    assert celery_app.conf.task_default_queue == name
    settings.DELIVERY_QUEUE = name
    client = broker_client()
    if client is None:
        pytest.skip("needs a Redis broker")
    yield name, client
    celery_app.conf.CELERY_TASK_DEFAULT_QUEUE = before
    broker_queue_delete(name)


def _reset_producers() -> None:
    celery_app._pool = None
    celery_app.amqp._producer_pool = None
    # Celery reads task_publish_retry once, when it first builds its task sender: build it anew.
    celery_app.amqp.__dict__.pop("send_task_message", None)


@pytest.fixture
def broker_down(monkeypatch):
    """Celery publishes to a closed port: publishing fails with a connection error.

    Publishing connects to ``broker_write_url``. ``CELERY_BROKER_URL`` in the environment would
    win over ``broker_url`` (Celery reads it first), but not over an explicit write URL; and the
    sender is rebuilt so that ``task_publish_retry`` applies whatever was published before.
    """
    monkeypatch.delenv("CELERY_BROKER_WRITE_URL", raising=False)
    before = (celery_app.conf.broker_write_url, celery_app.conf.task_publish_retry)
    celery_app.conf.CELERY_BROKER_WRITE_URL = "redis://127.0.0.1:1/0"
    celery_app.conf.CELERY_TASK_PUBLISH_RETRY = False
    assert celery_app.conf.broker_write_url == "redis://127.0.0.1:1/0"
    _reset_producers()
    yield
    celery_app.conf.CELERY_BROKER_WRITE_URL, celery_app.conf.CELERY_TASK_PUBLISH_RETRY = before
    _reset_producers()


def _published(name: str, client) -> list[dict]:
    """The task arguments of every message in the queue (kombu's JSON envelope, protocol 2)."""
    batches = []
    for raw in client.lrange(name, 0, -1):
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        batches.append(body[0][0])
    return batches


def _subscribers(count: int, opens_in_s: float = 30):
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=opens_in_s))
    subs = [subscription_subscribe(user_id=u, coupon=coupon)[0] for u in range(1, count + 1)]
    return coupon, subs


def _in_flight(slots: int = 16) -> tuple[int, int]:
    stats = queue.stats(REMINDER_TOPIC, range(slots), now_ms=epoch_ms())
    return sum(s.store for s in stats), sum(s.prepare for s in stats)


def test_one_round_over_many_slots_is_one_task_settled_per_slot(reminder_settings, delivery_queue):
    name, client = delivery_queue
    reminder_settings.change(slots=16)
    _, subs = _subscribers(40)
    assert len({s.slot for s in subs}) > 4  # spread over many slots
    worker = build_worker([REMINDER_TOPIC])
    try:
        report = worker.run_once()
    finally:
        worker.shutdown()
    assert report.claimed == 40
    (batch,) = _published(name, client)
    assert batch["topic"] == REMINDER_TOPIC
    # One parcel per slot's claimed batch: its members travel as the string Redis returned.
    assert {slot for slot, _, _ in batch["parcels"]} == {s.slot for s in subs}
    assert len(batch["parcels"]) == len({s.slot for s in subs})
    assert sorted(m for _, _, packed in batch["parcels"] for m in packed.split(",")) == sorted(
        member(s.pk) for s in subs
    )
    assert _in_flight() == (0, 40)  # handed on: in flight until the task settles them
    raw = engine_client()
    in_prepare = sum(raw.zcard(keys.slot_keys(REMINDER_TOPIC, s).prepare) for s in range(16))
    assert in_prepare == len(batch["parcels"])  # one prepare entry per parcel, not per reminder

    assert reminders_deliver(batch)["delivered"] == 40
    assert Notification.objects.count() == 40
    assert _in_flight() == (0, 0)  # acked in every slot


def test_full_batches_go_out_at_once_during_a_round(reminder_settings, delivery_queue):
    name, client = delivery_queue
    reminder_settings.change(slots=1, batch_size=10)
    _subscribers(25)
    worker = build_worker([REMINDER_TOPIC])
    try:
        worker.run_until_idle()
    finally:
        worker.shutdown()
    sizes = sorted(
        sum(len(packed.split(",")) for _, _, packed in b["parcels"])
        for b in _published(name, client)
    )
    assert sizes == [5, 10, 10]


def test_a_round_records_its_dispatched_count_once_at_its_end(reminder_settings, delivery_queue):
    """Per batch, handing on only adds to the round's count; the round's end records it (one
    metrics round trip per round, not one per batch)."""
    reminder_settings.change(slots=1, batch_size=10)
    _subscribers(25)
    # A running system's marker: the worker below must not take Redis for empty and rebuild it
    # (NX cannot see into the parcel claimed here, so a rebuild would index its ten again).
    engine_client().set(keys.epoch(), "set by an earlier worker")
    before = metrics.count(REMINDER_TOPIC, "dispatched", minutes=2)
    token = scripts.lease_acquire(engine_client(), keys.slot_keys(REMINDER_TOPIC, 0),
                                  holder="test", ttl_ms=60_000)  # fmt: skip
    parcel = queue.claim_parcel(REMINDER_TOPIC, 0, now_ms=epoch_ms() + 60_000, limit=10,
                                visibility_ms=30_000, lease_token=token)  # fmt: skip
    scripts.lease_release(engine_client(), keys.slot_keys(REMINDER_TOPIC, 0).lease, token=token)
    assert parcel.size == 10
    handle_reminders(REMINDER_TOPIC, parcel, 0)
    assert metrics.count(REMINDER_TOPIC, "dispatched", minutes=2) == before  # not yet

    end_round(REMINDER_TOPIC)
    assert metrics.count(REMINDER_TOPIC, "dispatched", minutes=2) == before + 10
    end_round(REMINDER_TOPIC)  # nothing new: nothing recorded twice
    assert metrics.count(REMINDER_TOPIC, "dispatched", minutes=2) == before + 10

    worker = build_worker([REMINDER_TOPIC])
    try:
        worker.run_until_idle()
    finally:
        worker.shutdown()
    assert metrics.count(REMINDER_TOPIC, "dispatched", minutes=2) == before + 25


def test_a_refused_publish_puts_the_round_back_with_backoff(
    reminder_settings, delivery_queue, broker_down, caplog
):
    reminder_settings.change(backoff_ms=60_000)
    _subscribers(12)
    worker = build_worker([REMINDER_TOPIC])
    try:
        report = worker.run_once()
    finally:
        worker.shutdown()
    assert report.claimed == 12
    assert _in_flight() == (12, 0)  # back in store, not stuck in prepare
    assert "handing 12 reminders" in caplog.text
    stats = queue.stats(REMINDER_TOPIC, range(16), now_ms=epoch_ms())
    assert sum(s.due for s in stats) == 0  # waiting out the backoff
    assert not Notification.objects.exists()
    assert set(ReminderSubscription.objects.values_list("status", flat=True)) == {"scheduled"}


def test_a_one_slot_batch_of_the_previous_format_is_still_delivered(reminder_settings):
    reminder_settings.change(slots=1)
    _subscribers(3)
    # Claimed and handed on as a worker of the previous release did, one slot per task.
    token = queue.HANDED_TOKEN
    claimed = queue.claim(
        REMINDER_TOPIC, 0, now_ms=epoch_ms(), limit=100, visibility_ms=60_000,
        lease_token=token,
    )  # fmt: skip
    members = [e.job_id for e in claimed]
    assert len(members) == 3
    result = reminders_deliver({"topic": REMINDER_TOPIC, "slot": 0, "members": members})
    assert result["delivered"] == 3
    assert Notification.objects.count() == 3
    assert queue.stats(REMINDER_TOPIC, [0], now_ms=epoch_ms())[0].prepare == 0
