"""Reading a topic's backlog: counts, heads, due times and where a job is. Reads only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .. import connection, scripts
from ..connection import Client
from ..keys import slot_keys

PARCEL_COUNTERS = 2  # the parcels hash's "#seq" and "#n"


@dataclass(frozen=True, slots=True)
class SlotStats:
    topic: str
    slot: int
    store: int  # scheduled, not yet claimed
    due: int  # of those, due now
    oldest_overdue_ms: int  # how late the most overdue one is (0: none overdue)
    prepare: int  # claimed, in flight
    dead: int


def stats(
    topic: str, slots: Iterable[int], *, now_ms: int, client: Client | None = None
) -> list[SlotStats]:
    """Backlog figures for each slot, in one pipeline. ``store`` counts every scheduled job, in
    ``store`` or ``later``; ``prepare`` the jobs in flight, those in parcels included (a
    parcel's prepare entry stands for its ``#n`` share)."""
    slots = list(slots)
    pipe = scripts.pipeline(connection.client(client))
    for slot in slots:
        k = slot_keys(topic, slot)
        for key in (k.store, k.later):
            pipe.zcard(key)
            pipe.zcount(key, "-inf", now_ms)
            pipe.zrange(key, 0, 0, withscores=True)
        pipe.zcard(k.prepare)
        pipe.zcard(k.dead)
        pipe.hlen(k.parcels)
        pipe.hget(k.parcels, "#n")
    raw = pipe.execute()
    out = []
    for i, slot in enumerate(slots):
        near, near_due, near_head, far, far_due, far_head, prepare, dead, fields, in_parcels = raw[
            10 * i : 10 * i + 10
        ]
        store, due = near + far, near_due + far_due
        heads = [int(rows[0][1]) for rows in (near_head, far_head) if rows]
        overdue = max(0, now_ms - min(heads)) if heads else 0
        if fields:  # "#seq" and "#n" beside one field per parcel
            prepare += int(in_parcels or 0) - (fields - PARCEL_COUNTERS)
        out.append(SlotStats(topic, slot, store, due, overdue, prepare, dead))
    return out


def heads(
    topic: str, slots: Iterable[int], *, client: Client | None = None
) -> dict[int, int | None]:
    """Per slot, the earliest due time (ms) in its store, or None when empty (one pipeline):
    what a claim would take first. ``later`` is not read: what falls due there is promoted into
    store first (a backlog past one promotion's limit over the next ticks)."""
    slots = list(slots)
    if not slots:
        return {}
    pipe = scripts.pipeline(connection.client(client))
    for slot in slots:
        pipe.zrange(slot_keys(topic, slot).store, 0, 0, withscores=True)
    return {
        slot: int(rows[0][1]) if rows else None
        for slot, rows in zip(slots, pipe.execute(), strict=True)
    }


def earliest_due(topic: str, slots: Iterable[int], *, client: Client | None = None) -> int | None:
    """The smallest due time (ms) scheduled in ``slots`` (store or later), or None when none is."""
    pipe = scripts.pipeline(connection.client(client))
    for slot in slots:
        k = slot_keys(topic, slot)
        pipe.zrange(k.store, 0, 0, withscores=True)
        pipe.zrange(k.later, 0, 0, withscores=True)
    firsts = [int(rows[0][1]) for rows in pipe.execute() if rows]
    return min(firsts) if firsts else None


def due_before(
    topic: str, slot: int, *, before_ms: int, limit: int, client: Client | None = None
) -> list[str]:
    """Up to ``limit`` scheduled job ids of a slot due before ``before_ms``, earliest first."""
    k = slot_keys(topic, slot)
    pipe = connection.client(client).pipeline(transaction=False)
    for key in (k.store, k.later):
        pipe.zrangebyscore(key, "-inf", f"({before_ms}", start=0, num=limit, withscores=True)
    rows = sorted(
        (score, scripts.as_str(member)) for tier in pipe.execute() for member, score in tier
    )
    return [member for _, member in rows[:limit]]


def due_count(topic: str, slot: int, *, now_ms: int, client: Client | None = None) -> int:
    """How many scheduled entries of one slot are due by ``now_ms`` (two ZCOUNTs)."""
    k = slot_keys(topic, slot)
    pipe = connection.client(client).pipeline(transaction=False)
    for key in (k.store, k.later):
        pipe.zcount(key, "-inf", now_ms)
    return sum(pipe.execute())


def due_between(
    topic: str,
    slots: range | list[int],
    start_ms: int,
    bounds_ms: list[int],
    *,
    client: Client | None = None,
) -> list[int]:
    """How many scheduled entries fall due in each window [previous bound, bound) from
    ``start_ms`` on, over ``slots``: one pipeline of ZCOUNTs."""
    pipe = connection.client(client).pipeline(transaction=False)
    edges = [start_ms, *bounds_ms]
    for slot in slots:
        k = slot_keys(topic, slot)
        for key in (k.store, k.later):
            for low, high in zip(edges, edges[1:], strict=False):
                pipe.zcount(key, low, f"({high}")
    counts = pipe.execute()
    windows = len(bounds_ms)
    return [sum(counts[i::windows]) for i in range(windows)]


@dataclass(frozen=True)
class Place:
    """Where one job is in its slot now: ``where`` is ``scheduled`` (store or later; ``at_ms`` its
    due time), ``in flight`` (prepare; ``at_ms`` when its visibility runs out), ``dead`` (``at_ms``
    when it died) or ``absent`` (fired and acknowledged, cancelled, or not indexed yet)."""

    where: str
    at_ms: int | None


def place(topic: str, slot: int, job_id: str, *, client: Client | None = None) -> Place:
    k = slot_keys(topic, slot)
    pipe = connection.client(client).pipeline(transaction=False)
    pipe.zscore(k.store, job_id)
    pipe.zscore(k.later, job_id)
    pipe.zscore(k.prepare, job_id)
    pipe.zscore(k.dead, job_id)
    places = ("scheduled", "scheduled", "in flight", "dead")
    for where, score in zip(places, pipe.execute(), strict=True):
        if score is not None:
            return Place(where, int(score))
    return Place("absent", None)


def in_parcels(
    topic: str, slots: Iterable[int], *, client: Client | None = None
) -> dict[int, set[str]]:
    """Per slot, the ids in flight in its parcels now (one pipeline; slots with none left out).
    For a rebuild, whose NX cannot see into a parcel."""
    slots = list(slots)
    pipe = scripts.pipeline(connection.client(client))
    for slot in slots:
        pipe.hgetall(slot_keys(topic, slot).parcels)
    out = {}
    for slot, fields in zip(slots, pipe.execute(), strict=True):
        ids = {
            job_id
            for name, packed in fields.items()
            if not scripts.as_str(name).startswith("#")
            for job_id in scripts.as_str(packed).split(",")
        }
        if ids:
            out[slot] = ids
    return out
