"""Reads of the reminder engine's state for the console, ``/api/ops/`` and ``/metrics``.

Nothing here writes, and every read is bounded, so a page stays fast whatever the size of the
queues behind it:
- the backlog is one pipeline of O(log n) sorted-set calls per topic (ZCARD, ZCOUNT, ZRANGE 0 0);
- charts read the per-minute metric hashes of the last hour (``reminders.metrics``);
- workers come from the heartbeat registry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from django.conf import settings

from couponcenter.core.webhooks import origin
from reminders import metrics
from reminders.engine import leases, queue, rates
from reminders.engine.clock import epoch_ms
from reminders.engine.queue import SlotStats
from reminders.members import REMINDER_TOPICS
from reminders.models import ReminderSettings
from reminders.selectors import reminder_settings_get
from reminders.selectors.timeout_topics import timeout_topic_specs

CHART_MINUTES = 60
# The p99 shown in the banner: the worst minute among the last few (a single quiet minute after a
# burst must not hide it, and an hour-old spike must not keep the banner up).
RECENT_MINUTES = 5


def ms_to_datetime(ms: int | None) -> datetime | None:
    return None if not ms else datetime.fromtimestamp(ms / 1000, tz=UTC)


# --- topics and slots ----------------------------------------------------------------------------


def topic_slot_counts(*, live: ReminderSettings | None = None) -> dict[str, int]:
    """Every topic with the number of slots to look at (every layout not yet drained)."""
    live = live or reminder_settings_get()
    configured = dict.fromkeys(REMINDER_TOPICS, live.slots)
    configured.update({name: spec.slots for name, spec in timeout_topic_specs().items()})
    return {topic: queue.served_slot_count(topic, slots) for topic, slots in configured.items()}


# --- backlog -------------------------------------------------------------------------------------


@dataclass
class TopicBacklog:
    topic: str
    slots: list[SlotStats]
    store: int = 0
    due: int = 0
    oldest_overdue_ms: int = 0
    prepare: int = 0
    dead: int = 0

    def __post_init__(self) -> None:
        for s in self.slots:
            self.store += s.store
            self.due += s.due
            self.prepare += s.prepare
            self.dead += s.dead
            self.oldest_overdue_ms = max(self.oldest_overdue_ms, s.oldest_overdue_ms)


@dataclass
class Backlog:
    topics: list[TopicBacklog]
    now_ms: int
    totals: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = ("store", "due", "prepare", "dead")
        self.totals = {n: sum(getattr(t, n) for t in self.topics) for n in names}
        self.totals["oldest_overdue_ms"] = max(
            (t.oldest_overdue_ms for t in self.topics), default=0
        )


def backlog(*, at_ms: int | None = None, topic: str | None = None) -> Backlog:
    """Per topic and slot: store size, due now, oldest overdue age, in flight and dead."""
    at_ms = epoch_ms() if at_ms is None else at_ms
    topics = []
    for name, slots in topic_slot_counts().items():
        if topic is None or name == topic:
            topics.append(TopicBacklog(name, queue.stats(name, range(slots), now_ms=at_ms)))
    return Backlog(topics, at_ms)


def backlog_as_dict(data: Backlog) -> dict:
    return {
        "now_ms": data.now_ms,
        "totals": data.totals,
        "topics": [
            {
                "topic": t.topic,
                "store": t.store,
                "due": t.due,
                "oldest_overdue_ms": t.oldest_overdue_ms,
                "prepare": t.prepare,
                "dead": t.dead,
                "slots": [{k: v for k, v in asdict(s).items() if k != "topic"} for s in t.slots],
            }
            for t in data.topics
        ],
    }


# --- what falls due soon ------------------------------------------------------------------------

DUE_SOON_STEP_MIN = 10
DUE_SOON_WINDOWS = 6  # the next hour, in 10-minute windows


def due_soon(*, at_ms: int | None = None) -> list[dict]:
    """Per topic: how many scheduled jobs fall due in each of the next hour's 10-minute windows
    (one pipeline of ZCOUNTs per topic, over every slot still served)."""
    at_ms = epoch_ms() if at_ms is None else at_ms
    step = DUE_SOON_STEP_MIN * 60_000
    bounds = [at_ms + step * (i + 1) for i in range(DUE_SOON_WINDOWS)]
    rows = []
    for topic, slots in topic_slot_counts().items():
        counts = queue.due_between(topic, range(slots), at_ms, bounds)
        rows.append({"topic": topic, "windows": counts, "total": sum(counts)})
    return rows


# --- throughput and lateness ---------------------------------------------------------------------


def throughput(
    *, minutes: int = CHART_MINUTES, now: float | None = None, step_s: int = 60
) -> dict[str, list[dict]]:
    """Per topic (the reminders', then the generic ones), per period (a minute, or an hour with
    ``step_s=3600``; oldest first): counts, lateness histogram and p50/p99."""
    names = [*REMINDER_TOPICS, *timeout_topic_specs()]
    return {
        topic: metrics.series(topic, minutes=minutes, now=now, step_s=step_s) for topic in names
    }


@dataclass(frozen=True)
class Lateness:
    """Lateness over a window, from the samples of all its minutes together. The percentiles are
    interpolated inside a histogram bucket: the true value lies within that bucket's edges."""

    samples: int
    p50_ms: int | None
    p99_ms: int | None
    p99_bucket_ms: tuple[int, int] | None  # (lower, upper) edges around p99

    @property
    def past_buckets(self) -> bool:
        """p99 lies in the open last bucket: later than its edge, by an unknown amount."""
        return metrics.past_buckets(self.p99_ms)


def recent_lateness(series: dict[str, list[dict]], *, minutes: int = RECENT_MINUTES) -> Lateness:
    hist = metrics.merged(row for rows in series.values() for row in rows[-minutes:])
    p99 = metrics.percentile(hist, 0.99)
    return Lateness(
        samples=sum(hist.values()),
        p50_ms=metrics.percentile(hist, 0.50),
        p99_ms=p99,
        p99_bucket_ms=metrics.bucket_bounds(p99) if p99 is not None else None,
    )


def recent_p99_ms(series: dict[str, list[dict]], *, minutes: int = RECENT_MINUTES) -> int | None:
    return recent_lateness(series, minutes=minutes).p99_ms


# --- workers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    host: str
    pid: int
    version: str
    config_version: int
    heartbeat_age_s: float
    live: bool
    current: bool  # has picked up the current ReminderSettings.version
    owned: dict[str, list[int]]

    @property
    def owned_summary(self) -> str:
        return "; ".join(f"{t}: {_ranges(s)}" for t, s in sorted(self.owned.items()) if s) or "-"


def workers(*, at_ms: int | None = None, live: ReminderSettings | None = None) -> list[WorkerRow]:
    """Registered workers (live first), heartbeat age, and whether they run the current config."""
    at_ms = epoch_ms() if at_ms is None else at_ms
    version = (live or reminder_settings_get(max_age_s=0)).version
    rows = [
        WorkerRow(
            worker_id=w.worker_id,
            host=w.host,
            pid=w.pid,
            version=w.version,
            config_version=w.config_version,
            heartbeat_age_s=max(0, at_ms - w.heartbeat_ms) / 1000,
            live=at_ms - w.heartbeat_ms <= settings.WORKER_LEASE_MS,
            current=w.config_version >= version,
            owned=w.owned,
        )
        for w in leases.list_workers()
    ]
    return sorted(rows, key=lambda r: (not r.live, r.worker_id))


def _ranges(slots: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out, start, prev = [], None, None
    for s in sorted(slots):
        if start is None:
            start = prev = s
        elif s == prev + 1:
            prev = s
        else:
            out.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = s
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(out)


# --- generic timeout topics ----------------------------------------------------------------------


@dataclass(frozen=True)
class TimeoutTopicRow:
    """One generic topic as the console shows it."""

    name: str
    type: str
    target: str  # scheme and host only
    paused: bool
    read_only: bool
    backlog: TopicBacklog | None
    lateness_p50_ms: int | None  # the last RECENT_MINUTES minutes
    lateness_p99_ms: int | None
    hour: dict[str, int]  # delivered, failed, dead in the last hour
    rate_limit_per_s: int
    tokens: float | None  # in the bucket now (None: no limit)
    throttled: int  # due jobs held back by the limit (per claim), since the bucket was made
    in_flight: int  # jobs taken in by the live workers' executors (firing, waiting or held)
    capacity: int  # how many they take in at most (their queues, not their threads)
    threads: int  # the executors' threads (the topic's concurrency, summed over workers)
    workers: int  # live workers running an executor of the topic

    @property
    def saturation_pct(self) -> int:
        return round(100 * self.in_flight / self.capacity) if self.capacity else 0


def timeout_topic_rows(
    *, data: Backlog, series: dict[str, list[dict]], at_ms: int | None = None
) -> list[TimeoutTopicRow]:
    """Every generic topic: backlog, lateness, the hour's counts, rate-limit state and how full
    the workers' executors are (from their heartbeats)."""
    at_ms = epoch_ms() if at_ms is None else at_ms
    backlogs = {t.topic: t for t in data.topics}
    load: dict[str, list[int]] = {}
    for w in leases.list_workers():
        if at_ms - w.heartbeat_ms > settings.WORKER_LEASE_MS:
            continue
        for topic, figures in (w.load or {}).items():
            # [in flight, capacity, threads]; a worker of an older version sends no threads.
            total = load.setdefault(topic, [0, 0, 0, 0])
            for i, n in enumerate(figures[:3]):
                total[i] += n
            total[3] += 1
    rows = []
    for name, spec in timeout_topic_specs().items():
        recent = recent_lateness({name: series.get(name, [])})
        hour = {n: sum(r[n] for r in series.get(name, [])) for n in ("delivered", "failed", "dead")}
        bucket = (
            rates.state(name, spec.rate_limit_per_s, now_ms=at_ms)
            if spec.rate_limit_per_s
            else None
        )
        in_flight, capacity, threads, running = load.get(name, [0, 0, 0, 0])
        rows.append(
            TimeoutTopicRow(
                name=name,
                type=spec.type,
                target=origin(spec.url) if spec.url else spec.target,
                paused=spec.paused,
                read_only=spec.read_only,
                backlog=backlogs.get(name),
                lateness_p50_ms=recent.p50_ms,
                lateness_p99_ms=recent.p99_ms,
                hour=hour,
                rate_limit_per_s=spec.rate_limit_per_s,
                tokens=bucket.tokens if bucket else None,
                throttled=bucket.throttled if bucket else 0,
                in_flight=in_flight,
                capacity=capacity,
                threads=threads,
                workers=running,
            )
        )
    return rows
