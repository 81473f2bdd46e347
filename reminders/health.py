"""Readiness checks of the reminders app, registered with the kernel's health registry from
``reminders/apps.py``: the Celery broker reminders are handed to (hard: without it nothing is
delivered), and the reminder workers' heartbeats (soft: a warning, a 503 with
``?require_workers=1``)."""

from __future__ import annotations

from typing import Any

from celery import current_app
from django.conf import settings

from reminders.engine import leases
from reminders.engine.clock import epoch_ms

BROKER_TIMEOUT_S = 2.0


def broker_check() -> None:
    with current_app.connection_for_write(url=settings.CELERY_BROKER_URL) as conn:
        conn.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_S)
        # A connected socket is not a working broker: for Redis, make it answer a command.
        client = getattr(conn.default_channel, "client", None)
        if client is not None:
            client.ping()


def workers_check() -> dict[str, Any]:
    """A warning with no live worker; an error when a worker's process is alive but its dispatch
    loop has not completed a round for ``WORKER_STALL_MS`` (a liveness probe's "restart it")."""
    now_ms = epoch_ms()
    live = leases.live_workers(now_ms=now_ms, lease_ms=settings.WORKER_LEASE_MS)
    registered = leases.list_workers()
    stalled = leases.stalled_workers(
        now_ms=now_ms, lease_ms=settings.WORKER_LEASE_MS, stall_ms=settings.WORKER_STALL_MS
    )
    status = "error" if stalled else "ok" if live else "warning"
    return {
        "status": status,
        "live": len(live),
        "registered": len(registered),
        "stalled": len(stalled),
    }
