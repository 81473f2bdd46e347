"""Upkeep shared by the reminder benchmarks: fresh statistics, and what a run leaves behind."""

from __future__ import annotations

from django.db import connection

from couponcenter.core.redis import get_redis
from couponcenter.coupons.models import Coupon
from reminders.models import Notification, ReminderSubscription


def vacuum_analyze() -> None:
    """Fresh planner statistics and no dead rows left behind by the load or the last run.

    Autovacuum does this in production; here it may be off (it is on this project's CI machine),
    and a bulk load followed at once by a measurement would otherwise run on stale statistics."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for model in (ReminderSubscription, Notification, Coupon):
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")


def delete_bench_rows(coupons: list[Coupon], user_base: int, count: int) -> None:
    """The inbox rows of users ``user_base ..+count``, and the coupons with their subscriptions."""
    users = (user_base, user_base + count)
    while Notification.objects.filter(user_id__range=users).exists():
        ids = Notification.objects.filter(user_id__range=users).values_list("pk", flat=True)[
            :20_000
        ]
        Notification.objects.filter(pk__in=list(ids)).delete()
    for coupon in coupons:
        ReminderSubscription.objects.filter(coupon=coupon)._raw_delete(connection.alias)
        coupon.delete()


def delete_keys(prefix: str) -> None:
    """Every Redis key under ``prefix``."""
    client = get_redis()
    batch = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(batch), 1000):
        client.delete(*batch[i : i + 1000])
