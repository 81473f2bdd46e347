"""Timeout jobs and subscriptions partitioned on PostgreSQL (reminders/partition_layout.py): where
rows live, the uniqueness the hot paths rely on, statements that prune to the live leaf, rows
moved by a concurrent transaction, and the upkeep that drops finished days whole."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from couponcenter.core.db.partitions import partition_name, partitions_ensure, partitions_list
from couponcenter.core.errors import BusinessError
from reminders.engine.scripts import Claimed
from reminders.models import ReminderSubscription, TimeoutJob
from reminders.services import (
    subscription_subscribe,
    subscription_unsubscribe,
    subscriptions_rebuild,
    timeout_job_cancel,
    timeout_job_create,
    timeout_job_end,
    timeout_job_ensure,
    timeout_job_reschedule,
    timeout_jobs_rebuild,
)
from reminders.services.dead_letters import dead_letters_requeue
from reminders.services.firing import timeout_jobs_take_rows
from reminders.services.inbox import STILL_SCHEDULED, TABLE
from reminders.services.partitions import (
    MAINTAIN_LOCK,
    SUBSCRIPTIONS,
    TIMEOUT_JOBS,
    reminder_partitions_maintain,
    timeout_jobs_partitioned,
)
from reminders.services.timeouts import timeout_job_pending_by_key
from reminders.services.timeouts_bulk import timeout_jobs_bulk_create
from tests.support.factories import CouponFactory

TOPIC = "timeout.default"  # a `log` topic in settings.TIMEOUT_TOPICS
WHEN = datetime(2031, 3, 1, 9, tzinfo=UTC)
Status = TimeoutJob.Status
SubStatus = ReminderSubscription.Status


@pytest.fixture
def postgres(db):
    if connection.vendor != "postgresql":
        pytest.skip("partitions are PostgreSQL's")


def _where(table: str, pk_column: str, pk: int) -> str:
    """The partition that holds row ``pk`` of ``table``."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT tableoid::regclass::text FROM {table} WHERE {pk_column} = %s", [pk])
        row = cursor.fetchone()
    return row[0] if row else ""


def _today(layout) -> str:
    """The done leaf's partition of today (the migration's attached table, or one of its own)."""
    return partition_name(layout.done_leaf, timezone.now())


def _plan(sql: str, params=()) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def _plans(queries, verb: str) -> list[str]:
    return [_plan(q["sql"]) for q in queries if q["sql"].lstrip().startswith(verb)]


def _waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0]


def _until(condition, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _in_thread(target, out: dict, name: str) -> threading.Thread:
    def run():
        try:
            out[name] = target()
        except Exception as exc:  # the test asserts on it
            out[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# --- where rows live ---------------------------------------------------------------------------


def test_every_status_has_its_leaf():
    """A status in neither list would have no partition: its rows could not be written."""
    for layout, model in ((TIMEOUT_JOBS, TimeoutJob), (SUBSCRIPTIONS, ReminderSubscription)):
        assert not set(layout.live) & set(layout.done)
        assert set(layout.live) | set(layout.done) == set(model.Status.values)


def test_a_job_lives_in_the_live_leaf_until_it_finishes_then_in_todays_day(postgres):
    assert timeout_jobs_partitioned()
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="p1", action_time=WHEN)
    assert _where(TimeoutJob._meta.db_table, "job_id", job.pk) == TIMEOUT_JOBS.live_leaf
    timeout_job_cancel(job=job)
    assert _where(TimeoutJob._meta.db_table, "job_id", job.pk) == _today(TIMEOUT_JOBS)
    job.refresh_from_db()  # found by its primary key wherever it lives
    assert job.status == Status.CANCELLED


def test_a_dead_job_requeued_moves_back_to_the_live_leaf(postgres):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="p2", action_time=WHEN)
    TimeoutJob.objects.filter(pk=job.pk).update(status=Status.DEAD, gmt_modified=timezone.now())
    assert _where(TimeoutJob._meta.db_table, "job_id", job.pk) == _today(TIMEOUT_JOBS)
    result = dead_letters_requeue(topic=TOPIC, slot=job.slot, job_ids=[str(job.pk)])
    assert result.rows_fixed == 1
    assert _where(TimeoutJob._meta.db_table, "job_id", job.pk) == TIMEOUT_JOBS.live_leaf


def test_a_resubscribe_after_a_cancel_schedules_the_same_row_again(postgres):
    """One row per (user, coupon) whatever the status: the cancelled row comes back from the done
    leaf, with its id, instead of a second row beside it."""
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=2))
    sub, created = subscription_subscribe(user_id=7, coupon=coupon)
    assert created
    table = ReminderSubscription._meta.db_table
    assert _where(table, "id", sub.pk) == SUBSCRIPTIONS.live_leaf
    assert subscription_unsubscribe(user_id=7, coupon_id=coupon.pk)
    assert _where(table, "id", sub.pk) == _today(SUBSCRIPTIONS)
    again, created = subscription_subscribe(user_id=7, coupon=coupon)
    assert created and again.pk == sub.pk
    assert _where(table, "id", sub.pk) == SUBSCRIPTIONS.live_leaf
    assert ReminderSubscription.objects.filter(user_id=7, coupon=coupon).count() == 1
    # Subscribing again while it is scheduled is a no-op.
    assert subscription_subscribe(user_id=7, coupon=coupon) == (again, False)


# --- uniqueness under concurrency --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_racing_creates_by_business_key_make_one_pending_job(postgres):
    threads, out, start = [], {}, threading.Barrier(6)

    def ensure():
        start.wait(10)
        return timeout_job_ensure(topic=TOPIC, biz_type="order", biz_id="race", action_time=WHEN)

    for n in range(6):
        threads.append(_in_thread(ensure, out, f"t{n}"))
    for thread in threads:
        thread.join(30)
    results = list(out.values())
    assert all(isinstance(r, tuple) for r in results), results
    assert sum(created for _, created in results) == 1
    assert len({job.pk for job, _ in results}) == 1
    pending = TimeoutJob.objects.filter(biz_id="race", status=Status.PENDING)
    assert pending.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_create_waiting_on_an_uncommitted_one_returns_it(postgres):
    """The second create waits on the first one's uncommitted row in the unique index of the
    live leaf, then returns that job (the idempotent create), never a second pending job."""
    holding, release, out = threading.Event(), threading.Event(), {}

    def first():
        with transaction.atomic():
            job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="held", action_time=WHEN)
            holding.set()
            assert release.wait(30)
        return job

    one = _in_thread(first, out, "first")
    assert holding.wait(30)
    two = _in_thread(
        lambda: timeout_job_ensure(topic=TOPIC, biz_type="order", biz_id="held", action_time=WHEN),
        out,
        "second",
    )
    _until(lambda: _waiting_on_a_lock() >= 1, "the second create never waited")
    release.set()
    one.join(30)
    two.join(30)
    job, created = out["second"]
    assert not created and job.pk == out["first"].pk


@pytest.mark.django_db(transaction=True)
def test_racing_subscribes_after_a_cancel_leave_one_row(postgres):
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=2))
    subscription_subscribe(user_id=8, coupon=coupon)
    subscription_unsubscribe(user_id=8, coupon_id=coupon.pk)
    threads, out, start = [], {}, threading.Barrier(5)

    def subscribe():
        start.wait(10)
        return subscription_subscribe(user_id=8, coupon=coupon)

    for n in range(5):
        threads.append(_in_thread(subscribe, out, f"t{n}"))
    for thread in threads:
        thread.join(30)
    assert all(isinstance(r, tuple) for r in out.values()), out
    assert sum(created for _, created in out.values()) == 1
    rows = ReminderSubscription.objects.filter(user_id=8, coupon=coupon)
    assert list(rows.values_list("status", flat=True)) == [SubStatus.SCHEDULED]


@pytest.mark.django_db(transaction=True)
def test_racing_first_subscribes_make_one_row(postgres):
    coupon = CouponFactory(claim_opens_at=timezone.now() + timedelta(hours=2))
    threads, out, start = [], {}, threading.Barrier(5)

    def subscribe():
        start.wait(10)
        return subscription_subscribe(user_id=9, coupon=coupon)

    for n in range(5):
        threads.append(_in_thread(subscribe, out, f"t{n}"))
    for thread in threads:
        thread.join(30)
    assert all(isinstance(r, tuple) for r in out.values()), out
    assert sum(created for _, created in out.values()) == 1
    assert ReminderSubscription.objects.filter(user_id=9, coupon=coupon).count() == 1


# --- a row moved by a concurrent transaction -------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("second", ["end", "cancel", "reschedule"])
def test_a_statement_waiting_on_a_row_moved_meanwhile_sees_it_where_it_went(postgres, second):
    """A cancel holds the job's row and moves it to the done leaf; a second action waiting on
    that row meets it moved (PostgreSQL's serialization failure), runs again and answers as on a
    plain table: the job is no longer pending."""
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="moved", action_time=WHEN)
    holding, release, out = threading.Event(), threading.Event(), {}

    def cancel():
        with transaction.atomic():
            timeout_job_cancel(job=TimeoutJob.objects.get(pk=job.pk))
            holding.set()
            assert release.wait(30)
        return True

    actions = {
        "end": lambda: timeout_job_end(job=job, reason="stuck", by="test"),
        "cancel": lambda: timeout_job_cancel(job=job),
        "reschedule": lambda: timeout_job_reschedule(job=job, action_time=WHEN + timedelta(1)),
    }
    one = _in_thread(cancel, out, "cancel")
    assert holding.wait(30)
    two = _in_thread(actions[second], out, "second")
    _until(lambda: _waiting_on_a_lock() >= 1, "the second action never waited")
    release.set()
    one.join(30)
    two.join(30)
    assert isinstance(out["second"], BusinessError), out["second"]
    assert out["second"].code in ("not_live", "not_pending")
    job.refresh_from_db()
    assert job.status == Status.CANCELLED


# --- pruning -----------------------------------------------------------------------------------


def _touches(plan: str, layout) -> set[str]:
    leaves = {layout.live_leaf, layout.done_leaf}
    found = {leaf for leaf in leaves if f" {leaf} " in plan or f" {leaf}_p" in plan}
    if f" {layout.default}" in plan or f"on {layout.default}" in plan:
        found.add(layout.done_leaf)
    return found


def test_the_business_key_lookup_and_the_creates_conflict_touch_only_the_live_leaf(postgres):
    # A topic's backlog, analyzed: on a near-empty leaf every index costs the same and the plan
    # follows whatever statistics an earlier test left on the table, not the query.
    timeout_jobs_bulk_create(
        [
            {"topic": TOPIC, "biz_type": "order", "biz_id": f"b{n}", "action_time": WHEN}
            for n in range(2000)
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TIMEOUT_JOBS.live_leaf}")
    timeout_job_create(topic=TOPIC, biz_type="order", biz_id="k1", action_time=WHEN)
    with CaptureQueriesContext(connection) as queries:
        assert timeout_job_pending_by_key(topic=TOPIC, biz_type="order", biz_id="k1")
    (plan,) = _plans(queries.captured_queries, "SELECT")
    assert _touches(plan, TIMEOUT_JOBS) == {TIMEOUT_JOBS.live_leaf}, plan
    assert "timeoutjob_one_pending_per_biz" in plan, plan


def test_cancel_reschedule_and_the_take_touch_only_the_live_leaf(postgres):
    jobs = [
        timeout_job_create(topic=TOPIC, biz_type="order", biz_id=f"t{n}", action_time=WHEN)
        for n in range(3)
    ]
    with CaptureQueriesContext(connection) as queries:
        timeout_job_reschedule(job=jobs[0], action_time=WHEN + timedelta(hours=1))
        timeout_job_cancel(job=jobs[1])
        due = {jobs[2].pk: Claimed(str(jobs[2].pk), 0, 1)}
        taken, _ = timeout_jobs_take_rows(due)
    assert [job.pk for job in taken] == [jobs[2].pk]
    plans = _plans(queries.captured_queries, "UPDATE")
    assert len(plans) == 3
    for plan in plans:
        assert _touches(plan, TIMEOUT_JOBS) == {TIMEOUT_JOBS.live_leaf}, plan


def test_the_reconcile_of_due_jobs_and_reminders_touches_only_the_live_leaves(postgres):
    with CaptureQueriesContext(connection) as queries:
        timeout_jobs_rebuild(due_before=timezone.now() + timedelta(minutes=5))
        subscriptions_rebuild(due_before=timezone.now() + timedelta(minutes=5))
    plans = _plans(queries.captured_queries, "SELECT")
    jobs = [p for p in plans if TIMEOUT_JOBS.table in p]
    subs = [p for p in plans if SUBSCRIPTIONS.table in p]
    assert jobs and subs
    for plan in jobs:
        assert _touches(plan, TIMEOUT_JOBS) == {TIMEOUT_JOBS.live_leaf}, plan
    for plan in subs:
        assert _touches(plan, SUBSCRIPTIONS) == {SUBSCRIPTIONS.live_leaf}, plan


def test_the_inbox_claim_of_scheduled_reminders_touches_only_the_live_leaf(postgres):
    sql = (
        f"UPDATE {TABLE} SET status = 'sent' WHERE {STILL_SCHEDULED} AND remind_at <= now() "
        "AND id IN (1, 2, 3) RETURNING id"
    )
    plan = _plan(sql, [SubStatus.SCHEDULED])
    assert _touches(plan, SUBSCRIPTIONS) == {SUBSCRIPTIONS.live_leaf}, plan
    assert "subscription_due" not in plan, plan


# --- upkeep ------------------------------------------------------------------------------------
# The migration attached the old table as the done leaves' partition of the day it ran, from
# MINVALUE: every past day is in it. These tests move the clock weeks ahead instead.

FUTURE = timedelta(days=40)
NO_DROP = {"timeout_job_retention": timedelta(0), "subscription_retention": timedelta(0)}


def _finished_on(day: datetime, biz_id: str, status: int = Status.PROCESSED) -> TimeoutJob:
    """A job finished at noon of ``day``, its partition made as the upkeep of that day would."""
    reminder_partitions_maintain(now=day, **NO_DROP)
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id=biz_id, action_time=WHEN)
    noon = day.replace(hour=12, minute=0, second=0, microsecond=0)
    TimeoutJob.objects.filter(pk=job.pk).update(status=status, gmt_modified=noon)
    assert _where(TimeoutJob._meta.db_table, "job_id", job.pk) == partition_name(
        TIMEOUT_JOBS.done_leaf, day
    )
    return job


@pytest.fixture
def days_restored():
    """What a test that commits its DDL dropped comes back: today's partitions."""
    yield
    for layout in (TIMEOUT_JOBS, SUBSCRIPTIONS):
        partitions_ensure(layout.done_days, now=timezone.now())


def test_the_upkeep_creates_days_ahead_and_drops_whole_days_past_the_retention(postgres):
    now = timezone.now() + FUTURE
    old = _finished_on(now - timedelta(days=10), "old")
    recent = _finished_on(now - timedelta(days=3), "recent")
    pending = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="live", action_time=WHEN)
    report = reminder_partitions_maintain(
        now=now, timeout_job_retention=timedelta(days=7), subscription_retention=timedelta(0)
    )
    dropped = report.dropped[TIMEOUT_JOBS.done_leaf].dropped
    assert partition_name(TIMEOUT_JOBS.done_leaf, now - timedelta(days=10)) in dropped
    assert partition_name(TIMEOUT_JOBS.done_leaf, now - timedelta(days=3)) not in dropped
    assert report.dropped[SUBSCRIPTIONS.done_leaf].dropped == []
    days = partitions_list(TIMEOUT_JOBS.done_leaf)
    assert partition_name(TIMEOUT_JOBS.done_leaf, now + timedelta(days=2)) in days
    assert not TimeoutJob.objects.filter(pk=old.pk).exists()
    assert TimeoutJob.objects.filter(pk=recent.pk).exists()
    assert TimeoutJob.objects.get(pk=pending.pk).status == Status.PENDING
    # Retention 0 keeps everything.
    report = reminder_partitions_maintain(now=now + timedelta(days=30), **NO_DROP)
    assert report.dropped[TIMEOUT_JOBS.done_leaf].dropped == []
    assert TimeoutJob.objects.filter(pk=recent.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_day_is_not_dropped_while_a_requeue_is_moving_its_dead_job_out(postgres, days_restored):
    """Retention racing a requeue: the requeue holds the dead job's row; the drop does not get
    its lock in time and leaves the day to the next pass; by then the job is pending, in the
    live leaf, and the day goes without it."""
    now = timezone.now() + FUTURE
    day = now - timedelta(days=10)
    job = _finished_on(day, "requeued", status=Status.DEAD)
    holding, release, out = threading.Event(), threading.Event(), {}

    def requeue():
        with transaction.atomic():
            dead_letters_requeue(topic=TOPIC, slot=job.slot, job_ids=[str(job.pk)])
            holding.set()
            assert release.wait(30)
        return True

    thread = _in_thread(requeue, out, "requeue")
    assert holding.wait(30)
    retention = {"timeout_job_retention": timedelta(days=7), "subscription_retention": timedelta(0)}
    report = reminder_partitions_maintain(now=now, **retention)
    name = partition_name(TIMEOUT_JOBS.done_leaf, day)
    assert name in report.dropped[TIMEOUT_JOBS.done_leaf].busy
    assert name in partitions_list(TIMEOUT_JOBS.done_leaf)
    release.set()
    thread.join(30)
    assert out["requeue"] is True
    report = reminder_partitions_maintain(now=now, **retention)
    assert name in report.dropped[TIMEOUT_JOBS.done_leaf].dropped
    assert TimeoutJob.objects.get(pk=job.pk).status == Status.PENDING


@pytest.mark.django_db(transaction=True)
def test_one_process_of_the_fleet_keeps_the_partitions_at_a_time(postgres):
    holding, release, out = threading.Event(), threading.Event(), {}

    def hold_the_turn():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", MAINTAIN_LOCK)
            holding.set()
            assert release.wait(30)
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", MAINTAIN_LOCK)
        return True

    thread = _in_thread(hold_the_turn, out, "other")
    assert holding.wait(30)
    later = timezone.now() + timedelta(days=400)  # a day no other test makes
    report = reminder_partitions_maintain(now=later, **NO_DROP)
    assert report.skipped and report.created == []
    assert partition_name(TIMEOUT_JOBS.done_leaf, later) not in partitions_list(
        TIMEOUT_JOBS.done_leaf
    )
    release.set()
    thread.join(30)
    report = reminder_partitions_maintain(now=later, **NO_DROP)
    assert not report.skipped
    assert partition_name(TIMEOUT_JOBS.done_leaf, later) in report.created


def test_the_upkeep_drops_on_postgresql_and_leaves_sqlite_to_the_batched_delete(db):
    job = timeout_job_create(topic=TOPIC, biz_type="order", biz_id="by-vendor", action_time=WHEN)
    TimeoutJob.objects.filter(pk=job.pk).update(
        status=Status.PROCESSED, gmt_modified=timezone.now() - timedelta(days=30)
    )
    report = reminder_partitions_maintain(
        now=timezone.now(),
        timeout_job_retention=timedelta(days=1),
        subscription_retention=timedelta(days=1),
    )
    if connection.vendor == "postgresql":
        assert timeout_jobs_partitioned()
        # Dated before the first day, the row sat in DEFAULT, which the drop clears.
        assert report.dropped[TIMEOUT_JOBS.done_leaf].rows == 1
        assert not TimeoutJob.objects.filter(pk=job.pk).exists()
    else:
        assert report.created == [] and not report.dropped
        assert not timeout_jobs_partitioned()
        assert TimeoutJob.objects.filter(pk=job.pk).exists()  # the batched DELETE's to remove
