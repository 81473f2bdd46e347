"""``manage.py run_reminder_worker`` as a real process: it drains, stops cleanly on SIGTERM, and a
worker killed mid-batch loses nothing (another worker delivers after the visibility deadline).

The child processes talk to this test's database (committed rows: transaction=True) and to the
same Redis under this test's key prefix.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from couponcenter.coupons.bench.http import database_url
from reminders.engine import leases, queue, topic_model
from reminders.models import TimeoutJob
from reminders.services import timeout_job_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
TOPICS = {
    "t.log": {"type": "log", "slots": 4},
    # One slot, so one claim takes every job; a short visibility so a dead worker's claim expires.
    "t.sleepy": {"type": "callable", "path": f"{__name__}.sleepy_action", "slots": 1,
                 "visibility_ms": 1500, "max_attempts": 5},
}  # fmt: skip
SLEEP_ENV = "CC_TEST_ACTION_SLEEP_S"


def sleepy_action(jobs: list[TimeoutJob]) -> None:
    """Runs inside the worker process: hangs when told to (to be killed mid-batch)."""
    time.sleep(float(os.environ.get(SLEEP_ENV, "0")))


@pytest.fixture(autouse=True)
def timeout_topics(settings) -> Iterator[None]:
    settings.TIMEOUT_TOPICS = TOPICS
    yield
    for name in TOPICS:
        topic_model.unregister_topic(name)


@pytest.fixture
def worker_env(redis_prefix) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SLEEP_ENV}
    env.update(
        DATABASE_URL=database_url(),
        REDIS_URL=django_settings.REDIS_URL,
        REDIS_KEY_PREFIX=redis_prefix,
        TIMEOUT_TOPICS_JSON=json.dumps(TOPICS),
        WORKER_LEASE_MS="1000",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def spawn(worker_env, tmp_path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start ``manage.py run_reminder_worker *args``; any still running at the end is killed."""
    procs: list[subprocess.Popen] = []

    def start(*args: str, **env: str) -> subprocess.Popen:
        log = (tmp_path / f"worker-{len(procs)}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_reminder_worker", *args],
            cwd=ROOT, env={**worker_env, **env}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        proc.log_path = log.name
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def make_jobs(topic: str, n: int) -> list[TimeoutJob]:
    due = timezone.now() - timedelta(seconds=1)
    return [
        timeout_job_create(topic=topic, biz_type="order", biz_id=f"P-{i}", action_time=due)
        for i in range(n)
    ]


# How long a wait may take when it includes a worker's start: a deadline, never a duration (each
# wait ends as soon as its condition holds), so it is set for a worker starting on a loaded
# machine (the parallel suite beside it), not for a quiet one.
STARTED_S = 120


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    log = Path(proc.log_path).read_text()[-3000:] if proc is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{log}")


def processed(jobs: list[TimeoutJob]) -> int:
    return TimeoutJob.objects.filter(
        pk__in=[j.pk for j in jobs], status=TimeoutJob.Status.PROCESSED
    ).count()


def in_slot() -> tuple[int, int, int]:
    """(store, prepare, dead) of the one-slot sleepy topic."""
    s = queue.stats("t.sleepy", [0], now_ms=0)[0]
    return s.store, s.prepare, s.dead


def lease_keys(redis_client, prefix: str) -> list[bytes]:
    return [
        k for k in redis_client.scan_iter(match=f"{prefix}:*") if b"lease" in k or b"single" in k
    ]


def test_worker_processes_due_jobs_and_stops_cleanly_on_sigterm(spawn, redis_client, redis_prefix):
    proc = spawn("--topic", "t.log")
    jobs = make_jobs("t.log", 6)
    wait_for(lambda: processed(jobs) == 6, STARTED_S, "6 jobs processed", proc)
    wait_for(lambda: len(leases.list_workers()) == 1, 5, "the worker registered", proc)
    assert lease_keys(redis_client, redis_prefix)
    assert sum(s.store + s.prepare for s in queue.stats("t.log", range(4), now_ms=0)) == 0

    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, Path(proc.log_path).read_text()[-3000:]
    assert time.monotonic() - started < 10
    assert leases.list_workers() == []
    assert lease_keys(redis_client, redis_prefix) == []


def test_a_job_that_never_returns_does_not_keep_the_worker_from_stopping(spawn):
    # A callable that never returns holds one of the executor's threads; SIGTERM used to wait
    # for it forever. The worker stops after the executor's bound and leaves the job in flight,
    # for the reaper to bring back (not lost).
    proc = spawn("--topic", "t.sleepy", **{SLEEP_ENV: "3600"})
    [job] = make_jobs("t.sleepy", 1)
    wait_for(lambda: in_slot()[1] == 1, STARTED_S, "the job in flight", proc)
    wait_for(lambda: TimeoutJob.objects.get(pk=job.pk).status == TimeoutJob.Status.RUNNING, 30,
             "the job running", proc)  # fmt: skip
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        code = "still running"
    assert code == 0, Path(proc.log_path).read_text()[-3000:]
    assert "jobs still firing at close; left to the reaper" in Path(proc.log_path).read_text()
    assert in_slot()[1] == 1  # still in flight: the reaper's to bring back
    assert leases.list_workers() == []


def test_once_drains_what_is_due_and_exits(spawn):
    jobs = make_jobs("t.log", 5)
    later = timeout_job_create(topic="t.log", biz_type="order", biz_id="later",
                               action_time=timezone.now() + timedelta(hours=1))  # fmt: skip
    proc = spawn("--once", "--topic", "t.log")
    assert proc.wait(timeout=60) == 0
    output = Path(proc.log_path).read_text()
    assert "claimed 5, acked 5" in output, output[-3000:]
    assert processed(jobs) == 5
    later.refresh_from_db()
    assert later.status == TimeoutJob.Status.PENDING
    assert leases.list_workers() == []


def test_unknown_topic_is_a_command_error(spawn):
    proc = spawn("--topic", "nope")
    assert proc.wait(timeout=60) != 0
    output = Path(proc.log_path).read_text()
    assert "CommandError: unknown topics ['nope']" in output, output[-3000:]
    assert "Traceback" not in output


def test_killed_worker_loses_nothing(spawn):
    jobs = make_jobs("t.sleepy", 5)
    stuck = spawn("--topic", "t.sleepy", **{SLEEP_ENV: "120"})
    wait_for(lambda: in_slot()[1] == 5, STARTED_S, "the batch claimed (in prepare)", stuck)
    stuck.send_signal(signal.SIGKILL)
    stuck.wait(timeout=10)
    assert processed(jobs) == 0

    rescuer = spawn("--topic", "t.sleepy")
    wait_for(lambda: processed(jobs) == 5, STARTED_S, "the jobs redelivered", rescuer)
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.wait(timeout=10) == 0
    rows = TimeoutJob.objects.filter(pk__in=[j.pk for j in jobs])
    assert set(rows.values_list("attempts", flat=True)) == {2}  # delivered a second time
    assert in_slot() == (0, 0, 0)


def test_a_running_worker_removes_what_has_aged_out(spawn):
    old = TimeoutJob.objects.create(
        topic="t.log", biz_type="order", biz_id="old", status=TimeoutJob.Status.PROCESSED,
        action_time=timezone.now() - timedelta(days=30),
    )  # fmt: skip
    TimeoutJob.objects.filter(pk=old.pk).update(gmt_modified=timezone.now() - timedelta(days=8))
    pending = timeout_job_create(
        topic="t.log", biz_type="order", biz_id="later", action_time=timezone.now() + timedelta(1)
    )
    proc = spawn("--topic", "t.log")
    wait_for(
        lambda: not TimeoutJob.objects.filter(pk=old.pk).exists(), STARTED_S, "retention", proc
    )
    assert TimeoutJob.objects.get(pk=pending.pk).status == TimeoutJob.Status.PENDING
