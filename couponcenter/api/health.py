"""Liveness/readiness and Prometheus metrics."""

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from couponcenter.redis import get_redis


def _check(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a health check reports any failure
        return f"error: {exc.__class__.__name__}: {exc}"
    return "ok"


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def healthz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _check(_database), "redis": _check(lambda: get_redis().ping())}
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "degraded", "checks": checks},
        status=200 if healthy else 503,
    )


def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
