"""The reminders' retention, run by the reminder worker's housekeeping (docs/retention.md).

What goes, each after its ``ReminderSettings`` retention (0: kept forever):
- timeout jobs processed or cancelled (with their history) that long after they finished
  (``gmt_modified``); a pending or running job never goes. A dead job stays as long as its dead
  letter may still be requeued too (the longer of the two retentions);
- notifications read that long after they were read; never read, that long after they were
  shown (``visible_at``; a staged one not yet shown never qualifies); one held for the user's
  next digest never goes;
- reminder subscriptions sent, dropped or cancelled that long after they finished
  (``updated_at``); a scheduled one never goes; a failed one (a dead letter of a reminder topic)
  stays as long as its dead letter too;
- dead letters (entries of the engine's dead sets, in Redis) that long after they died.

On PostgreSQL notifications, timeout jobs and subscriptions are partitioned by day
(docs/partitioning.md, docs/timeouts.md "Partitioned tables"): their retention drops whole days
by the same rules, a day holding any row still kept staying whole; elsewhere it deletes in
batches.

Removing a notification also removes its line in the ledger that stops a user being reminded
twice: by then (weeks after its delivery) no redelivery of that reminder is left to stop.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from couponcenter.core.db.partitions import DropReport
from couponcenter.core.retention import RetentionRun, delete_in_batches, retention_run
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.models import Notification, ReminderSettings, ReminderSubscription, TimeoutJob
from reminders.selectors import reminder_settings_get
from reminders.selectors.queues import topic_slot_counts

from .notification_partitions import notification_partitions_drop, notification_partitions_ensure
from .partitions import reminder_partitions_ensure, subscriptions_drop, timeout_jobs_drop

# The names the console shows each retention's last run under; the first three are tables (the
# partition check asks about them), the notifications' two retentions share their table.
TIMEOUT_JOBS = TimeoutJob._meta.db_table
NOTIFICATIONS = Notification._meta.db_table
NOTIFICATIONS_READ = f"{NOTIFICATIONS}:read"
NOTIFICATIONS_UNREAD = f"{NOTIFICATIONS}:unread"
SUBSCRIPTIONS = ReminderSubscription._meta.db_table
DEAD_LETTERS = "dead_letters"
# What the console lists: (name, the ReminderSettings field, what goes).
RETENTIONS = (
    (TIMEOUT_JOBS, "timeout_job_retention", "Processed, cancelled and dead timeout jobs"),
    (NOTIFICATIONS_READ, "notification_read_retention", "Notifications read"),
    (NOTIFICATIONS_UNREAD, "notification_unread_retention", "Notifications never read"),
    (SUBSCRIPTIONS, "subscription_retention", "Sent, dropped, cancelled and failed reminders"),
    (DEAD_LETTERS, "dead_letter_retention", "Dead letters (in Redis)"),
)

Job, Sub = TimeoutJob.Status, ReminderSubscription.Status


def _longer(a: timedelta, b: timedelta) -> timedelta:
    """The longer of two retentions, where 0 (forever) is the longest."""
    return timedelta(0) if not a or not b else max(a, b)


def timeout_jobs_aged_out(*, live: ReminderSettings, now: datetime) -> QuerySet:
    """Finished timeout jobs past their retention (none when it is 0)."""
    finished = Q(status__in=[Job.PROCESSED, Job.CANCELLED]) & Q(
        gmt_modified__lt=now - live.timeout_job_retention
    )
    dead_keep = _longer(live.timeout_job_retention, live.dead_letter_retention)
    if dead_keep:
        finished |= Q(status=Job.DEAD, gmt_modified__lt=now - dead_keep)
    return TimeoutJob.objects.filter(finished)


def notifications_read_aged_out(*, live: ReminderSettings, now: datetime) -> QuerySet:
    return Notification.objects.filter(
        read_at__lt=now - live.notification_read_retention, held=False
    )


def notifications_unread_aged_out(*, live: ReminderSettings, now: datetime) -> QuerySet:
    return Notification.objects.filter(
        read_at__isnull=True,
        held=False,
        visible_at__lt=now - live.notification_unread_retention,
    )


def subscriptions_aged_out(*, live: ReminderSettings, now: datetime) -> QuerySet:
    finished = Q(status__in=[Sub.SENT, Sub.DROPPED, Sub.CANCELLED]) & Q(
        updated_at__lt=now - live.subscription_retention
    )
    failed_keep = _longer(live.subscription_retention, live.dead_letter_retention)
    if failed_keep:
        finished |= Q(status=Sub.FAILED, updated_at__lt=now - failed_keep)
    return ReminderSubscription.objects.filter(finished)


def dead_letters_delete(
    *, before: datetime, batch_size: int, should_stop: Callable[[], bool] = lambda: False
) -> tuple[int, bool]:
    """Delete the dead letters of every topic and slot that died before ``before``, at most
    ``batch_size`` per script call (each reads and removes in one step); (deleted, stopped)."""
    before_ms = epoch_ms(before)
    deleted = 0
    for topic, slots in topic_slot_counts().items():
        for slot in range(slots):
            while True:
                if should_stop():
                    return deleted, True
                removed = queue.purge_dead_before(
                    topic, slot, before_ms=before_ms, limit=batch_size
                )
                deleted += removed
                if removed < batch_size:
                    break
    return deleted, False


def reminders_retention(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> list[RetentionRun]:
    """One retention pass over the reminders' tables and dead letters with the settings as they
    are now (read afresh: an edit applies from the next pass). A database error propagates."""
    live = reminder_settings_get(max_age_s=0)
    now = now or timezone.now()
    batch_size = batch_size or settings.RETENTION_BATCH_SIZE

    def batches(queryset: QuerySet) -> Callable[[], tuple[int, bool]]:
        return lambda: delete_in_batches(queryset, batch_size=batch_size, should_stop=should_stop)

    def dead_letters() -> tuple[int, bool]:
        before = now - live.dead_letter_retention
        return dead_letters_delete(before=before, batch_size=batch_size, should_stop=should_stop)

    plan = [  # (name, its table, its retention, the rows past it)
        (TIMEOUT_JOBS, TIMEOUT_JOBS, live.timeout_job_retention, timeout_jobs_aged_out),
        (
            NOTIFICATIONS_READ,
            NOTIFICATIONS,
            live.notification_read_retention,
            notifications_read_aged_out,
        ),
        (
            NOTIFICATIONS_UNREAD,
            NOTIFICATIONS,
            live.notification_unread_retention,
            notifications_unread_aged_out,
        ),
        (SUBSCRIPTIONS, SUBSCRIPTIONS, live.subscription_retention, subscriptions_aged_out),
    ]
    # On PostgreSQL notifications go by whole days, both retentions in one drop (each run
    # offers it; the second finds nothing left), after the days ahead are made.
    notification_partitions_ensure(now=now)
    # Timeout jobs and subscriptions: their done leaves' days, a day with a dead job that can
    # still be requeued kept whole; failed subscriptions stay in the live leaf, so they still go
    # in batches.
    reminder_partitions_ensure(now=now)
    failed_keep = _longer(live.subscription_retention, live.dead_letter_retention)
    failed = ReminderSubscription.objects.filter(
        status=Sub.FAILED, updated_at__lt=now - failed_keep
    )

    def subscriptions_drop_and_failed() -> DropReport:
        report = subscriptions_drop(
            now=now, retention=live.subscription_retention, should_stop=should_stop
        )
        if failed_keep and not report.stopped:
            deleted, report.stopped = batches(failed)()
            report.rows += deleted
        return report

    drops = {
        NOTIFICATIONS: lambda: notification_partitions_drop(
            now=now,
            read_retention=live.notification_read_retention,
            unread_retention=live.notification_unread_retention,
            should_stop=should_stop,
        ),
        TIMEOUT_JOBS: lambda: timeout_jobs_drop(
            now=now,
            retention=live.timeout_job_retention,
            dead_retention=_longer(live.timeout_job_retention, live.dead_letter_retention),
            should_stop=should_stop,
        ),
        SUBSCRIPTIONS: subscriptions_drop_and_failed,
    }
    runs = [
        retention_run(
            name,
            table=table,
            retention=retention,
            delete=batches(rows(live=live, now=now)),
            drop=drops.get(table),
        )
        for name, table, retention, rows in plan
    ]
    runs.append(
        retention_run(DEAD_LETTERS, retention=live.dead_letter_retention, delete=dead_letters)
    )
    return runs
