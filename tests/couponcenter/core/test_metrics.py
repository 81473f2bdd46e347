"""``/metrics``: who may scrape, the state read at scrape time, and multiprocess mode."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.test import Client

from couponcenter.core import metrics as core_metrics
from expiry.services import last_run_key
from reminders.engine import leases, queue
from reminders.members import REMINDER_TOPIC

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """No state cached from another test's scrape, and no multiprocess dir from the outside."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    core_metrics.state.clear()


def scrape(client: Client | None = None, **headers) -> tuple[int, str]:
    response = (client or Client(REMOTE_ADDR="127.0.0.1")).get("/metrics", **headers)
    return response.status_code, response.content.decode()


def sample(text: str, name: str, labels: str = "") -> float:
    prefix = f"{name}{{{labels}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise AssertionError(f"{prefix!r} not in the scrape")


# --- access --------------------------------------------------------------------------------------


def test_loopback_may_scrape():
    status, text = scrape()
    assert status == 200
    assert "couponcenter_reminder_events_total" in text
    assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200


def test_the_world_may_not(settings):
    settings.METRICS_TOKEN = "s3cret-token"
    assert scrape(Client(REMOTE_ADDR="203.0.113.9"))[0] == 403
    # A local proxy forwarding someone else is not loopback.
    assert scrape(HTTP_X_FORWARDED_FOR="203.0.113.9")[0] == 403
    bad = scrape(Client(REMOTE_ADDR="203.0.113.9"), HTTP_AUTHORIZATION="Bearer wrong")
    assert bad[0] == 403 and "s3cret" not in bad[1]
    # Tokens of the API do not open /metrics.
    token_scheme = scrape(
        Client(REMOTE_ADDR="203.0.113.9"), HTTP_AUTHORIZATION="Token s3cret-token"
    )
    assert token_scheme[0] == 403


def test_a_bearer_token_may_scrape_from_anywhere(settings):
    settings.METRICS_TOKEN = "s3cret-token"
    client = Client(REMOTE_ADDR="203.0.113.9")
    assert scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token")[0] == 200


def test_no_token_configured_means_loopback_only(settings):
    settings.METRICS_TOKEN = ""
    assert scrape(Client(REMOTE_ADDR="203.0.113.9"), HTTP_AUTHORIZATION="Bearer ")[0] == 403


def test_loopback_can_be_switched_off(settings):
    settings.METRICS_ALLOW_LOOPBACK = False
    assert scrape()[0] == 403


# --- state gauges --------------------------------------------------------------------------------


def test_backlog_dead_workers_and_expiry_are_read_at_scrape_time(redis_client):
    now_ms = int(time.time() * 1000)
    queue.schedule(REMINDER_TOPIC, "j1", now_ms - 5000, slot=0)
    queue.schedule(REMINDER_TOPIC, "j2", now_ms + 60_000, slot=1)
    queue.schedule("timeout.default", "t1", now_ms + 60_000, slot=3)
    held = leases.SlotLeases("w1")
    held.sync({"timeout.default": [3]})
    claimed = queue.claim("timeout.default", 3, now_ms=now_ms + 61_000, visibility_ms=60_000,
                          limit=10, lease_token=held.token("timeout.default", 3))  # fmt: skip
    assert claimed
    leases.heartbeat(leases.WorkerInfo(worker_id="w1", heartbeat_ms=now_ms))
    redis_client.hset(
        last_run_key(), mapping={"per_s": "1234.5", "finished_at": "2030-01-01T00:00:00+00:00"}
    )

    status, text = scrape()
    assert status == 200
    topic = f'topic="{REMINDER_TOPIC}"'
    assert sample(text, "couponcenter_queue_backlog", topic) == 2
    assert sample(text, "couponcenter_queue_due", topic) == 1
    assert sample(text, "couponcenter_queue_oldest_overdue_seconds", topic) >= 5
    assert sample(text, "couponcenter_queue_in_flight", 'topic="timeout.default"') == 1
    assert sample(text, "couponcenter_queue_dead", topic) == 0
    assert sample(text, "couponcenter_reminder_workers_live") == 1
    assert sample(text, "couponcenter_expiry_pending_due") == 0
    assert sample(text, "couponcenter_expiry_last_rate_per_second") == 1234.5
    assert sample(text, "couponcenter_expiry_last_run_timestamp_seconds") == 1893456000.0
    assert sample(text, "couponcenter_state_up", 'source="redis"') == 1
    assert sample(text, "couponcenter_state_up", 'source="database"') == 1


def test_the_state_is_cached_between_close_scrapes():
    scrape()
    queue.schedule(REMINDER_TOPIC, "late", int(time.time() * 1000), slot=0)
    _, text = scrape()
    assert sample(text, "couponcenter_queue_backlog", f'topic="{REMINDER_TOPIC}"') == 0
    core_metrics.state.clear()
    _, text = scrape()
    assert sample(text, "couponcenter_queue_backlog", f'topic="{REMINDER_TOPIC}"') == 1


def test_redis_down_still_scrapes(settings):
    from couponcenter.coupons.bench.http import free_port

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_EMBEDDED = False
    status, text = scrape()
    assert status == 200
    assert sample(text, "couponcenter_state_up", 'source="redis"') == 0
    assert "couponcenter_reminder_events_total" in text


# --- several processes -------------------------------------------------------------------------

COUNT_IN_A_CHILD = """
import django; django.setup()
from reminders import metrics
metrics.EVENTS.labels("t.multi", "dispatched").inc({n})
"""


def test_multiprocess_mode_adds_up_every_process(tmp_path, monkeypatch, redis_prefix):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
           "DJANGO_SETTINGS_MODULE": "couponcenter.settings"}  # fmt: skip
    for n in (3, 4):
        subprocess.run([sys.executable, "-c", COUNT_IN_A_CHILD.format(n=n)], env=env, check=True,
                       cwd=ROOT, timeout=60)  # fmt: skip
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    status, text = scrape()
    assert status == 200
    labels = 'event="dispatched",topic="t.multi"'
    assert sample(text, "couponcenter_reminder_events_total", labels) == 7
    assert sample(text, "couponcenter_state_up", 'source="redis"') == 1  # the state is there too


def test_a_loopback_caller_behind_a_proxy_header_needs_the_token(settings):
    settings.METRICS_TOKEN = "s3cret-token"
    for header in ("HTTP_X_REAL_IP", "HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED"):
        assert scrape(**{header: "203.0.113.9"})[0] == 403, header
