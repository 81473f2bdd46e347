"""A dispatcher's upkeep: what keeps its slots served, apart from claiming them.

At most every ``every_ms`` (and at once when a topic is added or resized), one pass:

- heartbeat: this worker's ``WorkerInfo``, so the others count it in the slot assignment;
- slot leases: work out which slots of each topic this worker should own among the live workers,
  then acquire, renew or give up leases to match;
- promotion: in the owned slots, move what falls due in the next minutes from ``later`` into
  ``store``, where the claims look;
- reaping, by exactly one worker (the ``reaper`` singleton lease): expired in-flight entries go
  back to store or to the dead queue; every ``PRUNE_EVERY_MS`` it also forgets drained slot
  layouts and long-dead workers;
- housekeeping, by exactly one worker (the ``housekeeping`` singleton lease): the process's own
  chores (the reminder worker's database reconcile).

Apart from the passes, a renewer thread (``renew_leases``) keeps the slot leases and an "alive"
beat going while a round runs long, so a slow round does not lose its slots, and a stuck one is
reported stalled.

Between passes only a slot whose last promotion was full is promoted again, every tick, so a
backlog that fell due while no worker ran is caught up a bounded script call at a time. The
interval keeps a busy loop's round trips on claims; it must stay well under the lease time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence

from . import leases, queue
from .connection import Client
from .topic_model import EngineSettings, Topic, TopicSettings

log = logging.getLogger("reminders.engine")

REAP_LIMIT = 1000  # expired in-flight jobs moved back per slot per pass (a parcel whole)
PRUNE_EVERY_MS = 10_000  # how often the reaper forgets drained layouts and long-dead workers

Served = Sequence[tuple[Topic, TopicSettings]]


class Maintenance:
    """``clock``: epoch ms, read on every use (the dispatcher passes one that follows its own).
    ``housekeeping``: the chores run under the ``housekeeping`` lease; a failing one is logged
    and handed to ``on_error``. ``load``: per topic [in flight, capacity] of this process's
    executors, heartbeated."""

    def __init__(
        self,
        slot_leases: leases.SlotLeases,
        *,
        client: Client | None,
        clock: Callable[[], int],
        every_ms: int = 0,
        version: str = "",
        housekeeping: Sequence[Callable[[], object]] = (),
        load: Callable[[], dict[str, list[int]]] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ):
        self.leases = slot_leases
        self.worker_id = slot_leases.worker_id
        self.client = client
        self.clock = clock
        self.every_ms = every_ms
        self.version = version
        self.housekeeping = list(housekeeping)
        self.load = load
        self.on_error = on_error
        self.started_ms = clock()
        self.round_ms = 0  # the end of the dispatcher's last completed round, heartbeated
        self.promote_limit = queue.PROMOTE_LIMIT  # jobs moved per slot and promotion
        self._last_ms: int | None = None
        self._last_shape: tuple = ()
        self._layouts_seen: dict[str, int] = {}
        self._last_prune_ms = 0
        # Slots whose last promotion moved a full ``promote_limit`` (more may be waiting, e.g.
        # what fell due in later while no worker ran): promoted again every tick until not.
        self._behind: dict[str, set[int]] = {}

    @property
    def behind(self) -> bool:
        """Some slot has more to promote: the loop should tick again at once."""
        return any(self._behind.values())

    def tick(self, cfg: EngineSettings, topics: Served) -> int:
        """The pass when it is due, else the promotions that are behind; returns how many
        entries the reaper moved."""
        now = self.clock()
        shape = tuple((topic.name, ts.slots) for topic, ts in topics)
        if (
            self._last_ms is None
            or shape != self._last_shape
            or now - self._last_ms >= self.every_ms
        ):
            self._last_ms = now
            self._last_shape = shape  # a topic added or resized gets its slots at once
            return self._pass(cfg, topics)
        if self.behind:
            self._promote(topics, behind_only=True)
        return 0

    def renew_leases(self, stop: threading.Event, stalled: Callable[[], bool]) -> None:
        """The renewer thread, until ``stop``: the slot leases are extended every third of their
        time, however long the loop's current round takes, unless the loop is ``stalled`` (stuck
        in one tick: then they lapse and other workers take the slots over). It also says the
        process is alive, so that a stuck loop shows as stalled, not as gone."""
        while not stop.wait(max(self.leases.ttl_ms / 3000, 0.05)):
            try:
                leases.beat_alive(self.worker_id, now_ms=self.clock(), client=self.client)
            except Exception:  # Redis down: the loop's own errors say so
                log.debug("alive beat failed", exc_info=True)
            if stalled():
                continue
            try:
                for topic, slot in self.leases.renew():
                    log.warning("lease lost on %s:%s (renewer)", topic, slot)
            except Exception:  # Redis down: the loop's own errors say so
                log.debug("lease renewal failed", exc_info=True)

    def release(self) -> None:
        """Give up the singleton leases at shutdown, so another worker takes them at once."""
        leases.release_singleton("reaper", self.worker_id, client=self.client)
        leases.release_singleton("housekeeping", self.worker_id, client=self.client)

    def _pass(self, cfg: EngineSettings, topics: Served) -> int:
        served = {topic.name: self._served_slots(topic, ts) for topic, ts in topics}
        self._heartbeat(cfg, [topic for topic, _ in topics])
        live = leases.live_workers(now_ms=self.clock(), lease_ms=cfg.lease_ms, client=self.client)
        wanted = {
            name: leases.assign_slots(self.worker_id, live, name, n) for name, n in served.items()
        }
        for topic, slot in self.leases.sync(wanted).lost:
            log.warning("lease lost on %s:%s", topic, slot)
        self._promote(topics)
        reaped = self._reap(topics, served, cfg)
        self._housekeep(cfg)
        return reaped

    def _served_slots(self, topic: Topic, ts: TopicSettings) -> int:
        if self._layouts_seen.get(topic.name) != ts.slots:
            queue.record_layout(topic.name, ts.slots, client=self.client)
            self._layouts_seen[topic.name] = ts.slots
        return queue.served_slot_count(topic.name, ts.slots, client=self.client)

    def _heartbeat(self, cfg: EngineSettings, topics: list[Topic]) -> None:
        info = leases.WorkerInfo(
            worker_id=self.worker_id,
            heartbeat_ms=self.clock(),
            host=self.worker_id.split(":")[0],
            pid=os.getpid(),
            version=self.version,
            started_ms=self.started_ms,
            config_version=cfg.version,
            owned={t.name: self.leases.owned(t.name) for t in topics},
            load=self.load() if self.load is not None else {},
            round_ms=self.round_ms,
        )
        leases.heartbeat(info, client=self.client)

    def _promote(self, topics: Served, *, behind_only: bool = False) -> None:
        """In our slots, move what falls due within the next ``LATER_AFTER_MS`` (beyond each
        topic's look-ahead) from ``later`` into ``store``, at most ``promote_limit`` a slot.
        ``behind_only``: just the slots whose last promotion was full."""
        now, behind = self.clock(), {}
        for topic, ts in topics:
            slots: Iterable[int]
            if behind_only:
                slots = self._behind.get(topic.name, ())
            else:
                slots = self.leases.owned(topic.name)
            tokens = {
                slot: token
                for slot in slots
                if (token := self.leases.token(topic.name, slot)) is not None
            }
            until = now + ts.lookahead_ms + queue.LATER_AFTER_MS
            moved = queue.promote(
                topic.name, tokens, until_ms=until, limit=self.promote_limit, client=self.client
            )
            behind[topic.name] = {s for s, n in moved.items() if n >= self.promote_limit}
        self._behind = behind  # a topic gone since is forgotten

    def _reap(self, topics: Served, served: dict[str, int], cfg: EngineSettings) -> int:
        if not leases.try_singleton("reaper", self.worker_id, cfg.lease_ms, client=self.client):
            return 0
        now, reaped = self.clock(), 0
        for topic, ts in topics:
            result = queue.reap(
                topic.name,
                range(served[topic.name]),
                now_ms=now,
                limit=REAP_LIMIT,
                max_attempts=ts.max_attempts,
                client=self.client,
            )
            reaped += result.retried + result.dead
            if result.dead_ids and topic.on_dead is not None:
                try:
                    topic.on_dead(list(result.dead_ids))
                except Exception:  # the entries are in the dead queue either way
                    log.exception(
                        "on_dead of %s failed for %d jobs", topic.name, len(result.dead_ids)
                    )
        if now - self._last_prune_ms >= PRUNE_EVERY_MS:
            self._last_prune_ms = now
            for topic, ts in topics:
                queue.prune_layouts(topic.name, ts.slots, client=self.client)
            leases.prune_workers(now_ms=now, older_than_ms=10 * cfg.lease_ms, client=self.client)
        return reaped

    def _housekeep(self, cfg: EngineSettings) -> None:
        if not self.housekeeping or not leases.try_singleton(
            "housekeeping", self.worker_id, cfg.lease_ms, client=self.client
        ):
            return
        for job in self.housekeeping:
            try:
                job()
            except Exception as exc:  # one failing chore must not stop dispatch
                log.exception("housekeeping %r failed", job)
                if self.on_error:
                    self.on_error(exc)
