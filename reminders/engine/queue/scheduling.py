"""Scheduling and cancelling: jobs into their slot's ``store`` (or ``later``), and out again.

Neither is fenced: any process may schedule or cancel, whoever owns the slot.
"""

from __future__ import annotations

from collections.abc import Iterable

from .. import connection, scripts
from ..clock import epoch_ms
from ..connection import Client
from ..keys import slot_for, slot_keys
from .layouts import slot_layouts

SCHEDULE_CHUNK = 2000  # jobs per EVALSHA: big enough to amortise a round trip, small enough not to
PIPELINE_CALLS = 64  # stall Redis; calls per pipeline flush keep client memory bounded
# A job due later than this from now is scheduled in its slot's ``later`` set, and moved into
# ``store`` (where claims look) by the slot's owner once it falls due within this much, plus
# the topic's look-ahead (``promote``): a burst is claimed from a set of minutes, not of days.
LATER_AFTER_MS = 120_000


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
