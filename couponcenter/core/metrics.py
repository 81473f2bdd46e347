"""Prometheus: the registry ``/metrics`` serves, and the state sources read at scrape time.

Counters and histograms are each app's own (``reminders.metrics``: dispatch and delivery events,
lateness), incremented in whichever process does the work: reminder workers, Celery workers, web
workers. With ``PROMETHEUS_MULTIPROC_DIR`` set (an empty directory per host, shared by every
process of the service on that host, emptied at boot), prometheus_client keeps each process's
values in files there and a scrape adds them up; without it, ``/metrics`` shows this process's
registry.

The state of the queues and of the sweeper is not a counter anyone increments: each app registers
a *state source* here from its ``AppConfig.ready()`` (as django-rq's ``RQCollector`` is
registered), a function that reads its gauges when scraped (``reminders``: Redis, ``expiry``: the
database). The ``StateCollector`` keeps the answer ``STATE_TTL_S`` seconds, so two Prometheus
replicas scraping every 15 s cost one read, and exports ``couponcenter_state_up{source=...} 0`` for
a source that failed instead of failing the whole scrape. This module knows no app.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from couponcenter.core.caching import TTLCache

logger = logging.getLogger(__name__)

STATE_TTL_S = 5.0

StateReader = Callable[[], list[GaugeMetricFamily]]


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class StateCollector(Collector):
    """The registered state sources, read at scrape time (at most every ``ttl_s`` seconds)."""

    def __init__(self, ttl_s: float = STATE_TTL_S) -> None:
        self.sources: dict[str, StateReader] = {}
        self._lock = threading.Lock()  # one read at a time: two scrapes at once share it
        self._cache: TTLCache[str, list] = TTLCache(ttl_s)

    def register(self, source: str, read: StateReader) -> None:
        """Add (or replace) the source ``source``; idempotent, so ``ready()`` may run twice."""
        with self._lock:
            self.sources[source] = read
            self._cache.clear()

    def clear(self) -> None:
        """Forget the last read: the next scrape reads every source again."""
        self._cache.clear()

    def collect(self) -> Iterator:
        with self._lock:
            return iter(self._cache.get("state", self._read))

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
        for source, read in self.sources.items():
            started = time.perf_counter()
            try:
                out.extend(read())
                up.add_metric([source], 1)
            except Exception:  # noqa: BLE001 - a scrape reports what it can
                logger.warning("metrics: reading the %s state failed", source, exc_info=True)
                up.add_metric([source], 0)
            scrape.add_metric([source], time.perf_counter() - started)
        return out


state = StateCollector()
_default_registered = False
_register_lock = threading.Lock()


def register_state_source(source: str, read: StateReader) -> None:
    """Called by an app's ``ready()``: ``read`` returns its gauges, fresh, at scrape time."""
    state.register(source, read)


def registry() -> CollectorRegistry:
    """What a scrape serves: every process's metrics (multiprocess) or this one's, plus state."""
    global _default_registered
    if multiprocess_dir():
        scrape = CollectorRegistry()
        MultiProcessCollector(scrape)
        scrape.register(state)
        return scrape
    with _register_lock:
        if not _default_registered:
            REGISTRY.register(state)
            _default_registered = True
    return REGISTRY


def render() -> tuple[bytes, str]:
    return generate_latest(registry()), CONTENT_TYPE_LATEST


def mark_process_dead(pid: int | None = None) -> None:
    """Drop an exited process's live gauges (multiprocess mode only; counters are kept)."""
    if multiprocess_dir():
        prometheus_multiprocess.mark_process_dead(pid or os.getpid())
