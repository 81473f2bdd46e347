"""Upkeep of the partitioned timeout jobs and subscriptions (reminders/partition_layout.py,
docs/timeouts.md "Partitioned tables"): the days of their done leaves created ahead, and the days
past their retention dropped whole. The reminder worker's housekeeping calls
``reminder_partitions_maintain`` with the retention of its pass, under its lock; on SQLite (no
partitions) it does nothing and the retention is a batched ``DELETE`` instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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
    if not (timeout_jobs_partitioned() or subscriptions_partitioned()):
        return report
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        if not mine:
            report.skipped = True
            return report
        report.created = _ensure(now=now)
        for layout, retention in (
            (TIMEOUT_JOBS, timeout_job_retention),
            (SUBSCRIPTIONS, subscription_retention),
        ):
            report.dropped[layout.done_leaf] = _drop(layout, retention=retention, now=now)
    return report


def reminder_partitions_ensure(*, now: datetime) -> list[str]:
    """The done leaves' days from today to their horizon; the names created. Nothing on SQLite,
    before the migrations, or while another process maintains them."""
    if not (timeout_jobs_partitioned() or subscriptions_partitioned()):
        return []
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        return _ensure(now=now) if mine else []


def timeout_jobs_drop(
    *,
    now: datetime,
    retention: timedelta,
    dead_retention: timedelta,
    should_stop: Callable[[], bool] = lambda: False,
) -> DropReport:
    """Drop the days of finished jobs older than ``retention``, except a day holding a dead job
    younger than ``dead_retention`` (0: dead jobs are kept forever), which can still be requeued;
    stopping between days when asked."""
    if not retention or not timeout_jobs_partitioned():
        return DropReport()
    dead = f"status = {TimeoutJob.Status.DEAD}"
    if dead_retention:
        dead += f" AND gmt_modified >= '{(now - dead_retention).isoformat()}'::timestamptz"
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        if not mine:
            return DropReport()
        return _drop(TIMEOUT_JOBS, retention=retention, now=now, keep=dead, should_stop=should_stop)


def subscriptions_drop(
    *, now: datetime, retention: timedelta, should_stop: Callable[[], bool] = lambda: False
) -> DropReport:
    """Drop the days of sent, cancelled and dropped subscriptions older than ``retention`` (the
    failed ones stay in the live leaf, with the scheduled), stopping between days when asked."""
    if not retention or not subscriptions_partitioned():
        return DropReport()
    with maintenance_turn(MAINTAIN_LOCK) as mine:
        if not mine:
            return DropReport()
        return _drop(SUBSCRIPTIONS, retention=retention, now=now, should_stop=should_stop)


def _ensure(*, now: datetime) -> list[str]:
    return [
        name
        for layout in (TIMEOUT_JOBS, SUBSCRIPTIONS)
        if partitioned(layout.done_leaf)
        for name in partitions_ensure(layout.done_days, now=now)
    ]


def _drop(
    layout: StatusLayout,
    *,
    retention: timedelta,
    now: datetime,
    should_stop: Callable[[], bool] = lambda: False,
    keep: str = "",
) -> DropReport:
    spec = dataclasses.replace(layout.done_days, keep=keep) if keep else layout.done_days
    return partitions_drop_expired(spec, retention=retention, now=now, should_stop=should_stop)
