"""Health probes and the Prometheus endpoint.

- ``/healthz/live/``: liveness. The process answers; nothing else is touched, so a database or
  Redis outage never gets healthy web processes restarted in a loop.
- ``/healthz/``: readiness. The database, Redis (the schedule), the Celery broker and the reminder
  workers' heartbeats, each with its status and latency. A hard dependency down is a 503 (take
  this instance out of the load balancer); no live reminder worker is only a warning, and a 503
  with ``?require_workers=1`` (for a deploy gate or an alert probe).
- ``/metrics``: Prometheus text format, from loopback or with ``Authorization: Bearer
  $METRICS_TOKEN``.

Both health views are open to anonymous callers, so they say which check failed and the error's
class only: never a message, host or URL (those can carry credentials); the details go to the log.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from couponcenter import monitoring
from couponcenter.redis import get_redis

logger = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 2.0


def _timed(name: str, probe: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        result = {"status": "ok", **(probe() or {})}
    except Exception as exc:  # noqa: BLE001 - a health check reports any failure
        logger.warning("health check %s failed", name, exc_info=True)
        result = {"status": "error", "error": exc.__class__.__name__}
    result["latency_ms"] = round((time.perf_counter() - started) * 1000, 2)
    return result


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def _redis() -> None:
    get_redis().ping()


def _broker() -> None:
    from couponcenter.celery import app

    with app.connection_for_write(url=settings.CELERY_BROKER_URL) as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        # A connected socket is not a working broker: for Redis, make it answer a command.
        client = getattr(conn.default_channel, "client", None)
        if client is not None:
            client.ping()


def _workers() -> dict[str, Any]:
    from reminders.engine import leases

    now_ms = int(time.time() * 1000)
    live = leases.live_workers(now_ms=now_ms, lease_ms=settings.WORKER_LEASE_MS)
    registered = leases.list_workers()
    return {"status": "ok" if live else "warning", "live": len(live), "registered": len(registered)}


@never_cache
@require_GET
def live(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def ready(request: HttpRequest) -> JsonResponse:
    checks = {
        "database": _timed("database", _database),
        "redis": _timed("redis", _redis),
        "broker": _timed("broker", _broker),
    }
    checks["workers"] = (
        _timed("workers", _workers)
        if checks["redis"]["status"] == "ok"
        else {"status": "error", "error": "RedisUnavailable", "latency_ms": 0.0}
    )
    hard_down = [name for name in ("database", "redis", "broker") if checks[name]["status"] != "ok"]
    warnings = []
    if checks["workers"]["status"] != "ok":
        warnings.append("no live reminder worker")
    require_workers = request.GET.get("require_workers") in {"1", "true", "yes"}
    failing = hard_down + (["workers"] if require_workers and warnings else [])
    body = {
        "status": "error" if failing else "warning" if warnings else "ok",
        "checks": checks,
        "warnings": warnings,
        "failing": failing,
    }
    return JsonResponse(body, status=503 if failing else 200)


def metrics_allowed(request: HttpRequest) -> bool:
    """A bearer token equal to ``METRICS_TOKEN``, or a direct loopback caller.

    A loopback request that carries ``X-Forwarded-For`` came through a local proxy, which may be
    forwarding anyone: it needs the token like everybody else.
    """
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())
    proxied = "X-Forwarded-For" in request.headers or "Forwarded" in request.headers
    return (
        settings.METRICS_ALLOW_LOOPBACK
        and not proxied
        and request.META.get("REMOTE_ADDR") in {"127.0.0.1", "::1"}
    )


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return HttpResponse(
            "metrics: loopback or Authorization: Bearer <METRICS_TOKEN>\n",
            status=403,
            content_type="text/plain",
        )
    body, content_type = monitoring.render()
    return HttpResponse(body, content_type=content_type)
