"""Health probes, their registry, and the Prometheus endpoint.

- ``/healthz/live/``: liveness. The process answers; nothing else is touched, so a database or
  Redis outage never gets healthy web processes restarted in a loop.
- ``/healthz/``: readiness. The database and Redis (the kernel's own checks), and whatever the apps
  register from their ``AppConfig.ready()`` (``reminders``: the Celery broker and the reminder
  workers' heartbeats), each with its status and latency. A *hard* check down is a 503 (take this
  instance out of the load balancer); a *soft* one that fails or warns is only a warning, and a
  503 with ``?require_workers=1`` (for a deploy gate or an alert probe).
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
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from couponcenter.core import metrics as core_metrics
from couponcenter.core.redis import get_redis

logger = logging.getLogger(__name__)

Probe = Callable[[], dict[str, Any] | None]


@dataclass(frozen=True)
class Check:
    name: str
    probe: Probe
    # A hard check failing takes the instance out of service (503); a soft one only warns.
    hard: bool = True
    # Skipped (reported as this dependency's unavailability) when that check failed.
    needs: str | None = None
    warning: str = ""  # what a failing soft check says in ``warnings``


_checks: dict[str, Check] = {}


def register_check(
    name: str, probe: Probe, *, hard: bool = True, needs: str | None = None, warning: str = ""
) -> None:
    """Add (or replace) a readiness check; called from an app's ``ready()``."""
    _checks[name] = Check(name, probe, hard, needs, warning or f"{name} check failed")


def _timed(name: str, probe: Probe) -> dict[str, Any]:
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


register_check("database", _database)
register_check("redis", _redis)


@never_cache
@require_GET
def live(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def ready(request: HttpRequest) -> JsonResponse:
    results: dict[str, dict[str, Any]] = {}
    for check in _checks.values():
        if check.needs and results.get(check.needs, {}).get("status") != "ok":
            unavailable = check.needs.title().replace("_", "") + "Unavailable"
            results[check.name] = {"status": "error", "error": unavailable, "latency_ms": 0.0}
        else:
            results[check.name] = _timed(check.name, check.probe)
    hard_down = [c.name for c in _checks.values() if c.hard and results[c.name]["status"] != "ok"]
    soft_down = [c for c in _checks.values() if not c.hard and results[c.name]["status"] != "ok"]
    warnings = [c.warning for c in soft_down]
    require_workers = request.GET.get("require_workers") in {"1", "true", "yes"}
    failing = hard_down + ([c.name for c in soft_down] if require_workers else [])
    body = {
        "status": "error" if failing else "warning" if warnings else "ok",
        "checks": results,
        "warnings": warnings,
        "failing": failing,
    }
    return JsonResponse(body, status=503 if failing else 200)


def metrics_allowed(request: HttpRequest) -> bool:
    """A bearer token equal to ``METRICS_TOKEN``, or a direct loopback caller.

    A loopback request that carries a proxy header (``X-Forwarded-For``, ``Forwarded``,
    ``X-Real-IP``) came through a local proxy, which may be forwarding anyone: it needs the token
    like everybody else. Loopback callers are trusted only with ``METRICS_ALLOW_LOOPBACK``, on by
    default in development only.
    """
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())
    proxied = any(h in request.headers for h in ("X-Forwarded-For", "Forwarded", "X-Real-IP"))
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
    body, content_type = core_metrics.render()
    return HttpResponse(body, content_type=content_type)
