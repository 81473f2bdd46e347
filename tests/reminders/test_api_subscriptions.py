"""PUT / DELETE / GET /api/users/{user_id}/reminders/... against the real database and Redis."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from reminders.engine import queue
from reminders.members import REMINDER_TOPIC, member
from reminders.models import ReminderSubscription
from tests.support.factories import CouponFactory, api_user

pytestmark = pytest.mark.django_db(transaction=True)


def _client(token: str | None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def service():
    return _client(api_user(perms=("couponcenter.act_for_any_user",))[1])


@pytest.fixture
def upcoming():
    return CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1), name="Upcoming")


def _url(user_id, coupon_id) -> str:
    return f"/api/users/{user_id}/reminders/{coupon_id}/"


def _in_redis(sub: ReminderSubscription) -> bool:
    return queue.place(REMINDER_TOPIC, sub.slot, member(sub.pk)).where == "scheduled"


def test_put_creates_then_is_idempotent(service, upcoming, reminder_settings):
    first = service.put(_url(7, upcoming.pk))
    assert first.status_code == 201, first.content
    body = first.json()
    assert (body["coupon"], body["user_id"], body["status"]) == (upcoming.pk, 7, "scheduled")
    assert body["coupon_name"] == "Upcoming"
    sub = ReminderSubscription.objects.get()
    assert sub.remind_at == upcoming.claim_opens_at - timedelta(seconds=60)
    assert _in_redis(sub)

    again = service.put(_url(7, upcoming.pk))
    assert again.status_code == 200
    assert again.json()["id"] == body["id"]
    assert ReminderSubscription.objects.count() == 1


def test_delete_is_idempotent_and_removes_the_entry(service, upcoming, reminder_settings):
    service.put(_url(7, upcoming.pk))
    sub = ReminderSubscription.objects.get()
    assert service.delete(_url(7, upcoming.pk)).status_code == 204
    assert service.delete(_url(7, upcoming.pk)).status_code == 204
    sub.refresh_from_db()
    assert sub.status == "cancelled"
    assert not _in_redis(sub)
    # Subscribing again schedules afresh.
    assert service.put(_url(7, upcoming.pk)).status_code == 201
    sub.refresh_from_db()
    assert sub.status == "scheduled" and _in_redis(sub)


def test_delete_without_a_subscription_is_204(service, upcoming):
    assert service.delete(_url(7, upcoming.pk)).status_code == 204
    assert not ReminderSubscription.objects.exists()


@pytest.mark.parametrize(
    ("coupon_kw", "code"),
    [
        ({"status": "cancelled"}, "cancelled"),
        ({"claim_opens_at_s": -7200, "claim_closes_at_s": -60}, "closed"),
        ({"claim_opens_at_s": -60}, "already_open"),
    ],
)
def test_put_refusals_are_409_with_a_code(service, reminder_settings, coupon_kw, code):
    now = timezone.now()
    kw = {"claim_opens_at": now + timedelta(seconds=coupon_kw.pop("claim_opens_at_s", 3600))}
    if "claim_closes_at_s" in coupon_kw:
        kw["claim_closes_at"] = now + timedelta(seconds=coupon_kw.pop("claim_closes_at_s"))
    coupon = CouponFactory(**kw, **coupon_kw)
    response = service.put(_url(7, coupon.pk))
    assert response.status_code == 409, response.content
    assert response.json()["code"] == code
    assert not ReminderSubscription.objects.exists()


def test_unknown_coupon_is_404(service, reminder_settings):
    assert service.put(_url(7, 999_999)).status_code == 404
    assert service.delete(_url(7, 999_999)).status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/api/users/abc/reminders/1/",
        "/api/users/7/reminders/abc/",
        "/api/users/-7/reminders/1/",
        "/api/users/7/reminders/1.5/",
        "/api/users/7/reminders/9999999999999999999999/",
        "/api/users/99999999999999999999/reminders/1/",
    ],
)
def test_bad_ids_are_rejected_cleanly(service, path):
    for method in ("put", "delete", "get"):
        assert getattr(service, method)(path).status_code in (400, 404), (method, path)
    assert not ReminderSubscription.objects.exists()


def test_linked_account_acts_only_for_its_user(upcoming, reminder_settings):
    _, token = api_user(end_user_id=7)
    client = _client(token)
    assert client.put(_url(8, upcoming.pk)).status_code == 403
    assert client.delete(_url(8, upcoming.pk)).status_code == 403
    assert client.get("/api/users/8/reminders/").status_code == 403
    assert client.get("/api/users/8/notifications/").status_code == 403
    assert client.put(_url(7, upcoming.pk)).status_code == 201
    assert not ReminderSubscription.objects.filter(user_id=8).exists()


def test_anonymous_is_401(upcoming):
    assert _client(None).put(_url(7, upcoming.pk)).status_code == 401
    assert _client(None).get("/api/users/7/reminders/").status_code == 401


def test_get_lists_a_users_reminders(service, reminder_settings):
    later = timezone.now() + timedelta(hours=1)
    kept, dropped = CouponFactory(claim_opens_at=later), CouponFactory(claim_opens_at=later)
    service.put(_url(7, kept.pk))
    service.put(_url(7, dropped.pk))
    service.delete(_url(7, dropped.pk))
    service.put(_url(8, kept.pk))

    response = service.get("/api/users/7/reminders/")
    assert response.status_code == 200
    rows = {r["coupon"]: r["status"] for r in response.json()["results"]}
    assert rows == {kept.pk: "scheduled", dropped.pk: "cancelled"}
    assert response.json()["count"] == 2
    assert service.get("/api/users/9/reminders/").json()["results"] == []


def test_put_after_the_reminder_was_sent_is_a_no_op(service, upcoming, reminder_settings):
    service.put(_url(7, upcoming.pk))
    sub = ReminderSubscription.objects.get()
    ReminderSubscription.objects.filter(pk=sub.pk).update(status="sent")
    queue.cancel(REMINDER_TOPIC, member(sub.pk), slot=sub.slot)  # acked
    response = service.put(_url(7, upcoming.pk))
    assert response.status_code == 200
    assert response.json()["status"] == "sent"
    assert not _in_redis(sub)


def test_put_after_a_failed_reminder_moves_it_out_of_the_dead_set(
    service, upcoming, reminder_settings
):
    reminder_settings.change(slots=16)
    service.put(_url(7, upcoming.pk))
    sub = ReminderSubscription.objects.get()
    job = member(sub.pk)
    # Three failed deliveries: the entry is dead in its slot, the subscription failed.
    queue.schedule(REMINDER_TOPIC, job, 0, slot=sub.slot)
    claimed = queue.claim(REMINDER_TOPIC, sub.slot, now_ms=1, limit=10, visibility_ms=1000,
                          lease_token=queue.HANDED_TOKEN)  # fmt: skip
    assert [c.job_id for c in claimed] == [job]
    queue.nack_handed(REMINDER_TOPIC, sub.slot, [(job, "HTTP 500")], now_ms=2, max_attempts=1,
                      backoff_base_ms=0, backoff_cap_ms=0)  # fmt: skip
    ReminderSubscription.objects.filter(pk=sub.pk).update(status="failed")
    reminder_settings.change(slots=1)  # a new layout: the new entry lands in another slot

    assert service.put(_url(7, upcoming.pk)).status_code == 201
    sub.refresh_from_db()
    assert (sub.status, sub.slot) == ("scheduled", 0)
    assert _in_redis(sub)
    dead = [d.job_id for s in range(16) for d in queue.list_dead(REMINDER_TOPIC, s)]
    assert dead == []
