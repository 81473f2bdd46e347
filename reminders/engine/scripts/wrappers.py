"""One typed wrapper per script (rq style): arguments in the order the script's header names
them, replies turned into ``replies`` types.

Return codes become exceptions here: a fenced script that finds another token in the slot's lease
key returns -1 (``LEASE_LOST``) and the wrapper raises ``LeaseLost``. Callers never see raw
replies. A ``*_call`` builds the same invocation for ``run_calls`` to pipeline, and a ``parse_*``
reads its reply.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

from ..connection import Client
from ..keys import SlotKeys
from .loading import (
    ACK,
    CANCEL,
    CLAIM_DUE,
    CLAIM_PARCEL,
    ENQUEUE,
    LEASE_ACQUIRE,
    LEASE_RELEASE,
    LEASE_RENEW,
    NACK,
    PROMOTE,
    PURGE_DEAD,
    PURGE_DEAD_BEFORE,
    REAP,
    REQUEUE_DEAD,
    SETTLE_PARCEL,
    SINGLETON_HOLD,
    WORKERS_PRUNE,
    Call,
    as_str,
)
from .replies import Claimed, LeaseLost, NackResult, Parcel, ReapResult

LEASE_LOST = -1


# --- queue scripts -------------------------------------------------------------------------------


def enqueue_call(
    k: SlotKeys,
    items: Iterable[tuple[int, str]],
    *,
    nx: bool = False,
    later_after_ms: int | None = None,
) -> Call:
    """``items`` are (due_ms, job_id); see ``enqueue``."""
    args: list[Any] = ["nx" if nx else "upsert", -1 if later_after_ms is None else later_after_ms]
    for due_ms, job_id in items:
        args.append(due_ms)
        args.append(job_id)
    return ENQUEUE.call((k.store, k.prepare, k.dead, k.meta, k.later), args)


def enqueue(
    client: Client,
    k: SlotKeys,
    items: Iterable[tuple[int, str]],
    *,
    nx: bool = False,
    later_after_ms: int | None = None,
) -> int:
    """Upsert (due_ms, job_id) pairs into the schedule; ``nx``: only jobs found nowhere in the
    slot. Jobs due after ``later_after_ms`` go to ``later`` (None: every one to ``store``)."""
    script, keys, args = enqueue_call(k, items, nx=nx, later_after_ms=later_after_ms)
    return int(script(client, keys, args))


def promote(client: Client, k: SlotKeys, *, token: str, until_ms: int, limit: int) -> int:
    """Move up to ``limit`` jobs due by ``until_ms`` from later into store. Raises LeaseLost."""
    moved = int(PROMOTE(client, (k.later, k.store, k.lease), (token, until_ms, limit)))
    if moved == LEASE_LOST:
        raise LeaseLost(k)
    return moved


_WHERE = {1: "store", 2: "prepare", 3: "dead"}


def cancel_call(k: SlotKeys, job_id: str) -> Call:
    return CANCEL.call((k.store, k.prepare, k.dead, k.meta, k.later), (job_id,))


def cancel(client: Client, k: SlotKeys, job_id: str) -> str | None:
    """Remove ``job_id`` from the slot; returns where it was: "store" (scheduled, in store or
    later), "prepare" or "dead"."""
    script, keys, args = cancel_call(k, job_id)
    return _WHERE.get(int(script(client, keys, args)))


def claim_due(
    client: Client,
    k: SlotKeys,
    *,
    token: str,
    now_ms: int,
    limit: int,
    visibility_ms: int,
    with_due: bool = True,
    isolate_suspects: bool = False,
) -> list[Claimed]:
    """Claimed entries, oldest due first; ``due_ms`` is 0 unless ``with_due``. Raises LeaseLost.

    ``isolate_suspects``: an entry the reaper brought back is claimed alone (``suspect=True``)
    and a batch stops before one, so a job that kills its handler dies alone."""
    args = (token, now_ms, limit, visibility_ms, int(with_due), int(isolate_suspects))
    raw = CLAIM_DUE(client, (k.store, k.prepare, k.meta, k.lease), args)
    if raw[0] == LEASE_LOST:
        raise LeaseLost(k)
    n = raw[1] if len(raw) > 1 else 0
    ids = raw[2 : 2 + n]
    if ids and isinstance(ids[0], bytes):
        ids = [i.decode() for i in ids]
    rest = 2 + n
    if with_due:
        dues, rest = _dues(raw[rest : rest + n]), rest + n
    else:
        dues = [0] * n
    attempts = [1] * n
    for index, attempt in zip(raw[rest::2], raw[rest + 1 :: 2], strict=True):
        attempts[index - 1] = attempt
    if raw[0] == 1:  # a suspect, claimed alone
        return [Claimed(ids[0], dues[0], attempts[0], True)]
    # A burst builds 200,000 of these: tuple.__new__ over zip() stays in C, where Claimed(...)
    # runs the named tuple's Python-level __new__ once per entry (about half the cost).
    rows = zip(ids, dues, attempts, repeat(False, n), strict=True)
    return list(map(_new_tuple, repeat(Claimed, n), rows))


_new_tuple = tuple.__new__


def _dues(scores: list) -> list[int]:
    try:
        return list(map(int, scores))
    except ValueError:  # a score someone wrote with a fraction or an exponent
        return [int(float(score)) for score in scores]


def claim_parcel(
    client: Client, k: SlotKeys, *, token: str, now_ms: int, limit: int, visibility_ms: int
) -> Parcel | None:
    """Up to ``limit`` due jobs, oldest first, as one in-flight parcel; None when nothing is
    due. Raises LeaseLost."""
    raw = CLAIM_PARCEL(
        client,
        (k.store, k.prepare, k.meta, k.lease, k.parcels),
        (token, now_ms, limit, visibility_ms),
    )
    if raw[0] == LEASE_LOST:
        raise LeaseLost(k)
    if len(raw) == 1:
        return None
    pairs = raw[4:]
    return Parcel(k.slot, int(raw[2]), int(raw[1]), as_str(raw[3]), _retries(raw[3], pairs))


def _retries(packed: bytes | str, pairs: list) -> dict[str, int]:
    if not pairs:
        return {}
    ids = as_str(packed).split(",")
    return {ids[index - 1]: attempt for index, attempt in zip(pairs[::2], pairs[1::2], strict=True)}


def settle_parcel_call(
    k: SlotKeys,
    parcel_id: int,
    *,
    now_ms: int,
    failures: Sequence[tuple[str, str]],
    max_attempts: int,
    backoff_base_ms: int,
    backoff_cap_ms: int,
) -> Call:
    args: list[Any] = [parcel_id, now_ms, max_attempts, backoff_base_ms, backoff_cap_ms]
    for job_id, error in failures:
        args += (job_id, error)
    return SETTLE_PARCEL.call((k.prepare, k.store, k.dead, k.meta, k.parcels), args)


def parse_settled(raw: Sequence[int]) -> NackResult:
    return NackResult(retried=raw[1], dead=raw[2], missing=raw[3])


def ack(client: Client, k: SlotKeys, *, token: str, job_ids: Sequence[str]) -> int:
    """Drop handled jobs from prepare; returns how many were still there."""
    removed = int(ACK(client, (k.prepare, k.meta, k.lease), (token, *job_ids)))
    if removed == LEASE_LOST:
        raise LeaseLost(k)
    return removed


def nack(
    client: Client,
    k: SlotKeys,
    *,
    token: str,
    now_ms: int,
    failures: Sequence[tuple[str, str]],
    max_attempts: int,
    backoff_base_ms: int,
    backoff_cap_ms: int,
) -> NackResult:
    """Failed (job_id, error) pairs: back to store after backoff, or dead at ``max_attempts``."""
    args: list[Any] = [token, now_ms, max_attempts, backoff_base_ms, backoff_cap_ms]
    for job_id, error in failures:
        args += (job_id, error)
    raw = NACK(client, (k.prepare, k.store, k.dead, k.meta, k.lease), args)
    if raw[0] == LEASE_LOST:
        raise LeaseLost(k)
    return NackResult(retried=raw[1], dead=raw[2], missing=raw[3])


def reap_call(k: SlotKeys, *, now_ms: int, limit: int, max_attempts: int, error: str) -> Call:
    return REAP.call(
        (k.prepare, k.store, k.dead, k.meta, k.parcels), (now_ms, limit, max_attempts, error)
    )


def parse_reap(raw: Sequence[Any]) -> ReapResult:
    return ReapResult(retried=raw[0], dead=raw[1], dead_ids=tuple(as_str(i) for i in raw[2:]))


def reap(
    client: Client,
    k: SlotKeys,
    *,
    now_ms: int,
    limit: int,
    max_attempts: int,
    error: str = "visibility timeout",
) -> ReapResult:
    """Jobs whose visibility deadline passed go back to store (due now) or to dead."""
    script, keys, args = reap_call(
        k, now_ms=now_ms, limit=limit, max_attempts=max_attempts, error=error
    )
    return parse_reap(script(client, keys, args))


def requeue_dead(
    client: Client, k: SlotKeys, *, now_ms: int, limit: int, job_ids: Sequence[str] = ()
) -> int:
    """Dead jobs (the given ids, or the ``limit`` oldest) back to store, due now, attempts reset."""
    return int(REQUEUE_DEAD(client, (k.dead, k.store, k.meta), (now_ms, limit, *job_ids)))


def purge_dead(client: Client, k: SlotKeys, *, limit: int, job_ids: Sequence[str] = ()) -> int:
    return int(PURGE_DEAD(client, (k.dead, k.meta), (limit, *job_ids)))


def purge_dead_before(client: Client, k: SlotKeys, *, before_ms: int, limit: int) -> int:
    return int(PURGE_DEAD_BEFORE(client, (k.dead, k.meta), (before_ms, limit)))


# --- lease scripts -------------------------------------------------------------------------------


def lease_acquire_call(k: SlotKeys, *, holder: str, ttl_ms: int, current: str | None) -> Call:
    return LEASE_ACQUIRE.call((k.lease, k.fence), (holder, ttl_ms, current or ""))


def parse_token(raw: bytes | str | None) -> str | None:
    return None if raw is None else as_str(raw)


def lease_acquire(
    client: Client, k: SlotKeys, *, holder: str, ttl_ms: int, current: str | None = None
) -> str | None:
    """Take the slot's lease (new fencing token) or keep ours; None when another holder has it."""
    script, keys, args = lease_acquire_call(k, holder=holder, ttl_ms=ttl_ms, current=current)
    return parse_token(script(client, keys, args))


def lease_renew_call(key: str, *, token: str, ttl_ms: int) -> Call:
    return LEASE_RENEW.call((key,), (token, ttl_ms))


def lease_renew(client: Client, key: str, *, token: str, ttl_ms: int) -> bool:
    return bool(LEASE_RENEW(client, (key,), (token, ttl_ms)))


def lease_release_call(key: str, *, token: str) -> Call:
    return LEASE_RELEASE.call((key,), (token,))


def lease_release(client: Client, key: str, *, token: str) -> bool:
    return bool(LEASE_RELEASE(client, (key,), (token,)))


def singleton_hold(client: Client, key: str, *, token: str, ttl_ms: int) -> bool:
    return bool(SINGLETON_HOLD(client, (key,), (token, ttl_ms)))


def workers_prune(client: Client, beats: str, info: str, *, cutoff_ms: int, limit: int) -> int:
    return int(WORKERS_PRUNE(client, (beats, info), (cutoff_ms, limit)))
