"""The sweeper runs the expiry tables' retention (expiry.retention) on its turn: one sweeper in the
fleet per RETENTION_EVERY_S, with the settings read at each pass."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from couponcenter.core.retention import RetentionTurn, retention_last_runs, table_partitioned
from couponcenter.coupons.models import UserCoupon
from expiry import services
from expiry.models import ExpiryTask
from expiry.retention import EXPIRY_TASKS, USER_COUPONS, coupons_over, expiry_retention
from expiry.sweeper import Sweeper
from tests.support.factories import CouponFactory, UserCouponFactory

pytestmark = pytest.mark.django_db(transaction=True)
DAY = timedelta(days=1)


def used_long_ago(coupon, *, age: timedelta) -> UserCoupon:
    at = timezone.now() - age
    row = UserCouponFactory(
        coupon=coupon, status="used", used_at=at, claimed_at=at - DAY, expires_at=at + DAY
    )
    task = ExpiryTask.objects.create(user_coupon=row, expire_at=row.expires_at, status="processed")
    ExpiryTask.objects.filter(pk=task.pk).update(updated_at=at)  # processed when it was used
    return row


def short_retention() -> None:
    config = services.expiry_settings_get(max_age_s=0)
    config.user_coupon_retention = DAY
    config.retention = DAY  # on PostgreSQL a user coupon waits for its task's day to go
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


@pytest.mark.postgres
def test_on_postgresql_a_user_coupon_waits_for_its_tasks_day_and_no_task_is_deleted(redis_client):
    """The partitioned expiry tasks go only by whole days: the user coupon retention never
    reaches them with a DELETE (it would leave dead rows there), it waits for the drop."""
    short_retention()
    config = services.expiry_settings_get(max_age_s=0)
    config.retention = 3 * DAY  # the tasks stay longer than their user coupons would
    services.expiry_settings_save(instance=config)
    closed = CouponFactory(
        claim_opens_at=timezone.now() - 10 * DAY, claim_closes_at=timezone.now() - 5 * DAY
    )
    row = used_long_ago(closed, age=2 * DAY)
    statements: list[tuple[str, int]] = []  # each with the rows it touched

    def seen(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        statements.append((sql, context["cursor"].rowcount))
        return result

    with connection.execute_wrapper(seen):
        expiry_retention()
        assert UserCoupon.objects.filter(pk=row.pk).exists()  # its task is kept for 3 days
        assert ExpiryTask.objects.filter(user_coupon_id=row.pk).exists()
        config.retention = DAY
        services.expiry_settings_save(instance=config)
        expiry_retention()
    assert not ExpiryTask.objects.filter(user_coupon_id=row.pk).exists()
    assert not UserCoupon.objects.filter(pk=row.pk).exists()
    # The task went with its day (here DEFAULT's batch: its day had no partition); the user
    # coupon's cascade, which Django still sends, found nothing left to delete.
    deleted = {
        table: sum(n for q, n in statements if q.startswith(f'DELETE FROM "{table}" '))
        for table in ("expiry_expirytask", "couponcenter_usercoupon")
    }
    assert deleted == {"expiry_expirytask": 0, "couponcenter_usercoupon": 1}
