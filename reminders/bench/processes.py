"""The processes a reminders benchmark runs beside itself, started as subprocesses and stopped
afterwards: a reminder worker and a Celery worker on the benchmark's own key prefix and queue
(``bench_processes``); for ``bench_timeouts``, a reminder worker on the bench's timeout topics
(``timeout_worker_process``) and the local receiver its http jobs call (``receiver_process``).
Each is stopped the one way every benchmark stops what it started
(``couponcenter.coupons.bench.http.stop``). The measuring stays in the benchmark modules.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager

from celery import current_app
from django.conf import settings

from couponcenter.core.process import die_with_parent
from couponcenter.coupons.bench.http import database_url, free_port, stop
from reminders.engine import leases

# Pool processes of the one Celery worker: one per core of the benchmark machine.
CELERY_CONCURRENCY = 2
CELERY_NICE = 5


@contextmanager
def bench_processes(prefix: str, delivery_queue: str, *, log_dir: str):
    """A reminder worker and a Celery worker (concurrency 2) on the bench's prefix and queue."""
    # BENCH_LOG_LEVEL=INFO keeps the workers' round, reconciler and backpressure lines.
    level = os.environ.get("BENCH_LOG_LEVEL", "WARNING")
    env = {
        **os.environ,
        "REDIS_KEY_PREFIX": prefix,
        "DELIVERY_QUEUE": delivery_queue,
        "LOG_LEVEL": level,
        "PYTHONUNBUFFERED": "1",
    }
    manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
    # Delivery runs at a lower CPU priority than dispatch, as the README's deployment section
    # advises for hosts that share them: the claim is the latency-critical step.
    celery = ["nice", "-n", str(CELERY_NICE), sys.executable, "-m", "celery", "-A", "couponcenter"]
    celery += ["worker", "--pool", "prefork", "--concurrency", str(CELERY_CONCURRENCY)]
    celery += ["-Q", delivery_queue, "--without-gossip", "--without-mingle", "--without-heartbeat"]
    celery += ["--loglevel", level]
    os.makedirs(log_dir, exist_ok=True)
    celery_log = open(os.path.join(log_dir, "bench-celery.log"), "w")  # noqa: SIM115
    worker_log = open(os.path.join(log_dir, "bench-worker.log"), "w")  # noqa: SIM115
    procs = [
        subprocess.Popen(
            celery, env=env, stdout=celery_log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
        ),
        subprocess.Popen(
            manage + ["run_reminder_worker"],
            env=env,
            stdout=worker_log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        ),
    ]
    try:
        _wait_ready(procs)
        yield procs
    finally:
        stop(*procs, timeout=20)
        celery_log.close()
        worker_log.close()


def _wait_ready(procs: list[subprocess.Popen], timeout: float = 60) -> None:
    """Until the reminder worker heartbeats and the Celery worker answers a control ping."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"bench process exited with {proc.returncode}: {proc.args}")
        if leases.list_workers() and celery_answers(timeout=0.5):
            return
        time.sleep(0.2)
    raise RuntimeError("bench processes did not become ready in time")


def celery_answers(*, timeout: float) -> bool:
    """Whether a Celery worker answers a control ping, asked on a connection of its own that is
    closed afterwards: a pooled one would stay waiting on a reply, and a process forked later (a
    benchmark's children) would block for good in kombu's after-fork cleanup reading it."""
    with current_app.connection_for_write() as conn:
        return bool(current_app.control.ping(timeout=timeout, connection=conn))


@contextmanager
def receiver_process():
    """``reminders.bench.receiver`` on a free port, until it says it is ready; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reminders.bench.receiver", str(port)],
        cwd=settings.BASE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=die_with_parent,
    )
    try:
        line = proc.stdout.readline()
        if "ready" not in line:
            raise RuntimeError(f"the receiver did not start: {line}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def timeout_worker_process(prefix: str, topics: tuple[str, ...], log_dir: str):
    """``run_reminder_worker`` firing only ``topics``, on the bench's key prefix, until its lease
    shows up in Redis; its log is ``bench-timeouts-worker.log`` in ``log_dir``. It uses this
    process's database and Redis (under pytest, the test database)."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": prefix,
        "LOG_LEVEL": "WARNING",
        "WEBHOOK_ALLOW_PRIVATE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_reminder_worker"]
    for topic in topics:
        argv += ["--topic", topic]
    os.makedirs(log_dir, exist_ok=True)
    log = open(os.path.join(log_dir, "bench-timeouts-worker.log"), "w")  # noqa: SIM115
    proc = subprocess.Popen(
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent
    )
    try:
        deadline = time.monotonic() + 60
        while not any(w.pid == proc.pid for w in leases.list_workers()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the bench worker did not start; see bench-timeouts-worker.log")
            time.sleep(0.1)
        yield proc
    finally:
        stop(proc)
        log.close()
