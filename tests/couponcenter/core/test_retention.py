"""The retention kernel (couponcenter.core.retention) on a real database and a real Redis: batches
that stop and resume, the way chosen per table, the last run kept, one process at a time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.core import retention as kernel
from couponcenter.core.db.partitions import DropReport, partitioned
from couponcenter.core.retention import (
    RetentionTurn,
    delete_in_batches,
    retention_last_runs,
    retention_run,
)
from reminders.models import Notification

pytestmark = pytest.mark.django_db


def notes(n: int, *, read: bool) -> list[Notification]:
    now = timezone.now()
    return [
        Notification.objects.create(
            user_id=1, dedup_key=f"{read}:{i}", read_at=now if read else None
        )
        for i in range(n)
    ]


def test_batches_delete_only_the_filtered_rows_and_resume_after_a_stop():
    notes(7, read=True)
    unread = notes(3, read=False)
    rows = Notification.objects.filter(read_at__isnull=False)
    asks = iter([False, True])  # one batch, then asked to stop

    deleted, stopped = delete_in_batches(rows, batch_size=3, should_stop=lambda: next(asks))
    assert (deleted, stopped) == (3, True)
    assert rows.count() == 4  # the rest waits for the next pass

    deleted, stopped = delete_in_batches(rows, batch_size=3)
    assert (deleted, stopped) == (4, False)  # 3, then a short batch of 1 ends it
    assert list(Notification.objects.order_by("pk")) == unread


def test_a_zero_retention_runs_nothing_and_the_run_is_recorded():
    def delete():
        raise AssertionError("a retention of 0 keeps everything")

    run = retention_run("t:zero", retention=timedelta(0), delete=delete)
    assert run.way == "kept" and run.removed == 0

    done = retention_run("t:some", retention=timedelta(days=1), delete=lambda: (5, False))
    assert done.way == "delete" and done.removed == 5
    last = retention_last_runs(["t:zero", "t:some", "t:never"])
    assert last["t:zero"]["way"] == "kept"
    assert last["t:some"]["removed"] == "5" and last["t:some"]["retention_s"] == "86400"
    assert last["t:never"] == {}


def test_a_failed_run_is_recorded_with_its_error_and_raises():
    def delete():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        retention_run("t:fail", retention=timedelta(days=1), delete=delete)
    assert retention_last_runs(["t:fail"])["t:fail"]["error"] == "RuntimeError: boom"


def test_the_way_is_chosen_by_the_partition_check(monkeypatch):
    def drop():
        return DropReport(rows=42)

    def delete():
        return 1, False

    # A plain table (and every table on SQLite); the partitioned ones are the kernel's to say.
    assert kernel.table_partitioned("reminders_notification") == partitioned(
        "reminders_notification"
    )
    assert not kernel.table_partitioned("couponcenter_coupon")
    assert retention_run("t", retention=timedelta(days=1), delete=delete, drop=drop).way == "delete"
    monkeypatch.setattr(kernel, "table_partitioned", lambda table: table == "parted")
    run = retention_run(
        "t:r", table="parted", retention=timedelta(days=1), delete=delete, drop=drop
    )
    assert (run.way, run.removed) == ("drop", 42)
    # Partitioned, but the app gave no drop: batches.
    assert retention_run("t", table="parted", retention=timedelta(1), delete=delete).way == "delete"


def test_one_process_at_a_time_once_per_interval(redis_client):
    first, second = RetentionTurn("t", every_s=60), RetentionTurn("t", every_s=60)
    assert first.take()
    assert not second.take()  # within the interval
    redis_client.delete(first.turn_key)  # the interval is over, the first is still running
    assert not second.take()  # its lease says so
    assert first.keep()
    first.release()
    assert not first.keep()  # released: nothing to renew
    redis_client.delete(first.turn_key)
    assert second.take()
    assert redis_client.pttl(second.turn_key) > 50_000
    second.release()
    assert not redis_client.exists(second.lease_key)


def test_a_lost_lease_stops_the_pass(redis_client):
    turn = RetentionTurn("t", every_s=60)
    assert turn.take()
    redis_client.delete(turn.lease_key)  # lapsed (a stall longer than the lease)
    redis_client.set(turn.lease_key, "someone else")
    assert not turn.keep()
    turn.release()
    assert redis_client.get(turn.lease_key) == b"someone else"
