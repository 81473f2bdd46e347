"""Workers, heartbeats, slot leases with fencing tokens, slot assignment and singleton leases.

- A worker heartbeats into ``{workers}:beats`` (ZSET id -> ms) and ``{workers}:info`` (HASH id ->
  JSON). Live workers are those whose heartbeat is younger than the lease time.
- Slots of a topic are spread over the sorted live worker ids: slot s belongs to worker
  ``(s + crc32(topic)) % n`` (the shift keeps every topic's slot 0 off the same worker).
- A worker holds a lease per owned slot: ``SET <slot>:lease <token> NX PX ttl`` in Lua, where the
  token is ``<INCR <slot>:fence>:<worker id>``. Every tick the worker re-runs the acquire script for
  all slots it wants: it renews the leases it holds (compare-and-pexpire) and takes free ones.
  A worker that dies stops heartbeating and renewing, so within the lease time it drops out of
  the live list and its leases expire; the new owners acquire at their next tick.
- The token is checked inside the claim, ack and nack scripts, so a worker that lost its lease
  (paused, partitioned, slow) cannot move entries, even if it still believes it owns the slot.
- Clocks: heartbeats use the workers' wall clocks, so hosts must agree to well under a lease time.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from . import connection, keys, scripts
from .connection import Client
from .keys import slot_keys

DEFAULT_LEASE_MS = 5000


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


# --- worker registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    heartbeat_ms: int
    host: str = ""
    pid: int = 0
    version: str = ""
    started_ms: int = 0
    config_version: int = 0
    owned: dict[str, list[int]] = field(default_factory=dict)
    # Per topic handed on to an executor of this worker: [in flight, capacity, threads].
    load: dict[str, list[int]] = field(default_factory=dict)
    round_ms: int = 0  # when the dispatch loop last completed a round (0: none yet)


def heartbeat(worker: WorkerInfo, *, client: Client | None = None) -> None:
    info = {k: v for k, v in vars(worker).items() if k not in ("worker_id", "heartbeat_ms")}
    pipe = scripts.pipeline(connection.client(client))
    pipe.hset(keys.workers_info(), worker.worker_id, json.dumps(info))
    pipe.zadd(keys.workers_beats(), {worker.worker_id: worker.heartbeat_ms})
    pipe.execute()


def beat_alive(worker_id: str, *, now_ms: int, client: Client | None = None) -> None:
    """The process is alive, whatever its dispatch loop does (``keys.workers_alive``)."""
    connection.client(client).zadd(keys.workers_alive(), {worker_id: now_ms})


def stalled_workers(
    *, now_ms: int, lease_ms: int, stall_ms: int, client: Client | None = None
) -> list[str]:
    """Workers whose process is alive (within the lease time) but whose dispatch loop has not
    completed a round for ``stall_ms``: what a liveness probe must call dead."""
    client = connection.client(client)
    alive = client.zrangebyscore(keys.workers_alive(), now_ms - lease_ms, "+inf")
    if not alive:
        return []
    infos = client.hmget(keys.workers_info(), alive)
    stalled = []
    for raw_id, raw in zip(alive, infos, strict=True):
        info = json.loads(raw or "{}")
        last = info.get("round_ms") or info.get("started_ms") or 0
        if now_ms - last > stall_ms:
            stalled.append(scripts.as_str(raw_id))
    return sorted(stalled)


def live_workers(*, now_ms: int, lease_ms: int, client: Client | None = None) -> list[str]:
    """Ids of workers that heartbeated within the lease time, sorted."""
    ids = connection.client(client).zrangebyscore(keys.workers_beats(), now_ms - lease_ms, "+inf")
    return sorted(scripts.as_str(i) for i in ids)


def list_workers(*, client: Client | None = None) -> list[WorkerInfo]:
    """Every registered worker with its last heartbeat (live or not yet pruned), for the console."""
    client = connection.client(client)
    beats = dict(client.zrange(keys.workers_beats(), 0, -1, withscores=True))
    infos = client.hgetall(keys.workers_info())
    out = []
    for raw_id, beat in beats.items():
        info = json.loads(infos.get(raw_id) or "{}")
        out.append(WorkerInfo(worker_id=scripts.as_str(raw_id), heartbeat_ms=int(beat), **info))
    return sorted(out, key=lambda w: w.worker_id)


def deregister(worker_id: str, *, client: Client | None = None) -> None:
    pipe = scripts.pipeline(connection.client(client))
    pipe.zrem(keys.workers_beats(), worker_id)
    pipe.zrem(keys.workers_alive(), worker_id)
    pipe.hdel(keys.workers_info(), worker_id)
    pipe.execute()


def prune_workers(*, now_ms: int, older_than_ms: int, client: Client | None = None) -> int:
    client = connection.client(client)
    client.zremrangebyscore(keys.workers_alive(), "-inf", now_ms - older_than_ms)
    return scripts.workers_prune(
        client,
        keys.workers_beats(),
        keys.workers_info(),
        cutoff_ms=now_ms - older_than_ms,
        limit=1000,
    )


# --- slot assignment ------------------------------------------------------------------------------


def assign_slots(worker_id: str, live: Sequence[str], topic: str, slot_count: int) -> list[int]:
    """The slots of ``topic`` that ``worker_id`` should own among the ``live`` workers."""
    ids = sorted(live)
    if worker_id not in ids:
        return []
    n, me, shift = len(ids), ids.index(worker_id), zlib.crc32(topic.encode())
    return [slot for slot in range(slot_count) if (slot + shift) % n == me]


def poll_order(topic: str, owned: Sequence[int], *, client: Client | None = None) -> list[int]:
    """Owned slots rotated to start where the workers' shared ``INCR`` counter points."""
    if len(owned) < 2:
        return list(owned)
    start = connection.client(client).incr(keys.round_robin(topic)) % len(owned)
    return [*owned[start:], *owned[:start]]


# --- slot leases ----------------------------------------------------------------------------------


@dataclass
class SyncReport:
    acquired: list[tuple[str, int]] = field(default_factory=list)
    lost: list[tuple[str, int]] = field(default_factory=list)
    released: list[tuple[str, int]] = field(default_factory=list)


class SlotLeases:
    """The slot leases one worker holds, keyed by (topic, slot), with their fencing tokens.

    Thread-safe: the dispatch loop syncs them while a renewer thread may extend them
    (``Dispatcher``: renewal does not wait for a long round)."""

    def __init__(
        self, worker_id: str, *, ttl_ms: int = DEFAULT_LEASE_MS, client: Client | None = None
    ):
        self.worker_id = worker_id
        self.ttl_ms = ttl_ms
        self.client = client
        self.held: dict[tuple[str, int], str] = {}
        self._lock = threading.RLock()

    def token(self, topic: str, slot: int) -> str | None:
        return self.held.get((topic, slot))

    def owned(self, topic: str) -> list[int]:
        with self._lock:
            return sorted(slot for (t, slot) in self.held if t == topic)

    def sync(self, wanted: Mapping[str, Iterable[int]]) -> SyncReport:
        """Hold the wanted slots we can get: release the rest, renew ours, take free ones."""
        with self._lock:
            return self._sync(wanted)

    def _sync(self, wanted: Mapping[str, Iterable[int]]) -> SyncReport:
        report = SyncReport()
        want = {(topic, slot) for topic, slots in wanted.items() for slot in slots}
        report.released = self._release([pair for pair in self.held if pair not in want])
        pairs = sorted(want)
        calls = [
            scripts.lease_acquire_call(
                slot_keys(*pair),
                holder=self.worker_id,
                ttl_ms=self.ttl_ms,
                current=self.held.get(pair),
            )
            for pair in pairs
        ]
        for pair, raw in zip(
            pairs, scripts.run_calls(connection.client(self.client), calls), strict=True
        ):
            token = scripts.parse_token(raw)
            if token is None:
                if self.held.pop(pair, None) is not None:
                    report.lost.append(pair)
            elif self.held.get(pair) != token:
                self.held[pair] = token
                report.acquired.append(pair)
        return report

    def renew(self) -> list[tuple[str, int]]:
        """Extend every held lease (mid-tick, during a long drain); returns the ones lost."""
        with self._lock:
            return self._renew()

    def _renew(self) -> list[tuple[str, int]]:
        pairs = list(self.held)
        calls = [
            scripts.lease_renew_call(
                slot_keys(*pair).lease, token=self.held[pair], ttl_ms=self.ttl_ms
            )
            for pair in pairs
        ]
        lost = [
            p
            for p, ok in zip(
                pairs, scripts.run_calls(connection.client(self.client), calls), strict=True
            )
            if not ok
        ]
        for pair in lost:
            del self.held[pair]
        return lost

    def drop(self, topic: str, slot: int) -> None:
        """Forget a lease a script reported lost (LeaseLost)."""
        with self._lock:
            self.held.pop((topic, slot), None)

    def release(self, pairs: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        with self._lock:
            return self._release(pairs)

    def _release(self, pairs: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        pairs = [pair for pair in pairs if pair in self.held]
        calls = [
            scripts.lease_release_call(slot_keys(*pair).lease, token=self.held.pop(pair))
            for pair in pairs
        ]
        if calls:
            scripts.run_calls(connection.client(self.client), calls)
        return pairs

    def release_all(self) -> None:
        self.release(list(self.held))


# --- singleton leases -----------------------------------------------------------------------------


def try_singleton(name: str, token: str, ttl_ms: int, *, client: Client | None = None) -> bool:
    """Take or keep the named lease (reaping, DB reconcile): True while we are the one doing it."""
    return scripts.singleton_hold(
        connection.client(client), keys.singleton(name), token=token, ttl_ms=ttl_ms
    )


def release_singleton(name: str, token: str, *, client: Client | None = None) -> bool:
    return scripts.lease_release(connection.client(client), keys.singleton(name), token=token)
