"""The queue API: schedule, cancel, claim, ack, nack, reap, inspect and steer dead jobs.

Every function takes the topic and the slot explicitly: the slot count of a topic can change at
runtime, so the caller stores each job's slot (``slot_for(basis, slots)`` at schedule time) and
uses it to cancel. Slot layouts (slot counts) still holding entries are kept in a per-topic set;
workers serve ``served_slot_count()`` slots, which covers every old layout until it is drained
(slot counts are powers of two, so a smaller layout's slots are a prefix of a larger one's).

Every function accepts ``client=`` (default: the connection installed in ``connection``),
standalone or cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from . import connection, keys, scripts
from .clock import epoch_ms
from .connection import Client
from .keys import slot_for, slot_keys
from .scripts import Claimed, NackResult, Parcel, ReapResult

SCHEDULE_CHUNK = 2000  # jobs per EVALSHA: big enough to amortise a round trip, small enough not to
PIPELINE_CALLS = 64  # stall Redis; calls per pipeline flush keep client memory bounded
# A job due later than this from now is scheduled in its slot's ``later`` set, and moved into
# ``store`` (where claims look) by the slot's owner once it falls due within this much, plus
# the topic's look-ahead (``promote``): a burst is claimed from a set of minutes, not of days.
LATER_AFTER_MS = 120_000
PROMOTE_LIMIT = 20_000  # jobs moved per slot and call


@dataclass(frozen=True, slots=True)
class SlotStats:
    topic: str
    slot: int
    store: int  # scheduled, not yet claimed
    due: int  # of those, due now
    oldest_overdue_ms: int  # how late the most overdue one is (0: none overdue)
    prepare: int  # claimed, in flight
    dead: int


@dataclass(frozen=True, slots=True)
class DeadEntry:
    job_id: str
    died_ms: int
    attempts: int
    last_error: str


# --- producing -----------------------------------------------------------------------------------


def schedule(
    topic: str,
    job_id: str,
    due_ms: int,
    *,
    slot: int,
    client: Client | None = None,
    now_ms: int | None = None,
) -> bool:
    """Schedule (or move) one job; True if it was not scheduled before."""
    later_after = (epoch_ms() if now_ms is None else now_ms) + LATER_AFTER_MS
    k = slot_keys(topic, slot)
    added = scripts.enqueue(
        connection.client(client), k, [(due_ms, job_id)], later_after_ms=later_after
    )
    return added == 1


def schedule_many(
    topic: str,
    items: Iterable[tuple[str, int, int]],
    *,
    nx: bool = False,
    client: Client | None = None,
    now_ms: int | None = None,
) -> int:
    """Bulk schedule (job_id, due_ms, slot) items: grouped per slot, chunked, pipelined. Jobs
    due more than ``LATER_AFTER_MS`` after ``now_ms`` (default: the clock) wait in ``later``.

    ``nx=True`` is the rebuild mode: jobs already scheduled, in flight or dead are left alone.
    Returns the number of jobs newly added.
    """
    later_after = (epoch_ms() if now_ms is None else now_ms) + LATER_AFTER_MS
    by_slot: dict[int, list] = {}
    for job_id, due_ms, slot in items:
        pairs = by_slot.get(slot)
        if pairs is None:
            pairs = by_slot[slot] = []
        pairs.append((due_ms, job_id))
    calls = []
    for slot, pairs in by_slot.items():
        k = slot_keys(topic, slot)
        for i in range(0, len(pairs), SCHEDULE_CHUNK):
            calls.append(
                scripts.enqueue_call(
                    k, pairs[i : i + SCHEDULE_CHUNK], nx=nx, later_after_ms=later_after
                )
            )
    added = 0
    for i in range(0, len(calls), PIPELINE_CALLS):
        added += sum(scripts.run_calls(connection.client(client), calls[i : i + PIPELINE_CALLS]))
    return added


def cancel(topic: str, job_id: str, *, slot: int, client: Client | None = None) -> str | None:
    """Remove a job wherever it is in its slot; returns "store", "prepare", "dead" or None."""
    return scripts.cancel(connection.client(client), slot_keys(topic, slot), job_id)


def cancel_many(
    topic: str, items: Iterable[tuple[str, int]], *, client: Client | None = None
) -> int:
    """Cancel (job_id, slot) pairs in pipelined batches; returns how many were found."""
    client = connection.client(client)
    calls = [scripts.cancel_call(slot_keys(topic, slot), job_id) for job_id, slot in items]
    found = 0
    for i in range(0, len(calls), PIPELINE_CALLS * 16):
        found += sum(1 for r in scripts.run_calls(client, calls[i : i + PIPELINE_CALLS * 16]) if r)
    return found


def cancel_anywhere(
    topic: str, job_id: str, *, slot_basis: object, client: Client | None = None
) -> str | None:
    """Cancel when the stored slot is unknown: try the job's slot under every live layout."""
    where = None
    for slot in sorted({slot_for(slot_basis, n) for n in slot_layouts(topic, client=client)}):
        where = cancel(topic, job_id, slot=slot, client=client) or where
    return where


# --- consuming (fenced: the caller must hold the slot's lease) -----------------------------------


def claim(
    topic: str,
    slot: int,
    *,
    now_ms: int,
    limit: int,
    visibility_ms: int,
    lease_token: str,
    with_due: bool = True,
    isolate_suspects: bool = False,
    client: Client | None = None,
) -> list[Claimed]:
    """Move up to ``limit`` due jobs to prepare, oldest first. Raises LeaseLost.

    ``with_due=False`` skips reading the due times (``due_ms`` is 0), which makes the claim
    markedly cheaper for handlers that re-read the job from the database anyway.
    ``isolate_suspects``: a job the reaper brought back (its handler never answered) is claimed
    alone, and a batch stops before one (see ``claim_due.lua``).
    """
    return scripts.claim_due(
        connection.client(client),
        slot_keys(topic, slot),
        token=lease_token,
        now_ms=now_ms,
        limit=limit,
        visibility_ms=visibility_ms,
        with_due=with_due,
        isolate_suspects=isolate_suspects,
    )


def claim_parcel(
    topic: str,
    slot: int,
    *,
    now_ms: int,
    limit: int,
    visibility_ms: int,
    lease_token: str,
    client: Client | None = None,
) -> Parcel | None:
    """Move up to ``limit`` due jobs, oldest first, into one in-flight parcel (None: nothing
    due). Raises LeaseLost. For handlers that hand whole batches on: one prepare entry per batch
    instead of one per job, and one string of ids instead of a reply element each; the parcel is
    settled whole (``settle_parcels``) or reaped whole. A job inside a parcel is not found by
    ``cancel`` or ``place``, so its owner must check its own record before acting on it."""
    return scripts.claim_parcel(
        connection.client(client),
        slot_keys(topic, slot),
        token=lease_token,
        now_ms=now_ms,
        limit=limit,
        visibility_ms=visibility_ms,
    )


def settle_parcels(
    topic: str,
    parcels: Sequence[tuple[int, int, Sequence[tuple[str, str]]]],
    *,
    now_ms: int,
    max_attempts: int,
    backoff_base_ms: int,
    backoff_cap_ms: int,
    client: Client | None = None,
) -> NackResult:
    """(slot, parcel id, failures) settled in one pipeline: each parcel leaves prepare, its
    (job_id, error) failures retry after backoff or go dead at ``max_attempts``, the rest are
    done. ``missing`` counts parcels the reaper had taken back already (nothing done for them)."""
    calls = [
        scripts.settle_parcel_call(
            slot_keys(topic, slot),
            parcel_id,
            now_ms=now_ms,
            failures=failures,
            max_attempts=max_attempts,
            backoff_base_ms=backoff_base_ms,
            backoff_cap_ms=backoff_cap_ms,
        )
        for slot, parcel_id, failures in parcels
    ]
    if not calls:
        return NackResult(0, 0, 0)
    results = [
        scripts.parse_settled(raw) for raw in scripts.run_calls(connection.client(client), calls)
    ]
    return NackResult(
        sum(r.retried for r in results),
        sum(r.dead for r in results),
        sum(r.missing for r in results),
    )


def promote(
    topic: str,
    tokens: Mapping[int, str],
    *,
    until_ms: int,
    limit: int = PROMOTE_LIMIT,
    client: Client | None = None,
) -> dict[int, int]:
    """Move jobs due by ``until_ms`` from ``later`` into ``store`` in the slots whose lease
    tokens are given ({slot: token}), up to ``limit`` a slot, in one pipeline. Returns how many
    moved per slot; a slot whose lease was lost moves nothing and is left out."""
    slots = list(tokens)
    calls = [
        scripts.PROMOTE.call((k.later, k.store, k.lease), (tokens[slot], until_ms, limit))
        for slot in slots
        for k in (slot_keys(topic, slot),)
    ]
    if not calls:
        return {}
    moved = scripts.run_calls(connection.client(client), calls)
    return {slot: int(n) for slot, n in zip(slots, moved, strict=True) if int(n) >= 0}


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


def ack(
    topic: str, slot: int, job_ids: Sequence[str], *, lease_token: str, client: Client | None = None
) -> int:
    """Jobs done: drop them from prepare. Raises LeaseLost (then nothing is removed)."""
    if not job_ids:
        return 0
    return scripts.ack(
        connection.client(client), slot_keys(topic, slot), token=lease_token, job_ids=job_ids
    )


def nack(
    topic: str,
    slot: int,
    failures: Sequence[tuple[str, str]],
    *,
    now_ms: int,
    max_attempts: int,
    backoff_base_ms: int,
    backoff_cap_ms: int,
    lease_token: str,
    client: Client | None = None,
) -> NackResult:
    """(job_id, error) pairs failed: retry after backoff, or dead at ``max_attempts``."""
    if not failures:
        return NackResult(0, 0, 0)
    return scripts.nack(
        connection.client(client),
        slot_keys(topic, slot),
        token=lease_token,
        now_ms=now_ms,
        failures=failures,
        max_attempts=max_attempts,
        backoff_base_ms=backoff_base_ms,
        backoff_cap_ms=backoff_cap_ms,
    )


def bury(
    topic: str,
    slot: int,
    failures: Sequence[tuple[str, str]],
    *,
    now_ms: int,
    lease_token: str,
    client: Client | None = None,
) -> NackResult:
    """(job_id, error) pairs go straight to dead, whatever their attempt count."""
    return nack(
        topic,
        slot,
        failures,
        now_ms=now_ms,
        max_attempts=0,
        backoff_base_ms=0,
        backoff_cap_ms=0,
        lease_token=lease_token,
        client=client,
    )


# --- settling entries a handler handed on (invariant 6: not fenced) ----------------------------

HANDED_TOKEN = "handed-on"


def ack_handed(
    topic: str, slot: int, job_ids: Sequence[str], *, client: Client | None = None
) -> int:
    """A deliverer finished entries handed on to it: drop them from prepare."""
    return ack(topic, slot, job_ids, lease_token=HANDED_TOKEN, client=client)


def ack_handed_many(
    topic: str, parts: Mapping[int, Sequence[str]], *, client: Client | None = None
) -> int:
    """``ack_handed`` for several slots at once ({slot: job ids}), in one pipeline."""
    calls = [
        scripts.ACK.call((k.prepare, k.meta, k.lease), (HANDED_TOKEN, *ids))
        for slot, ids in parts.items()
        if ids
        for k in (slot_keys(topic, slot),)
    ]
    return sum(int(n) for n in scripts.run_calls(connection.client(client), calls)) if calls else 0


def unclaim(
    topic: str, slot: int, entries: Sequence[Claimed], *, client: Client | None = None
) -> int:
    """Give claimed entries back to store at their due time, their attempt not spent (a worker
    stopping with entries it held ahead of their due time); returns how many went back."""
    if not entries:
        return 0
    k = slot_keys(topic, slot)
    args = [x for e in entries for x in (e.job_id, e.due_ms, e.attempt)]
    return int(scripts.UNCLAIM(connection.client(client), (k.prepare, k.store), args))


def nack_handed(
    topic: str,
    slot: int,
    failures: Sequence[tuple[str, str]],
    *,
    now_ms: int,
    max_attempts: int,
    backoff_base_ms: int,
    backoff_cap_ms: int,
    client: Client | None = None,
) -> NackResult:
    """A deliverer failed entries handed on to it: retry after backoff, or dead."""
    return nack(
        topic,
        slot,
        failures,
        now_ms=now_ms,
        max_attempts=max_attempts,
        backoff_base_ms=backoff_base_ms,
        backoff_cap_ms=backoff_cap_ms,
        lease_token=HANDED_TOKEN,
        client=client,
    )


def reap(
    topic: str,
    slots: Iterable[int],
    *,
    now_ms: int,
    limit: int,
    max_attempts: int,
    client: Client | None = None,
) -> ReapResult:
    """Expired prepare entries back to store or dead: one pipeline, ``limit`` per slot."""
    calls = [
        scripts.reap_call(
            slot_keys(topic, slot),
            now_ms=now_ms,
            limit=limit,
            max_attempts=max_attempts,
            error="visibility timeout",
        )
        for slot in slots
    ]
    results = [
        scripts.parse_reap(raw) for raw in scripts.run_calls(connection.client(client), calls)
    ]
    return ReapResult(
        sum(r.retried for r in results),
        sum(r.dead for r in results),
        tuple(job_id for r in results for job_id in r.dead_ids),
    )


# --- inspecting ----------------------------------------------------------------------------------


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


PARCEL_COUNTERS = 2  # the parcels hash's "#seq" and "#n"


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


def list_dead(
    topic: str, slot: int, *, offset: int = 0, limit: int = 100, client: Client | None = None
) -> list[DeadEntry]:
    """Dead jobs of a slot, most recent first, with their attempts and last error."""
    client = connection.client(client)
    k = slot_keys(topic, slot)
    rows = client.zrevrange(k.dead, offset, offset + max(limit, 1) - 1, withscores=True)
    if not rows:
        return []
    ids = [scripts.as_str(member) for member, _ in rows]
    fields = [f for job_id in ids for f in (f"a:{job_id}", f"e:{job_id}")]
    meta = client.hmget(k.meta, fields)
    return [
        DeadEntry(job_id, int(score), int(meta[2 * i] or 0), scripts.as_str(meta[2 * i + 1] or b""))
        for i, (job_id, (_, score)) in enumerate(zip(ids, rows, strict=True))
    ]


# --- steering dead jobs --------------------------------------------------------------------------


def requeue_dead(
    topic: str,
    slot: int,
    *,
    now_ms: int,
    job_ids: Sequence[str] = (),
    limit: int = 1000,
    client: Client | None = None,
) -> int:
    """Dead jobs (the given ids, else the ``limit`` oldest) back to store, due now."""
    return scripts.requeue_dead(
        connection.client(client),
        slot_keys(topic, slot),
        now_ms=now_ms,
        limit=max(limit, len(job_ids)),
        job_ids=job_ids,
    )


def purge_dead(
    topic: str,
    slot: int,
    *,
    job_ids: Sequence[str] = (),
    limit: int = 1000,
    client: Client | None = None,
) -> int:
    """Delete dead jobs (the given ids, else the ``limit`` oldest) for good."""
    return scripts.purge_dead(
        connection.client(client),
        slot_keys(topic, slot),
        limit=max(limit, len(job_ids)),
        job_ids=job_ids,
    )


# --- slot layouts --------------------------------------------------------------------------------


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
