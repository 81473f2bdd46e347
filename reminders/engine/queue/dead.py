"""Dead jobs: listing them, and sending them back to store or deleting them for good."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import connection, scripts
from ..connection import Client
from ..keys import slot_keys


@dataclass(frozen=True, slots=True)
class DeadEntry:
    job_id: str
    died_ms: int
    attempts: int
    last_error: str


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


def purge_dead_before(
    topic: str, slot: int, *, before_ms: int, limit: int = 1000, client: Client | None = None
) -> int:
    """Delete for good at most ``limit`` dead jobs that died before ``before_ms`` (oldest first);
    fewer than ``limit`` deleted: none older is left."""
    return scripts.purge_dead_before(
        connection.client(client), slot_keys(topic, slot), before_ms=before_ms, limit=limit
    )
