"""Chaos: a real PostgreSQL server stopped and started again under a running worker.

``test_postgres_outage`` cuts the connections with a proxy; here the server itself goes away: a
private cluster (``initdb`` in a temporary folder) holds the service's database, a reminder
worker fires timeout jobs from it, and the server is shut down (``pg_ctl stop -m fast``: every
session ended) for 8 s, then started again. The worker reports the outage, keeps its loop, and
recovers without a restart: every job is processed, none is dead, nothing is left in Redis.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg2
import pytest
from django.conf import settings

from reminders.engine import queue
from tests.chaos.faults import PrivatePostgres
from tests.e2e.conftest import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
TOPIC = "timeout.default"  # a log topic in settings.TIMEOUT_TOPICS, 8 slots
JOBS, SPREAD_S, OUTAGE_S = 300, 20, 8

CREATE_JOBS = f"""
from datetime import timedelta
from django.utils import timezone
from reminders.services import timeout_jobs_bulk_create
now = timezone.now()
timeout_jobs_bulk_create([
    {{"topic": "{TOPIC}", "biz_type": "chaos", "biz_id": f"pg-{{i}}",
      "action_time": now + timedelta(seconds=1 + {SPREAD_S} * i / {JOBS})}}
    for i in range({JOBS})
])
"""


@pytest.fixture
def private_postgres():
    # Not under pytest's tmp_path: the server runs as the postgres user, who may not enter it.
    pg = PrivatePostgres(Path(tempfile.mkdtemp(prefix="cc-private-pg-")))
    if not pg.available:
        pytest.skip("needs the PostgreSQL server binaries (pg_ctl, initdb)")
    pg.init().start()
    try:
        yield pg
    finally:
        pg.close()


def _statuses(pg: PrivatePostgres) -> dict[int, int]:
    """{status: count} of the jobs, read straight from the private server."""
    with contextlib.closing(psycopg2.connect(pg.url("cc"), connect_timeout=2)) as conn, \
            conn.cursor() as cursor:  # fmt: skip
        cursor.execute("SELECT status, count(*) FROM reminders_timeoutjob GROUP BY status")
        return dict(cursor.fetchall())


def test_postgres_stopped_and_started_under_a_worker(private_postgres, stack):
    pg = private_postgres
    admin = psycopg2.connect(pg.url("postgres"))
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute("CREATE DATABASE cc")
    admin.close()
    env = {**stack.env, "DATABASE_URL": pg.url("cc"), "DB_CONN_MAX_AGE": "60"}
    manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
    for argv in (["migrate", "-v", "0"], ["shell", "-c", CREATE_JOBS]):
        done = subprocess.run(manage + argv, env=env, cwd=settings.BASE_DIR, capture_output=True,
                              text=True, timeout=180)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _statuses(pg) == {0: JOBS}

    stack.env.update(env)
    worker = stack.start_reminder_worker()
    wait_for(lambda: _statuses(pg).get(2, 0) > 0, timeout=60, interval=0.1,
             what=f"the first jobs fired\n{worker.output()[-3000:]}")  # fmt: skip
    pg.stop()
    down_at = time.monotonic()
    with pytest.raises(psycopg2.OperationalError):
        _statuses(pg)  # really down
    time.sleep(OUTAGE_S)  # the outage itself, not a wait for something
    pg.start()
    assert time.monotonic() - down_at >= OUTAGE_S

    wait_for(lambda: _statuses(pg) == {2: JOBS}, timeout=120, interval=0.25,
             what=f"every job processed: {_statuses(pg)}\n{worker.output()[-3000:]}")  # fmt: skip
    stats = queue.stats(TOPIC, range(8), now_ms=0)
    assert sum(s.store + s.prepare + s.dead for s in stats) == 0
    log = worker.output()
    assert "OperationalError" in log, log[-3000:]  # the outage was seen and reported
    assert worker.alive(), "recovered without a restart"
