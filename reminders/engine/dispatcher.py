"""The dispatch loop: one object per worker process, ``run_once()`` per tick.

A tick: read the config, let ``Maintenance`` heartbeat, sync the slot leases, promote and reap
when its pass is due, then claim due entries batch by batch, round-robin over the owned slots
(starting where the shared INCR counter points), hand each batch to its topic's handler and
ack / nack / bury per item, then call each topic's ``flush`` hook (a handler may gather a round's
batches into one hand-off). A tick stops claiming when every slot came back short or its time
budget (a third of the lease time) is spent; the loop then sleeps until the next tick or the
earliest due entry in the owned slots, whichever is sooner.

A batch whose ack or nack hits LeaseLost is dropped in hand: another worker owns the slot now,
and the entries come back to it through the reaper after the visibility timeout.

The upkeep of the slots (heartbeat, leases, promotion, reaping, housekeeping) is
``maintenance.Maintenance``; what is left here is one loop whose steps share a tick's state
(its report, its budget, the slots in hand), so it stays one module.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import redis

from . import leases, queue
from .clock import epoch_ms
from .connection import Client
from .maintenance import Maintenance
from .scripts import Claimed, LeaseLost, Parcel
from .topic_model import (
    HANDED_ON,
    OK,
    ConfigProvider,
    EngineSettings,
    Outcome,
    Result,
    Retry,
    Topic,
    TopicSettings,
    all_topics,
)

log = logging.getLogger("reminders.engine")

MIN_SLEEP_S = 0.005  # never spin: even with work due "now" give Redis and the handler room
ERROR_SLEEP_S = 1.0  # after a failed tick (Redis down, handler bug in setup)
# The renewer thread keeps the slot leases while a round runs long (a slow publish, a long
# rebuild), but not for a loop stuck this long in one tick: its slots should go to others, and
# its worker is reported stalled (``leases.stalled_workers``, the health check).
STALL_MS = 60_000
_DONE = (Outcome.OK, Outcome.DROP)


@dataclass
class TickReport:
    claimed: int = 0
    acked: int = 0
    dropped: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0
    reaped: int = 0
    owned: dict[str, list[int]] = field(default_factory=dict)
    busy: bool = False  # stopped on the time budget with full batches still coming
    next_due_ms: int | None = None


class ClaimBudget(Protocol):
    """How many entries of a topic may be claimed now (a rate limit, an executor's room)."""

    def take(self, topic: Topic, want: int) -> int:
        """Up to ``want``; 0 claims nothing of ``topic`` this time."""

    def give_back(self, topic: Topic, unused: int) -> None:
        """The claim found fewer due entries than it was allowed: return the rest."""

    def held_back(self, topic: Topic, due_left: int) -> None:
        """A claim cut short by ``take`` came back full: ``due_left`` due entries of its slot
        (at most what the cut refused) are waiting because of it."""

    def rate_cut(self, topic: Topic) -> int:
        """How many of what the last ``take`` of ``topic`` refused are worth counting as held
        back (a rate limit's refusals; 0: none, and the loop counts nothing)."""


@dataclass(frozen=True)
class Hooks:
    """What the process running the loop plugs into it; the loop runs without any.

    ``may_claim(topic)``: backpressure; False skips claiming that topic (its due entries wait
    in Redis), asked before each batch. ``budget``: caps each claim (rate limits, executors'
    room). ``housekeeping``: chores run by exactly one worker at each maintenance pass (the
    database reconcile; see ``maintenance``). ``on_error``: told of a failed tick, flush or
    chore (to close stale database connections). ``on_shutdown``: run first on shutdown
    (executors finishing what they hold). ``handed_counts``: running totals ("acked",
    "retried", "dead") of entries handed on and settled in this process since it started; each
    tick reports what they grew by. ``load``: per topic [in flight, capacity] of this process's
    executors, heartbeated."""

    may_claim: Callable[[Topic], bool] | None = None
    budget: ClaimBudget | None = None
    housekeeping: Sequence[Callable[[], object]] = ()
    on_error: Callable[[BaseException], None] | None = None
    on_shutdown: Sequence[Callable[[], None]] = ()
    handed_counts: Callable[[], dict[str, int]] | None = None
    load: Callable[[], dict[str, list[int]]] | None = None


class Dispatcher:
    def __init__(
        self,
        topics: Sequence[Topic] | Callable[[], Sequence[Topic]] | None = None,
        *,
        config: ConfigProvider | None = None,
        hooks: Hooks = Hooks(),
        worker_id: str | None = None,
        client: Client | None = None,
        clock: Callable[[], int] = epoch_ms,
        version: str = "",
        maintenance_every_ms: int = 0,
        min_sleep_ms: float = MIN_SLEEP_S * 1000,
        stall_ms: int = STALL_MS,
    ):
        """``topics``: a list, or a callable asked every tick (topics may come and go while the
        worker runs). ``clock``: epoch ms. ``maintenance_every_ms``: heartbeat, lease sync,
        promotion, reaping and housekeeping run at most this often (0: every tick), so a busy
        loop spends its round trips on claims; keep it well under the lease time.
        ``min_sleep_ms``: the shortest sleep between ticks; under a steady stream of due entries
        it sets how many one claim gathers (and so how many handler calls there are).
        ``stall_ms``: a tick running longer lets its leases lapse and reports the worker
        stalled."""
        self._topics = topics if topics is None or callable(topics) else list(topics)
        self.config = config or EngineSettings
        self.worker_id = worker_id or leases.new_worker_id()
        self.client = client
        self.clock = clock
        self.may_claim = hooks.may_claim or (lambda topic: True)
        self.budget = hooks.budget
        self.on_error = hooks.on_error
        self.on_shutdown = list(hooks.on_shutdown)
        self.handed_counts = hooks.handed_counts
        self._handed_seen: dict[str, int] = (
            dict(hooks.handed_counts()) if hooks.handed_counts else {}
        )
        self._budget_cut: dict[str, bool] = {}  # the last claim of a topic got less than asked
        self.min_sleep_s = min_sleep_ms / 1000
        self.stall_ms = stall_ms
        self._tick_started = time.monotonic()
        self.leases = leases.SlotLeases(self.worker_id, client=client)
        self.maintenance = Maintenance(
            self.leases,
            client=client,
            clock=lambda: self.clock(),  # read through: a clock set on the dispatcher holds there
            every_ms=maintenance_every_ms,
            version=version,
            housekeeping=hooks.housekeeping,
            load=hooks.load,
            on_error=hooks.on_error,
        )
        self._stop = threading.Event()
        self._wake = threading.Event()  # wake(): room freed up somewhere, claim again now

    def topics(self) -> list[Topic]:
        if self._topics is None:
            return all_topics()
        return list(self._topics()) if callable(self._topics) else self._topics

    # --- one tick ---------------------------------------------------------------------------------

    def run_once(self) -> TickReport:
        self._tick_started = time.monotonic()
        topic_list = self.topics()  # first: a provider may add topics the config then describes
        cfg = self.config()
        self.leases.ttl_ms = cfg.lease_ms
        topics = [(topic, cfg.for_topic(topic)) for topic in topic_list]
        report = TickReport(reaped=self.maintenance.tick(cfg, topics))
        report.owned = {t.name: self.leases.owned(t.name) for t, _ in topics}
        working = [(topic, ts) for topic, ts in topics if not ts.paused and self.may_claim(topic)]
        try:
            self._claim_round_robin(working, report, budget_ms=cfg.lease_ms // 3)
        finally:
            self._flush(working)
        report.next_due_ms = self._next_due(working)
        if self.maintenance.behind:
            report.busy = True  # more to promote: tick again at once
        self._count_handed(report)
        self.maintenance.round_ms = self.clock()
        return report

    def _count_handed(self, report: TickReport) -> None:
        if self.handed_counts is None:
            return
        now = dict(self.handed_counts())
        for name in ("acked", "retried", "dead"):
            grew = now.get(name, 0) - self._handed_seen.get(name, 0)
            setattr(report, name, getattr(report, name) + grew)
        self._handed_seen = now

    def _claim_round_robin(self, topics, report: TickReport, *, budget_ms: int) -> None:
        """Round-robin over owned slots, higher-priority topics drained first."""
        deadline = self.clock() + budget_ms
        for priority in sorted({topic.priority for topic, _ in topics}, reverse=True):
            now = self.clock()
            active = [
                (topic, ts, slot)
                for topic, ts in topics
                if topic.priority == priority
                for slot in self._due_slots(topic, now + ts.lookahead_ms)
            ]
            while active and not self._stop.is_set():
                if self.clock() >= deadline:
                    report.busy = True
                    return
                active = [item for item in active if self._one_batch(*item, report)]

    def _flush(self, topics) -> None:
        """Each topic's ``flush`` hook, higher priorities first; a failing one is logged and
        the rest still run (what it held stays in prepare and is reaped, never lost)."""
        for topic, _ in sorted(topics, key=lambda item: -item[0].priority):
            if topic.flush is None:
                continue
            try:
                topic.flush()
            except Exception as exc:
                log.exception("flush of %s failed", topic.name)
                if self.on_error:
                    self.on_error(exc)

    def _due_slots(self, topic: Topic, now_ms: int) -> list[int]:
        """Owned slots with something due, in the shared round-robin order (docs/engine.md);
        one pipeline."""
        owned = self.leases.owned(topic.name)
        heads = queue.heads(topic.name, owned, client=self.client)
        due = [slot for slot in owned if (head := heads[slot]) is not None and head <= now_ms]
        order = leases.poll_order(topic.name, due, client=self.client) if due else []
        if len(order) > 1 and self._budget_cut.get(topic.name):
            # A budget (a rate limit) lets only the first slots claim each tick: a random start
            # keeps the shared counter's alternation from lining up with when tokens come back,
            # which could hand every token to the same slot (one tenant starving another).
            start = random.randrange(len(order))
            order = [*order[start:], *order[:start]]
        return order

    def _one_batch(self, topic: Topic, ts: TopicSettings, slot: int, report: TickReport) -> bool:
        """Claim and handle one batch; True when it was full (more may be due)."""
        if not self.may_claim(topic):  # backpressure, re-checked between batches
            return False
        token = self.leases.token(topic.name, slot)
        if token is None:
            return False
        asked = limit = ts.batch_size
        if self.budget is not None:
            granted = self.budget.take(topic, limit)
            self._budget_cut[topic.name] = granted < limit
            limit = min(limit, granted)
            if limit <= 0:
                self._note_held_back(topic, ts, slot, asked)
                return False
        if topic.parcels:
            full = self._one_parcel(topic, ts, slot, token, limit, report)
        else:
            full = self._one_claim(topic, ts, slot, token, limit, report)
        if full and limit < asked:
            self._note_held_back(topic, ts, slot, asked - limit)
        return full

    def _note_held_back(self, topic: Topic, ts: TopicSettings, slot: int, refused: int) -> None:
        """Tell the budget how many due entries a cut left in the slot (only after a cut, so an
        unthrottled claim costs nothing more)."""
        if self.budget is None:
            return
        refused = min(refused, self.budget.rate_cut(topic))
        if refused <= 0:  # cut for want of executor room only: nothing to count, no round trip
            return
        due = queue.due_count(
            topic.name, slot, now_ms=self.clock() + ts.lookahead_ms, client=self.client
        )
        if due:
            self.budget.held_back(topic, min(due, refused))

    def _one_claim(
        self, topic: Topic, ts: TopicSettings, slot: int, token: str, limit: int, report: TickReport
    ) -> bool:
        """Claim one batch of entries and settle them; True when it was full."""
        entries: list[Claimed] = []
        try:
            entries = queue.claim(
                topic.name,
                slot,
                **self._claim_window(ts, token, limit),
                with_due=topic.needs_due,
                isolate_suspects=topic.isolate_suspects,
            )
            if entries:
                report.claimed += len(entries)
                self._settle(topic, ts, slot, token, entries, report)
        except LeaseLost:
            log.warning("lease lost on %s:%s; dropping the batch in hand", topic.name, slot)
            self.leases.drop(topic.name, slot)
            report.lease_lost += 1
            return False
        finally:
            if self.budget is not None and len(entries) < limit:
                self.budget.give_back(topic, limit - len(entries))
        # A suspect comes alone (see Topic.isolate_suspects); more may be due behind it.
        return len(entries) >= limit or (len(entries) == 1 and entries[0].suspect)

    def _claim_window(self, ts: TopicSettings, token: str, limit: int) -> dict:
        """What a claim of either kind is given: up to when, how many, for how long, under which
        lease."""
        return {
            "now_ms": self.clock() + ts.lookahead_ms,
            "limit": limit,
            "visibility_ms": ts.visibility_ms,
            "lease_token": token,
            "client": self.client,
        }

    def _one_parcel(
        self, topic: Topic, ts: TopicSettings, slot: int, token: str, limit: int, report: TickReport
    ) -> bool:
        """Claim one batch as a parcel and hand it on; True when it was full."""
        count = 0
        try:
            parcel = queue.claim_parcel(topic.name, slot, **self._claim_window(ts, token, limit))
            if parcel is not None:
                count = parcel.size
                report.claimed += count
                self._hand_parcel(topic, ts, parcel, report)
        except LeaseLost:
            log.warning("lease lost on %s:%s; nothing claimed", topic.name, slot)
            self.leases.drop(topic.name, slot)
            report.lease_lost += 1
            return False
        finally:
            if self.budget is not None and count < limit:
                self.budget.give_back(topic, limit - count)
        return count >= limit

    def _hand_parcel(
        self, topic: Topic, ts: TopicSettings, parcel: Parcel, report: TickReport
    ) -> None:
        """The handler must take the parcel whole; if it cannot, every job of it is retried
        (a parcel is never left for the reaper when its handler answered)."""
        try:
            result = topic.handler(parcel, parcel.slot)
            if result is HANDED_ON:
                return
            error = f"a parcel's handler answered {result!r}, not HANDED_ON"
        except Exception as exc:  # a handler bug must not kill the worker: retry the parcel
            log.exception("handler for %s failed on a parcel of %d", topic.name, parcel.size)
            error = f"{type(exc).__name__}: {exc}"[:500]
        settled = queue.settle_parcels(
            topic.name,
            [(parcel.slot, parcel.parcel_id, [(job_id, error) for job_id in parcel.job_ids()])],
            now_ms=self.clock(),
            max_attempts=ts.max_attempts,
            backoff_base_ms=ts.backoff_base_ms,
            backoff_cap_ms=ts.backoff_cap_ms,
            client=self.client,
        )
        report.retried += settled.retried
        report.dead += settled.dead

    def _settle(self, topic, ts, slot, token, entries: list[Claimed], report: TickReport) -> None:
        results = self._handle(topic, entries, slot)
        if results is HANDED_ON:  # the whole batch, as a burst's is: nothing to settle here
            return
        if isinstance(results, Result):
            results = [results] * len(entries)
        done, retry, bury = [], [], []
        for entry, result in zip(entries, results, strict=True):
            outcome = result.outcome
            if outcome is Outcome.HANDED_ON:  # the common case of a burst: nothing to settle
                continue
            if outcome in _DONE:
                done.append(entry.job_id)
                report.dropped += outcome is Outcome.DROP
            elif outcome is Outcome.RETRY:
                retry.append((entry.job_id, result.error))
            elif outcome is Outcome.DEAD:
                bury.append((entry.job_id, result.error))
        kw = {"lease_token": token, "client": self.client}
        report.acked += queue.ack(topic.name, slot, done, **kw)
        now = self.clock()
        if retry:
            nacked = queue.nack(
                topic.name,
                slot,
                retry,
                now_ms=now,
                max_attempts=ts.max_attempts,
                backoff_base_ms=ts.backoff_base_ms,
                backoff_cap_ms=ts.backoff_cap_ms,
                **kw,
            )
            report.retried += nacked.retried
            report.dead += nacked.dead
        if bury:
            report.dead += queue.bury(topic.name, slot, bury, now_ms=now, **kw).dead

    def _handle(self, topic: Topic, entries: list[Claimed], slot: int) -> list[Result] | Result:
        try:
            results = topic.handler(entries, slot) if topic.pass_slot else topic.handler(entries)
            if isinstance(results, Result):
                return results
            if isinstance(results, Mapping):
                return [results.get(e.job_id, OK) for e in entries]
            results = list(results)
            if len(results) != len(entries):
                raise ValueError(f"handler returned {len(results)} results for {len(entries)}")
            return results
        except Exception as exc:  # a handler bug must not kill the worker: retry the batch
            log.exception("handler for %s failed on %d entries", topic.name, len(entries))
            return [Retry(f"{type(exc).__name__}: {exc}"[:500])] * len(entries)

    def _next_due(self, topics) -> int | None:
        """When the next claim is due: the earliest head, less its topic's look-ahead."""
        heads = [
            (
                queue.earliest_due(t.name, self.leases.owned(t.name), client=self.client),
                ts.lookahead_ms,
            )
            for t, ts in topics
        ]
        dues = [due - ahead for due, ahead in heads if due is not None]
        return min(dues) if dues else None

    # --- the loop ---------------------------------------------------------------------------------

    def run_until_idle(self, max_ticks: int = 1000) -> TickReport:
        """``--once``: tick until nothing due is left in our slots (or ``max_ticks``)."""
        total = TickReport()
        for _ in range(max_ticks):
            report = self.run_once()
            for name in ("claimed", "acked", "dropped", "retried", "dead", "lease_lost", "reaped"):
                setattr(total, name, getattr(total, name) + getattr(report, name))
            total.owned = report.owned
            if not report.busy and (
                report.next_due_ms is None or report.next_due_ms > self.clock()
            ):
                break
        return total

    def _stalled(self) -> bool:
        return (time.monotonic() - self._tick_started) * 1000 > self.stall_ms

    def run_forever(self) -> None:
        """Tick until ``stop()``; the process wires its signals to it (SIGTERM and SIGINT in
        the reminder worker)."""
        log.info("worker %s starting", self.worker_id)
        next_tick = time.monotonic()
        renewer = threading.Thread(
            target=self.maintenance.renew_leases,
            args=(self._stop, self._stalled),
            name="lease-renewer",
            daemon=True,
        )
        renewer.start()
        try:
            while not self._stop.is_set():
                try:
                    report = self.run_once()
                    # Inside the try: the sleep reads the config too, and a database outage
                    # there must not end the loop.
                    next_tick = self._sleep(report, next_tick)
                except Exception as exc:
                    log.exception("tick failed")
                    if self.on_error:
                        self.on_error(exc)
                    self._stop.wait(ERROR_SLEEP_S)
                    continue
        finally:
            self.shutdown()

    def _sleep(self, report: TickReport, next_tick: float) -> float:
        """Drift-corrected: ticks stay on a fixed grid; wake sooner for work due before then."""
        cfg = self.config()
        now = time.monotonic()
        next_tick = max(next_tick + cfg.tick_ms / 1000, now)  # behind: skip, don't burst
        wake = min(next_tick, now + cfg.lease_ms / 3000)  # renew leases well before they expire
        if report.busy:
            wake = now
        elif report.next_due_ms is not None:
            wake = min(wake, now + max(0.0, (report.next_due_ms - self.clock()) / 1000))
        self._wake.wait(max(wake - now, self.min_sleep_s))
        self._wake.clear()
        return next_tick

    def stop(self, *_: object) -> None:
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """End the current sleep early (an executor that was full has room again): called from
        other threads."""
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def shutdown(self) -> None:
        """Hand our slots over at once instead of after the lease time."""
        for hook in self.on_shutdown:
            try:
                hook()
            except Exception:
                log.exception("shutdown hook %r failed", hook)
        try:
            self.leases.release_all()
            self.maintenance.release()
            leases.deregister(self.worker_id, client=self.client)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Redis went first (an embedded one stops with everything else): nothing to hand
            # over in it, and nothing to say at length.
            log.warning(
                "worker %s: Redis is gone (%s); its leases lapse on their own",
                self.worker_id,
                exc.__class__.__name__,
            )
        except Exception:
            log.exception("worker %s: clean shutdown failed; leases will expire", self.worker_id)
        log.info("worker %s stopped", self.worker_id)
