"""The urgency signal: is an urgent path behind its target, which, by how much, since when
(docs/operations.md, Resource-aware dispatch).

Invariants:
- the urgent paths are the work with a deadline: reminders (dispatch and delivery), timeouts due
  now, claims. Each app measures its own and registers a probe from its ``AppConfig.ready()``
  (this module knows no app): a function of the time now returning ``Reading``s, a path's value
  and its target in ms. A path is behind while its value is past its target;
- a process asks the probes at most once per ``URGENCY_CACHE_MS`` (``UrgencySignal``): every
  background loop may ask before each batch;
- when a path fell behind is kept in Redis (one hash, a field per path, set by the first reading
  that finds it behind, removed by the first that finds it on target), so every process and the
  console agree on "since";
- a probe that cannot be read (Redis down) says nothing: background work is never held back by a
  signal nobody can read, and the failure is logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis
from django.conf import settings

from couponcenter.core.redis import get_redis

logger = logging.getLogger(__name__)

Clock = Callable[[], int]  # epoch ms


def epoch_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Reading:
    """One urgent path's value now (ms: how late its oldest waiting job is, or its p99) and the
    target it is held to."""

    path: str
    value_ms: int
    target_ms: int

    @property
    def behind(self) -> bool:
        return self.value_ms > self.target_ms


@dataclass(frozen=True)
class Behind:
    path: str
    value_ms: int
    target_ms: int
    since_ms: int


@dataclass(frozen=True)
class Urgency:
    at_ms: int
    readings: tuple[Reading, ...] = ()
    behind: tuple[Behind, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.behind)

    @property
    def worst(self) -> Behind | None:
        """The path furthest past its target (relative to it)."""
        return max(self.behind, key=lambda b: b.value_ms / b.target_ms, default=None)


Probe = Callable[[int], Iterable[Reading]]
_probes: dict[str, Probe] = {}


def register_urgent_path(name: str, probe: Probe) -> None:
    """Called by an app's ``ready()``; idempotent (a name registered again is replaced)."""
    _probes[name] = probe


def since_key() -> str:
    """Redis hash: path -> epoch ms it fell behind (only paths behind now have a field)."""
    return f"{settings.REDIS_KEY_PREFIX}:urgency:since"


class UrgencySignal:
    """The probes' answer, read at most once per ``cache_ms`` (default ``URGENCY_CACHE_MS``).
    ``clock``: epoch ms (the tests move it on)."""

    def __init__(self, *, clock: Clock = epoch_ms, cache_ms: int | None = None) -> None:
        self.clock = clock
        self._cache_ms = cache_ms
        self._lock = threading.Lock()
        self._last: Urgency | None = None

    @property
    def cache_ms(self) -> int:
        return settings.URGENCY_CACHE_MS if self._cache_ms is None else self._cache_ms

    def read(self) -> Urgency:
        now = self.clock()
        with self._lock:
            last = self._last
            if last is not None and 0 <= now - last.at_ms < self.cache_ms:
                return last
            self._last = last = self._read(now)
            return last

    def clear(self) -> None:
        with self._lock:
            self._last = None

    def _read(self, now: int) -> Urgency:
        readings: list[Reading] = []
        for name, probe in list(_probes.items()):
            try:
                readings.extend(probe(now))
            except Exception:  # noqa: BLE001 - an unreadable path holds nothing back
                logger.warning("urgency: the probe %s could not be read", name, exc_info=True)
        worst: dict[str, Reading] = {}  # several probes may report one path: the worst counts
        for r in readings:
            if r.path not in worst or r.value_ms - r.target_ms > worst[r.path].value_ms - (
                worst[r.path].target_ms
            ):
                worst[r.path] = r
        try:
            since = _since_update(now, worst.values())
        except redis.RedisError:
            logger.warning("urgency: Redis unreachable, nothing held back", exc_info=True)
            return Urgency(now, tuple(worst.values()))
        behind = tuple(
            Behind(r.path, r.value_ms, r.target_ms, since[r.path])
            for r in worst.values()
            if r.behind
        )
        return Urgency(now, tuple(worst.values()), behind)


def _since_update(now: int, readings: Iterable[Reading]) -> dict[str, int]:
    """Note in Redis when each path behind fell behind (kept if known), forget the others; the
    moments of the paths behind (one round trip)."""
    readings = list(readings)
    pipe = get_redis().pipeline(transaction=False)
    for r in readings:
        if r.behind:
            pipe.hsetnx(since_key(), r.path, now)
        else:
            pipe.hdel(since_key(), r.path)
    pipe.hgetall(since_key())
    raw = pipe.execute()[-1]
    since = {_text(k): int(v) for k, v in raw.items()}
    return {r.path: since.get(r.path, now) for r in readings if r.behind}


def urgency_since() -> dict[str, int]:
    """The paths behind as last seen by any process, with when they fell behind ({}: Redis
    down)."""
    try:
        raw = get_redis().hgetall(since_key())
    except redis.RedisError:
        return {}
    return {_text(k): int(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# The process's signal: every background loop of the process shares its reading.
signal = UrgencySignal()


def urgency_now() -> Urgency:
    return signal.read()
