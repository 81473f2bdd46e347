"""The machine's own speed, measured beside each of ``bench_days``' days: a fixed piece of the
hot paths' kind of work on a table made for it and dropped after it, so the work is the same on
every day whatever the service's tables have grown to (docs/performance.md, "The machine's speed
that day").

The hot paths write PostgreSQL from Python: rows built in Python, sent as multi-row ``INSERT``s
(the inbox, the timeouts' creation), then updated in batches by key range (the night's sweep, the
firing's settles), each batch its own transaction, by two connections at once. The reference does
exactly that, ``ROWS`` rows, and times the two halves apart. Two days whose service figures fell
together while the reference fell as much met a slower machine; a service figure that fell while
the reference held is the service's own.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from django.db import connection, transaction

TABLE = "bench_days_machine_reference"
ROWS = 60_000
WRITERS = 2  # as many as the sweepers, and the Celery worker's processes
INSERT_CHUNK = 500  # rows per INSERT statement, as the inbox writes them
INSERTS_PER_TRANSACTION = 10
UPDATE_BATCH = 1_000  # rows per UPDATE, as a sweeper's batch
PAYLOAD = '{"coupons": [{"id": 1}], "subscriptions": [1]}'


def create() -> None:
    """The reference's table, empty, with a primary key and two secondary indexes (one unique),
    as the inbox and the timeout jobs have."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")
        cursor.execute(
            f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, user_id bigint NOT NULL, "
            "key varchar(64) NOT NULL UNIQUE, status varchar(16) NOT NULL, "
            "at timestamptz NOT NULL, payload text NOT NULL)"
        )
        cursor.execute(f"CREATE INDEX {TABLE}_status_at ON {TABLE} (status, at)")


def drop() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")


def _insert(writer: int) -> int:
    done = 0
    ids = range(writer, ROWS, WRITERS)
    per_transaction = INSERT_CHUNK * INSERTS_PER_TRANSACTION
    for first in range(0, len(ids), per_transaction):
        with transaction.atomic(), connection.cursor() as cursor:
            block = ids[first : first + per_transaction]
            for lo in range(0, len(block), INSERT_CHUNK):
                chunk = block[lo : lo + INSERT_CHUNK]
                rows = [
                    (pk, 9_000_000 + pk, f"reference:{pk}", "scheduled", PAYLOAD) for pk in chunk
                ]
                values = ",".join(["(%s, %s, %s, %s, now(), %s)"] * len(rows))
                cursor.execute(
                    f"INSERT INTO {TABLE} (id, user_id, key, status, at, payload) VALUES {values}",
                    [value for row in rows for value in row],
                )
                done += cursor.rowcount
    return done


def _update(writer: int) -> int:
    done = 0
    for lo in range(writer * UPDATE_BATCH, ROWS, WRITERS * UPDATE_BATCH):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {TABLE} SET status = 'done', at = now() "
                "WHERE id BETWEEN %s AND %s AND status = 'scheduled'",
                [lo, lo + UPDATE_BATCH - 1],
            )
            done += cursor.rowcount
    return done


def _timed(work) -> tuple[float, int]:
    """``work(writer)`` in ``WRITERS`` threads, each with its own connection, released together;
    the seconds until the last is done, and the rows they did."""
    start, done, failed = threading.Barrier(WRITERS + 1), [], []

    def writer(number: int) -> None:
        try:
            start.wait()
            done.append(work(number))
        except BaseException as error:  # re-raised below, in the caller's thread
            failed.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    start.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if failed:
        raise failed[0]
    return seconds, sum(done)


def measure() -> dict[str, Any]:
    """One sample: ``ROWS`` rows inserted, then updated, on a new table; the rates of each half
    and ``per_s``, all the rows' work (inserted plus updated) over both halves' seconds."""
    create()
    try:
        insert_s, inserted = _timed(_insert)
        update_s, updated = _timed(_update)
    finally:
        drop()
    if inserted != ROWS or updated != ROWS:
        raise AssertionError(f"the reference inserted {inserted} and updated {updated}, not {ROWS}")
    return {
        "insert_per_s": round(ROWS / insert_s),
        "update_per_s": round(ROWS / update_s),
        "per_s": round(2 * ROWS / (insert_s + update_s)),
    }


def day_reference(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A day's reference from its samples: the median of their ``per_s`` (one sample taken while
    something else happened to run beside it leaves the day's figure), with the samples."""
    return {
        "per_s": round(statistics.median(s["per_s"] for s in samples)),
        "samples": samples,
    }
