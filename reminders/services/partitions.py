"""Upkeep of the partitioned timeout jobs and subscriptions (reminders/partition_layout.py,
docs/timeouts.md "Partitioned tables"): the days of their done leaves created ahead, and the days
past their retention dropped whole. The reminder worker's housekeeping calls
``reminder_partitions_maintain`` with the retention of its pass, under its lock; on SQLite (no
partitions) it does nothing and the retention is a batched ``DELETE`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from couponcenter.core.db.partitions import (
    DropReport,
    maintenance_turn,
    partitioned,
    partitions_drop_expired,
    partitions_ensure,
)
from reminders.models import ReminderSubscription, TimeoutJob
from reminders.partition_layout import StatusLayout, subscription_layout, timeout_job_layout

TIMEOUT_JOBS = timeout_job_layout(TimeoutJob._meta.db_table)
SUBSCRIPTIONS = subscription_layout(ReminderSubscription._meta.db_table)
# Session advisory lock: one process of the fleet maintains these partitions at a time.
MAINTAIN_LOCK = (0x5E1A, 0x7130)


@dataclass
class PartitionsReport:
    created: list[str] = field(default_factory=list)
    dropped: dict[str, DropReport] = field(default_factory=dict)  # by done leaf
    skipped: bool = False  # another process had the turn


def timeout_jobs_partitioned() -> bool:
    """Whether timeout jobs live in the partitioned layout (PostgreSQL, migrated)."""
    return partitioned(TIMEOUT_JOBS.done_leaf)


def subscriptions_partitioned() -> bool:
    return partitioned(SUBSCRIPTIONS.done_leaf)


def reminder_partitions_maintain(
    *, now: datetime, timeout_job_retention: timedelta, subscription_retention: timedelta
) -> PartitionsReport:
    """Ensure the done leaves' days ahead, then drop the days older than their retention
    (processed, cancelled and dead jobs with their history; sent, cancelled and dropped
    subscriptions). A retention of 0 keeps everything. Call it outside a transaction. Does
    nothing while another process maintains them (``report.skipped``)."""
    report = PartitionsReport()
    pairs: list[tuple[StatusLayout, timedelta]] = [
        (TIMEOUT_JOBS, timeout_job_retention),
        (SUBSCRIPTIONS, subscription_retention),
    ]
    if not (timeout_jobs_partitioned() or subscriptions_partitioned()):
        return report
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        if not mine:
            report.skipped = True
            return report
        for layout, retention in pairs:
            spec = layout.done_days
            report.created += partitions_ensure(spec, now=now)
            report.dropped[spec.table] = partitions_drop_expired(spec, retention=retention, now=now)
    return report
