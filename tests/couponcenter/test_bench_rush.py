"""The rush benchmark against a real gunicorn and wrk: a coupon opens a second after the users
start tapping; every user gets one final answer, the winners are exactly the stock (or every user,
when the stock is larger), nobody holds two, and the run leaves nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from io import StringIO

import psutil
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command

from couponcenter.coupons import gate
from couponcenter.coupons.bench import rush
from couponcenter.coupons.bench.http import database_url
from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.ops.bench import report
from expiry.models import ExpiryTask

pytestmark = [
    pytest.mark.postgres,
    # Alone: gunicorn and wrk at full load, with the machine to themselves.
    pytest.mark.alone,
    pytest.mark.django_db(transaction=True),
    # Under CI=1 a skip fails the run (tests/conftest.py): .ci/run installs wrk.
    pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed"),
]


def test_a_tiny_rush_answers_every_user_and_sells_exactly_the_stock(settings):
    settings.DEBUG = True  # the command refuses to load and delete data otherwise
    before = (Coupon.objects.count(), UserCoupon.objects.count(), ExpiryTask.objects.count())
    out = StringIO()
    call_command(
        "bench_rush", "--users", "300", "--stocks", "50,300", "--connections", "4",
        "--workers", "1", "--threads", "4", "--healthz-seconds", "1", "--json", stdout=out,
    )  # fmt: skip
    result = json.loads(out.getvalue())
    assert [run["stock"] for run in result["runs"]] == [50, 300]
    for run in result["runs"]:
        assert run["winners"] == run["stock"] == run["answers_by_code"]["201"]
        assert run["users_over_limit"] == 0
        assert run["answers"] == 300 and run["unanswered"] == 0
        assert run["answers_by_code"]["sold_out"] == 300 - run["stock"]
        assert run["answers_by_code"]["errors"] == 0
        assert run["exact"] is True and run["audit"]["oversell"] is False
        assert run["healthz_per_s"] > 0 and run["answers_of_healthz"] > 0
        # The reference is the faster of the windows before and after the rush.
        assert run["healthz_per_s"] == max(run["healthz_before_after_per_s"])
        assert len(run["healthz_before_after_per_s"]) == len(run["healthz_p99_ms"]) == 2
        assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["p999_ms"]
        # No final answer comes before the opening, which is lead_s after the first tap.
        assert run["all_answered_s"] >= run["lead_s"] > 0
    ratios = report.ratios({"rush": result})
    assert ratios["rush_answers_of_raw_http"] == result["runs"][0]["answers_of_healthz"]
    assert ratios["rush_winners_of_raw_http"] == result["runs"][1]["answers_of_healthz"]
    after = (Coupon.objects.count(), UserCoupon.objects.count(), ExpiryTask.objects.count())
    assert after == before


def test_sigterm_mid_rush_stops_gunicorn_and_wrk_and_deletes_the_coupon(tmp_path):
    """Benchmarks are stopped with SIGTERM (an orchestrator's, a timeout's): it must unwind as
    Ctrl-C does, not leave a gunicorn serving and the run's coupon in the tables."""
    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "manage.py", "bench_rush", "--users", "200000", "--stocks", "1000"]
    argv += ["--connections", "4", "--workers", "1", "--threads", "4", "--healthz-seconds", "1"]
    err = tmp_path / "stderr"
    with err.open("w") as stderr:
        proc = subprocess.Popen(argv, cwd=django_settings.BASE_DIR, env=env, stderr=stderr,
                                stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 180
            while not Coupon.objects.filter(name__startswith="bench-rush").exists():
                assert proc.poll() is None, err.read_text()
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.1)  # polls the database
            children = psutil.Process(proc.pid).children(recursive=True)
            assert any("gunicorn" in " ".join(c.cmdline()) for c in children)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _, alive = psutil.wait_procs(children, timeout=60)
    assert not alive, [child.cmdline() for child in alive]
    assert proc.returncode != 0
    assert not Coupon.objects.filter(name__startswith="bench-rush").exists(), err.read_text()


def test_a_signal_inside_the_coupons_commit_hooks_still_deletes_it(monkeypatch):
    """The coupon's row commits before its on-commit hooks (the gate's build) run: a SIGTERM
    that lands inside them (seen once in CI) must not leave the committed coupon behind."""

    def interrupted(coupon_id):
        raise KeyboardInterrupt  # what the command's SIGTERM handler raises

    monkeypatch.setattr(gate, "gate_build", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rush._rush(None, token="", stock=10, users=10, connections=1, max_seconds=1,
                   progress=lambda *args: None)  # fmt: skip
    assert not Coupon.objects.filter(name__startswith="bench-rush").exists()
