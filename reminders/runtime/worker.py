"""The reminder worker process: the engine's dispatch loop wired to Django.

- config: ``ReminderSettings`` (read every tick, cached briefly) via ``runtime.topic_wiring``;
- housekeeping under a singleton lease (exactly one worker does it): the reconcile that rebuilds
  pending jobs due within ``RECONCILE_WINDOW_S`` from the database every ``RECONCILE_EVERY_S``, so
  a Redis restart or flush loses nothing, and removes the entries in that window whose row is
  final (``services.orphans``: a subscribe/unsubscribe race can index a cancelled row); in the
  worker process it runs in a thread of its own, off the dispatch loop; and the claim gates'
  upkeep (``GateUpkeep``); and the reminders' retention (``RetentionUpkeep``);
- background work yields to the urgent paths (docs/operations.md, Resource-aware dispatch): the
  gates' upkeep and the retention skip their turn, or stop after their batch, while one is behind
  (``couponcenter.core.holdback``); the reconcile does not, being the reminders' own guarantee;
- backpressure: claiming of reminders pauses while the Celery delivery queue is deeper than
  ``ReminderSettings.max_delivery_queue`` (the backlog waits in Redis, where it is safe);
- errors close stale database connections so a restarted PostgreSQL is picked up again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from functools import partial

from celery import current_app
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from couponcenter.core import __version__
from couponcenter.core.holdback import Holdback
from couponcenter.core.redis import get_redis
from couponcenter.core.retention import RetentionRun, RetentionTurn
from couponcenter.coupons.gate import gates_maintain, gates_maintain_turn
from reminders import metrics, services
from reminders.engine import keys
from reminders.engine.dispatcher import Dispatcher, Hooks
from reminders.engine.topic_model import Topic
from reminders.handlers.coupon_reminders import delivery_queue_depth
from reminders.members import REMINDER_TOPICS
from reminders.runtime.topic_wiring import (
    ClaimBudget,
    GenericTopics,
    builtin_topics,
    engine_settings,
)
from reminders.selectors import queues, reminder_settings_get
from reminders.services.orphans import queues_prune_orphans
from reminders.services.retention import reminders_retention

logger = logging.getLogger(__name__)
BROKER_WARN_EVERY_S = 10.0
BROKER_RETRY_S = 1.0
# The background jobs' names in the hold-back records (the console's rows).
GATES_JOB, RETENTION_JOB = "claim gates", "reminders retention"


class BacklogSampler:
    """Note every topic's backlog (scheduled, and overdue of those) in the metrics every
    ``every_s`` seconds, so the queue pages draw it over time. A housekeeping chore: one worker
    samples, whatever the number running; one pipeline per topic over its slots."""

    def __init__(self, every_s: float = 15.0) -> None:
        self.every_s = every_s
        self.last = float("-inf")

    def __call__(self) -> None:
        now = time.time()
        if now - self.last < self.every_s:
            return
        self.last = now
        for topic in queues.backlog(at_ms=int(now * 1000)).topics:
            metrics.sample_backlog(topic.topic, backlog=topic.store, overdue=topic.due, now=now)


class Reconciler:
    """Rebuild from the database what Redis may have lost.

    - every ``every_s`` seconds, the pending jobs due within ``window_s`` (idempotent, NX);
    - at once and in full when the epoch marker is gone: Redis was flushed or restarted without
      its data, so nothing it held can be trusted (the marker is set again first, so exactly one
      full rebuild runs per loss).

    ``background``: the periodic reconcile runs in a thread of its own (the worker process), not
    in the dispatch loop's: it reads every reminder due within the window and rebuilds it, and
    with 50,000 due in the next minutes that would hold up every claim for half a second, once a
    minute. One runs at a time; a
    call while it is still running does nothing. The full rebuild stays in the loop: after a
    loss Redis has nothing to claim until it is done.
    """

    def __init__(
        self,
        every_s: float | None = None,
        window_s: float | None = None,
        *,
        background: bool = False,
    ) -> None:
        self.every_s = settings.RECONCILE_EVERY_S if every_s is None else every_s
        self.window_s = settings.RECONCILE_WINDOW_S if window_s is None else window_s
        self.last = float("-inf")  # the first call always runs, however young the host is
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="reconcile")
            if background
            else None
        )
        self._running: Future | None = None

    def __call__(self) -> Future | None:
        """Returns the periodic reconcile's future when one was started in the background."""
        started = time.perf_counter()
        if get_redis().set(keys.epoch(), timezone.now().isoformat(), nx=True):
            self.last = time.monotonic()
            counts = services.queues_rebuild()
            seconds = round(time.perf_counter() - started, 3)
            if any(counts.values()):
                logger.warning(
                    "Redis epoch marker missing (flush, or a restart without its data): full "
                    "rebuild, %s re-indexed in %.3f s",
                    counts,
                    seconds,
                    extra={"counts": counts, "seconds": seconds},
                )
            else:
                # A first start, or a loss of nothing: Redis held every pending entry already.
                logger.info(
                    "Redis holds the whole schedule (checked in %.3f s against the database)",
                    seconds,
                    extra={"counts": counts, "seconds": seconds},
                )
            return None
        if time.monotonic() - self.last < self.every_s:
            return None
        if self._pool is None:
            self.last = time.monotonic()
            self._reconcile_window()
            return None
        if self._running is not None and not self._running.done():
            return None  # the last one is still at it; due again once it ends
        self.last = time.monotonic()
        self._running = self._pool.submit(self._in_background)
        return self._running

    def close(self) -> None:
        """Wait for a reconcile in flight (it is bounded by its window), then stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _in_background(self) -> None:
        try:
            self._reconcile_window()
        except Exception:
            logger.exception("reconcile failed; it runs again in %s s", self.every_s)
            raise
        finally:
            connection.close()  # this thread's own; the next run opens a fresh one

    def _reconcile_window(self) -> None:
        started = time.perf_counter()
        window_end = timezone.now() + timedelta(seconds=self.window_s)
        counts = services.queues_rebuild(due_before=window_end)
        if any(counts.values()):
            # The counts in the text too: the plain log format drops ``extra``.
            logger.warning(
                "reconcile re-indexed missing entries: %s", counts, extra={"counts": counts}
            )
        orphans = queues_prune_orphans(due_before=window_end)
        if orphans:
            logger.warning(
                "reconcile removed orphaned entries: %s", orphans, extra={"counts": orphans}
            )
            for topic, removed in orphans.items():
                metrics.record(topic, {"orphaned": removed})
        logger.debug("reconcile took %.3f s", time.perf_counter() - started)


class GateUpkeep:
    """The claim gates' upkeep (``couponcenter.coupons.gate.gates_maintain``): gates built before
    their coupon opens, stale holds dropped, counts reconciled with PostgreSQL, gates Redis lost
    built again, every ``GATE_MAINTAIN_INTERVAL_S``.

    Why here: the reminder worker is the one process every deployment runs all the time (the
    Procfile, docs/operations.md) that already keeps Redis in step with the database on a
    schedule; a web process lives by requests and may be recycled, and Celery's beat is not
    deployed. The dispatcher runs it under its ``housekeeping`` lease, and ``gates_maintain_turn``
    (a Redis key that lapses after the interval) makes it one round per interval across the
    fleet, even while the lease moves between workers. ``background``: in a thread of its own
    (the worker process), since a rebuild reads every claim of a coupon; one at a time.
    """

    def __init__(self, *, background: bool = False) -> None:
        self.hold = Holdback(GATES_JOB)
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate-upkeep")
            if background
            else None
        )
        self._running: Future | None = None

    def __call__(self) -> Future | None:
        if not settings.CLAIM_GATE:
            return None
        if self._running is not None and not self._running.done():
            return None
        if not gates_maintain_turn() or self.hold.check():
            return None  # held back: this turn is skipped
        if self._pool is None:
            gates_maintain()
            return None
        self._running = self._pool.submit(self._in_background)
        return self._running

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _in_background(self) -> list[int]:
        try:
            return gates_maintain()
        except Exception:
            logger.exception("claim gates' upkeep failed; it runs again in its next turn")
            raise
        finally:
            connection.close()  # this thread's own


class RetentionUpkeep:
    """The reminders' retention (``services.retention.reminders_retention``): finished timeout
    jobs, old notifications, finished subscriptions and dead letters removed in batches.

    Run here for the reasons ``GateUpkeep`` is; ``RetentionTurn`` makes it one pass per
    ``RETENTION_EVERY_S`` across the fleet, and one at a time (a lease held while it runs).
    ``background``: in a thread of its own (the worker process), off the dispatch loop; ``close``
    asks a pass in flight to stop after its batch, and waits for it.
    """

    def __init__(self, *, background: bool = False) -> None:
        self._turn = RetentionTurn("reminders", every_s=settings.RETENTION_EVERY_S)
        self.hold = Holdback(RETENTION_JOB)
        self._stop = threading.Event()
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="retention")
            if background
            else None
        )
        self._running: Future | None = None

    def __call__(self) -> Future | None:
        if self._running is not None and not self._running.done():
            return None
        if self._stop.is_set() or not self._turn.take():
            return None
        if self.hold.check():
            self._turn.give_back()  # taken again once the urgent paths are on target
            return None
        if self._pool is None:
            self._run()
            return None
        self._running = self._pool.submit(self._in_background)
        return self._running

    def close(self) -> None:
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _run(self) -> list[RetentionRun]:
        try:
            return reminders_retention(
                should_stop=lambda: (
                    self._stop.is_set() or not self._turn.keep() or self.hold.check()
                )
            )
        finally:
            self._turn.release()

    def _in_background(self) -> list[RetentionRun]:
        try:
            return self._run()
        except Exception:
            logger.exception("retention failed; it runs again in its next turn")
            raise
        finally:
            connection.close()  # this thread's own


class DeliveryBackpressure:
    """Claim reminders only while the Celery delivery queue is shallower than the configured
    limit; the depth is read at most every ``every_s`` seconds (one LLEN)."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s = every_s
        self._checked = 0.0
        self._room = True
        self._warned = float("-inf")

    def __call__(self, topic: Topic) -> bool:
        if topic.name not in REMINDER_TOPICS:
            return True  # other topics are not delivered through Celery
        now = time.monotonic()
        if now - self._checked >= self.every_s:
            self._checked = now
            limit = reminder_settings_get().max_delivery_queue
            try:
                self._room = limit == 0 or delivery_queue_depth() < limit
            except Exception as exc:  # the broker is down: reminders wait in Redis, unclaimed
                self._room = False
                self._checked = now + BROKER_RETRY_S - self.every_s  # ask again in a second
                if now - self._warned >= BROKER_WARN_EVERY_S:
                    self._warned = now
                    logger.warning("broker unreachable (%s): not claiming reminders", exc)
                return False
            if not self._room:
                logger.info("backpressure: delivery queue at its limit of %d batches", limit)
        return self._room


def _on_error(exc: BaseException) -> None:
    close_old_connections()


def _warm_celery() -> None:
    """Finalize the Celery app, resolve its broker transport and build its task sender now: left
    to the first publish, they cost about 110 ms of imports in the middle of the first burst. No
    connection is opened (the broker may be down at start; the backpressure check reports that).
    """
    current_app.finalize(auto=True)
    with current_app.connection_for_write() as conn:
        conn.transport  # noqa: B018  (the import is the point; released unconnected)
    amqp = current_app.amqp
    amqp.producer_pool  # noqa: B018
    # The task sender, and the event dispatcher it is built with (which imports celery.events):
    # another 55 ms of the first burst's dispatch otherwise.
    amqp.send_task_message  # noqa: B018


def build_worker(
    topic_names: list[str] | None = None,
    *,
    threaded: bool = False,
    clock: Callable[[], int] | None = None,
) -> Dispatcher:
    """The dispatch loop of this process. ``threaded``: generic topics fire in their executors'
    threads (``run_reminder_worker``), their jobs held from ``TIMEOUT_HOLD_MS`` before they are
    due; otherwise inline, in the loop's thread (``--once``, the tests): the same firing and
    settling code, finished when the tick returns. ``clock``: epoch ms for the loop and the
    executors' holding (the tests move it on)."""
    # Import the apps' Celery tasks as a Celery worker does: a ``celery`` topic then calls its
    # task by signature, which honours task_always_eager (a task known by name only never does).
    current_app.autodiscover_tasks(force=True)
    _warm_celery()
    names = set(topic_names) if topic_names else None
    generic = GenericTopics(inline=not threaded, names=names, clock=clock)
    builtin = builtin_topics(names)
    known = {t.name for t in generic.refresh() + builtin}
    if names and names - known:
        generic.executors.close()
        raise ValueError(f"unknown topics {sorted(names - known)}; known: {sorted(known)}")
    reconciler = Reconciler(background=threaded)
    gate_upkeep = GateUpkeep(background=threaded)
    retention = RetentionUpkeep(background=threaded)
    hooks = Hooks(
        may_claim=DeliveryBackpressure(),
        budget=ClaimBudget(generic),
        housekeeping=[reconciler, gate_upkeep, retention, BacklogSampler()],
        on_error=_on_error,
        on_shutdown=[
            generic.executors.close,
            reconciler.close,
            gate_upkeep.close,
            retention.close,
        ],
        handed_counts=generic.executors.counts,
        load=generic.executors.load,
    )
    dispatcher = Dispatcher(
        lambda: generic.refresh() + builtin,
        config=partial(engine_settings, generic),
        hooks=hooks,
        version=__version__,
        # Heartbeat, leases and reaping five times per lease period, not on every tick of a
        # loop that wakes for each due second.
        maintenance_every_ms=max(settings.WORKER_LEASE_MS // 5, 50),
        # Under a steady stream of due reminders, one claim (and one Celery task) per 20 ms
        # instead of per 5: a quarter of the tasks for at most 15 ms more lateness.
        min_sleep_ms=settings.WORKER_MIN_SLEEP_MS,
        stall_ms=settings.WORKER_STALL_MS,
        **({"clock": clock} if clock is not None else {}),
    )
    generic.executors.on_room = dispatcher.wake  # a full executor with room again
    return dispatcher
