"""The coupon services against a real database: validation, claims, refusals, redeem, hooks."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from couponcenter.coupons import services, signals
from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.coupons.rules import ClaimRefused, CouponStateError, RedeemRefused
from expiry.models import ExpiryTask
from reminders.models import ReminderSubscription
from reminders.services import subscription_subscribe
from tests.support.factories import CouponFactory, UserCouponFactory

pytestmark = pytest.mark.django_db


def valid_fields(**overrides) -> dict:
    fields = {
        "name": "Spring sale",
        "claim_opens_at": timezone.now() + timedelta(hours=1),
        "total_stock": 10,
        "valid_for": timedelta(days=7),
    }
    return {**fields, **overrides}


# --- create / update / cancel -----------------------------------------------------------------


def test_create_applies_defaults():
    coupon = services.coupon_create(**valid_fields())
    coupon.refresh_from_db()
    assert coupon.status == Coupon.Status.ACTIVE
    assert coupon.per_user_limit == 1
    assert coupon.reminder_lead == timedelta(seconds=60)
    assert coupon.claimed_count == 0


def test_create_with_fixed_expiry():
    opens = timezone.now() + timedelta(hours=1)
    coupon = services.coupon_create(
        **valid_fields(claim_opens_at=opens, valid_for=None, expires_at=opens + timedelta(days=1))
    )
    assert coupon.expires_at == opens + timedelta(days=1)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"valid_for": None}, "valid_for"),
        ({"expires_at": datetime(2100, 1, 1, tzinfo=UTC)}, "valid_for"),
        ({"valid_for": timedelta(0)}, "valid_for"),
        ({"valid_for": timedelta(seconds=-1)}, "valid_for"),
        ({"valid_for": timedelta(days=100_000)}, "valid_for"),
        ({"reminder_lead": timedelta(seconds=-1)}, "reminder_lead"),
        ({"reminder_lead": timedelta(days=8)}, "reminder_lead"),
        ({"total_stock": 0}, "total_stock"),
        ({"total_stock": 2_000_000_001}, "total_stock"),
        ({"per_user_limit": 0}, "per_user_limit"),
        ({"per_user_limit": 1001}, "per_user_limit"),
        ({"name": ""}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"reminder_priority": "urgent"}, "reminder_priority"),
        ({"claim_opens_at": datetime(1, 1, 1, tzinfo=UTC)}, "claim_opens_at"),
        ({"claim_opens_at": datetime(9999, 12, 31, tzinfo=UTC)}, "claim_opens_at"),
    ],
)
def test_create_refuses_bad_fields_and_writes_nothing(overrides, field):
    with pytest.raises(ValidationError) as exc:
        services.coupon_create(**valid_fields(**overrides))
    assert field in exc.value.message_dict
    assert not Coupon.objects.exists()


def test_create_refuses_a_window_that_closes_before_it_opens():
    opens = timezone.now() + timedelta(hours=1)
    with pytest.raises(ValidationError) as exc:
        services.coupon_create(**valid_fields(claim_opens_at=opens, claim_closes_at=opens))
    assert "claim_closes_at" in exc.value.message_dict
    with pytest.raises(ValidationError) as exc:
        services.coupon_create(
            **valid_fields(claim_opens_at=opens, valid_for=None, expires_at=opens)
        )
    assert "expires_at" in exc.value.message_dict
    assert not Coupon.objects.exists()


def test_update_changes_only_given_fields():
    coupon = CouponFactory(total_stock=10)
    updated = services.coupon_update(coupon=coupon, total_stock=20, name="Renamed")
    fresh = Coupon.objects.get(pk=coupon.pk)
    assert (updated.total_stock, fresh.total_stock, fresh.name) == (20, 20, "Renamed")
    assert fresh.valid_for == timedelta(days=7)


def test_update_cannot_drop_stock_below_claims():
    coupon = CouponFactory(total_stock=5)
    for user_id in (1, 2, 3):
        services.coupon_claim(coupon_id=coupon.pk, user_id=user_id)
    with pytest.raises(ValidationError) as exc:
        services.coupon_update(coupon=coupon, total_stock=2)
    assert "total_stock" in exc.value.message_dict
    assert Coupon.objects.get(pk=coupon.pk).total_stock == 5
    services.coupon_update(coupon=coupon, total_stock=3)
    assert Coupon.objects.get(pk=coupon.pk).remaining_stock == 0


def test_update_does_not_overwrite_claimed_count():
    coupon = CouponFactory()
    stale = Coupon.objects.get(pk=coupon.pk)
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    services.coupon_update(coupon=stale, name="Renamed")
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 1


def test_update_refuses_unknown_fields_and_cancelled_coupons():
    coupon = CouponFactory()
    with pytest.raises(TypeError):
        services.coupon_update(coupon=coupon, claimed_count=0)
    services.coupon_cancel(coupon=coupon)
    with pytest.raises(CouponStateError) as exc:
        services.coupon_update(coupon=coupon, name="x")
    assert exc.value.code == "cancelled"


def test_update_invalid_changes_nothing():
    coupon = CouponFactory(name="Before")
    with pytest.raises(ValidationError):
        services.coupon_update(coupon=coupon, name="After", valid_for=None)
    assert Coupon.objects.get(pk=coupon.pk).name == "Before"


def test_moving_the_opening_moves_reminders():
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1))
    sub, _ = subscription_subscribe(user_id=7, coupon=coupon)
    new_opening = coupon.claim_opens_at + timedelta(hours=2)
    services.coupon_update(coupon=coupon, claim_opens_at=new_opening)
    sub.refresh_from_db()
    assert sub.remind_at == new_opening - coupon.reminder_lead


def test_cancel_is_idempotent_and_cancels_reminders():
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1))
    sub, _ = subscription_subscribe(user_id=7, coupon=coupon)
    assert services.coupon_cancel(coupon=coupon).status == Coupon.Status.CANCELLED
    assert services.coupon_cancel(coupon=coupon).status == Coupon.Status.CANCELLED
    sub.refresh_from_db()
    assert sub.status == ReminderSubscription.Status.CANCELLED


def test_reminder_hooks_tolerate_a_missing_reminders_services_module(monkeypatch):
    # ``None`` in sys.modules makes the import fail exactly as a missing module does.
    monkeypatch.setitem(sys.modules, "reminders.services", None)
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=1))
    services.coupon_update(coupon=coupon, claim_opens_at=coupon.claim_opens_at + timedelta(1))
    assert services.coupon_cancel(coupon=coupon).status == Coupon.Status.CANCELLED


def test_reminder_hook_errors_are_not_swallowed():
    def broken(sender, *, coupon, **kwargs):
        raise RuntimeError("hook failed")

    signals.coupon_cancelled.connect(broken, dispatch_uid="test.broken")
    try:
        coupon = CouponFactory()
        with pytest.raises(RuntimeError):
            services.coupon_cancel(coupon=coupon)
    finally:
        signals.coupon_cancelled.disconnect(dispatch_uid="test.broken")
    # The cancel rolled back with the failed receiver.
    assert Coupon.objects.get(pk=coupon.pk).status == Coupon.Status.ACTIVE


# --- claim -----------------------------------------------------------------------------------


def test_claim_writes_the_user_coupon_and_its_expiry_task():
    coupon = CouponFactory(valid_for=timedelta(days=3))
    now = timezone.now()
    user_coupon = services.coupon_claim(coupon_id=coupon.pk, user_id=42, now=now)
    assert user_coupon.status == UserCoupon.Status.UNUSED
    assert user_coupon.expires_at == now + timedelta(days=3)
    task = ExpiryTask.objects.get(user_coupon=user_coupon)
    assert (task.expire_at, task.status) == (user_coupon.expires_at, ExpiryTask.Status.PENDING)
    assert Coupon.objects.get(pk=coupon.pk).claimed_count == 1


def test_claim_with_a_fixed_expiry():
    expires = timezone.now() + timedelta(days=2)
    coupon = CouponFactory(valid_for=None, expires_at=expires)
    assert services.coupon_claim(coupon_id=coupon.pk, user_id=1).expires_at == expires


def _refusal(coupon: Coupon, user_id: int = 1, now: datetime | None = None) -> str:
    with pytest.raises(ClaimRefused) as exc:
        services.coupon_claim(coupon_id=coupon.pk, user_id=user_id, now=now)
    return exc.value.code


def test_claim_refusal_codes_write_nothing():
    now = timezone.now()
    hour = timedelta(hours=1)
    assert _refusal(CouponFactory(claim_opens_at=now + hour)) == "not_open"
    assert _refusal(CouponFactory(claim_opens_at=now - 2 * hour, claim_closes_at=now)) == "closed"
    expired = CouponFactory(claim_opens_at=now - 2 * hour, valid_for=None, expires_at=now - hour)
    assert _refusal(expired) == "closed"
    cancelled = CouponFactory()
    services.coupon_cancel(coupon=cancelled)
    assert _refusal(cancelled) == "cancelled"
    sold_out = CouponFactory(total_stock=1)
    services.coupon_claim(coupon_id=sold_out.pk, user_id=1)
    assert _refusal(sold_out, user_id=2) == "sold_out"
    limited = CouponFactory(per_user_limit=1)
    services.coupon_claim(coupon_id=limited.pk, user_id=1)
    assert _refusal(limited, user_id=1) == "limit_reached"
    assert UserCoupon.objects.count() == ExpiryTask.objects.count() == 2
    assert Coupon.objects.get(pk=limited.pk).claimed_count == 1


def test_claim_opens_on_the_second():
    opens = timezone.now() + timedelta(hours=1)
    coupon = CouponFactory(claim_opens_at=opens)
    assert _refusal(coupon, now=opens - timedelta(microseconds=1)) == "not_open"
    assert services.coupon_claim(coupon_id=coupon.pk, user_id=1, now=opens)


def test_claim_unknown_coupon():
    with pytest.raises(Coupon.DoesNotExist):
        services.coupon_claim(coupon_id=999_999, user_id=1)


def test_per_user_limit_takes_free_slots():
    coupon = CouponFactory(per_user_limit=3)
    claims = [services.coupon_claim(coupon_id=coupon.pk, user_id=5) for _ in range(3)]
    assert sorted(c.seq for c in claims) == [1, 2, 3]
    assert _refusal(coupon, user_id=5) == "limit_reached"
    # A claim removed by hand frees its slot (seq 2), not "the next one" (4, over the limit).
    claims[1].delete()
    assert services.coupon_claim(coupon_id=coupon.pk, user_id=5).seq == 2


def test_lowering_the_limit_refuses_users_already_over_it():
    coupon = CouponFactory(per_user_limit=3)
    for _ in range(2):
        services.coupon_claim(coupon_id=coupon.pk, user_id=5)
    services.coupon_update(coupon=coupon, per_user_limit=1)
    assert _refusal(coupon, user_id=5) == "limit_reached"
    assert services.coupon_claim(coupon_id=coupon.pk, user_id=6)


# --- redeem ----------------------------------------------------------------------------------


def test_redeem_marks_used_and_processes_the_expiry_task():
    coupon = CouponFactory()
    user_coupon = services.coupon_claim(coupon_id=coupon.pk, user_id=9)
    used = services.coupon_redeem(user_coupon_id=user_coupon.pk, user_id=9)
    assert used.status == UserCoupon.Status.USED and used.used_at is not None
    task = ExpiryTask.objects.get(user_coupon=user_coupon)
    assert task.status == ExpiryTask.Status.PROCESSED


def _redeem_refusal(user_coupon: UserCoupon, now: datetime | None = None) -> str:
    with pytest.raises(RedeemRefused) as exc:
        services.coupon_redeem(user_coupon_id=user_coupon.pk, user_id=user_coupon.user_id, now=now)
    return exc.value.code


def test_redeem_refusals():
    coupon = CouponFactory(valid_for=timedelta(days=1))
    user_coupon = services.coupon_claim(coupon_id=coupon.pk, user_id=9)
    # Past its expiry but not swept yet: still refused.
    assert _redeem_refusal(user_coupon, now=user_coupon.expires_at) == "expired"
    swept = UserCouponFactory(status=UserCoupon.Status.EXPIRED)
    assert _redeem_refusal(swept) == "expired"
    services.coupon_redeem(user_coupon_id=user_coupon.pk, user_id=9)
    assert _redeem_refusal(user_coupon) == "already_used"
    assert UserCoupon.objects.get(pk=user_coupon.pk).status == UserCoupon.Status.USED


def test_redeem_someone_elses_coupon():
    user_coupon = UserCouponFactory(user_id=1)
    with pytest.raises(UserCoupon.DoesNotExist):
        services.coupon_redeem(user_coupon_id=user_coupon.pk, user_id=2)
    assert UserCoupon.objects.get(pk=user_coupon.pk).status == UserCoupon.Status.UNUSED
