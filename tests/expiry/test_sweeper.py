"""The Sweeper loop: passes, live settings, failed batches, sleeping, SIGTERM."""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.db.models import F
from django.utils import timezone

from couponcenter.coupons.models import UserCoupon
from expiry import selectors, services
from expiry.bench.sweep import BENCH_NOW, bench_data_load
from expiry.models import ExpirySettings, ExpiryTask
from expiry.sweeper import Sweeper
from tests.support.factories import CouponFactory, ExpiryTaskFactory, UserCouponFactory

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_settings():
    services.expiry_settings_cache_clear()
    yield
    services.expiry_settings_cache_clear()


def due_tasks(count, *, ago=timedelta(minutes=1)):
    expires_at = timezone.now() - ago
    return [
        ExpiryTaskFactory(
            user_coupon=UserCouponFactory(
                expires_at=expires_at, claimed_at=expires_at - timedelta(days=1)
            )
        )
        for _ in range(count)
    ]


def pending_count():
    return ExpiryTask.objects.filter(status=ExpiryTask.Status.PENDING).count()


# --- a trigger that fails one coupon's update: a real database error, no mocks --------------------


def add_failing_trigger(user_coupon_id: int) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION expiry_test_boom() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'boom'; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER expiry_test_boom BEFORE UPDATE ON couponcenter_usercoupon "
                f"FOR EACH ROW WHEN (NEW.id = {int(user_coupon_id)}) "
                "EXECUTE FUNCTION expiry_test_boom()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER expiry_test_boom BEFORE UPDATE ON couponcenter_usercoupon "
                f"WHEN NEW.id = {int(user_coupon_id)} BEGIN SELECT RAISE(ABORT, 'boom'); END"
            )


def drop_failing_trigger() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("DROP TRIGGER IF EXISTS expiry_test_boom ON couponcenter_usercoupon")
            cursor.execute("DROP FUNCTION IF EXISTS expiry_test_boom()")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS expiry_test_boom")


@pytest.mark.django_db(transaction=True)
def test_run_once_sweeps_what_is_due_and_records_the_run_in_redis(redis_prefix):
    due_tasks(5)
    not_yet = due_tasks(1, ago=-timedelta(hours=1))[0]

    result = Sweeper(batch_size=2).run_once()

    assert result.ok
    assert (result.totals.batches, result.totals.processed) == (3, 5)
    assert pending_count() == 1 and services.next_due_at() == not_yet.expire_at
    last = selectors.last_run()
    assert services.last_run_key().startswith(f"{redis_prefix}:")
    assert (last["processed"], last["expired"], last["error"]) == ("5", "5", "")


@pytest.mark.django_db
def test_an_idle_pass_logs_nothing_and_a_busy_one_its_progress(redis_prefix, caplog):
    with caplog.at_level("INFO", logger="expiry.sweeper"):
        Sweeper(batch_size=2).run_once()  # nothing due
        assert not [r for r in caplog.records if "so far" in r.getMessage()]
        due_tasks(3)
        Sweeper(batch_size=2).run_once()
    assert any("tasks processed so far" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_each_pass_reads_the_live_settings():
    due_tasks(4)
    sweeper = Sweeper()
    config = services.expiry_settings_get(max_age_s=0)
    config.batch_size = 3
    services.expiry_settings_save(instance=config)

    assert sweeper.run_once().totals.batches == 2  # 3 + 1

    ExpirySettings.objects.update(batch_size=1, version=F("version") + 1)
    due_tasks(2)
    assert sweeper.run_once().totals.batches == 3  # 1 + 1 + empty


@pytest.mark.django_db(transaction=True)
def test_a_failing_batch_leaves_its_rows_pending_and_the_next_pass_retries():
    tasks = due_tasks(4)
    add_failing_trigger(tasks[2].user_coupon_id)
    sweeper = Sweeper(batch_size=10)
    try:
        failed = sweeper.run_once()
        assert not failed.ok and "boom" in failed.error
        # The whole batch rolled back: nothing expired, nothing processed.
        assert pending_count() == 4
        assert not UserCoupon.objects.filter(status=UserCoupon.Status.EXPIRED).exists()
        assert selectors.last_run()["error"] == failed.error
    finally:
        drop_failing_trigger()

    retried = sweeper.run_once()
    assert retried.ok and retried.totals.expired == 4
    assert pending_count() == 0


@pytest.mark.django_db(transaction=True)
def test_cleanup_runs_with_the_configured_retention():
    task = due_tasks(1)[0]
    ExpiryTask.objects.filter(pk=task.pk).update(
        status="processed", updated_at=timezone.now() - timedelta(days=8)
    )
    result = Sweeper().run_once()
    assert result.cleaned == 1 and not ExpiryTask.objects.exists()


@pytest.mark.django_db
def test_sleep_is_capped_by_the_interval_and_ends_at_the_next_due_task():
    sweeper = Sweeper()
    services.expiry_settings_get(max_age_s=0)  # defaults: 60 s
    idle = sweeper.run_once()
    # Each bound is taken from the clock around the call, so a slow machine cannot break them.
    started = time.monotonic()
    sleep = sweeper._sleep_seconds(started, idle)
    assert 60 - (time.monotonic() - started) <= sleep <= 60

    # Drift correction: the interval counts from the start of the pass, not its end.
    sleep = sweeper._sleep_seconds(started - 10, idle)
    assert 50 - (time.monotonic() - started) <= sleep <= 50

    due_tasks(1, ago=-timedelta(seconds=5))  # due in 5 s
    due = services.next_due_at()
    before = timezone.now()
    sleep = sweeper._sleep_seconds(time.monotonic(), idle)
    after = timezone.now()
    assert (due - after).total_seconds() <= sleep <= (due - before).total_seconds() + 0.001


@pytest.mark.django_db(transaction=True)
def test_stop_ends_run_forever_promptly():
    due_tasks(3)
    sweeper = Sweeper()

    def run():
        try:
            sweeper.run_forever()
        finally:
            connection.close()  # the thread's own connection

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while pending_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    sweeper.stop()  # it is now asleep for up to the 60 s interval
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert pending_count() == 0


def _subprocess_env() -> dict:
    db = connection.settings_dict
    url = f"postgres://{db['USER']}"
    url += f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    url += f"@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = dict(os.environ, DATABASE_URL=url, REDIS_KEY_PREFIX=django_settings.REDIS_KEY_PREFIX)
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_sigterm_finishes_the_batch_in_flight_then_exits():
    count, batch = 40_000, 500
    coupon = CouponFactory(total_stock=count)
    bench_data_load(coupon=coupon, count=count, progress=False)
    assert services.next_due_at() < BENCH_NOW  # long due, so the real clock sweeps them
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "run_expiry_sweeper", "--batch-size", str(batch)],
        cwd=ROOT,
        env=_subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not ExpiryTask.objects.filter(status="processed").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "sweeper never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = proc.stdout.read().decode()
    assert proc.returncode == 0, output
    assert "sweeper stopped" in output
    # Whole batches only: every processed task's coupon expired, every pending one untouched.
    processed = ExpiryTask.objects.filter(status="processed").count()
    expired = UserCoupon.objects.filter(status="expired").count()
    assert processed == expired and processed % batch == 0, (processed, expired)
    assert 0 < processed < count, "the SIGTERM landed mid-sweep"
    assert processed + pending_count() == count


def _terminate_backend(pid):
    """Have PostgreSQL drop the backend ``pid`` (what an outage does to a live connection)."""
    import psycopg2

    other = psycopg2.connect(**connection.get_connection_params())
    try:
        other.autocommit = True
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
            assert cursor.fetchone()[0], "the backend was not terminated"
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_connection_lost_between_sweep_and_cleanup_fails_the_pass_not_the_sweeper():
    # CI, PostgreSQL cut for 10 s: the connection went after the pass's last batch, the lane's
    # release failed (logged), and cleanup's BEGIN raised InterfaceError ("connection already
    # closed"), which is no DatabaseError: it escaped run_once and the sweeper process died.
    if connection.vendor != "postgresql":
        pytest.skip("a PostgreSQL backend to terminate")
    due_tasks(3)

    class CutAfterTheSweep(Sweeper):
        def _progress(self, batch):
            super()._progress(batch)
            _terminate_backend(connection.connection.info.backend_pid)

    sweeper = CutAfterTheSweep(batch_size=10)
    failed = sweeper.run_once()
    assert not failed.ok and "closed" in failed.error
    assert failed.totals.expired == 3  # the sweep itself committed before the cut

    due_tasks(2)
    recovered = Sweeper(batch_size=10).run_once()  # a fresh connection, no restart
    assert recovered.ok and recovered.totals.expired == 2
    assert pending_count() == 0
