"""Liveness and readiness: per-check status and latency, 503 on a hard dependency, no secrets.

Outages are real: a Redis URL or broker URL pointing at a closed loopback port, not a mock.
"""

from __future__ import annotations

import time

import pytest

from couponcenter.bench.http import free_port
from reminders.engine import leases

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
    assert body["warnings"] == ["no live reminder worker"]

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
