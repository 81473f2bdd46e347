"""The sweeper runs the expiry tables' retention (expiry.retention) on its turn: one sweeper in the
fleet per RETENTION_EVERY_S, with the settings read at each pass."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.core.retention import RetentionTurn, retention_last_runs, table_partitioned
from couponcenter.coupons.models import UserCoupon
from expiry import services
from expiry.models import ExpiryTask
from expiry.retention import EXPIRY_TASKS, USER_COUPONS, coupons_over
from expiry.sweeper import Sweeper
from tests.support.factories import CouponFactory, UserCouponFactory

pytestmark = pytest.mark.django_db(transaction=True)
DAY = timedelta(days=1)


def used_long_ago(coupon, *, age: timedelta) -> UserCoupon:
    at = timezone.now() - age
    row = UserCouponFactory(
        coupon=coupon, status="used", used_at=at, claimed_at=at - DAY, expires_at=at + DAY
    )
    ExpiryTask.objects.create(user_coupon=row, expire_at=row.expires_at, status="processed")
    return row


def short_retention() -> None:
    config = services.expiry_settings_get(max_age_s=0)
    config.user_coupon_retention = DAY
    services.expiry_settings_save(instance=config)


def test_the_sweeper_removes_aged_out_user_coupons_on_its_turn_only(redis_client):
    short_retention()
    closed = CouponFactory(
        claim_opens_at=timezone.now() - 10 * DAY, claim_closes_at=timezone.now() - 5 * DAY
    )
    first = used_long_ago(closed, age=3 * DAY)

    assert Sweeper().run_once().ok
    assert not UserCoupon.objects.filter(pk=first.pk).exists()
    last = retention_last_runs([USER_COUPONS, EXPIRY_TASKS])
    assert last[USER_COUPONS]["removed"] == "1"
    # Whole days of processed tasks on PostgreSQL (docs/partitioning.md), batches elsewhere.
    assert last[EXPIRY_TASKS]["way"] == ("drop" if table_partitioned(EXPIRY_TASKS) else "delete")

    second = used_long_ago(closed, age=3 * DAY)
    assert Sweeper().run_once().ok  # another sweeper, within the interval: not its turn
    assert UserCoupon.objects.filter(pk=second.pk).exists()

    redis_client.delete(RetentionTurn("expiry", every_s=1).turn_key)  # the interval is over
    assert Sweeper().run_once().ok
    assert not UserCoupon.objects.filter(pk=second.pk).exists()


def test_coupons_over_are_those_closed_or_cancelled_for_the_whole_retention():
    now = timezone.now()
    on_sale = CouponFactory(claim_opens_at=now - 10 * DAY)
    closed_long = CouponFactory(claim_opens_at=now - 10 * DAY, claim_closes_at=now - 5 * DAY)
    closed_lately = CouponFactory(claim_opens_at=now - 10 * DAY, claim_closes_at=now - DAY / 2)
    expired_long = CouponFactory(
        claim_opens_at=now - 10 * DAY, expires_at=now - 5 * DAY, valid_for=None
    )
    cancelled = CouponFactory(claim_opens_at=now - 10 * DAY, status="cancelled")
    over = set(coupons_over(before=now - DAY))
    assert over == {closed_long.pk, expired_long.pk}  # cancelled only a moment ago
    assert on_sale.pk not in over and closed_lately.pk not in over
    assert cancelled.pk in set(coupons_over(before=now + DAY))
