"""Several processes against one Redis: racing claimers, a worker killed mid-batch, a worker
paused past its lease. Each child process builds its own client (get_redis() is per pid)."""

import multiprocessing
import os
import signal
import time

import pytest

from couponcenter.core.redis import get_redis
from reminders.engine import queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.engine.keys import slot_keys
from reminders.engine.leases import SlotLeases
from reminders.engine.scripts import LeaseLost

T = "coupon.reminder"
ctx = multiprocessing.get_context("fork")  # children inherit the test's key prefix setting


def _claimer(slots: list[int], tokens: dict[int, str], now: int, out) -> None:
    client = get_redis()
    claimed = []
    for slot in slots:
        token = tokens[slot]
        while got := queue.claim(T, slot, now_ms=now, limit=2000, visibility_ms=600_000,
                                 lease_token=token, with_due=False, client=client):  # fmt: skip
            claimed.extend(c.job_id for c in got)
    out.put(claimed)


@pytest.mark.slow
def test_eight_claimers_race_over_a_million_entries(redis_client, now):
    n, slots = 1_000_000, 4
    queue.schedule_many(T, ((str(i), now - i % 1000, i % slots) for i in range(n)),
                        client=redis_client)  # fmt: skip
    owner = SlotLeases("owner", ttl_ms=600_000, client=redis_client)
    owner.sync({T: range(slots)})
    tokens = {s: owner.token(T, s) for s in range(slots)}
    out = ctx.Queue()
    # every claimer walks all slots, starting at a different one, so they collide on each
    orders = [[(i + s) % slots for s in range(slots)] for i in range(8)]
    procs = [ctx.Process(target=_claimer, args=(order, tokens, now, out)) for order in orders]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    claimed = [job for result in results for job in result]
    assert len(claimed) == n and len(set(claimed)) == n  # each exactly once, none lost
    assert sum(1 for r in results if r) >= 2  # they really raced
    stats = queue.stats(T, range(slots), now_ms=now, client=redis_client)
    assert sum(s.prepare for s in stats) == n and sum(s.store for s in stats) == 0


def _claim_then_hang(token: str, ready, claim_at: int) -> None:
    client = get_redis()
    queue.claim(T, 0, now_ms=claim_at, limit=100, visibility_ms=500, lease_token=token,
                client=client)  # fmt: skip
    ready.set()
    time.sleep(60)  # killed before it can ack


def test_entries_of_a_killed_worker_come_back_after_the_visibility_deadline(redis_client):
    # The scripts take "now" as an argument: the claim and the reaps run on one explicit clock,
    # so how long the machine takes between them does not matter.
    claim_at = epoch_ms()
    queue.schedule_many(T, [(f"j{i}", claim_at - 1, 0) for i in range(100)], client=redis_client)
    token = scripts.lease_acquire(redis_client, slot_keys(T, 0), holder="victim", ttl_ms=60_000)
    ready = ctx.Event()
    proc = ctx.Process(target=_claim_then_hang, args=(token, ready, claim_at))
    proc.start()
    assert ready.wait(30)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert queue.reap(T, [0], now_ms=claim_at + 499, limit=1000, max_attempts=5,
                      client=redis_client).retried == 0  # fmt: skip
    assert queue.reap(T, [0], now_ms=claim_at + 501, limit=1000, max_attempts=5,
                      client=redis_client).retried == 100  # fmt: skip
    again = queue.claim(T, 0, now_ms=claim_at + 502, limit=1000, visibility_ms=500,
                        lease_token=token, client=redis_client)  # fmt: skip
    assert len(again) == 100 and {c.attempt for c in again} == {2}


def _claim_then_ack_when_told(ready, go, result) -> None:
    client = get_redis()
    leases = SlotLeases("sleeper", ttl_ms=300, client=client)
    leases.sync({T: [0]})
    token = leases.token(T, 0)
    got = queue.claim(T, 0, now_ms=epoch_ms(), limit=100, visibility_ms=60_000, lease_token=token,
                      client=client)  # fmt: skip
    ready.set()
    go.wait(30)
    try:
        queue.ack(T, 0, [c.job_id for c in got], lease_token=token, client=client)
        result.put("acked")
    except LeaseLost:
        result.put("lease lost")


def test_a_worker_paused_past_its_lease_cannot_ack_after_takeover(redis_client):
    queue.schedule_many(T, [(f"j{i}", epoch_ms() - 1, 0) for i in range(10)], client=redis_client)
    ready, go, result = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_claim_then_ack_when_told, args=(ready, go, result))
    proc.start()
    assert ready.wait(30)
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        taker = SlotLeases("taker", ttl_ms=5000, client=redis_client)
        deadline = time.monotonic() + 30  # the paused worker's 300 ms lease expires (observed)
        while not taker.sync({T: [0]}).acquired and time.monotonic() < deadline:
            time.sleep(0.05)
        assert taker.owned(T) == [0]
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    go.set()
    assert result.get(timeout=30) == "lease lost"
    proc.join(timeout=10)
    stats = queue.stats(T, [0], now_ms=epoch_ms(), client=redis_client)[0]
    assert stats.prepare == 10  # untouched by the stale worker; the reaper will bring them back
