"""Workers, slot assignment, lease sync and takeover, fencing after takeover, singleton leases."""

import time

import pytest

from reminders.engine import leases, queue
from reminders.engine.keys import slot_keys
from reminders.engine.leases import SlotLeases, WorkerInfo, assign_slots
from reminders.engine.scripts import LeaseLost

T = "coupon.reminder"


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_assignment_covers_every_slot_once_and_evenly(workers):
    live = [f"w{i}" for i in range(workers)]
    owned = {w: assign_slots(w, live, T, 16) for w in live}
    flat = sorted(s for slots in owned.values() for s in slots)
    assert flat == list(range(16))
    assert max(map(len, owned.values())) - min(map(len, owned.values())) <= 1
    assert assign_slots("stranger", live, T, 16) == []


def test_heartbeats_decide_who_is_live(client, now):
    leases.heartbeat(WorkerInfo("w1", now, host="h", pid=1, owned={T: [0]}), client=client)
    leases.heartbeat(WorkerInfo("w2", now - 6000), client=client)
    assert leases.live_workers(now_ms=now, lease_ms=5000, client=client) == ["w1"]
    (w1, w2) = leases.list_workers(client=client)
    assert (w1.worker_id, w1.host, w1.owned, w2.heartbeat_ms) == ("w1", "h", {T: [0]}, now - 6000)
    assert leases.prune_workers(now_ms=now, older_than_ms=5000, client=client) == 1
    leases.deregister("w1", client=client)
    assert leases.list_workers(client=client) == []


def test_two_workers_share_the_slots(client):
    w1, w2 = SlotLeases("w1", client=client), SlotLeases("w2", client=client)
    assert len(w1.sync({T: range(4)}).acquired) == 4
    # w2 joins: each wants half; w2 only gets what w1 has released
    half = {w: assign_slots(w, ["w1", "w2"], T, 4) for w in ("w1", "w2")}
    assert w2.sync({T: half["w2"]}).acquired == []
    assert sorted(w1.sync({T: half["w1"]}).released) == [(T, s) for s in half["w2"]]
    assert sorted(w2.sync({T: half["w2"]}).acquired) == [(T, s) for s in half["w2"]]
    assert sorted(w1.owned(T) + w2.owned(T)) == [0, 1, 2, 3]
    report = w1.sync({T: half["w1"]})  # a renewal keeps the same tokens
    assert report.acquired == report.lost == []


def test_a_dead_workers_slots_are_taken_over_within_the_lease_time(client, now):
    w1 = SlotLeases("w1", ttl_ms=300, client=client)
    w2 = SlotLeases("w2", ttl_ms=300, client=client)
    w1.sync({T: range(4)})
    assert w2.sync({T: range(4)}).acquired == []  # held while w1 renews
    lease_keys = [slot_keys(T, s).lease for s in range(4)]
    # Unless renewed, every lease is gone within the lease time (Redis expires it: PX).
    assert all(0 < client.pttl(key) <= 300 for key in lease_keys)
    # w1 stops renewing (crashed): once Redis has expired its leases (observed, however long a
    # loaded machine takes), w2 takes every slot in one sync.
    deadline = time.monotonic() + 30
    while any(client.exists(key) for key in lease_keys):
        assert time.monotonic() < deadline, "the leases never expired"
        time.sleep(0.02)
    assert sorted(w2.sync({T: range(4)}).acquired) == [(T, s) for s in range(4)]
    # w1 wakes up and still believes it owns slot 0: fencing refuses it
    queue.schedule(T, "j", now, slot=0, client=client)
    with pytest.raises(LeaseLost):
        queue.claim(T, 0, now_ms=now, limit=1, visibility_ms=10, lease_token=w1.token(T, 0),
                    client=client)  # fmt: skip
    assert w1.sync({T: range(4)}).lost == [(T, s) for s in range(4)]
    assert w1.owned(T) == []


def test_renew_reports_lost_leases(client):
    w1 = SlotLeases("w1", client=client)
    w1.sync({T: [0, 1]})
    client.delete(slot_keys(T, 1).lease)
    assert w1.renew() == [(T, 1)] and w1.owned(T) == [0]
    w1.release_all()
    assert client.get(slot_keys(T, 0).lease) is None


def test_singleton_lease(client):
    assert leases.try_singleton("reaper", "w1", 60_000, client=client)
    assert leases.try_singleton("reaper", "w1", 60_000, client=client)  # renewal
    assert not leases.try_singleton("reaper", "w2", 60_000, client=client)
    assert not leases.release_singleton("reaper", "w2", client=client)
    assert leases.release_singleton("reaper", "w1", client=client)
    assert leases.try_singleton("reaper", "w2", 60_000, client=client)


def test_poll_order_rotates_with_the_shared_counter(client):
    orders = [leases.poll_order(T, [3, 5, 7], client=client) for _ in range(3)]
    assert sorted(o[0] for o in orders) == [3, 5, 7]
    assert all(sorted(o) == [3, 5, 7] for o in orders)
