"""Issue 4 under faults, with real processes: a failing webhook (only the failed items are retried,
three attempts, then the dead queue and an alert), and SIGKILLed workers (nothing lost, nothing
shown twice)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.utils import timezone

from reminders.engine.keys import slot_for
from reminders.members import member
from reminders.models import Notification, ReminderSubscription
from reminders.services import subscription_subscribe, subscriptions_rebuild
from tests.e2e.conftest import backlog, dead_members, drained, wait_for
from tests.support.factories import CouponFactory
from tests.support.standard_webhooks import Check, verify_python

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SECRET = "e2e-webhook-secret-of-32-bytes-or-more"
Status = ReminderSubscription.Status


def _due_coupon(**kw):
    """A coupon opening in 40 s with the default 60 s lead: its reminders are due at once."""
    return CouponFactory(claim_opens_at=timezone.now() + timedelta(seconds=40), **kw)


def _subscribe_bulk(coupon, user_ids: list[int], slots: int) -> None:
    """Many due subscriptions at once: rows in bulk, then indexed the way a rebuild does."""
    ReminderSubscription.objects.bulk_create(
        ReminderSubscription(
            coupon=coupon,
            user_id=u,
            remind_at=coupon.claim_opens_at - coupon.reminder_lead,
            slot=slot_for(u, slots),
        )
        for u in user_ids
    )
    assert subscriptions_rebuild() == len(user_ids)


def _webhook_env(stack, hook, alert=None) -> None:
    stack.env.update(
        NOTIFY_WEBHOOK_URL=hook.url,
        NOTIFY_WEBHOOK_SECRET=SECRET,
        WEBHOOK_ALLOW_HTTP="1",
        ALERT_WEBHOOK_URL=alert.url if alert else "",
    )


def _user_of(request) -> int:
    return request.json()["user_id"]


def _signed(request) -> bool:
    return verify_python(Check(SECRET, request.headers, request.body)) is None


def test_failing_webhook_retries_only_failed_items_then_dead_and_alert(
    stack, reminder_settings, receiver_factory, settings
):
    # The webhook gateway is refused without a target: the workers get theirs from their
    # environment (_webhook_env); this process, which saves the settings, needs one too.
    settings.NOTIFY_WEBHOOK_URL = "http://127.0.0.1/the-workers-have-their-own"
    reminder_settings.change(gateway="webhook", backoff_ms=200, max_attempts=3, slots=4,
                             tick_interval_ms=200)  # fmt: skip
    hook, alert = receiver_factory(), receiver_factory()
    users = list(range(1, 21))
    failing = {3, 7, 11, 15, 19}
    hook.respond = lambda body: 500 if json.loads(body)["user_id"] in failing else 200
    _webhook_env(stack, hook, alert)
    stack.start()
    coupon = _due_coupon(name="Flash deal")
    subs = {u: subscription_subscribe(user_id=u, coupon=coupon)[0] for u in users}

    def settled() -> bool:
        hits = Counter(_user_of(r) for r in hook.snapshot())
        # The dead may go in more than one round, each with its own alert: every one alerted.
        alerted = {s for r in alert.snapshot() for s in r.json()["details"]["subscriptions"]}
        return (
            all(hits[u] >= (3 if u in failing else 1) for u in users)
            and ReminderSubscription.objects.filter(status=Status.FAILED).count() == len(failing)
            and alerted >= {subs[u].pk for u in failing}
        )

    wait_for(settled, timeout=90, what=f"retries, dead and alert\n{stack.logs()}")
    drained(dead=len(failing), stack=stack)

    requests = hook.snapshot()
    hits = Counter(_user_of(r) for r in requests)
    assert hits == {u: 3 if u in failing else 1 for u in users}
    assert all(_signed(r) for r in requests)
    keys = defaultdict(set)
    for r in requests:
        keys[_user_of(r)].add(r.headers["Idempotency-Key"])
    assert all(len(k) == 1 for k in keys.values()), "a retry must reuse the idempotency key"
    # Retries wait for the backoff: 200 ms, then 400 ms.
    for u in failing:
        times = sorted(r.at for r in requests if _user_of(r) == u)
        assert times[1] - times[0] >= 0.2 and times[2] - times[1] >= 0.4, times

    statuses = dict(ReminderSubscription.objects.values_list("user_id", "status"))
    assert statuses == {u: Status.FAILED if u in failing else Status.SENT for u in users}
    assert dead_members() == {member(subs[u].pk) for u in failing}
    assert backlog() == {"store": 0, "prepare": 0, "dead": len(failing)}

    alerts = [r.json() for r in alert.snapshot()]
    assert all(a["text"].startswith(":rotating_light:") for a in alerts)
    assert all("dead after 3 attempts" in a["title"] for a in alerts)
    alerted = {s for a in alerts for s in a["details"]["subscriptions"]}
    assert alerted == {subs[u].pk for u in failing}


def test_reminder_worker_killed_mid_run_loses_and_repeats_nothing(stack, reminder_settings):
    users = list(range(1, 2001))
    reminder_settings.change(slots=16, batch_size=20, max_delivery_queue=2,
                             visibility_timeout_ms=3000, max_attempts=5,
                             tick_interval_ms=200)  # fmt: skip
    coupon = _due_coupon()
    _subscribe_bulk(coupon, users, slots=16)
    stack.start_celery()
    worker = stack.start_reminder_worker()

    wait_for(Notification.objects.exists, timeout=30, interval=0.01, what="first deliveries")
    worker.kill()
    left = backlog()
    assert left["store"] + left["prepare"] > 0, f"the kill came too late to test anything: {left}"
    stack.start_reminder_worker()

    wait_for(
        lambda: Notification.objects.count() >= len(users),
        timeout=60,
        what=f"{len(users)} notifications\n{stack.logs()}",
    )
    drained(stack=stack)
    per_user = Counter(Notification.objects.values_list("user_id", flat=True))
    assert per_user == dict.fromkeys(users, 1)
    assert set(ReminderSubscription.objects.values_list("status", flat=True)) == {Status.SENT}
    assert backlog() == {"store": 0, "prepare": 0, "dead": 0}


def test_celery_worker_killed_mid_delivery_notifies_everyone_once(
    stack, reminder_settings, receiver_factory, settings
):
    users = list(range(1, 101))
    settings.NOTIFY_WEBHOOK_URL = "http://127.0.0.1/the-workers-have-their-own"  # as above
    reminder_settings.change(gateway="webhook", slots=4, batch_size=10, max_attempts=5,
                             visibility_timeout_ms=3000, tick_interval_ms=200)  # fmt: skip
    hook = receiver_factory()
    hook.delay_s = 0.02  # slow enough for the kill to land in the middle of a batch
    _webhook_env(stack, hook)
    celery = stack.start_celery()
    stack.start_reminder_worker()
    coupon = _due_coupon()
    _subscribe_bulk(coupon, users, slots=4)

    def seen() -> set[int]:
        return {_user_of(r) for r in hook.snapshot()}

    wait_for(lambda: len(seen()) >= 20, timeout=30, interval=0.01, what="first deliveries")
    celery.kill()
    assert len(seen()) < len(users), "the kill came too late to test anything"
    stack.start_celery()

    wait_for(
        lambda: (
            len(seen()) >= len(users)
            and not ReminderSubscription.objects.filter(status=Status.SCHEDULED).exists()
        ),
        timeout=60,
        what=f"every user notified\n{stack.logs()}",
    )
    drained(stack=stack)
    keys = defaultdict(set)
    for r in hook.snapshot():
        assert _signed(r)
        keys[_user_of(r)].add(r.headers["Idempotency-Key"])
    # At-least-once on the wire; the receiver dedups by key, so each user sees exactly one.
    assert {u: len(k) for u, k in keys.items()} == dict.fromkeys(users, 1)
    assert set(ReminderSubscription.objects.values_list("status", flat=True)) == {Status.SENT}
    assert backlog() == {"store": 0, "prepare": 0, "dead": 0}
