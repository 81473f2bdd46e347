"""``bench_days`` in a tiny form, for real: the production processes started beside it, real
PostgreSQL (autovacuum switched on and put back) and Redis. Its figures come from work done each
day (every claim expired or used, every reminder in the inbox, every timeout cancelled or fired,
the day before's expiry tasks removed by retention once re-dated); speed is never asserted."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import statistics
import subprocess
import sys
import time
import weakref
from datetime import UTC, datetime, timedelta

import psutil
import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from couponcenter.core.redis import broker_client, get_redis
from couponcenter.core.retention import table_partitioned
from couponcenter.coupons.bench.http import database_url
from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.ops.bench import days, machine_reference
from expiry.models import ExpirySettings, ExpiryTask
from expiry.services import expiry_settings_get
from reminders.bench import nginx
from reminders.bench.nginx import nginx_binary
from reminders.models import Notification, TimeoutJob, TimeoutTopic
from tests.support.factories import UserCouponFactory

# Alone: a run switches autovacuum on for the whole server, under every other test's database.
pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.alone]
# The runs fire their timeouts at nginx (make bench and CI install it).
needs_nginx = pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed")

# Each day's end asks for autovacuum's round for a moment only (the query runs; the figures are
# the benchmark's).
SHAPE = days.Shape(
    days=3, retention_days=1, claims=200, reminders=60, timeouts=25, autovacuum_wait_s=2
)


def _autovacuum() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return cursor.fetchone()[0]


def _autovacuum_in_auto_conf() -> list[str]:
    """What ``ALTER SYSTEM`` has written for autovacuum (what a server restart would read)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setting FROM pg_file_settings WHERE name = 'autovacuum' "
            "AND sourcefile LIKE '%%postgresql.auto.conf' ORDER BY seqno"
        )
        return [setting for (setting,) in cursor.fetchall()]


@needs_nginx
@pytest.mark.django_db(transaction=True)
def test_a_tiny_calendar_runs_every_day_for_real_and_puts_everything_back(
    monkeypatch, reminder_settings
):
    # The processes it starts (reminder worker, Celery, the spawned sweepers) use this database.
    monkeypatch.setenv("DATABASE_URL", database_url())
    ExpirySettings.objects.all().delete()
    retention_before = expiry_settings_get(max_age_s=0).retention
    autovacuum_before = _autovacuum()
    said: list[str] = []

    result = days.run(SHAPE, say=said.append)

    assert [d["day"] for d in result["days"]] == [1, 2, 3]
    used = SHAPE.claims // days.USED_EVERY
    fired = SHAPE.timeouts // 5
    for day in result["days"]:
        assert day["expired"] == SHAPE.claims - used  # the night expired every unused claim
        assert day["inbox"] == SHAPE.reminders
        assert (day["timeouts_cancelled"], day["timeouts_fired"]) == (SHAPE.timeouts - fired, fired)
        assert day["timeouts_arrived"] >= fired  # each in nginx's access log, at least once
        for rate in days.RATES:
            assert day[f"{rate}_per_s"] > 0
        assert set(day["tables"]) == {m._meta.db_table for m in days.TABLES}
        for stats in day["tables"].values():
            assert set(stats) == {
                "table_bytes", "index_bytes", "live_tuples", "dead_tuples", "partitioned"
            }  # fmt: skip
        assert day["tables"][UserCoupon._meta.db_table]["table_bytes"] > 0
        assert set(day["dead_tuples_at_day_end"]) == set(day["tables"])
        # The sweepers (processes that have exited, so their counts are in) read user coupons.
        assert set(day["buffers"]) == set(day["tables"])
        assert day["buffers"][UserCoupon._meta.db_table]["hit"] > 0
        assert 0 <= day["autovacuum_wait_s"] <= SHAPE.autovacuum_wait_s + 2
        # The night in its rounds, each its own cohort of the claims: together every unused one,
        # the day's rate their median. What each round met: the sweepers updated rows, so the
        # server wrote WAL meanwhile, and their own reads of the user coupons are counted (they
        # have exited).
        rounds = day["night_rounds"]
        cohorts = days.night_cohorts(SHAPE.claims)
        assert [r["expired"] for r in rounds] == [
            sum(1 for user in range(lo, hi + 1) if user % days.USED_EVERY) for lo, hi in cohorts
        ]
        assert day["expiry_sweep_per_s"] == sorted(r["per_s"] for r in rounds)[1]
        for night in rounds:
            assert night["per_s"] > 0
            assert night["wal_bytes"] > 0 and night["wal_fpi"] >= 0
            assert night["buffers"][UserCoupon._meta.db_table]["hit"] > 0
            assert all(isinstance(what, str) for what in night["autovacuum_beside"])
            # The harness analyzed the day's pending tasks after loading them, so the sweep
            # found the planner's statistics current and timed no ANALYZE of its own.
            assert night["sweep_analyzed"] == 0
        # Where the firing's seconds went: settled in order, the last one setting the rate.
        first, half, last = day["timeout_fire_settled_s"]
        assert 0 <= first <= half <= last
        # The rate is whole jobs a second over the unrounded seconds, ``last`` those seconds to
        # the millisecond: each is off by its rounding, which for a slow firing (a loaded
        # machine, a few jobs) is a whole job a second.
        assert day["timeout_fire_whole_per_s"] == pytest.approx(
            fired / last, abs=0.5 + fired * 0.0005 / (last - 0.0005) ** 2
        )
        # Each timeout rate is the median of its rounds'.
        for rate in ("timeout_create", "timeout_fire"):
            per_round = day[f"{rate}_rounds_per_s"]
            assert len(per_round) == days.TIMEOUT_ROUNDS and all(r > 0 for r in per_round)
            assert day[f"{rate}_per_s"] == sorted(per_round)[1]
        assert all(isinstance(what, str) for what in day["timeout_fire_autovacuum_beside"])
        # The machine's own speed, sampled three times a day; the day's figure their median.
        samples = day["reference"]["samples"]
        assert len(samples) == 3 and all(s["per_s"] > 0 for s in samples)
        assert day["reference_per_s"] == sorted(s["per_s"] for s in samples)[1]
    # Retention (one day) removes the day before's processed tasks, re-dated a day back, each day.
    removed = [d["retention_removed"][ExpiryTask._meta.db_table] for d in result["days"]]
    if table_partitioned(ExpiryTask._meta.db_table):
        # Whole days go when the whole day is past the retention: day 1's on day 3 (its user
        # coupons wait for it rather than taking their tasks with them).
        assert removed == [0, 0, SHAPE.claims]
    else:
        assert removed == [0, SHAPE.claims, SHAPE.claims]

    assert set(result["day_last_of_first"]) == set(days.RATES)
    assert all(ratio > 0 for ratio in result["day_last_of_first"].values())
    assert set(result["day_trend_last_of_first"]) == set(days.RATES)
    assert result["reference_last_of_first"] > 0
    assert set(result["day_last_of_first_of_reference"]) == set(days.RATES)
    assert set(result["met_of_reference"]) == {
        f"day_last_of_first_of_reference.{rate}" for rate in days.RATES
    }
    assert result["steady_day"] == 2
    assert result["table_bytes_last_of_steady"] > 0
    assert result["met"]["days_at_least_3x_retention"] is True
    lines = days.report_lines(result)
    assert any("last day / first day" in line and "target >= 0.9" in line for line in lines)
    assert any(line.startswith("total size: last day / day 2") for line in lines)
    assert any("| buffer hits | MiB read |" in line for line in lines)
    assert any(line.startswith("| day | round | sweep /s | expired | WAL MiB |") for line in lines)
    assert (
        sum(line.startswith("| 3 | ") for line in lines) == 2 + days.NIGHT_ROUNDS
    )  # a line a round
    assert any(line.startswith("| day | fire /s | first s | half s | last s |") for line in lines)

    # It said so, and put autovacuum, the live settings and the database back.
    if autovacuum_before != "on":
        assert "autovacuum switched on for this run" in result["autovacuum"]
        assert f"autovacuum put back: {autovacuum_before}" in said
    assert _autovacuum() == autovacuum_before
    assert expiry_settings_get(max_age_s=0).retention == retention_before
    assert not Coupon.objects.filter(name__startswith=days.COUPON_NAME).exists()
    assert not TimeoutJob.objects.filter(topic=days.TOPIC).exists()
    assert not TimeoutTopic.objects.filter(name=days.TOPIC).exists()
    assert not Notification.objects.filter(user_id__gte=days.USER_BASE).exists()
    assert machine_reference.TABLE not in connection.introspection.table_names()


@pytest.mark.django_db(transaction=True)
def test_without_nginx_the_command_refuses_before_it_changes_anything(monkeypatch):
    autovacuum_before = _autovacuum()
    monkeypatch.setattr(nginx, "nginx_binary", lambda: None)
    with pytest.raises(CommandError, match="apt-get install nginx-light"):
        call_command("bench_days", "--days", "3", "--retention-days", "1")
    assert _autovacuum() == autovacuum_before
    assert not TimeoutTopic.objects.filter(name=days.TOPIC).exists()


@pytest.mark.django_db(transaction=True)
def test_autovacuum_and_the_retention_settings_are_put_back_after_a_failure():
    autovacuum_before = _autovacuum()
    retention_before = expiry_settings_get(max_age_s=0).retention
    said: list[str] = []
    with (
        pytest.raises(RuntimeError, match="mid-run"),
        days.autovacuum_on(said.append),
        days.retention_settings(timedelta(days=1)),
    ):
        assert _autovacuum() == "on"
        assert expiry_settings_get(max_age_s=0).retention == timedelta(days=1)
        raise RuntimeError("mid-run")
    assert _autovacuum() == autovacuum_before
    assert expiry_settings_get(max_age_s=0).retention == retention_before
    if autovacuum_before != "on":
        assert said == [
            "autovacuum switched on for this run (ALTER SYSTEM, as in production); it was "
            f"{autovacuum_before}, and is put back afterwards",
            f"autovacuum put back: {autovacuum_before}",
        ]


@needs_nginx
@pytest.mark.django_db(transaction=True)
def test_sigterm_mid_run_puts_autovacuum_back_and_deletes_the_bench_rows(tmp_path):
    autovacuum_before = _autovacuum()
    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "manage.py", "bench_days", "--days", "3", "--retention-days", "1"]
    argv += ["--claims", "100", "--reminders", "20", "--timeouts", "10"]
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen(argv, cwd=settings.BASE_DIR, env=env, stderr=stderr,
                                stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            # Once the first day's claims are in: autovacuum is on and bench rows exist.
            while not Coupon.objects.filter(name__startswith=days.COUPON_NAME).exists():
                assert proc.poll() is None, err.read_text()
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.1)  # polls the database
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    output = err.read_text()
    assert proc.returncode != 0
    if autovacuum_before != "on":
        assert f"autovacuum put back: {autovacuum_before}" in output, output
    assert _autovacuum() == autovacuum_before
    assert not Coupon.objects.filter(name__startswith=days.COUPON_NAME).exists()
    assert not TimeoutTopic.objects.filter(name=days.TOPIC).exists()


@needs_nginx
@pytest.mark.django_db(transaction=True)
def test_a_run_killed_outright_still_has_autovacuum_put_back(tmp_path):
    """SIGKILL (an OOM kill, a timeout's kill) runs no ``finally``: ``ALTER SYSTEM`` would
    outlive the run, server restarts included, unless something outside the run undoes it."""
    autovacuum_before, auto_conf_before = _autovacuum(), _autovacuum_in_auto_conf()
    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "manage.py", "bench_days", "--days", "3", "--retention-days", "1"]
    argv += ["--claims", "100", "--reminders", "20", "--timeouts", "10"]
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen(argv, cwd=settings.BASE_DIR, env=env, stderr=stderr,
                                stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            # Killed in the first night, once its sweeper processes have started: they too must
            # not outlive the run, whether they are still starting or waiting for the start.
            while len(sweepers := _sweepers(proc.pid)) < days.SWEEPERS:
                assert proc.poll() is None, err.read_text()
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.05)  # polls the process table
            assert _autovacuum() == "on"
            children = psutil.Process(proc.pid).children(recursive=True)
            # and its nginx, reminder worker and Celery worker
            assert len(children) > len(sweepers)
            # and the guard of its Redis keys and delivery queue (``namespace_guard``)
            (guard,) = [c for c in children if "namespace_guard" in " ".join(c.cmdline())]
            prefix, queue = guard.cmdline()[-2:]
        finally:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 60
    while _autovacuum() != autovacuum_before and time.monotonic() < deadline:
        time.sleep(0.1)  # polls the setting the guard puts back
    assert _autovacuum() == autovacuum_before, err.read_text()
    assert _autovacuum_in_auto_conf() == auto_conf_before  # and for the next server start
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, [child.cmdline() for child in alive]
    # The guard (one of the children) ended after the workers: nothing of the run is in Redis.
    assert list(get_redis().scan_iter(match=f"{prefix}:*")) == []
    broker = broker_client()
    if broker is not None:
        assert list(broker.scan_iter(match=f"*{queue}*")) == []


def _sweepers(pid: int) -> list[psutil.Process]:
    """The night's sweeper processes of the run ``pid`` (multiprocessing's spawned children)."""
    sweepers = []
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            if "spawn_main" in " ".join(child.cmdline()):
                sweepers.append(child)
    return sweepers


@pytest.mark.parametrize("claims", [10, 11, 200, 300_000, 300_001])
def test_the_night_cohorts_cover_every_claimer_once_in_even_contiguous_ranges(claims):
    cohorts = days.night_cohorts(claims)

    assert len(cohorts) == days.NIGHT_ROUNDS
    assert [user for lo, hi in cohorts for user in range(lo, hi + 1)] == list(range(1, claims + 1))
    sizes = [hi - lo + 1 for lo, hi in cohorts]
    assert max(sizes) - min(sizes) <= 1


def test_a_firing_s_rounds_follow_the_settles_and_one_stalled_round_leaves_the_median():
    due = datetime(2026, 11, 29, tzinfo=UTC)
    # Six jobs in three rounds of two; the second round waits four seconds for its last job.
    settled = [due + timedelta(seconds=s) for s in (0.5, 1.0, 1.5, 5.5, 6.0, 6.5)]

    rates = days.firing_rounds_per_s(due, settled)

    assert rates == pytest.approx([2 / 1.0, 2 / 4.5, 2 / 1.0])
    assert statistics.median(rates) == pytest.approx(2.0)
    # Fewer jobs than rounds: only the rounds that hold a job.
    assert days.firing_rounds_per_s(due, settled[:1]) == pytest.approx([2.0])


class _Held:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self):
        self.me = self


def test_a_service_round_sees_the_harness_s_heap_collected_and_frozen_and_then_given_back():
    before = gc.get_freeze_count()
    gone = weakref.ref(_Held())  # the harness's garbage, still in a cycle
    kept = [[n] for n in range(1000)]  # what the harness keeps (lists: the collector tracks them)

    with days.service_heap():
        # Collected before the round, not on its clock; what the harness keeps is out of view.
        assert gone() is None
        assert gc.get_freeze_count() >= before + len(kept)
        assert not any(o is kept[0] for o in gc.get_objects())
        made = weakref.ref(_Held())  # the round's own garbage is still the collector's
        gc.collect()
        assert made() is None

    assert gc.get_freeze_count() == before
    assert any(o is kept[0] for o in gc.get_objects())


@pytest.mark.django_db(transaction=True)
def test_the_autovacuum_round_reads_a_table_s_own_threshold_before_the_server_s():
    UserCouponFactory.create_batch(20)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {UserCoupon._meta.db_table}, {Coupon._meta.db_table}")
        cursor.execute(
            "SELECT relname, reltuples FROM pg_class WHERE relname IN (%s, %s)",
            [UserCoupon._meta.db_table, Coupon._meta.db_table],
        )
        rows = dict(cursor.fetchall())
        cursor.execute(
            "SELECT current_setting('autovacuum_vacuum_threshold')::float, "
            "current_setting('autovacuum_vacuum_scale_factor')::float"
        )
        base, scale = cursor.fetchone()

    thresholds = days.vacuum_thresholds()

    user_coupons = UserCoupon._meta.db_table
    assert thresholds[user_coupons][1] == pytest.approx(base + 0.02 * rows[user_coupons])
    coupons = Coupon._meta.db_table
    assert thresholds[coupons][1] == pytest.approx(base + scale * rows[coupons])
    assert all(dead >= 0 for dead, _ in thresholds.values())


def test_the_fitted_line_reads_a_trend_through_the_noise_of_single_days():
    assert days._fitted_last_of_first([100, 100, 100]) == 1.0
    # A steady fall: the line ends where the days do.
    assert days._fitted_last_of_first([100, 90, 80, 70]) == 0.7
    # Flat but for a slow first day: the end points say 1.3, the line less.
    assert days._fitted_last_of_first([70, 100, 100, 100, 100, 91]) == 1.174
    assert days._fitted_last_of_first([100]) is None
    assert days._fitted_last_of_first([0, 0]) is None


def test_an_autovacuum_worker_is_named_by_what_it_does_and_to_which_table():
    assert (
        days.autovacuum_label("autovacuum: VACUUM ANALYZE public.couponcenter_usercoupon")
        == "VACUUM ANALYZE couponcenter_usercoupon"
    )
    assert days.autovacuum_label("autovacuum: ANALYZE public.t_p20261128") == "ANALYZE t_p20261128"


@pytest.mark.django_db(transaction=True)
def test_the_wal_counters_grow_with_what_is_written():
    before = days.wal_stats()
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_days_wal_probe (n int)")
        try:
            cursor.execute("INSERT INTO bench_days_wal_probe SELECT generate_series(1, 10000)")
            cursor.execute("SELECT pg_stat_force_next_flush()")
        finally:
            cursor.execute("DROP TABLE bench_days_wal_probe")
    after = days.wal_stats()
    assert after["records"] - before["records"] >= 10_000
    assert after["bytes"] > before["bytes"]


@pytest.mark.django_db(transaction=True)
def test_the_machine_reference_does_its_fixed_work_on_a_table_of_its_own_and_drops_it():
    machine_reference.create()  # what a run killed in the middle of a sample leaves
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {machine_reference.TABLE} VALUES (1, 1, 'x', 'y', now(), '')")

    sample = machine_reference.measure()  # it counts its rows: a short count raises

    assert sample["insert_per_s"] > 0 and sample["update_per_s"] > 0
    # Every row inserted and updated, over the two halves' seconds together.
    assert min(sample["insert_per_s"], sample["update_per_s"]) <= sample["per_s"]
    assert sample["per_s"] <= max(sample["insert_per_s"], sample["update_per_s"])
    assert machine_reference.TABLE not in connection.introspection.table_names()


def _calendar_day(day: int, reference: int, **rates: int) -> dict:
    return {
        "day": day,
        "reference_per_s": reference,
        **{f"{rate}_per_s": rates.get(rate, 1000) for rate in days.RATES},
        "tables": {"t": {"table_bytes": 1, "index_bytes": 1, "live_tuples": 10,
                         "dead_tuples": 0, "partitioned": True}},
        "dead_tuples_at_day_end": {"t": 0},
        "autovacuum_wait_s": 0.0,
    }  # fmt: skip


def test_a_rate_read_over_the_machine_s_speed_tells_a_slower_machine_from_a_slower_service():
    shape = days.Shape(days=3, retention_days=1, claims=1, reminders=1, timeouts=1)
    # The machine and every path 20 % slower on the last day, but for the inbox, which held.
    slower_machine = [
        _calendar_day(1, 100_000),
        _calendar_day(2, 90_000, expiry_sweep=900, inbox_burst=1000, timeout_create=900,
                      timeout_fire=900),
        _calendar_day(3, 80_000, expiry_sweep=800, inbox_burst=1000, timeout_create=800,
                      timeout_fire=800),
    ]  # fmt: skip

    result = days.summary(slower_machine, shape)

    assert result["reference_last_of_first"] == 0.8
    # The target as written reads the rates alone: not met.
    assert result["day_last_of_first"]["timeout_create"] == 0.8
    assert result["met"]["day_last_of_first.timeout_create"] is False
    # Over the machine's speed of each day, the service held; the inbox gained on the machine.
    assert result["day_last_of_first_of_reference"] == {
        "expiry_sweep": 1.0, "inbox_burst": 1.25, "timeout_create": 1.0, "timeout_fire": 1.0
    }  # fmt: skip
    assert result["day_trend_last_of_first_of_reference"]["timeout_create"] == 1.0
    assert all(result["met_of_reference"].values())

    # The service 20 % slower on the same machine: both readings say so.
    slower_service = [_calendar_day(1, 100_000), _calendar_day(3, 100_000, timeout_create=800)]
    result = days.summary(slower_service, shape)
    assert result["day_last_of_first_of_reference"]["timeout_create"] == 0.8
    assert result["met_of_reference"]["day_last_of_first_of_reference.timeout_create"] is False
    assert result["met"]["day_last_of_first.timeout_create"] is False
    lines = days.report_lines({**result, "days": [], "shape": shape.__dict__})
    assert "over the machine's speed of each day: 0.8 (NOT MET)" in "\n".join(lines)
