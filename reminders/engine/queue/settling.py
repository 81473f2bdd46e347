"""Settling entries a handler handed on (invariant 6 in ``reminders/engine/__init__.py``).

Whoever received them (a delivery task) settles them later, without the slot's lease: these calls
run under the shared token ``HANDED_TOKEN``, which the scripts accept in place of the lease's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from .. import connection, scripts
from ..connection import Client
from ..keys import slot_keys
from ..scripts import NackResult
from .consuming import ack, nack

HANDED_TOKEN = "handed-on"

# A deliverer finished entries handed on to it: drop them from prepare.
ack_handed = partial(ack, lease_token=HANDED_TOKEN)
# A deliverer failed entries handed on to it: retry after backoff, or dead.
nack_handed = partial(nack, lease_token=HANDED_TOKEN)


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
