"""The slot layouts (slot counts) of a topic that still hold entries.

Slot counts are powers of two, so a smaller layout's slots are a prefix of a larger one's: workers
serve ``served_slot_count()`` slots, which covers every old layout until it is drained.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import connection, keys
from ..connection import Client
from .backlog import stats


def record_layout(topic: str, slots: int, *, client: Client | None = None) -> None:
    """Note that ``topic`` uses ``slots`` slots (call whenever the configured count is seen)."""
    connection.client(client).sadd(keys.layouts(topic), slots)


def record_layout_covering(
    topic: str, slots: Iterable[int], *, client: Client | None = None
) -> None:
    """Record the smallest layout that serves every one of ``slots`` (after a flush the layout
    set is gone too, and an older, larger slot count may still be what these entries use)."""
    record_layout(topic, 1 << max(slots).bit_length(), client=client)


def slot_layouts(topic: str, *, client: Client | None = None) -> list[int]:
    return sorted(int(n) for n in connection.client(client).smembers(keys.layouts(topic)))


def served_slot_count(topic: str, current: int, *, client: Client | None = None) -> int:
    """How many slots workers must serve: the current layout, or a larger one not yet drained."""
    return max([current, *slot_layouts(topic, client=client)])


def prune_layouts(topic: str, current: int, *, client: Client | None = None) -> list[int]:
    """Forget layouts other than ``current`` whose extra slots are all empty; returns those gone."""
    client = connection.client(client)
    gone = []
    for n in slot_layouts(topic, client=client):
        if n == current:
            continue
        extra = range(current, n)  # empty when n < current: those slots are part of ours
        if all(
            s.store == s.prepare == s.dead == 0
            for s in stats(topic, extra, now_ms=0, client=client)
        ):
            client.srem(keys.layouts(topic), n)
            gone.append(n)
    return gone
