"""Table upkeep shared by the reminder benchmarks."""

from __future__ import annotations

from django.db import connection

from couponcenter.models import Coupon
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
