"""Cancel and reschedule find their row by its primary key, whatever the table's statistics say.

Seen in bench_timeouts: after a VACUUM ANALYZE of a nearly empty table, 100,000 pending jobs were
created and cancelled by key; PostgreSQL planned ``job_id = X AND status = 0`` on the partial
index of pending jobs (``timeoutjob_due``, which it believed empty) and walked all of them for each
cancel (11 ms instead of 0.1 ms; cancels fell from about 250/s to 100/s)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from reminders.models import TimeoutJob
from reminders.services import timeout_job_cancel, timeout_job_reschedule

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

PENDING_ROWS = 50_000


@pytest.fixture
def stale_statistics():
    """Statistics taken on an empty table, then many pending jobs: the state after a quiet night
    followed by a flood of new jobs, before autovacuum analyses the table again."""
    table = TimeoutJob._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {table}")
        cursor.execute(
            f"INSERT INTO {table} (topic, biz_type, biz_id, status, action_time, attribute, slot,"
            " attempts, last_error, recurrence, traceparent, gmt_create, gmt_modified)"
            " SELECT 'timeout.default', 'order', g::text, 0, now() + interval '1 day', '{}',"
            " g %% 8, 0, '', '', '', now(), now() FROM generate_series(1, %s) g",
            [PENDING_ROWS],
        )
    return TimeoutJob.objects.get(biz_id=str(PENDING_ROWS // 2))


def _plan_of_update(queries) -> str:
    update = next(q["sql"] for q in queries if q["sql"].startswith("UPDATE"))
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {update}")
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.parametrize("action", ["cancel", "reschedule"])
def test_a_cancel_or_a_move_goes_by_the_primary_key(stale_statistics, action):
    job = stale_statistics
    with CaptureQueriesContext(connection) as queries:
        if action == "cancel":
            timeout_job_cancel(job=job)
        else:
            timeout_job_reschedule(job=job, action_time=timezone.now() + timedelta(hours=2))
    plan = _plan_of_update(queries.captured_queries)
    assert "reminders_timeoutjob_pkey" in plan, plan
    assert "timeoutjob_due" not in plan, plan
    job.refresh_from_db()
    expected = TimeoutJob.Status.CANCELLED if action == "cancel" else TimeoutJob.Status.PENDING
    assert job.status == expected
