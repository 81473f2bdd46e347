"""Claiming and settling in a slot: what the slot's owner does (invariants 4 and 5 in
``reminders/engine/__init__.py``).

``claim``, ``claim_parcel``, ``ack``, ``nack``, ``bury`` and ``promote`` are fenced: the caller must
hold the slot's lease and pass its token, else they raise ``LeaseLost`` (``promote`` leaves the
slot out). ``unclaim`` and ``reap`` move only what is in prepare and need no token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .. import connection, scripts
from ..connection import Client
from ..keys import slot_keys
from ..scripts import Claimed, NackResult, Parcel, ReapResult

PROMOTE_LIMIT = 20_000  # jobs moved per slot and call


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
