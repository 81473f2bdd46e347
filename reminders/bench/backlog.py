"""Cost as the backlog grows (``manage.py bench_backlog``): what a pending reminder costs in Redis,
and whether claiming slows down when millions wait behind the due ones.

For each backlog size (1M and 10M by default) on a throwaway topic with the production slot count:

- ``bytes_per_pending``: Redis ``used_memory`` grown by scheduling the backlog, per job. Members
  are shaped as reminders' are (``"<subscription>:<user>:<coupon>"``, here 27 characters);
- ``claim_ack_per_s``: ``sample`` due jobs claimed and acked (batch 2,000, as the worker does)
  with the whole backlog waiting behind them in the same slots;
- the growth from the smallest to the largest backlog, as ratios (the target: claim rate within
  15 % of the 1M figure, at most 120 bytes per pending job).

The backlog is due an hour ahead, so it never mixes with the sample. Everything is deleted after.
"""

from __future__ import annotations

import time
from typing import Any

from couponcenter.bench.progress import Progress
from reminders.bench.engine import _cleanup, _topic
from reminders.engine import connection, keys, queue
from reminders.engine.connection import Client
from reminders.engine.leases import SlotLeases

SCHEDULE_CHUNK = 50_000
CLAIM_BATCH = 2000
USER_BASE = 9_100_000_000
SUB_BASE = 700_000_000
COUPON = 424242


def _member(i: int) -> str:
    return f"{SUB_BASE + i}:{USER_BASE + i}:{COUPON}"


def _used_memory(client: Client) -> int:
    return int(client.info("memory")["used_memory"])


def _schedule(topic, first: int, count: int, due_ms: int, slots: int, client, progress, what):
    for start in range(first, first + count, SCHEDULE_CHUNK):
        stop = min(start + SCHEDULE_CHUNK, first + count)
        queue.schedule_many(
            topic,
            [(_member(i), due_ms, keys.slot_for(USER_BASE + i, slots)) for i in range(start, stop)],
            client=client,
        )
        if progress:
            progress(what, stop - first, count)


def bench_backlog_size(
    pending: int,
    *,
    sample: int = 200_000,
    slots: int = 16,
    client: Client | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    client = connection.client(client)
    topic = _topic()
    now = int(time.time() * 1000)
    leases = SlotLeases("bench-backlog", ttl_ms=600_000, client=client)
    try:
        before = _used_memory(client)
        _schedule(topic, 0, pending, now + 3_600_000, slots, client, progress,
                  f"backlog {pending:,}")  # fmt: skip
        grown = _used_memory(client) - before
        _schedule(topic, pending, sample, now - 1000, slots, client, None, "")
        leases.sync({topic: range(slots)})
        done = 0
        started = time.perf_counter()
        for slot in range(slots):
            token = leases.token(topic, slot)
            while entries := queue.claim(topic, slot, now_ms=now, limit=CLAIM_BATCH,
                                         visibility_ms=60_000, lease_token=token,
                                         with_due=False, client=client):  # fmt: skip
                done += queue.ack(topic, slot, [e.job_id for e in entries], lease_token=token,
                                  client=client)  # fmt: skip
        seconds = time.perf_counter() - started
        left = sum(s.store for s in queue.stats(topic, range(slots), now_ms=now, client=client))
    finally:
        _cleanup(client, topic, slots)
        for slot in range(slots):
            client.delete(keys.slot_keys(topic, slot).store)
    if done != sample or left != pending:
        raise AssertionError(f"claimed {done} of {sample}; {left} of {pending} left pending")
    return {
        "pending": pending,
        "bytes_per_pending": round(grown / pending, 1),
        "claim_ack_per_s": round(done / seconds),
    }


def run(
    *,
    sizes: list[int],
    sample: int = 200_000,
    slots: int = 16,
    progress: Progress | None = None,
) -> dict[str, Any]:
    rows = [bench_backlog_size(n, sample=sample, slots=slots, progress=progress) for n in sizes]
    first, last = rows[0], rows[-1]
    return {
        "slots": slots,
        "sample": sample,
        "sizes": rows,
        "claim_rate_growth": round(last["claim_ack_per_s"] / first["claim_ack_per_s"], 3),
        "memory_growth": round(last["bytes_per_pending"] / first["bytes_per_pending"], 3),
        "max_bytes_per_pending": max(r["bytes_per_pending"] for r in rows),
    }
