"""Real processes for end-to-end tests: a Celery worker and ``run_reminder_worker`` per test, and
gunicorn with several worker processes where a test needs the web side.

Every test gets its own processes, wired to the pytest test database (committed rows only: the
tests use ``transaction=True``), the test's Redis key prefix and its own Celery queue, so tests
never steal each other's tasks. Processes are torn down with SIGTERM, then SIGKILL; the broker keys
of the test's queue are deleted afterwards (the broker database itself is never flushed).

Also here: a local HTTP receiver (a thread on 127.0.0.1) standing in for the notification webhook
and the alert (chat) webhook.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from django.conf import settings

from couponcenter.core.redis import broker_queue_delete
from couponcenter.coupons.bench.http import database_url, free_port
from reminders.engine import leases
from tests.support.settings_rows import reminder_settings_row

SCREENSHOTS_ENV = "CONSOLE_SCREENSHOTS_DIR"
READY_TIMEOUT_S = 60
# Several gunicorn workers each set Django up at once: on a loaded machine that takes a while.
WEB_READY_TIMEOUT_S = 180
STOP_TIMEOUT_S = 15
LEASE_MS = 2000  # short leases: a killed worker's slots are taken over within 2 s


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    """Where the browser tests save their screenshots: ``CONSOLE_SCREENSHOTS_DIR`` when set (CI
    sets it to a directory it keeps as an artifact), else a pytest temporary directory."""
    given = os.environ.get(SCREENSHOTS_ENV)
    where = Path(given) if given else tmp_path_factory.mktemp("screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


def wait_for(
    predicate: Callable[[], object], *, timeout: float, interval: float = 0.1, what: str = ""
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (a Celery worker and its pool children at once)."""
        _signal_group(self.popen, signal.SIGKILL)
        self.popen.wait(timeout=STOP_TIMEOUT_S)


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, sig)


@dataclass
class Stack:
    """The processes of one test. ``env`` may be extended before starting a process."""

    queue: str
    log_dir: Path
    env: dict[str, str]
    procs: list[Proc] = field(default_factory=list)
    cwd: Path | None = None  # where the processes run: the project root unless given

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.log_dir / f"{name}-{len(self.procs)}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                argv,
                env=self.env if env is None else env,
                cwd=self.cwd or settings.BASE_DIR,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill() takes the children too
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_celery(self, *, wait: bool = True) -> Proc:
        node = f"{self.queue}-{len(self.procs)}@%h"
        proc = self._start(
            "celery",
            [sys.executable, "-m", "celery", "-A", "couponcenter", "worker", "--pool", "prefork",
             "--concurrency", "2", "-Q", self.queue, "-n", node, "--without-gossip",
             "--without-mingle", "--without-heartbeat", "--loglevel", "INFO"],
        )  # fmt: skip
        if wait:
            self._wait(proc, lambda: " ready." in proc.output())
        return proc

    def start_reminder_worker(self, *, wait: bool = True) -> Proc:
        proc = self._start(
            "reminder-worker",
            [sys.executable, str(settings.BASE_DIR / "manage.py"), "run_reminder_worker"],
        )
        if wait:
            self._wait(proc, lambda: proc.popen.pid in {w.pid for w in leases.list_workers()})
        return proc

    def start_web(self, *, workers: int, app: str = "couponcenter.wsgi") -> str:
        """``gunicorn <app> -c gunicorn.conf.py`` with ``workers`` sync worker processes on a free
        loopback port, as deployed; returns its base URL once every worker process is up."""
        port = free_port()
        env = {
            **self.env,
            "GUNICORN_BIND": f"127.0.0.1:{port}",
            "WEB_CONCURRENCY": str(workers),
            "GUNICORN_WORKER_CLASS": "sync",
            "GUNICORN_ACCESS_LOG": "0",
        }
        argv = [sys.executable, "-m", "gunicorn", app, "-c", "gunicorn.conf.py"]
        proc = self._start("web", argv, env)
        base = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            try:
                with urllib.request.urlopen(base + "/healthz/live/", timeout=2) as response:
                    up = response.status == 200
            except OSError:
                return False
            return up and len(psutil.Process(proc.popen.pid).children()) >= workers

        self._wait(proc, serving, timeout=WEB_READY_TIMEOUT_S)
        return base

    def start(self) -> Stack:
        """A Celery worker and a reminder worker, started side by side."""
        celery = self.start_celery(wait=False)
        worker = self.start_reminder_worker(wait=False)
        self._wait(celery, lambda: " ready." in celery.output())
        self._wait(worker, lambda: worker.popen.pid in {w.pid for w in leases.list_workers()})
        return self

    def _wait(
        self, proc: Proc, ready: Callable[[], object], *, timeout: float = READY_TIMEOUT_S
    ) -> None:
        def check():
            if not proc.alive():
                raise AssertionError(f"{proc.name} exited early:\n{proc.output()[-4000:]}")
            return ready()

        wait_for(check, timeout=timeout, what=f"{proc.name} to be ready")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.alive():
                _signal_group(proc.popen, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            _signal_group(proc.popen, signal.SIGKILL)  # stray pool children too
            if proc.popen.poll() is None:
                proc.popen.wait(timeout=STOP_TIMEOUT_S)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log.name}\n{p.output()[-3000:]}" for p in self.procs)


@pytest.fixture
def stack(transactional_db, redis_prefix, tmp_path):
    """Unstarted processes for this test (``stack.start()``, or start them one by one)."""
    queue = f"e2e-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "couponcenter.settings",
        "DATABASE_URL": database_url(),
        "DB_CONN_MAX_AGE": "0",
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": redis_prefix,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "DELIVERY_QUEUE": queue,
        "COUPONCENTER_VAR_DIR": str(settings.VAR_DIR),
        "COUPONCENTER_REDIS_AUTOSTART": "0",
        "WORKER_LEASE_MS": str(LEASE_MS),
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
    }
    s = Stack(queue=queue, log_dir=tmp_path, env=env)
    try:
        yield s
    finally:
        s.stop()
        broker_queue_delete(queue)  # tasks left behind by killed workers too


@pytest.fixture
def reminder_settings(transactional_db):
    """The live settings row (with ``change(**fields)``), on a transactional database."""
    return reminder_settings_row()


# --- a local HTTP receiver ------------------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    at: float

    def json(self) -> dict:
        return json.loads(self.body)


class Receiver:
    """An HTTP endpoint on 127.0.0.1 recording every POST; ``respond(body) -> status`` decides."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.lock = threading.Lock()
        self.respond: Callable[[bytes], int] = lambda body: 200
        self.delay_s = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if len(body) < length:
                    # The sender died between its headers and the end of its body (a worker
                    # SIGKILLed mid-send): no request arrived, as a real server would see it.
                    self.close_connection = True
                    return
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                status = receiver.respond(body)
                with receiver.lock:
                    receiver.requests.append(
                        Received(self.path, dict(self.headers), body, status, time.time())
                    )
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook"

    def snapshot(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory():
    made: list[Receiver] = []

    def make() -> Receiver:
        made.append(Receiver())
        return made[-1]

    yield make
    for r in made:
        r.close()


# --- assertions shared by the e2e tests -----------------------------------------------------------


def drained(*, dead: int = 0, stack=None, timeout: float = 60) -> None:
    """Until nothing is scheduled or in flight any more (and ``dead`` entries are dead): from
    then on no delivery can come, so a duplicate would already show. Observed, not slept."""
    expected = {"store": 0, "prepare": 0, "dead": dead}
    wait_for(
        lambda: backlog() == expected,
        timeout=timeout,
        what=f"an empty schedule {expected}\n{stack.logs() if stack else ''}",
    )


def backlog() -> dict[str, int]:
    """Entries left in Redis over both reminder topics and every slot layout in use."""
    from reminders.engine import queue
    from reminders.members import REMINDER_TOPICS

    totals = {"store": 0, "prepare": 0, "dead": 0}
    for topic in REMINDER_TOPICS:
        slots = queue.served_slot_count(topic, 1)
        for s in queue.stats(topic, range(slots), now_ms=0):
            totals["store"] += s.store
            totals["prepare"] += s.prepare
            totals["dead"] += s.dead
    return totals


def dead_members() -> set[str]:
    from reminders.engine import queue
    from reminders.members import REMINDER_TOPICS

    return {
        d.job_id
        for topic in REMINDER_TOPICS
        for slot in range(queue.served_slot_count(topic, 1))
        for d in queue.list_dead(topic, slot, limit=10_000)
    }
