"""The management commands, end to end through call_command."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from couponcenter.coupons.models import Coupon, UserCoupon
from expiry import services
from expiry.bench import sweep
from expiry.bench.sweep import BENCH_COUPON_NAME
from expiry.models import ExpiryTask
from tests.support.factories import ExpiryTaskFactory, UserCouponFactory


@pytest.fixture(autouse=True)
def _fresh_settings():
    services.expiry_settings_cache_clear()
    yield
    services.expiry_settings_cache_clear()


@pytest.mark.parametrize("value", ["0", "-3"])
def test_run_expiry_sweeper_rejects_a_batch_size_below_one(value):
    with pytest.raises(CommandError, match="--batch-size must be at least 1"):
        call_command("run_expiry_sweeper", "--once", f"--batch-size={value}")


def test_run_expiry_sweeper_rejects_a_batch_size_that_is_not_a_number():
    with pytest.raises(CommandError, match="invalid int value"):
        call_command("run_expiry_sweeper", "--once", "--batch-size=lots")


@pytest.mark.django_db(transaction=True)
def test_run_expiry_sweeper_once_expires_due_coupons_and_exits():
    now = timezone.now()
    due = [
        UserCouponFactory(expires_at=now - timedelta(seconds=1), claimed_at=now - timedelta(days=1))
        for _ in range(3)
    ]
    later = UserCouponFactory(expires_at=now + timedelta(hours=1))
    for user_coupon in [*due, later]:
        ExpiryTaskFactory(user_coupon=user_coupon)
    out = StringIO()

    call_command("run_expiry_sweeper", "--once", "--batch-size=2", stdout=out)

    assert "expired 3 coupons, processed 3 tasks in 2 batches" in out.getvalue()
    assert UserCoupon.objects.filter(status="expired").count() == 3
    assert ExpiryTask.objects.get(user_coupon=later).status == "pending"


@pytest.mark.django_db
def test_bench_refuses_to_run_with_debug_off(settings):
    settings.DEBUG = False
    with pytest.raises(CommandError, match="--force"):
        call_command("bench_expiry", "--count=10")


@pytest.mark.django_db
def test_bench_rejects_bad_numbers():
    with pytest.raises(CommandError, match="at least 1"):
        call_command("bench_expiry", "--count=10", "--workers=0", "--force")


@pytest.mark.django_db
def test_bench_rejects_bad_rounds():
    with pytest.raises(CommandError, match=r"--rounds must be within 1\.\.10, got 0"):
        call_command("bench_expiry", "--count=10", "--rounds=0", "--force")


@pytest.mark.django_db(transaction=True)
def test_bench_in_rounds_takes_turns_and_reports_each_round():
    out = StringIO()
    call_command(
        "bench_expiry", "--count=200", "--workers=2", "--batch-size=40", "--rounds=2", "--json",
        "--force", stdout=out,
    )  # fmt: skip
    report = json.loads(out.getvalue())
    assert report["rounds"] == 2
    assert len(report["seconds_each"]) == 2 and len(report["raw_sql_seconds_each"]) == 2
    # Each side's time is the mean of its rounds (rounded to the millisecond).
    assert report["seconds"] == pytest.approx(sum(report["seconds_each"]) / 2, abs=0.002)
    assert report["raw_sql_seconds"] == pytest.approx(
        sum(report["raw_sql_seconds_each"]) / 2, abs=0.002
    )
    assert not Coupon.objects.filter(name=BENCH_COUPON_NAME).exists()
    assert UserCoupon.objects.count() == 0 and ExpiryTask.objects.count() == 0


def test_rounds_take_turns_so_each_side_goes_first_as_often():
    assert sweep._phases(1) == ["ours", "raw"]
    assert sweep._phases(2) == ["ours", "raw", "raw", "ours"]
    assert sweep._phases(3) == ["ours", "raw", "raw", "ours", "ours", "raw"]
    assert sweep._phases(2, warmup=True) == ["warm-up", "ours", "raw", "raw", "ours"]


@pytest.mark.django_db(transaction=True)
def test_an_untimed_warm_up_runs_first_unless_turned_off():
    reports = []
    for extra in ([], ["--no-warmup"]):
        out = StringIO()
        call_command(
            "bench_expiry", "--count=120", "--batch-size=40", "--json", "--force", *extra,
            stdout=out,
        )  # fmt: skip
        reports.append(json.loads(out.getvalue()))
    warmed, cold = reports
    assert warmed["warmup_seconds"] > 0 and cold["warmup_seconds"] is None
    assert UserCoupon.objects.count() == 0 and ExpiryTask.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_bench_expires_its_own_rows_reports_json_and_cleans_up():
    real = ExpiryTaskFactory(
        user_coupon=UserCouponFactory(
            expires_at=timezone.now() - timedelta(days=1),
            claimed_at=timezone.now() - timedelta(days=2),
        )
    )
    out = StringIO()

    call_command(
        "bench_expiry", "--count=300", "--workers=2", "--batch-size=40", "--json", "--force",
        stdout=out,
    )  # fmt: skip

    report = json.loads(out.getvalue())
    assert report["count"] == 300 and report["workers"] == 2 and report["batch_size"] == 40
    assert report["per_s"] > 0 and report["raw_sql_per_s"] > 0 and report["seconds"] > 0
    assert report["database"] in {"sqlite", "postgresql"}
    if report["database"] == "postgresql":  # each timed phase reports the WAL it wrote
        assert report["wal_mb"] >= 0 and report["raw_sql_wal_mb"] >= 0
    else:
        assert report["wal_mb"] is None and report["raw_sql_wal_mb"] is None
    # The bench never touches real rows, even due ones, and leaves none of its own.
    real.refresh_from_db()
    assert real.status == "pending" and real.user_coupon.status == "unused"
    assert not Coupon.objects.filter(name=BENCH_COUPON_NAME).exists()
    assert UserCoupon.objects.count() == 1 and ExpiryTask.objects.count() == 1
