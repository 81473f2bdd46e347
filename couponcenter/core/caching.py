"""The one per-process TTL cache.

Hot paths read a few small, slowly changing things many times a second (a coupon's state in every
claimed batch, the live settings row every tick, a token's caller on every claim). Each process
keeps them for a short, stated time instead of asking the database again; a change shows within
that time. Entries are per process (nothing is shared, nothing to invalidate across hosts), the
size is bounded (the cache is emptied when full: the keys are few, a refill is cheap), and time is
``time.monotonic()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """A dict whose entries are trusted for ``ttl_s`` seconds (``ttl_s`` may be a callable read at
    each lookup, so a setting changed by a test or an operator applies at once)."""

    def __init__(self, ttl_s: float | Callable[[], float], *, max_entries: int = 10_000) -> None:
        self._ttl = ttl_s
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._entries: dict[K, tuple[float, V]] = {}

    @property
    def ttl_s(self) -> float:
        return self._ttl() if callable(self._ttl) else self._ttl

    def get(self, key: K, load: Callable[[], V]) -> V:
        """The cached value of ``key``, or ``load()``'s (then cached)."""
        hit = self._entries.get(key)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        value = load()
        self.put(key, value, now=now)
        return value

    def get_many(self, keys: Iterable[K], load: Callable[[set[K]], Mapping[K, V]]) -> dict[K, V]:
        """The cached values of ``keys``; the missing or stale ones come from one ``load(missing)``
        call. A key ``load`` does not answer is left out (and not cached)."""
        now = time.monotonic()
        found: dict[K, V] = {}
        missing: set[K] = set()
        for key in keys:
            hit = self._entries.get(key)
            if hit is not None and hit[0] > now:
                found[key] = hit[1]
            else:
                missing.add(key)
        if missing:
            loaded = load(missing)
            for key, value in loaded.items():
                self.put(key, value, now=now)
                found[key] = value
        return found

    def put(self, key: K, value: V, *, now: float | None = None) -> None:
        expires = (time.monotonic() if now is None else now) + self.ttl_s
        with self._lock:
            if len(self._entries) >= self.max_entries and key not in self._entries:
                self._entries.clear()
            self._entries[key] = (expires, value)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
