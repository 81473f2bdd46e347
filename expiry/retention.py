"""The expiry tables' retention, run by the sweeper (docs/retention.md).

- processed expiry tasks older than ``ExpirySettings.retention`` (``services.expiry_cleanup``);
  a pending task is never removed;
- used and expired user coupons older than ``ExpirySettings.user_coupon_retention``, and only of
  coupons that can no longer be claimed, for at least as long: cancelled, or their claims closed
  (the claim window's end, or a fixed expiry, passed). The per-user limit counts a user's rows
  (unique coupon, user, seq): removing them from a coupon still on sale would let the user claim
  it again. An unused user coupon is never removed, whatever its coupon.
  Where the expiry tasks are partitioned (PostgreSQL), a user coupon waits until its task's day
  has been dropped, so the tasks' table never sees a DELETE (no dead rows to vacuum). Elsewhere
  it takes its processed task with it (CASCADE, in the same batch); a pending one keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from couponcenter.core.retention import RetentionRun, delete_in_batches, retention_run
from couponcenter.coupons.models import Coupon, UserCoupon

from . import partitioning, services
from .models import ExpiryTask

# The names the console shows each retention's last run under (and its database table).
EXPIRY_TASKS = ExpiryTask._meta.db_table
USER_COUPONS = UserCoupon._meta.db_table
# What the console lists: (name, the ExpirySettings field, what goes).
RETENTIONS = (
    (EXPIRY_TASKS, "retention", "Processed expiry tasks"),
    (
        USER_COUPONS,
        "user_coupon_retention",
        "Used and expired user coupons, of coupons that can no longer be claimed",
    ),
)


def coupons_over(*, before: datetime) -> list[int]:
    """Coupons that can no longer be claimed, and could not since before ``before``: cancelled
    (last changed before it), or whose claims closed before it. Oldest first."""
    over = (
        Q(status=Coupon.Status.CANCELLED, updated_at__lt=before)
        | Q(claim_closes_at__lt=before)
        | Q(expires_at__lt=before)
    )
    return list(Coupon.objects.filter(over).order_by("pk").values_list("pk", flat=True))


def user_coupons_aged_out(*, coupon_id: int, before: datetime, tasks_partitioned: bool):
    """One coupon's user coupons used or expired before ``before`` (its unique index leads with
    the coupon), whose expiry task is gone (``tasks_partitioned``: its day was dropped) or
    processed."""
    if tasks_partitioned:
        kept_for = ExpiryTask.objects.all()
    else:
        kept_for = ExpiryTask.objects.filter(status=ExpiryTask.Status.PENDING)
    return (
        UserCoupon.objects.filter(coupon_id=coupon_id)
        .filter(
            Q(status=UserCoupon.Status.USED, used_at__lt=before)
            | Q(status=UserCoupon.Status.EXPIRED, expires_at__lt=before)
        )
        .filter(~Exists(kept_for.filter(user_coupon=OuterRef("pk"))))
    )


def user_coupons_delete(
    *,
    retention: timedelta,
    now: datetime,
    batch_size: int,
    should_stop: Callable[[], bool] = lambda: False,
) -> tuple[int, bool]:
    """Delete the aged-out user coupons of every coupon that is over; (deleted, stopped)."""
    before = now - retention
    tasks_partitioned = partitioning.partitioned_tasks()
    deleted = 0
    for coupon_id in coupons_over(before=before):
        removed, stopped = delete_in_batches(
            user_coupons_aged_out(
                coupon_id=coupon_id, before=before, tasks_partitioned=tasks_partitioned
            ),
            batch_size=batch_size,
            should_stop=should_stop,
        )
        deleted += removed
        if stopped:
            return deleted, True
    return deleted, False


def expiry_retention(
    *, now: datetime | None = None, should_stop: Callable[[], bool] = lambda: False
) -> list[RetentionRun]:
    """One retention pass over the expiry tables with the settings as they are now (read
    afresh: an edit applies from the next pass). A database error propagates."""
    config = services.expiry_settings_get(max_age_s=0)
    now = now or timezone.now()
    partitioning.expiry_partitions_ensure(now=now)  # the days ahead, whatever the retention

    def tasks() -> tuple[int, bool]:
        removed = services.expiry_cleanup(
            now=now,
            retention=config.retention,
            batch_size=config.batch_size,
            should_stop=should_stop,
        )
        return removed, should_stop()

    def user_coupons() -> tuple[int, bool]:
        return user_coupons_delete(
            retention=config.user_coupon_retention,
            now=now,
            batch_size=settings.RETENTION_BATCH_SIZE,
            should_stop=should_stop,
        )

    return [
        retention_run(
            EXPIRY_TASKS,
            retention=config.retention,
            delete=tasks,
            drop=lambda: partitioning.expiry_partitions_drop(
                now=now, retention=config.retention, should_stop=should_stop
            ),
        ),
        retention_run(USER_COUPONS, retention=config.user_coupon_retention, delete=user_coupons),
    ]
