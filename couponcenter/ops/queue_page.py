"""One topic's queue page (``/admin/console/queue/<topic>/``), in the manner of the queue views
of Sidekiq Web and Oban Web: the backlog now and over time, lateness over time, and for a generic
topic a filterable table of its jobs whose selection the timeout-job admin acts on.

Every read is bounded: the backlog is one pipeline over the topic's slots, the charts read the
per-minute (or per-hour) metric hashes, the job table is one indexed page (newest first, one row
more than shown to know whether there is a next page; no COUNT).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet

from couponcenter.ops.overview import RANGES
from reminders import metrics
from reminders.engine.clock import epoch_ms
from reminders.models import TimeoutJob
from reminders.selectors import queues, timeout_job_list
from reminders.selectors.timeout_topics import timeout_topic_spec
from reminders.timeout_topic_rules import TimeoutTopicSpec

PAGE_SIZE = 50
STATUSES = {label.lower(): value for value, label in TimeoutJob.Status.choices}


@dataclass(frozen=True)
class JobFilter:
    status: str = ""  # a key of STATUSES, or "" for every status
    q: str = ""  # a business key type:id, a business id or a job id
    page: int = 0

    @classmethod
    def from_query(cls, params) -> JobFilter:
        status = params.get("status", "")
        page = params.get("p", "")
        return cls(
            status=status if status in STATUSES else "",
            q=(params.get("q") or "").strip()[:200],
            page=min(int(page), 1000) if page.isdigit() else 0,
        )

    def admin_query(self, topic: str) -> dict[str, str]:
        """The same selection as the timeout-job admin's list filters and search."""
        query = {"topic__exact": topic}
        if self.status:
            query["status__exact"] = str(STATUSES[self.status])
        if self.q:
            query["q"] = self.q
        return query


def _matching(topic: str, f: JobFilter) -> QuerySet[TimeoutJob]:
    jobs = timeout_job_list(topic=topic, status=STATUSES.get(f.status))
    if not f.q:
        return jobs
    if ":" in f.q:
        biz_type, _, biz_id = f.q.partition(":")
        return jobs.filter(biz_type=biz_type, biz_id=biz_id)
    if f.q.isdigit() and len(f.q) < 19:
        return jobs.filter(Q(pk=int(f.q)) | Q(biz_id=f.q))
    return jobs.filter(biz_id=f.q)


def job_page(topic: str, f: JobFilter) -> tuple[list[TimeoutJob], bool]:
    """A page of the topic's jobs, newest first, and whether an older page follows."""
    start = f.page * PAGE_SIZE
    rows = list(
        _matching(topic, f)
        .defer("attribute", "history")
        .order_by("-pk")[start : start + PAGE_SIZE + 1]
    )
    return rows[:PAGE_SIZE], len(rows) > PAGE_SIZE


def queue_page(topic: str, chart_range: str, f: JobFilter) -> dict | None:
    """What the page shows; None for a topic no queue serves."""
    if topic not in queues.topic_slot_counts():
        return None
    minutes, step_s = RANGES[chart_range]
    at_ms = epoch_ms()
    backlog = queues.backlog(at_ms=at_ms, topic=topic).topics[0]
    rows = metrics.series(topic, minutes=minutes, step_s=step_s)
    recent = metrics.series(topic, minutes=queues.RECENT_MINUTES)
    spec: TimeoutTopicSpec | None = timeout_topic_spec(topic)
    jobs, more = job_page(topic, f) if spec is not None else ([], False)
    return {
        "topic": topic,
        "spec": spec,
        "backlog": backlog,
        "rows": rows,
        "step_s": step_s,
        "lateness": queues.recent_lateness({topic: recent}),
        "totals": {name: sum(r[name] for r in rows) for name in metrics.COUNTS},
        "jobs": jobs,
        "has_more": more,
    }
