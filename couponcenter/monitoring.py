"""Prometheus: the registry ``/metrics`` serves, and the gauges read at scrape time.

Counters and histograms (``reminders.metrics``: dispatch and delivery events, lateness) are
incremented in whichever process does the work: reminder workers, Celery workers, web workers.
With ``PROMETHEUS_MULTIPROC_DIR`` set (an empty directory per host, shared by every process of
the service on that host, emptied at boot), prometheus_client keeps each process's values in
files there and a scrape adds them up; without it, ``/metrics`` shows this process's registry.

The state of the queues and of the sweeper is not a counter anyone increments: the
``StateCollector`` reads it when scraped, from Redis (``queue.stats`` over every served slot of
every topic, one pipeline per topic, O(log n) each) and from the expiry selectors (a capped count
over a partial index). Its answer is kept ``STATE_TTL_S`` seconds, so two Prometheus replicas
scraping every 15 s cost one read. If Redis or the database is down, the collector exports
``couponcenter_state_up{source=...} 0`` instead of failing the whole scrape.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

STATE_TTL_S = 5.0


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


# --- state read at scrape time ------------------------------------------------------------------


def _queue_gauges() -> list[GaugeMetricFamily]:
    from django.conf import settings

    from couponcenter.redis import get_redis
    from reminders.engine import leases, queue
    from reminders.selectors import reminder_settings_get
    from reminders.topics import REMINDER_TOPICS, timeout_topic_specs

    families = {
        "store": GaugeMetricFamily("couponcenter_queue_backlog", "Jobs scheduled, not yet "
                                   "claimed (store)", labels=["topic"]),
        "due": GaugeMetricFamily("couponcenter_queue_due", "Jobs due now and not yet claimed",
                                 labels=["topic"]),
        "prepare": GaugeMetricFamily("couponcenter_queue_in_flight", "Jobs claimed by a worker, "
                                     "not yet acked (prepare)", labels=["topic"]),
        "dead": GaugeMetricFamily("couponcenter_queue_dead", "Jobs in the dead queue",
                                  labels=["topic"]),
        "overdue": GaugeMetricFamily("couponcenter_queue_oldest_overdue_seconds", "How late the "
                                     "most overdue unclaimed job is", labels=["topic"]),
    }  # fmt: skip
    client = get_redis()
    live = reminder_settings_get()
    configured = dict.fromkeys(REMINDER_TOPICS, live.slots)
    configured.update({name: spec.slots for name, spec in timeout_topic_specs().items()})
    now_ms = int(time.time() * 1000)
    for topic, slots in configured.items():
        served = queue.served_slot_count(topic, slots, client=client)
        rows = queue.stats(topic, range(served), now_ms=now_ms, client=client)
        for field in ("store", "due", "prepare", "dead"):
            families[field].add_metric([topic], sum(getattr(r, field) for r in rows))
        overdue = max((r.oldest_overdue_ms for r in rows), default=0)
        families["overdue"].add_metric([topic], overdue / 1000)
    workers = GaugeMetricFamily(
        "couponcenter_reminder_workers_live", "Reminder workers with a fresh heartbeat"
    )
    workers.add_metric(
        [], len(leases.live_workers(now_ms=now_ms, lease_ms=settings.WORKER_LEASE_MS))
    )
    return [*families.values(), workers]


def _expiry_gauges() -> list[GaugeMetricFamily]:
    from expiry.selectors import expiry_stats

    stats = expiry_stats()
    last = stats["last_run"]
    pending = GaugeMetricFamily(
        "couponcenter_expiry_pending_due",
        f"Due expiry tasks not yet processed (counted up to {stats['pending_due_capped_at']})",
    )
    pending.add_metric([], stats["pending_due"])
    lag = GaugeMetricFamily(
        "couponcenter_expiry_lag_seconds", "Age of the oldest due, unprocessed expiry task"
    )
    lag.add_metric([], stats["lag_seconds"])
    rate = GaugeMetricFamily(
        "couponcenter_expiry_last_rate_per_second", "Tasks per second of the last sweeper pass"
    )
    rate.add_metric([], float(last.get("per_s") or 0))
    finished = GaugeMetricFamily(
        "couponcenter_expiry_last_run_timestamp_seconds", "When the last sweeper pass ended"
    )
    if last.get("finished_at"):
        from datetime import datetime

        finished.add_metric([], datetime.fromisoformat(last["finished_at"]).timestamp())
    return [pending, lag, rate, finished]


class StateCollector(Collector):
    """Queue backlog/dead gauges per topic, live workers, and the expiry sweeper's figures."""

    def __init__(self, ttl_s: float = STATE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: tuple[float, list] | None = None

    def collect(self) -> Iterator:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] > self.ttl_s:
                self._cached = (time.monotonic(), self._read())
            return iter(self._cached[1])

    def describe(self) -> list:
        return []  # read at scrape time only; registering must not touch Redis or the database

    def _read(self) -> list:
        up = GaugeMetricFamily(
            "couponcenter_state_up", "1 if the state source answered this scrape", labels=["source"]
        )
        scrape = GaugeMetricFamily(
            "couponcenter_state_scrape_seconds", "Time to read the state", labels=["source"]
        )
        out: list = [up, scrape]
        for source, read in (("redis", _queue_gauges), ("database", _expiry_gauges)):
            started = time.perf_counter()
            try:
                out.extend(read())
                up.add_metric([source], 1)
            except Exception:  # noqa: BLE001 - a scrape reports what it can
                logger.warning("metrics: reading the %s state failed", source, exc_info=True)
                up.add_metric([source], 0)
            scrape.add_metric([source], time.perf_counter() - started)
        return out


_state = StateCollector()
_default_registered = False
_register_lock = threading.Lock()


def registry() -> CollectorRegistry:
    """What a scrape serves: every process's metrics (multiprocess) or this one's, plus state."""
    global _default_registered
    if multiprocess_dir():
        scrape = CollectorRegistry()
        MultiProcessCollector(scrape)
        scrape.register(_state)
        return scrape
    with _register_lock:
        if not _default_registered:
            REGISTRY.register(_state)
            _default_registered = True
    return REGISTRY


def render() -> tuple[bytes, str]:
    import reminders.metrics  # noqa: F401  (the counters exist even before the first event)

    return generate_latest(registry()), CONTENT_TYPE_LATEST


def mark_process_dead(pid: int | None = None) -> None:
    """Drop an exited process's live gauges (multiprocess mode only; counters are kept)."""
    if multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())
