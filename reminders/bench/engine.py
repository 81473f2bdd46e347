"""Engine benchmarks on the configured Redis; ``bench_reminders`` (management command) calls these.

Benchmark code: it lives apart from the engine and is never loaded by a production process.

Each function builds its own throwaway topic under the current key prefix, measures one thing with
``time.perf_counter`` and deletes what it created. Figures are jobs per second in one process.
Item generation is outside the timed part; everything the engine does (grouping, Lua, transport,
decoding replies into ``Claimed`` tuples) is inside it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from reminders.engine import connection, keys, queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.engine.connection import Client
from reminders.engine.leases import SlotLeases

# The raw limit's loop: a bare pop of due members, no two-phase bookkeeping. Loaded through the
# engine's one loader, but never among the production scripts.
BENCH_POP = scripts.LuaScript("bench_pop", directory=Path(__file__).parent / "lua")


def bench_pop(client: Client, key: str, *, now_ms: int, limit: int) -> list[bytes]:
    """Pop up to ``limit`` due members of ``key``."""
    return BENCH_POP(client, (key,), (now_ms, limit))


def _topic() -> str:
    return f"bench-{uuid.uuid4().hex[:8]}"


def _items(n: int, slots: int, due_ms: int) -> list[tuple[str, int, int]]:
    return [(str(i), due_ms + (i % 1000), keys.slot_for(i, slots)) for i in range(n)]


def _cleanup(client: Client, topic: str, slots: int) -> None:
    for slot in range(slots):
        k = keys.slot_keys(topic, slot)
        for key in (k.store, k.prepare, k.dead, k.meta, k.lease, k.fence, k.parcels, k.later):
            client.delete(key)
    client.delete(keys.round_robin(topic), keys.layouts(topic))


def _rate(n: int, seconds: float) -> dict[str, Any]:
    return {
        "jobs": n,
        "seconds": round(seconds, 4),
        "per_second": round(n / seconds) if seconds else 0,
    }


def bench_schedule(
    n: int = 200_000, *, slots: int = 16, client: Client | None = None
) -> dict[str, Any]:
    """Jobs/s through ``schedule_many`` (grouped per slot, chunked EVALSHA, pipelined)."""
    client = connection.client(client)
    topic = _topic()
    items = _items(n, slots, due_ms=epoch_ms() + 3_600_000)
    try:
        start = time.perf_counter()
        added = queue.schedule_many(topic, items, client=client)
        result = _rate(n, time.perf_counter() - start)
    finally:
        _cleanup(client, topic, slots)
    return {"name": "schedule", "slots": slots, "added": added, **result}


def bench_claim_ack(
    n: int = 200_000,
    *,
    slots: int = 1,
    batch: int = 5000,
    with_due: bool = True,
    client: Client | None = None,
) -> dict[str, Any]:
    """Jobs/s of claim (store -> prepare, fenced) + ack (fenced) of ``n`` due jobs, one process."""
    client = connection.client(client)
    topic = _topic()
    now = epoch_ms()
    leases = SlotLeases("bench", ttl_ms=600_000, client=client)
    try:
        queue.schedule_many(topic, _items(n, slots, due_ms=now - 10_000), client=client)
        leases.sync({topic: range(slots)})
        done = 0
        start = time.perf_counter()
        for slot in range(slots):
            token = leases.token(topic, slot)
            while True:
                entries = queue.claim(
                    topic,
                    slot,
                    now_ms=now,
                    limit=batch,
                    visibility_ms=30_000,
                    lease_token=token,
                    with_due=with_due,
                    client=client,
                )
                if not entries:
                    break
                done += queue.ack(
                    topic, slot, [e.job_id for e in entries], lease_token=token, client=client
                )
        result = _rate(done, time.perf_counter() - start)
    finally:
        _cleanup(client, topic, slots)
    name = "claim_ack" if with_due else "claim_ack_no_due"
    return {"name": name, "slots": slots, "batch": batch, **result}


def bench_raw_lua(
    n: int = 200_000, *, batch: int = 5000, client: Client | None = None
) -> dict[str, Any]:
    """The machine's raw limit: a bare Lua pop-and-ack loop (ZRANGEBYSCORE LIMIT + ZREM)."""
    client = connection.client(client)
    topic = _topic()
    key = keys.slot_keys(topic, 0).store
    now = epoch_ms()
    try:
        pipe = scripts.pipeline(client)
        for i in range(0, n, 10_000):
            pipe.zadd(
                key, {str(j): now - 10_000 + (j % 1000) for j in range(i, min(i + 10_000, n))}
            )
        pipe.execute()
        done = 0
        start = time.perf_counter()
        while popped := bench_pop(client, key, now_ms=now, limit=batch):
            done += len(popped)
        result = _rate(done, time.perf_counter() - start)
    finally:
        _cleanup(client, topic, 1)
    return {"name": "raw_lua_pop", "batch": batch, **result}
