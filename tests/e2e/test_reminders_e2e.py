"""Issue 4 end to end: subscribe over the API, a real reminder worker and a real Celery worker
deliver into the inbox; every user sees exactly one notification, on time."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from couponcenter.coupons import services as coupon_services
from reminders.engine import queue
from reminders.members import REMINDER_TOPIC, member
from reminders.models import Notification, ReminderSubscription
from tests.e2e.conftest import backlog, wait_for
from tests.support.factories import CouponFactory, api_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

USERS = 200
LEAD = timedelta(seconds=5)


def _service_client() -> APIClient:
    _, token = api_user(perms=("couponcenter.act_for_any_user",))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _inbox(client: APIClient, user_id: int) -> list[dict]:
    response = client.get(f"/api/users/{user_id}/notifications/")
    assert response.status_code == 200, response.content
    return response.json()["results"]


def _parse(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_every_subscriber_is_reminded_once_on_time(stack, reminder_settings):
    reminder_settings.change(slots=16, tick_interval_ms=200, merge_window_ms=1000)
    stack.start_celery()
    client = _service_client()
    # Subscribe while the coupons open in an hour, then move the opening close: subscribing over
    # HTTP takes a while, and moving the time must move every reminder. The reminder worker starts
    # once all four have moved: one coupon at a time, the first one's reminders fall due before the
    # others move, and a worker running then sends user 1's first reminder alone (merging joins
    # what falls due together, not what is moved beside it later).
    later = timezone.now() + timedelta(hours=1)
    coupon = CouponFactory(claim_opens_at=later, reminder_lead=LEAD, name="Big sale")
    siblings = [CouponFactory(claim_opens_at=later, reminder_lead=LEAD) for _ in range(2)]
    doomed = CouponFactory(claim_opens_at=later, reminder_lead=LEAD, name="Doomed")
    users = list(range(1, USERS + 1))
    cancelled_users, leaver = [1001, 1002, 1003], 2001

    for user_id in users + [leaver]:
        response = client.put(f"/api/users/{user_id}/reminders/{coupon.pk}/")
        assert response.status_code == 201, response.content
    for sibling in siblings:  # user 1 follows three coupons opening at the same instant
        assert client.put(f"/api/users/1/reminders/{sibling.pk}/").status_code == 201
    for user_id in cancelled_users:
        assert client.put(f"/api/users/{user_id}/reminders/{doomed.pk}/").status_code == 201
    assert client.put(f"/api/users/5/reminders/{coupon.pk}/").status_code == 200  # idempotent

    # Due inside the pre-stage window, but far enough off for the worker's start, the leaver's
    # unsubscribe and the cancel to come first on a loaded machine: each of them then races the
    # staging of its reminder, not its showing.
    opens = timezone.now() + LEAD + timedelta(seconds=25)
    for c in [coupon, *siblings, doomed]:
        coupon_services.coupon_update(coupon=c, claim_opens_at=opens)

    stack.start_reminder_worker()

    leaver_sub = ReminderSubscription.objects.get(user_id=leaver, coupon=coupon)
    entry = member(leaver_sub.pk)

    # Due within the pre-stage window, the leaver's reminder is claimed as soon as the worker runs:
    # once it is in flight to delivery or already written, hidden, the unsubscribe must still win.
    wait_for(
        lambda: queue.place(REMINDER_TOPIC, leaver_sub.slot, entry).where != "scheduled",
        timeout=60,
        what="the leaver's reminder claimed by the worker (staged or in flight)",
    )
    assert client.delete(f"/api/users/{leaver}/reminders/{coupon.pk}/").status_code == 204
    assert queue.place(REMINDER_TOPIC, leaver_sub.slot, entry).where != "scheduled"
    assert not Notification.objects.filter(user_id=leaver).exists()  # withdrawn before it showed
    coupon_services.coupon_cancel(coupon=doomed)

    # Done when every entry has left Redis: nothing is scheduled or in flight any more, so no
    # delivery (and no duplicate) can still come. Observed, not timed: how late a reminder is
    # is the benchmarks' figure (bench_reminders: steady lateness p99), not this test's.
    # Pre-staged rows are written before their due time and shown from it: the due moment must
    # have passed too before the inboxes are read.
    wait_for(
        lambda: (
            Notification.objects.count() >= USERS
            and backlog() == {"store": 0, "prepare": 0, "dead": 0}
            and timezone.now() >= opens - LEAD
        ),
        timeout=(opens - timezone.now()).total_seconds() + 120,
        what=f"{USERS} notifications and an empty schedule\n{stack.logs()}",
    )

    remind_at = opens - LEAD
    for user_id in users:
        inbox = _inbox(client, user_id)
        assert len(inbox) == 1, (user_id, inbox)
        # Never shown early: a pre-staged row is written before its due time but visible from
        # it, a late one from when it was written.
        shown = max(_parse(inbox[0]["created_at"]), _parse(inbox[0]["visible_at"]))
        assert remind_at <= shown, (user_id, shown, remind_at)
    merged = _inbox(client, 1)[0]
    assert merged["title"].startswith("3 coupons you follow open")
    assert sorted(c["id"] for c in merged["payload"]["coupons"]) == sorted(
        [coupon.pk] + [s.pk for s in siblings]
    )
    for user_id in cancelled_users + [leaver]:
        assert _inbox(client, user_id) == []
        assert not Notification.objects.filter(user_id=user_id).exists()  # not even hidden
    assert Notification.objects.count() == USERS

    statuses = dict(
        ReminderSubscription.objects.filter(coupon=coupon).values_list("user_id", "status")
    )
    assert statuses.pop(leaver) == "cancelled"
    assert set(statuses.values()) == {"sent"}
    assert set(
        ReminderSubscription.objects.filter(coupon=doomed).values_list("status", flat=True)
    ) == {"cancelled"}
    assert backlog() == {"store": 0, "prepare": 0, "dead": 0}

    listed = client.get(f"/api/users/{leaver}/reminders/").json()["results"]
    assert [(r["coupon"], r["status"]) for r in listed] == [(coupon.pk, "cancelled")]
