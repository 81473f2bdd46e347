"""Delivery finds its batch's subscriptions by their primary key, whatever the table's
statistics say, and its users' staged notifications through the index of staged rows.

Seen in bench_reminders: with statistics taken while the table was nearly empty and then
200,000 reminders scheduled, PostgreSQL planned delivery's ``status = 'scheduled' AND id IN
(...)`` on the partial index of scheduled rows (``subscription_due``, which it believed nearly
empty) and walked all of them for every batch (26 ms a batch instead of about 1)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from reminders.members import REMINDER_TOPIC, member
from reminders.models import Notification, ReminderSubscription
from reminders.services.delivery import reminders_deliver
from reminders.services.staging import hidden_reminder_notes
from tests.support.factories import CouponFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

SCHEDULED_ROWS = 50_000
BATCH = 200


@pytest.fixture
def stale_statistics(reminder_settings):
    """Statistics of an empty table, then many scheduled reminders."""
    reminder_settings.change(slots=1)
    coupon = CouponFactory()
    table = ReminderSubscription._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")
        cursor.execute(
            f"INSERT INTO {table} (user_id, remind_at, status, slot, priority, drop_reason,"
            " created_at, updated_at, coupon_id, traceparent)"
            " SELECT g, %s, 'scheduled', 0, 'normal', '', now(), now(), %s, ''"
            " FROM generate_series(1, %s) g",
            [coupon.claim_opens_at - coupon.reminder_lead, coupon.pk, SCHEDULED_ROWS],
        )
    rows = ReminderSubscription.objects.filter(coupon=coupon).order_by("pk")[:BATCH]
    return [member(s.pk) for s in rows]


def _plan_of_update(queries) -> str:
    """EXPLAIN the delivery's UPDATE under the settings its transaction gave it."""
    sqls = [q["sql"] for q in queries]
    update = next(i for i, sql in enumerate(sqls) if sql.startswith("UPDATE"))
    with connection.cursor() as cursor:
        for sql in sqls[:update]:
            if sql.startswith("SET LOCAL"):
                cursor.execute(sql)
        cursor.execute(f"EXPLAIN {sqls[update]}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("SET LOCAL enable_seqscan TO DEFAULT")
    return plan


def test_a_delivery_batch_goes_by_the_primary_key(stale_statistics):
    members = stale_statistics
    with CaptureQueriesContext(connection) as queries:
        result = reminders_deliver({"topic": REMINDER_TOPIC, "parts": [[0, members]]})
    assert result["delivered"] == BATCH
    # The setting was for the claim alone: the rest of the transaction plans as configured.
    with connection.cursor() as cursor:
        cursor.execute("SHOW enable_seqscan")
        assert cursor.fetchone()[0] == "on"
    plan = _plan_of_update(queries.captured_queries)
    assert "reminders_remindersubscription_pkey" in plan, plan
    assert "subscription_due" not in plan, plan
    assert "Seq Scan" not in plan, plan
    assert Notification.objects.count() == BATCH
    assert ReminderSubscription.objects.filter(status="sent").count() == BATCH
    assert ReminderSubscription.objects.filter(status="scheduled").count() == SCHEDULED_ROWS - BATCH


DELIVERED_ROWS = 50_000
STAGED_ROWS = 10


def _scans(plan):
    """The scan nodes of an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(plan, list):
        for item in plan:
            yield from _scans(item)
    elif isinstance(plan, dict):
        if "Relation Name" in plan:
            yield plan
        for value in plan.values():
            yield from _scans(value)


def _rows(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {connection.ops.quote_name(table)}")
        return cursor.fetchone()[0]


def test_the_lookup_of_a_batchs_staged_notifications_uses_their_index():
    """A batch looks up its 2,000 users' staged rows; among 50,000 shown ones that is an index
    of ten entries, not 2,000 probes of the inbox's unique index."""
    table = Notification._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (user_id, dedup_key, kind, title, body, payload, created_at,"
            " visible_at, push, held)"
            " SELECT g, 'shown-' || g, 'coupon_reminder', '', '', '{}', now(), now(), true, false"
            " FROM generate_series(1, %s) g",
            [DELIVERED_ROWS],
        )
        cursor.execute(
            f"INSERT INTO {table} (user_id, dedup_key, kind, title, body, payload, created_at,"
            " visible_at, push, held)"
            " SELECT g, 'staged-' || g, 'coupon_reminder', '', '',"
            " json_build_object('subscriptions', json_build_array(g)),"
            " now(), now() + interval '1 hour', true, false"
            " FROM generate_series(1, %s) g",
            [STAGED_ROWS],
        )
        cursor.execute(f"ANALYZE {table}")
    users = list(range(1, 2001))
    with CaptureQueriesContext(connection) as queries:
        found = list(hidden_reminder_notes(users, timezone.now()))
    assert sorted((user, subs) for _, user, _, subs in found) == [
        (g, {g}) for g in range(1, STAGED_ROWS + 1)
    ]
    (lookup,) = [q["sql"] for q in queries.captured_queries]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {lookup}")
        scans = list(_scans(cursor.fetchone()[0]))
        # The staged index, or on the partitioned table (PostgreSQL) its copy in each partition.
        cursor.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relname = 'notification_staged' OR c.oid IN"
            " (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'notification_staged'::regclass)"
        )
        staged = {row[0] for row in cursor.fetchall()}
    holding = [s for s in scans if _rows(s["Relation Name"])]
    assert holding, scans
    assert all(s.get("Index Name") in staged for s in holding), scans
