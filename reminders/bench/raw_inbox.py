"""The raw limit of the inbox writes: a bare SQL loop doing delivery's database work, nothing else.

Batch for batch what a delivery task does in the database: in one transaction, the
``UPDATE ... SET status = 'sent' ... RETURNING`` of a batch of subscriptions and the multi-row
``INSERT ... ON CONFLICT DO NOTHING`` of their notifications (500 rows per statement, as the
inbox gateway writes them). No Redis, no Celery, no merging, no settling; as many writers (threads,
each with its own connection) as the benchmark's Celery worker has processes
(``CELERY_CONCURRENCY``), each taking every n-th batch.

The reminders end to end (count / end-to-end seconds) is reported as a fraction of this rate.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from reminders.bench.end_to_end import Progress, _coupon, _subscriptions
from reminders.bench.processes import CELERY_CONCURRENCY
from reminders.bench.tables import delete_bench_rows, vacuum_analyze
from reminders.gateways import INSERT_CHUNK
from reminders.models import Notification, ReminderSubscription

SUBS = ReminderSubscription._meta.db_table
INBOX = Notification._meta.db_table


def _writer(worker: int, workers: int, batches: list[list[int]], start, results) -> None:
    try:
        start.wait()
        done = 0
        for batch in batches[worker::workers]:
            done += _write(batch)
        results.append(done)
    finally:
        connection.close()


def _write(batch: list[int]) -> int:
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {SUBS} SET status = 'sent', sent_at = %s, updated_at = %s "
            f"WHERE status = 'scheduled' AND id IN ({','.join(['%s'] * len(batch))}) "
            "RETURNING id, user_id, coupon_id",
            [now, now, *batch],
        )
        rows = [
            (
                user,
                f"reminder:{pk}",
                "coupon_reminder",
                "Coupon opens in 1 minute",
                "Coupon",
                json.dumps({"coupons": [{"id": coupon}], "subscriptions": [pk]}),
                now,
                now,
                True,
                False,
            )
            for pk, user, coupon in cursor.fetchall()
        ]
        for first in range(0, len(rows), INSERT_CHUNK):
            chunk = rows[first : first + INSERT_CHUNK]
            values = ",".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            cursor.execute(
                f"INSERT INTO {INBOX} (user_id, dedup_key, kind, title, body, payload, "
                f"created_at, visible_at, push, held) VALUES {values} "
                "ON CONFLICT DO NOTHING",
                [value for row in chunk for value in row],
            )
    return len(rows)


def bench_raw_inbox(
    count: int, user_base: int, *, batch_size: int, progress: Progress | None = None
) -> dict[str, Any]:
    """``raw_inbox_per_s``: ``count`` subscriptions marked sent and written to the inbox."""
    coupon = _coupon(timezone.now() + timedelta(hours=3), "bench raw inbox")
    try:
        subs = _subscriptions(coupon, count, user_base, progress)
        vacuum_analyze()
        ids = [pk for pk, _, _ in subs]
        batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
        # Threads, each with its own connection: the work is the database's (psycopg2 lets go of
        # the GIL while a statement runs), and no process is forked from one that holds broker
        # and database sockets.
        start, results = threading.Event(), []
        threads = [
            threading.Thread(target=_writer, args=(w, CELERY_CONCURRENCY, batches, start, results))
            for w in range(CELERY_CONCURRENCY)
        ]
        for thread in threads:
            thread.start()
        started = time.perf_counter()
        start.set()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        written = sum(results)
        if written != count:
            raise AssertionError(f"the raw inbox loop wrote {written} rows, not {count}")
        return {
            "raw_inbox_s": round(seconds, 3),
            "raw_inbox_per_s": round(count / seconds),
            "raw_inbox_processes": CELERY_CONCURRENCY,
            "raw_inbox_written": written,
        }
    finally:
        delete_bench_rows([coupon], user_base, count)
        vacuum_analyze()
