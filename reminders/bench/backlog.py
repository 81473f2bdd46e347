"""Cost as the backlog grows (``manage.py bench_backlog``): what a pending reminder costs in Redis,
and whether claiming slows down when millions wait behind the due ones.

For each backlog size (1M and 10M by default) on a throwaway topic with the production slot count:

- ``bytes_per_pending``: Redis ``used_memory`` grown by scheduling the backlog, per job. Members
  are reminders' (``members.member`` of subscription ids from 700,000,000 up: six characters);
- ``claim_ack_per_s``: ``sample`` due jobs claimed and settled the reminders' way (parcels of
  2,000, as the worker claims them, each settled as delivery settles it) with the whole backlog
  waiting behind them in the same slots; ``claim_ack_per_s_per_entry`` the same for another
  ``sample`` claimed and acked entry by entry, the timeout topics' way; each the median of
  ``ROUNDS`` fresh samples after ``WARMUP`` (see ``bench_backlog_size``);
- the growth from the smallest to the largest backlog, as ratios (the target: claim rate within
  15 % of the 1M figure, at most 120 bytes per pending job).

The backlog is due an hour ahead, so it never mixes with the sample. Everything is deleted after.

``bench_rebuild_size`` (``--rebuild``): the rebuild rate from PostgreSQL, through the code path of
``rebuild_reminder_queues`` (``subscriptions_rebuild``), over N scheduled subscriptions of a bench
coupon, into a throwaway key prefix (so no worker sees them); rows and keys are deleted after.
"""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from couponcenter.coupons.bench.progress import Progress
from couponcenter.coupons.models import Coupon
from reminders.bench.engine import _cleanup, _topic
from reminders.bench.tables import delete_bench_rows, delete_keys, vacuum_analyze
from reminders.engine import connection as connection_redis
from reminders.engine import keys, queue
from reminders.engine.clock import epoch_ms
from reminders.engine.connection import Client
from reminders.engine.leases import SlotLeases
from reminders.members import member
from reminders.models import ReminderSubscription
from reminders.services.subscriptions import subscriptions_rebuild

SCHEDULE_CHUNK = 50_000
CLAIM_BATCH = 2000
WARMUP = 2  # samples claimed per way and backlog size before the measured ones (see below)
ROUNDS = 3  # samples measured per way and backlog size (the median is reported)
USER_BASE = 9_100_000_000
SUB_BASE = 700_000_000
REBUILD_LOAD_CHUNK = 200_000


def _member(i: int) -> str:
    return member(SUB_BASE + i)


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


def schedule_backlog(topic: str, count: int, *, due_ms: int, slots: int, progress=None) -> None:
    """``count`` reminder-shaped entries (of no subscription) due at ``due_ms`` in ``topic``."""
    client = connection_redis.client()
    _schedule(topic, 0, count, due_ms, slots, client, progress, f"backlog {count:,}")


def bench_backlog_size(
    pending: int,
    *,
    sample: int = 200_000,
    slots: int = 16,
    client: Client | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    client = connection_redis.client(client)
    topic = _topic()
    now = epoch_ms()
    leases = SlotLeases("bench-backlog", ttl_ms=600_000, client=client)
    try:
        before = _used_memory(client)
        _schedule(
            topic, 0, pending, now + 3_600_000, slots, client, progress, f"backlog {pending:,}"
        )
        grown = _used_memory(client) - before
        leases.sync({topic: range(slots)})
        # Each way WARMUP + ROUNDS times, alternating, a fresh sample each time; the median of
        # the ROUNDS is reported, every round beside it. Why warm-up rounds: Redis grows a
        # sorted set's hash table incrementally, one bucket per operation on the key, so right
        # after a load that crossed a power of two (10M over 16 slots is 625,000 a slot, past
        # 2^19) the first claims also finish the growth and ran at half speed; and one sample
        # takes under a second, where a neighbour's burst of CPU on a shared machine moved
        # single figures by a third.
        rounds: dict[str, list[int]] = {"parcels": [], "entries": []}
        first = pending
        for _ in range(WARMUP + ROUNDS):
            for way, claim in (("parcels", _claim_parcels), ("entries", _claim_entries)):
                _schedule(topic, first, sample, now - 1000, slots, client, None, "")
                first += sample
                rounds[way].append(claim(topic, slots, leases, now, sample, client))
        left = sum(s.store for s in queue.stats(topic, range(slots), now_ms=now, client=client))
    finally:
        _cleanup(client, topic, slots)
        for slot in range(slots):
            k = keys.slot_keys(topic, slot)
            client.delete(k.store, k.later)
    if left != pending:
        raise AssertionError(f"{left} of {pending} left pending")
    return {
        "pending": pending,
        "bytes_per_pending": round(grown / pending, 1),
        "claim_ack_per_s": statistics.median(rounds["parcels"][WARMUP:]),
        "claim_ack_per_s_per_entry": statistics.median(rounds["entries"][WARMUP:]),
        "rounds": rounds,  # the warm-up rounds first
    }


def _window(now: int, token: str, client) -> dict:
    """What each claim is given, parcels or entries: the worker's batch, a minute in flight."""
    return {
        "now_ms": now,
        "limit": CLAIM_BATCH,
        "visibility_ms": 60_000,
        "lease_token": token,
        "client": client,
    }


def _claim_parcels(topic, slots, leases, now, sample, client) -> int:
    """The reminders' way: due jobs claimed as parcels (batch 2,000, as the worker claims) and
    each parcel settled, as delivery settles it; jobs per second."""
    done, started = 0, time.perf_counter()
    for slot in range(slots):
        token = leases.token(topic, slot)
        while parcel := queue.claim_parcel(topic, slot, **_window(now, token, client)):
            settled = queue.settle_parcels(
                topic,
                [(slot, parcel.parcel_id, [])],
                now_ms=now,
                max_attempts=3,
                backoff_base_ms=1000,
                backoff_cap_ms=1000,
                client=client,
            )
            if settled.missing:
                raise AssertionError("a parcel went missing before it was settled")
            done += parcel.size
    seconds = time.perf_counter() - started
    if done != sample:
        raise AssertionError(f"claimed {done} of {sample} in parcels")
    return round(done / seconds)


def _claim_entries(topic, slots, leases, now, sample, client) -> int:
    """The timeout topics' way: claimed and acked entry by entry (a prepare entry each)."""
    done, started = 0, time.perf_counter()
    for slot in range(slots):
        token = leases.token(topic, slot)
        while entries := queue.claim(topic, slot, **_window(now, token, client), with_due=False):
            done += queue.ack(
                topic, slot, [e.job_id for e in entries], lease_token=token, client=client
            )
    seconds = time.perf_counter() - started
    if done != sample:
        raise AssertionError(f"claimed {done} of {sample} entry by entry")
    return round(done / seconds)


_SUBSCRIPTIONS = ReminderSubscription._meta.db_table
_PG_SUBSCRIPTIONS_SQL = f"""
INSERT INTO {_SUBSCRIPTIONS}
    (coupon_id, user_id, remind_at, status, slot, priority, drop_reason, traceparent,
     created_at, updated_at)
SELECT %(coupon)s, g, %(at)s + make_interval(secs => g %% 3600), 'scheduled', g %% 16,
       'normal', '', '', %(now)s, %(now)s
FROM generate_series(%(lo)s, %(hi)s) g
"""


def _load_subscriptions(coupon: Coupon, count: int, progress: Progress | None) -> None:
    """``count`` scheduled subscriptions of ``coupon`` (users ``USER_BASE + i``), in chunks."""
    at = timezone.now() + timedelta(days=365)
    for lo in range(0, count, REBUILD_LOAD_CHUNK):
        hi = min(lo + REBUILD_LOAD_CHUNK, count)
        with transaction.atomic():
            if connection.vendor == "postgresql":
                params = {"coupon": coupon.pk, "at": at, "now": timezone.now()}
                with connection.cursor() as cursor:
                    cursor.execute(
                        _PG_SUBSCRIPTIONS_SQL,
                        {**params, "lo": USER_BASE + lo, "hi": USER_BASE + hi - 1},
                    )
            else:
                ReminderSubscription.objects.bulk_create(
                    ReminderSubscription(
                        coupon=coupon,
                        user_id=USER_BASE + i,
                        slot=i % 16,
                        remind_at=at + timedelta(seconds=i % 3600),
                    )
                    for i in range(lo, hi)
                )
        if progress:
            progress(f"subscriptions {count:,}", hi, count)
    vacuum_analyze()


def bench_rebuild_size(count: int, *, progress: Progress | None = None) -> dict[str, Any]:
    """Scheduled reminders rebuilt from PostgreSQL per second, with ``count`` of them."""
    if ReminderSubscription.objects.filter(status=ReminderSubscription.Status.SCHEDULED).exists():
        raise RuntimeError("the rebuild bench needs a database with no scheduled reminders")
    coupon = Coupon.objects.create(
        name="__bench_rebuild__",
        claim_opens_at=timezone.now() + timedelta(days=400),
        total_stock=max(count, 1),
        valid_for=timedelta(days=1),
    )
    bench_prefix = f"bench-rebuild-{uuid.uuid4().hex[:8]}"
    try:
        _load_subscriptions(coupon, count, progress)
        with override_settings(REDIS_KEY_PREFIX=bench_prefix):
            done = 0

            def step(n: int) -> None:
                nonlocal done
                done += n
                if progress:
                    progress(f"rebuild {count:,}", done, count)

            started = time.perf_counter()
            added = subscriptions_rebuild(progress=step)
            seconds = time.perf_counter() - started
    finally:
        delete_keys(bench_prefix)
        delete_bench_rows([coupon], USER_BASE, count)
    if added != count:
        raise AssertionError(f"the rebuild indexed {added} of {count} scheduled reminders")
    return {
        "scheduled": count,
        "rebuild_s": round(seconds, 3),
        "rebuild_per_s": round(count / seconds),
    }


def run(
    *,
    sizes: list[int],
    sample: int = 200_000,
    slots: int = 16,
    rebuild: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    rows = [bench_backlog_size(n, sample=sample, slots=slots, progress=progress) for n in sizes]
    first, last = rows[0], rows[-1]
    result = {
        "slots": slots,
        "sample": sample,
        "sizes": rows,
        "claim_rate_growth": round(last["claim_ack_per_s"] / first["claim_ack_per_s"], 3),
        "claim_rate_growth_per_entry": round(
            last["claim_ack_per_s_per_entry"] / first["claim_ack_per_s_per_entry"], 3
        ),
        "memory_growth": round(last["bytes_per_pending"] / first["bytes_per_pending"], 3),
        "max_bytes_per_pending": max(r["bytes_per_pending"] for r in rows),
    }
    if rebuild:
        rebuilt = [bench_rebuild_size(n, progress=progress) for n in sizes]
        result["rebuild"] = rebuilt
        result["rebuild_rate_growth"] = round(
            rebuilt[-1]["rebuild_per_s"] / rebuilt[0]["rebuild_per_s"], 3
        )
    return result
