"""``bench_day`` shortened, for real: the production processes (two web pods, the reminder worker,
Celery, the sweeper) on real PostgreSQL and Redis, every path alone and then all at once, with the
rolling deploy. Asserted: every process replaced, nothing lost or duplicated over the run, and
background work held back while an urgent path was late, as the hold-back records show. Speed is
never asserted (the figures are the benchmark's, not the test's).

The script makes an urgent path late for sure: the reminder worker is replaced first and its
successor placed ``GAP_S`` later, so the order timeouts falling due meanwhile wait unclaimed past
their target; the expiry tasks fall due inside that gap."""

from __future__ import annotations

import psutil
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from couponcenter.coupons.bench.http import database_url
from couponcenter.coupons.models import Coupon
from couponcenter.ops.bench import day
from reminders.bench import nginx
from reminders.models import TimeoutTopic

# Alone: a day loads the machine on purpose, and its back-off is judged by lateness.
pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.alone]

GAP_S = 8.0
SHAPE = day.Shape(
    seconds=45,
    alone_s=2,
    reminders_rate=10,
    timeouts_rate=8,
    claims_rate=3,
    reads_rate=3,
    burst=300,
    rush_users=100,
    timeout_burst=100,
    expiry=2_000,
)
SCRIPT = day.Script(
    burst_at=3,
    rush_at=5,
    timeout_burst_at=6,
    deploy_at=8,
    sweep_at=8 + GAP_S - 2,  # the reminder worker gone for a few seconds by then
    deploy_order=("reminder-worker", "web-a", "web-b", "celery", "expiry-sweeper"),
    deploy_gaps=(("reminder-worker", GAP_S),),
)


@pytest.mark.django_db(transaction=True)
def test_a_shortened_day_loses_nothing_through_the_deploy_and_holds_background_work_back(
    monkeypatch, reminder_settings
):
    monkeypatch.setenv("DATABASE_URL", database_url())  # the processes it starts use this one
    said: list[str] = []
    # The session's own children (a Redis Cluster another test started) stay; the day's go.
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    result = day.run(SHAPE, SCRIPT, say=said.append, env={"GUNICORN_GRACEFUL_TIMEOUT": "2"})

    assert [step["pod"] for step in result["deploy"]] == list(SCRIPT.deploy_order)
    assert set(result["restarts"].values()) == {1}
    assert result["deliveries"]["total"] == {"lost": 0, "duplicated": 0}, result["deliveries"]
    assert result["met"]["nothing_lost"] and result["met"]["nothing_duplicated"]
    # Every path was measured alone and in the day.
    paths = result["paths"]
    for phase in ("alone", "together"):
        assert paths["reminders_steady"][phase]["lateness_samples"] > 0
        assert paths["reminders_burst"][phase]["lateness_samples"] == SHAPE.burst
        # Each job's firing lateness, read from nginx's access log and the job's due time.
        assert paths["timeouts"][phase]["burst"]["lateness_samples"] == SHAPE.timeout_burst
        assert paths["timeouts"][phase]["steady"]["lateness_samples"] > 0
        assert paths["api_reads"][phase]["latency_samples"] > 0
        # Every read answered as the client meant it (a job looked up by key is 200 or 404),
        # so the latency is the lookups', not refusals'.
        assert paths["api_reads"][phase]["errors"] == {}, paths["api_reads"][phase]
        assert paths["claims"][phase]["steady"]["latency_samples"] > 0
        assert paths["expiry"][phase]["expired"] == SHAPE.expiry
    # Background work waited for the late path while the reminder worker was away (which job
    # asked first depends on its own turn: the sweep, a retention, the claim gates' upkeep).
    held = [row for row in result["holdback"] if row["held_today_ms"] > 0]
    assert held and {row["path"] for row in held} <= {"timeouts", "reminders"}, result["holdback"]
    # Nothing left behind: its rows, its topics, its processes.
    assert not Coupon.objects.filter(name__startswith=day.COUPON_NAME).exists()
    assert not TimeoutTopic.objects.filter(name__startswith=day.TOPIC_PREFIX).exists()
    assert not [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and p.is_running() and p.status() != "zombie"
    ]
    assert "deploy: reminder-worker (pid" in "\n".join(said)


@pytest.mark.django_db(transaction=True)
def test_without_nginx_the_command_refuses_before_it_starts_anything(monkeypatch):
    """The day's timeouts fire at nginx; without it the command says what to install."""
    monkeypatch.setattr(nginx, "nginx_binary", lambda: None)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(CommandError, match="bench_day fires its timeouts at nginx"):
        call_command("bench_day", "--minutes", "1")
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert not TimeoutTopic.objects.filter(name__startswith=day.TOPIC_PREFIX).exists()
