"""Liveness and readiness: per-check status and latency, 503 on a hard dependency, no secrets.

Outages are real: a Redis URL or broker URL pointing at a closed loopback port, not a mock.
"""

from __future__ import annotations

import threading
import time

import pytest

from couponcenter.coupons.bench.http import free_port
from reminders.engine import leases, queue
from reminders.engine.clock import epoch_ms
from reminders.engine.dispatcher import Dispatcher
from reminders.engine.topic_model import OK, EngineSettings, Topic

pytestmark = pytest.mark.django_db


def heartbeat(worker_id: str = "host:1:abc") -> None:
    leases.heartbeat(leases.WorkerInfo(worker_id=worker_id, heartbeat_ms=int(time.time() * 1000)))


def test_liveness_needs_nothing(anon, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    settings.REDIS_EMBEDDED = False
    response = anon.get("/healthz/live/")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_ready_with_a_live_worker(anon):
    heartbeat()
    response = anon.get("/healthz/")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["warnings"] == [] and body["failing"] == []
    assert set(body["checks"]) == {"database", "redis", "broker", "workers"}
    for check in body["checks"].values():
        assert check["status"] == "ok"
        assert isinstance(check["latency_ms"], float)
    assert body["checks"]["workers"]["live"] == 1


def test_no_worker_is_a_warning_unless_required(anon):
    response = anon.get("/healthz/")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "warning"
    assert body["checks"]["workers"] == {
        **body["checks"]["workers"],
        "status": "warning",
        "live": 0,
    }
    assert body["warnings"] == ["no live reminder worker, or one whose loop is stalled"]

    required = anon.get("/healthz/?require_workers=1")
    assert required.status_code == 503
    assert required.json()["failing"] == ["workers"]
    heartbeat()
    assert anon.get("/healthz/?require_workers=1").status_code == 200


def test_a_stale_heartbeat_is_not_a_live_worker(anon, settings):
    leases.heartbeat(
        leases.WorkerInfo(
            worker_id="old", heartbeat_ms=int(time.time() * 1000) - settings.WORKER_LEASE_MS - 1000
        )
    )
    workers = anon.get("/healthz/").json()["checks"]["workers"]
    assert workers["live"] == 0 and workers["registered"] == 1


def test_redis_down_is_a_503_without_leaking_the_url(anon, settings):
    settings.REDIS_URL = f"redis://:hunter2-secret@127.0.0.1:{free_port()}/0"
    settings.REDIS_EMBEDDED = False
    response = anon.get("/healthz/")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "error"
    assert body["checks"]["redis"]["status"] == "error"
    assert body["checks"]["redis"]["error"] == "ConnectionError"
    assert body["checks"]["database"]["status"] == "ok"
    assert "redis" in body["failing"]
    text = response.content.decode()
    assert "hunter2" not in text and "127.0.0.1" not in text and "redis://" not in text


def test_broker_down_is_a_503(anon, settings):
    heartbeat()
    settings.CELERY_BROKER_URL = f"redis://:broker-secret@127.0.0.1:{free_port()}/0"
    response = anon.get("/healthz/")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["broker"]
    assert body["checks"]["broker"]["status"] == "error"
    assert body["checks"]["broker"]["latency_ms"] < 10_000
    assert "broker-secret" not in response.content.decode()


def test_health_is_get_only(anon):
    assert anon.post("/healthz/").status_code == 405
    assert anon.post("/healthz/live/").status_code == 405


def test_a_worker_whose_dispatch_loop_stalls_turns_health_red(anon, settings, redis_client):
    # A job's rule once kept a worker's loop from completing a round while its process lived
    # on, and /healthz/?require_workers=1 stayed green. The process still says it is alive (its
    # renewer thread), so it shows as stalled, not gone.
    settings.WORKER_STALL_MS = 300
    entered, release = threading.Event(), threading.Event()

    def stuck(entries):
        entered.set()
        release.wait(60)
        return [OK for _ in entries]

    topic = Topic("t.stall", stuck, slots=1)
    queue.schedule("t.stall", "j1", epoch_ms() - 10, slot=0, client=redis_client)
    worker = Dispatcher([topic], client=redis_client, stall_ms=settings.WORKER_STALL_MS,
                        config=lambda: EngineSettings(lease_ms=900))  # fmt: skip
    loop = threading.Thread(target=worker.run_forever)
    loop.start()
    try:
        assert entered.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            response = anon.get("/healthz/?require_workers=1")
            if response.status_code == 503:
                break
            time.sleep(0.05)
        assert response.status_code == 503, response.json()
        assert response.json()["failing"] == ["workers"]
        assert response.json()["checks"]["workers"]["stalled"] == 1
    finally:
        release.set()
        worker.stop()
        loop.join(30)
    assert not loop.is_alive()
