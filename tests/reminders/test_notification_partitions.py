"""Notifications partitioned by day of ``visible_at`` on PostgreSQL
(reminders.services.notification_partitions): the ledger holds across a day boundary, the inbox
write and a user's list touch only the partitions they need, and the retentions drop whole days."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from couponcenter.core.db.partitions import partition_name, partitions_ensure, partitions_list
from reminders import selectors
from reminders.gateways import InboxGateway, Message
from reminders.members import member
from reminders.models import Notification, ReminderSubscription
from reminders.services import notification_partitions as parts
from reminders.services.inbox import reminders_deliver_inbox
from tests.support.factories import CouponFactory
from tests.support.plans import relations

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TABLE = parts.TABLE
MAR1 = datetime(2027, 3, 1, tzinfo=UTC)  # past the first partition (the table before them)


@pytest.fixture(autouse=True)
def own_partitions():
    """Partitions this test creates go with it (a TRUNCATE leaves them)."""
    before = set(partitions_list(TABLE))
    yield
    with connection.cursor() as cursor:
        for name in set(partitions_list(TABLE)) - before:
            cursor.execute(f"DROP TABLE {connection.ops.quote_name(name)}")


def message(user_id: int, key: str, due: datetime) -> Message:
    return Message(user_id=user_id, dedup_key=key, title="t", body="b", visible_at=due)


def where(user_id: int) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT tableoid::regclass::text FROM {TABLE} WHERE user_id = %s ORDER BY id",
            [user_id],
        )
        return [row[0] for row in cursor.fetchall()]


def test_a_redelivery_across_the_day_boundary_writes_nothing():
    partitions_ensure(parts.NOTIFICATIONS, now=MAR1)
    due = MAR1 + timedelta(hours=23, minutes=59, seconds=59, milliseconds=900)
    gateway = InboxGateway()

    gateway.deliver([message(7, "reminder:41", due)])  # at 23:59:59.95
    gateway.deliver([message(7, "reminder:41", due)])  # again after midnight: same due moment

    assert where(7) == [partition_name(TABLE, MAR1)]
    assert Notification.objects.get(user_id=7).visible_at == due


def test_a_late_reminder_is_keyed_on_its_due_moment_not_on_when_it_is_written(
    reminder_settings,
):
    due = timezone.now().replace(microsecond=0) - timedelta(seconds=30)
    coupon = CouponFactory(claim_opens_at=due + timedelta(seconds=60))
    sub = ReminderSubscription.objects.create(coupon=coupon, user_id=8, remind_at=due)

    reminders_deliver_inbox(InboxGateway(), [member(sub.pk)], reminder_settings)

    assert Notification.objects.get(user_id=8).visible_at == due


def table_activity() -> dict[str, tuple]:
    """This session's reads and writes per partition, as counted so far (not yet reported)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, seq_scan, coalesce(idx_scan, 0), n_tup_ins, n_tup_upd, n_tup_del "
            "FROM pg_stat_xact_user_tables WHERE relname LIKE %s",
            [f"{TABLE}%"],
        )
        return {row[0]: row[1:] for row in cursor.fetchall()}


def test_the_inbox_write_touches_only_its_day():
    partitions_ensure(parts.NOTIFICATIONS, now=MAR1)
    due = MAR1 + timedelta(days=1, hours=2)
    InboxGateway().deliver([message(9, "reminder:1", due)])
    with transaction.atomic():  # one transaction: the counters are not reported midway
        before = table_activity()
        InboxGateway().deliver(
            [message(9, "reminder:1", due), message(10, "reminder:2", due)]  # one conflicts
        )
        after = table_activity()

    touched = {name for name, counts in after.items() if counts != before.get(name)}
    assert touched == {partition_name(TABLE, due)}
    assert Notification.objects.filter(dedup_key__in=["reminder:1", "reminder:2"]).count() == 2


def test_the_inbox_write_names_the_ledger_key():
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"EXPLAIN (FORMAT JSON) INSERT INTO {TABLE} (user_id, dedup_key, kind, title, body, "
            "payload, created_at, visible_at, push, held) "
            "VALUES (1, 'k', 'x', '', '', '{}', now(), now(), true, false) ON CONFLICT DO NOTHING"
        )
        plan = cursor.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    assert plan["Relation Name"] == TABLE
    assert plan["Conflict Resolution"] == "NOTHING"


def test_a_users_list_reads_no_day_ahead_of_now():
    now = timezone.now()
    partitions_ensure(parts.NOTIFICATIONS, now=now)  # days contiguous from the first partition
    InboxGateway().deliver(
        [message(11, "reminder:1", now - timedelta(hours=1)), message(11, "reminder:2", now)]
    )
    rows = selectors.notification_list(user_id=11, now=now)
    query, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {query}", params)
        read = relations(cursor.fetchone()[0])

    ahead = {name for name in partitions_list(TABLE) if name > partition_name(TABLE, now)}
    assert ahead - {f"{TABLE}_default"}  # there are days ahead, and none is read
    assert not read & ahead, read
    assert [n.dedup_key for n in rows] == ["reminder:2", "reminder:1"]


def drop(now: datetime, read: timedelta, unread: timedelta) -> int:
    report = parts.notification_partitions_drop(
        now=now, read_retention=read, unread_retention=unread
    )
    return report.rows


def test_retention_drops_read_days_keeps_days_with_unread_until_their_own_retention():
    partitions_ensure(parts.NOTIFICATIONS, now=MAR1)
    day1, day2 = MAR1 + timedelta(hours=3), MAR1 + timedelta(days=1, hours=3)
    InboxGateway().deliver([message(12, "reminder:1", day1), message(12, "reminder:2", day2)])
    Notification.objects.filter(dedup_key="reminder:1").update(read_at=day1)
    read, unread = timedelta(days=30), timedelta(days=90)

    assert drop(MAR1 + timedelta(days=40), read, unread) == 1

    assert partition_name(TABLE, MAR1) not in partitions_list(TABLE)  # only a read one: gone
    assert partition_name(TABLE, MAR1 + timedelta(days=1)) in partitions_list(TABLE)  # unread
    assert list(Notification.objects.values_list("dedup_key", flat=True)) == ["reminder:2"]
    assert drop(MAR1 + timedelta(days=92), read, unread) == 1
    assert not Notification.objects.exists()


def test_a_read_notification_counts_from_when_it_was_read():
    partitions_ensure(parts.NOTIFICATIONS, now=MAR1)
    InboxGateway().deliver([message(14, "reminder:1", MAR1 + timedelta(hours=3))])
    Notification.objects.update(read_at=MAR1 + timedelta(days=20))  # read weeks after it showed
    read, unread = timedelta(days=30), timedelta(days=90)

    assert drop(MAR1 + timedelta(days=40), read, unread) == 0  # read 20 days ago: kept
    assert drop(MAR1 + timedelta(days=51), read, unread) == 1


def test_a_notification_held_for_a_digest_keeps_its_day():
    partitions_ensure(parts.NOTIFICATIONS, now=MAR1)
    held = message(15, "reminder:1", MAR1 + timedelta(hours=3))
    held.push, held.held = False, True
    InboxGateway().deliver([held])

    assert drop(MAR1 + timedelta(days=400), timedelta(days=30), timedelta(days=90)) == 0
    assert Notification.objects.count() == 1


def test_retention_zero_keeps_everything():
    partitions_ensure(parts.NOTIFICATIONS, now=MAR1)
    InboxGateway().deliver([message(13, "reminder:1", MAR1 + timedelta(hours=1))])

    assert drop(MAR1 + timedelta(days=900), timedelta(0), timedelta(0)) == 0
    assert Notification.objects.count() == 1
