"""SIGTERM on the web (gunicorn) and on Celery finishes the work in flight and exits in bounds.

Real processes on the test database and this test's Redis prefix. (The reminder worker's and the
sweeper's SIGTERM are covered in tests/reminders/test_worker_process.py and
tests/expiry/test_sweeper.py; the reminder worker with a batch in flight is covered here.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from couponcenter.core.redis import broker_queue_delete
from couponcenter.coupons.bench.http import database_url, free_port
from reminders.engine import topic_model
from reminders.models import TimeoutJob
from reminders.services import timeout_job_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
STOP_BOUND_S = 15


@pytest.fixture
def env(redis_prefix) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DB_CONN_MAX_AGE": "0",
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": redis_prefix,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "COUPONCENTER_REDIS_AUTOSTART": "0",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture
def spawn(tmp_path) -> Iterator[Callable[..., subprocess.Popen]]:
    procs: list[subprocess.Popen] = []

    def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = tmp_path / f"proc-{len(procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        proc.log_path = log
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def output(proc: subprocess.Popen) -> str:
    return proc.log_path.read_text(errors="replace")[-4000:]


def wait_for(predicate: Callable[[], object], timeout: float, what: str, proc=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}\n{output(proc) if proc else ''}")


def stop_within(proc: subprocess.Popen, bound: float) -> float:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=bound + 5)
    return time.monotonic() - started


# --- gunicorn ------------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_gunicorn_finishes_requests_in_flight_on_sigterm(env, spawn, tmp_path):
    port = free_port()
    proc = spawn(
        [sys.executable, "-m", "gunicorn", "tests.support.lifecycle_app",
         "-c", "gunicorn.conf.py"],
        {**env, "GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "2",
         "GUNICORN_GRACEFUL_TIMEOUT": "10"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(base + "/healthz/live/"), 30, "gunicorn to serve", proc)
    status, body = http_get(base + "/healthz/")
    assert status in (200, 503) and json.loads(body)["checks"]["database"]["status"] == "ok"

    results: list[tuple[int, bytes]] = []
    mark = tmp_path / "slow-started"
    slow = threading.Thread(
        target=lambda: results.append(http_get(f"{base}/__slow__?s=3&mark={mark}"))
    )
    slow.start()
    wait_for(mark.exists, 30, "the slow request to reach a worker", proc)
    sigterm_at = time.time()
    took = stop_within(proc, STOP_BOUND_S)
    slow.join(timeout=10)
    assert results == [(200, b"slept\n")], output(proc)
    assert proc.returncode == 0, output(proc)
    # It exited only after the request had slept its 3 s, and within the bound.
    assert sigterm_at + took >= float(mark.read_text()) + 3, took
    assert took < STOP_BOUND_S, took


def test_gunicorn_kills_a_request_past_the_graceful_timeout(env, spawn, tmp_path):
    port = free_port()
    proc = spawn(
        [sys.executable, "-m", "gunicorn", "tests.support.lifecycle_app",
         "-c", "gunicorn.conf.py"],
        {**env, "GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1",
         "GUNICORN_GRACEFUL_TIMEOUT": "2"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(base + "/healthz/live/"), 30, "gunicorn to serve", proc)
    mark = tmp_path / "stuck-started"
    stuck = threading.Thread(
        target=lambda: _answers(f"{base}/__slow__?s=60&mark={mark}"), daemon=True
    )
    stuck.start()
    wait_for(mark.exists, 30, "the stuck request to reach a worker", proc)
    took = stop_within(proc, 10)
    assert took < 8, (took, output(proc))  # the bound holds even against a stuck request


def test_a_gunicorn_worker_freezes_the_loaded_app_out_of_the_collector_s_view(env, spawn):
    port = free_port()
    proc = spawn(
        [sys.executable, "-m", "gunicorn", "tests.support.lifecycle_app",
         "-c", "gunicorn.conf.py"],
        {**env, "GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _answers(base + "/healthz/live/"), 30, "gunicorn to serve", proc)

    status, body = http_get(base + "/__gc__")

    assert status == 200, output(proc)
    got = json.loads(body)
    assert got["frozen"] > 10_000  # Django and the app, loaded before the worker served
    assert got["threshold"][0] == 700  # Python's own: the web keeps it (gunicorn.conf.py)


def _answers(url: str) -> bool:
    try:
        return http_get(url, timeout=2)[0] == 200
    except OSError:
        return False


# --- Celery --------------------------------------------------------------------------------------


@pytest.fixture
def celery_queue() -> Iterator[str]:
    queue = f"lifecycle-{uuid.uuid4().hex[:10]}"
    yield queue
    broker_queue_delete(queue)


def start_celery(spawn, env: dict[str, str], queue: str) -> subprocess.Popen:
    proc = spawn(
        [sys.executable, "-m", "celery", "-A", "couponcenter", "worker", "--pool", "prefork",
         "--concurrency", "1", "-Q", queue, "-n", f"{queue}@%h", "--include",
         "tests.support.lifecycle_tasks", "--without-gossip", "--without-mingle",
         "--without-heartbeat", "--loglevel", "INFO"],
        env,
    )  # fmt: skip
    wait_for(lambda: " ready." in output(proc), 60, "celery to be ready", proc)
    return proc


def test_celery_warm_shutdown_finishes_the_task_in_flight(env, spawn, celery_queue, tmp_path):
    from couponcenter.celery import app

    proc = start_celery(spawn, env, celery_queue)
    marker = tmp_path / "task.done"
    app.send_task("tests.lifecycle.slow_write", args=[str(marker), 3], queue=celery_queue)
    wait_for(marker.with_suffix(".started").exists, 30, "the task to start", proc)
    took = stop_within(proc, STOP_BOUND_S)
    assert marker.read_text() == "done", output(proc)
    assert proc.returncode == 0, output(proc)
    assert 2 <= took < STOP_BOUND_S, took


def test_celery_children_export_metrics_in_multiprocess_mode(
    env, spawn, celery_queue, tmp_path, client
):
    from couponcenter.celery import app

    metrics_dir = tmp_path / "prom"
    metrics_dir.mkdir()
    proc = start_celery(spawn, {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}, celery_queue)
    for _ in range(3):
        app.send_task("tests.lifecycle.record_metric", args=["t.metrics", 2], queue=celery_queue)

    def exported() -> str:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(metrics_dir))
        return generate_latest(registry).decode()

    line = 'couponcenter_reminder_events_total{event="delivered",topic="t.metrics"} 6.0'
    wait_for(lambda: line in exported(), 30, "the children's counters", proc)
    assert stop_within(proc, STOP_BOUND_S) < STOP_BOUND_S
    # Counters outlive the process that counted them (mark_process_dead drops live gauges only).
    assert line in exported()
    assert 'couponcenter_delivery_lateness_seconds_count{topic="t.metrics"} 6.0' in exported()


# --- the reminder worker with a batch in flight --------------------------------------------------

SLEEPY = {"t.lifecycle": {"type": "callable", "slots": 1, "visibility_ms": 30_000,
                          "path": "tests.support.lifecycle_tasks.sleepy_action"}}  # fmt: skip


def test_reminder_worker_finishes_the_batch_in_flight_on_sigterm(env, spawn, settings):
    settings.TIMEOUT_TOPICS = SLEEPY
    try:
        due = timezone.now() - timedelta(seconds=1)
        jobs = [
            timeout_job_create(topic="t.lifecycle", biz_type="order", biz_id=f"L-{i}",
                               action_time=due)
            for i in range(3)
        ]  # fmt: skip
        proc = spawn(
            [sys.executable, "manage.py", "run_reminder_worker", "--topic", "t.lifecycle"],
            {**env, "TIMEOUT_TOPICS_JSON": json.dumps(SLEEPY), "CC_LIFECYCLE_SLEEP_S": "1"},
        )

        def processed() -> int:
            return TimeoutJob.objects.filter(
                pk__in=[j.pk for j in jobs], status=TimeoutJob.Status.PROCESSED
            ).count()

        wait_for(lambda: "sleepy action" in output(proc), 30, "the batch to start", proc)
        took = stop_within(proc, STOP_BOUND_S)
        assert proc.returncode == 0, output(proc)
        assert processed() == 3, output(proc)  # the whole batch, not cut off mid-way
        assert took < STOP_BOUND_S
    finally:
        topic_model.unregister_topic("t.lifecycle")
