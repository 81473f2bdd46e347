"""Background work yielding to the urgent paths (docs/operations.md, Resource-aware dispatch).

Invariants:
- a background job asks its ``Holdback`` before each batch or turn: ``check()`` True means not
  now; ``wait(stop)`` blocks while that holds, looking again every ``HOLDBACK_POLL_MS``. The batch
  in flight always finishes: holding back only delays the next one;
- a job waits only while an urgent path is behind (``couponcenter.core.urgency``); the first
  check that finds every path on target lets it go on at once: that is its catch-up;
- a job never waits past its own window: ``must_run`` (the job's deadline: the expiry window,
  ``expiry.window``) says why it must run now, and a maintenance job runs after
  ``HOLDBACK_MAX_S`` of one stretch of waiting. It then runs, urgent path behind or not, until the
  paths are on target again (the stretch ends); the console says why it overrode the signal;
- what each job waits for is kept in Redis for the console (``holdback_rows``): its state, since
  when, the path and the signal's value, and the time it waited per UTC day (summed over the
  processes that run it; kept two days). Written when the state changes and at most every poll
  while it waits, never once per batch; Redis down loses the record, never the work.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from django.conf import settings
from prometheus_client.core import GaugeMetricFamily

from couponcenter.core.redis import get_redis
from couponcenter.core.urgency import Behind, Clock, UrgencySignal, epoch_ms, urgency_now
from couponcenter.core.urgency import signal as process_signal

logger = logging.getLogger(__name__)

RUNNING, HELD, OVERRIDDEN = "running", "held", "overridden"
DAY_TOTALS_TTL_S = 2 * 86_400

# The job's deadline: why it must run now although a path is behind, or None (it may wait).
MustRun = Callable[[int], str | None]


def job_key(job: str) -> str:
    return f"{settings.REDIS_KEY_PREFIX}:holdback:{job}"


def jobs_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}:holdback:jobs"


def day_key(at_ms: int) -> str:
    """Redis hash: job -> ms held back on that UTC day."""
    day = datetime.fromtimestamp(at_ms / 1000, tz=UTC).strftime("%Y%m%d")
    return f"{settings.REDIS_KEY_PREFIX}:holdback:day:{day}"


class Holdback:
    """Whether the background job ``job`` may start its next batch now.

    ``signal``: the process's ``UrgencySignal`` unless given; ``clock`` (epoch ms) and ``sleep``
    (seconds) are the tests' to control; ``max_hold_s``: ``HOLDBACK_MAX_S`` unless given (None:
    no limit but ``must_run``'s)."""

    def __init__(
        self,
        job: str,
        *,
        must_run: MustRun | None = None,
        max_hold_s: float | None = -1,
        signal: UrgencySignal | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self.job = job
        self.must_run = must_run
        self._max_hold_s = max_hold_s
        self.signal = signal or process_signal
        self.clock = clock or (signal.clock if signal else epoch_ms)
        self.sleep = sleep
        self.state = RUNNING
        self.since_ms: int | None = None  # start of the stretch (held, then maybe overridden)
        self._accounted_ms = 0  # the stretch's time counted into the day's total up to here
        self._written_ms = 0

    @property
    def max_hold_ms(self) -> int | None:
        limit = settings.HOLDBACK_MAX_S if self._max_hold_s == -1 else self._max_hold_s
        return None if limit is None else int(limit * 1000)

    def check(self) -> bool:
        """True: an urgent path is behind and this job should not start a batch now."""
        urgency = self.signal.read()
        now = self.clock()
        worst = urgency.worst
        if worst is None:
            if self.state != RUNNING:
                self._end(now)
            return False
        if self.state == OVERRIDDEN:
            return False
        if self.max_hold_ms == 0:
            return False  # HOLDBACK_MAX_S=0: this job never waits
        if self.state == RUNNING:
            self.since_ms = self._accounted_ms = now
        why = self.must_run(now) if self.must_run is not None else None
        if why is None and self.max_hold_ms is not None and now - self.since_ms >= self.max_hold_ms:
            why = f"waited {(now - self.since_ms) // 1000} s, its longest (HOLDBACK_MAX_S)"
        if why is not None:
            self._override(now, worst, why)
            return False
        self._held(now, worst)
        return True

    def wait(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Return once the job may go on (or ``stop()``), checking every ``HOLDBACK_POLL_MS``."""
        while not stop() and self.check():
            self.sleep(settings.HOLDBACK_POLL_MS / 1000)

    # --- the record ------------------------------------------------------------------------------

    def _held(self, now: int, worst: Behind) -> None:
        first = self.state != HELD
        if first:
            self.state = HELD
            logger.info(
                "holdback: %s waits: %s at %d ms, past its target of %d ms",
                self.job,
                worst.path,
                worst.value_ms,
                worst.target_ms,
            )
        elif now - self._written_ms < settings.HOLDBACK_POLL_MS:
            return
        self._write(now, worst=worst, why="", waited=True)

    def _override(self, now: int, worst: Behind, why: str) -> None:
        self.state = OVERRIDDEN
        logger.warning("holdback: %s runs although %s is behind: %s", self.job, worst.path, why)
        self._write(now, worst=worst, why=why, waited=True)

    def _end(self, now: int) -> None:
        waited = self.state == HELD
        logger.info(
            "holdback: %s goes on, the urgent paths are on target (%.1f s after it first waited)",
            self.job,
            (now - (self.since_ms or now)) / 1000,
        )
        self.state = RUNNING
        self._write(now, worst=None, why="", waited=waited)
        self.since_ms = None

    def _write(self, now: int, *, worst: Behind | None, why: str, waited: bool) -> None:
        """Record the state; ``waited``: the time since the last record was spent waiting (it
        goes into the day's total)."""
        self._written_ms = now
        held_ms = max(0, now - self._accounted_ms) if waited else 0
        self._accounted_ms = now
        fields: dict[str, str | int] = {
            "state": self.state,
            "checked_ms": now,
            "why": why,
            "worker": f"{socket.gethostname()}:{os.getpid()}",
        }
        if worst is not None:
            fields.update(
                since_ms=self.since_ms or now,
                path=worst.path,
                value_ms=worst.value_ms,
                target_ms=worst.target_ms,
                path_since_ms=worst.since_ms,
            )
        else:
            fields["ended_ms"] = now
        try:
            pipe = get_redis().pipeline(transaction=False)
            pipe.sadd(jobs_key(), self.job)
            pipe.hset(job_key(self.job), mapping=fields)
            if held_ms:
                pipe.hincrby(day_key(now), self.job, held_ms)
                pipe.expire(day_key(now), DAY_TOTALS_TTL_S)
            pipe.execute()
        except redis.RedisError:
            logger.warning("holdback: could not record %s's state", self.job, exc_info=True)


# --- for the console -----------------------------------------------------------------------------


@dataclass
class HoldbackRow:
    job: str
    state: str
    since_ms: int | None
    path: str
    value_ms: int | None
    target_ms: int | None
    why: str
    checked_ms: int | None
    ended_ms: int | None
    held_today_ms: int
    worker: str

    @property
    def held(self) -> bool:
        return self.state == HELD

    @property
    def since_at(self) -> datetime | None:
        return _moment(self.since_ms)

    @property
    def checked_at(self) -> datetime | None:
        return _moment(self.checked_ms)

    @property
    def ended_at(self) -> datetime | None:
        return _moment(self.ended_ms)


def holdback_rows(*, now_ms: int | None = None) -> list[HoldbackRow]:
    """Every background job that ever waited (as recorded), by name, with its time held back
    today ([] when Redis is down)."""
    now_ms = epoch_ms() if now_ms is None else now_ms
    try:
        client = get_redis()
        jobs = sorted(_text(j) for j in client.smembers(jobs_key()))
        pipe = client.pipeline(transaction=False)
        for job in jobs:
            pipe.hgetall(job_key(job))
        pipe.hgetall(day_key(now_ms))
        *states, today = pipe.execute()
    except redis.RedisError:
        return []
    totals = {_text(k): int(v) for k, v in today.items()}
    rows = []
    for job, raw in zip(jobs, states, strict=True):
        f = {_text(k): _text(v) for k, v in raw.items()}
        rows.append(
            HoldbackRow(
                job=job,
                state=f.get("state", RUNNING),
                since_ms=_int(f.get("since_ms")),
                path=f.get("path", ""),
                value_ms=_int(f.get("value_ms")),
                target_ms=_int(f.get("target_ms")),
                why=f.get("why", ""),
                checked_ms=_int(f.get("checked_ms")),
                ended_ms=_int(f.get("ended_ms")),
                held_today_ms=totals.get(job, 0),
                worker=f.get("worker", ""),
            )
        )
    return rows


def holdback_gauges() -> list[GaugeMetricFamily]:
    """``/metrics`` at scrape time: each urgent path's value and target, and per background job
    whether it waits (1), runs although a path is behind (``overridden``) and its time held back
    today (registered as the ``urgency`` state source by ``couponcenter.ops``)."""
    value = GaugeMetricFamily(
        "couponcenter_urgent_path_seconds",
        "An urgent path's signal now: the oldest unclaimed due job's age, or the claims' p99",
        labels=["path"],
    )
    target = GaugeMetricFamily(
        "couponcenter_urgent_path_target_seconds", "The signal's target", labels=["path"]
    )
    for reading in urgency_now().readings:
        value.add_metric([reading.path], reading.value_ms / 1000)
        target.add_metric([reading.path], reading.target_ms / 1000)
    state = GaugeMetricFamily(
        "couponcenter_holdback_state",
        "1 for the background job's state now (running, held, overridden)",
        labels=["job", "state"],
    )
    today = GaugeMetricFamily(
        "couponcenter_holdback_today_seconds",
        "Time the background job waited for the urgent paths today (UTC), all processes",
        labels=["job"],
    )
    for row in holdback_rows():
        for name in (RUNNING, HELD, OVERRIDDEN):
            state.add_metric([row.job, name], 1.0 if row.state == name else 0.0)
        today.add_metric([row.job], row.held_today_ms / 1000)
    return [value, target, state, today]


def _moment(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _int(value: str | None) -> int | None:
    return int(value) if value else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
