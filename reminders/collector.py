"""The reminders app's state at scrape time (as django-rq's ``RQCollector``): registered with the
kernel's ``/metrics`` from ``reminders/apps.py`` as the ``redis`` state source."""

from __future__ import annotations

from django.conf import settings
from prometheus_client.core import GaugeMetricFamily

from couponcenter.core.redis import get_redis
from reminders.engine import leases, queue
from reminders.engine.clock import epoch_ms
from reminders.selectors.queues import topic_slot_counts


def queue_gauges() -> list[GaugeMetricFamily]:
    """Backlog, due, in flight, dead and oldest overdue per topic (every served slot, one pipeline
    per topic, O(log n) each), and the live workers."""
    families = {
        "store": GaugeMetricFamily(
            "couponcenter_queue_backlog",
            "Jobs scheduled, not yet claimed (store)",
            labels=["topic"],
        ),
        "due": GaugeMetricFamily(
            "couponcenter_queue_due", "Jobs due now and not yet claimed", labels=["topic"]
        ),
        "prepare": GaugeMetricFamily(
            "couponcenter_queue_in_flight",
            "Jobs claimed by a worker, not yet acked (prepare)",
            labels=["topic"],
        ),
        "dead": GaugeMetricFamily(
            "couponcenter_queue_dead", "Jobs in the dead queue", labels=["topic"]
        ),
        "overdue": GaugeMetricFamily(
            "couponcenter_queue_oldest_overdue_seconds",
            "How late the most overdue unclaimed job is",
            labels=["topic"],
        ),
    }
    client = get_redis()
    now_ms = epoch_ms()
    for topic, served in topic_slot_counts().items():
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
