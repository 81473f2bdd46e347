"""The claim gate in Redis (couponcenter.coupons.gate), on real Redis and real PostgreSQL.

Its answers, the arithmetic of holds (reserve, settle, release), the rebuild that is the
reconcile, concurrent claims that never pass the stock or a user's limit, the build after the
gate's keys are lost, the hooks of coupon changes, the upkeep, and an unreachable Redis.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from couponcenter.core.redis import get_redis, is_cluster
from couponcenter.coupons import gate, services
from couponcenter.coupons.gate import (
    GatePass,
    GateRefusal,
    gate_build,
    gate_build_soon,
    gate_claim,
    gate_release,
    gate_settle,
    gate_sold_out,
    gate_user_full,
    gates_maintain,
)
from couponcenter.coupons.models import CouponStockShard, UserCoupon
from reminders.runtime.worker import GateUpkeep
from tests.reminders.engine import conftest as engine_conftest

# The engine tests' session-wide 3-master Redis Cluster.
redis_cluster, cluster_client = engine_conftest.redis_cluster, engine_conftest.cluster_client

WAIT_S = 60  # a thread that never ends fails the test instead of hanging it


def now_ms() -> int:
    return int(timezone.now().timestamp() * 1000)


def new_coupon(**fields):
    values = {
        "name": "Rush",
        "claim_opens_at": timezone.now() - timedelta(minutes=1),
        "total_stock": 10,
        "valid_for": timedelta(days=7),
    }
    values.update(fields)
    return services.coupon_create(**values)


def state(redis_client, coupon_id: int) -> tuple[dict, dict, int]:
    """(the gate hash, users -> claims, holds in flight), as ints."""
    keys = gate._keys(coupon_id)
    fields = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys[0]).items()}
    users = {int(k): int(v) for k, v in redis_client.hgetall(keys[1]).items()}
    return fields, users, redis_client.zcard(keys[2])


def pg_claimed(coupon_id: int) -> int:
    shards = CouponStockShard.objects.filter(coupon_id=coupon_id)
    return sum(shard.claimed for shard in shards)


def pg_users(coupon_id: int) -> dict[int, int]:
    return dict(
        Counter(UserCoupon.objects.filter(coupon_id=coupon_id).values_list("user_id", flat=True))
    )


def delete_gate(redis_client, coupon_id: int) -> None:
    assert redis_client.delete(*gate._keys(coupon_id))


@pytest.mark.django_db
def test_each_refusal_and_a_pass(redis_client):
    opens = timezone.now() - timedelta(minutes=1)
    closes = opens + timedelta(hours=1)
    coupon = new_coupon(claim_opens_at=opens, claim_closes_at=closes, total_stock=2)
    assert gate_build(coupon_id=coupon.pk)
    opens_ms, closes_ms = int(opens.timestamp() * 1000), int(closes.timestamp() * 1000)

    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=opens_ms - 1) == GateRefusal(
        "not_open", opens_ms=opens_ms
    )
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=closes_ms) == GateRefusal(
        "closed", closes_ms=closes_ms
    )
    first = gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=opens_ms)
    assert isinstance(first, GatePass) and first.seq == 1
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=opens_ms) == GateRefusal(
        "limit_reached"
    )
    assert isinstance(gate_claim(coupon_id=coupon.pk, user_id=2, now_ms=opens_ms), GatePass)
    assert gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=opens_ms) == GateRefusal("sold_out")

    services.coupon_cancel(coupon=coupon)  # its on-commit hook needs a real commit: build here
    gate_build(coupon_id=coupon.pk)
    assert gate_claim(coupon_id=coupon.pk, user_id=4, now_ms=opens_ms) == GateRefusal("cancelled")


@pytest.mark.django_db
def test_the_closing_time_is_the_earlier_of_the_window_and_the_validity(redis_client):
    expires = timezone.now() + timedelta(minutes=30)
    coupon = new_coupon(
        claim_closes_at=timezone.now() + timedelta(hours=1), expires_at=expires, valid_for=None
    )
    gate_build(coupon_id=coupon.pk)
    expires_ms = int(expires.timestamp() * 1000)
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=expires_ms) == GateRefusal(
        "closed", closes_ms=expires_ms
    )


@pytest.mark.django_db
def test_reserve_settle_and_release(redis_client):
    coupon = new_coupon(total_stock=5, per_user_limit=2)
    gate_build(coupon_id=coupon.pk)
    t = now_ms()

    a = gate_claim(coupon_id=coupon.pk, user_id=7, now_ms=t)
    b = gate_claim(coupon_id=coupon.pk, user_id=7, now_ms=t)
    assert (a.seq, b.seq) == (1, 2) and a.hold != b.hold
    fields, users, held = state(redis_client, coupon.pk)
    assert (fields["taken"], users, held) == ("2", {7: 2}, 2)

    gate_release(coupon_id=coupon.pk, user_id=7, hold=b.hold)
    gate_release(coupon_id=coupon.pk, user_id=7, hold=b.hold)  # a second time gives nothing
    fields, users, held = state(redis_client, coupon.pk)
    assert (fields["taken"], users, held) == ("1", {7: 1}, 1)
    again = gate_claim(coupon_id=coupon.pk, user_id=7, now_ms=t)
    assert again.seq == 2  # the released claim number is free again

    gate_settle(coupon_id=coupon.pk, holds=[a.hold])  # committed: the unit stays taken
    fields, users, held = state(redis_client, coupon.pk)
    assert (fields["taken"], users, held) == ("2", {7: 2}, 1)
    gate_release(coupon_id=coupon.pk, user_id=7, hold=a.hold)  # settled: nothing comes back
    assert state(redis_client, coupon.pk)[0]["taken"] == "2"

    gate_release(coupon_id=coupon.pk, user_id=7, hold=again.hold)
    fields, users, held = state(redis_client, coupon.pk)
    assert (fields["taken"], users, held) == ("1", {7: 1}, 0)


@pytest.mark.django_db
def test_postgresql_refusals_correct_the_gate(redis_client):
    coupon = new_coupon(total_stock=5, per_user_limit=3)
    gate_build(coupon_id=coupon.pk)
    t = now_ms()
    assert isinstance(gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=t), GatePass)

    gate_user_full(coupon_id=coupon.pk, user_id=1)
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=t) == GateRefusal("limit_reached")
    assert isinstance(gate_claim(coupon_id=coupon.pk, user_id=2, now_ms=t), GatePass)
    gate_sold_out(coupon_id=coupon.pk)
    assert state(redis_client, coupon.pk)[0]["taken"] == "5"
    assert gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=t) == GateRefusal("sold_out")


@pytest.mark.django_db
def test_the_reconcile_drops_stale_holds_and_counts_what_postgresql_holds(redis_client, settings):
    coupon = new_coupon(total_stock=10, per_user_limit=2)
    for user_id in (1, 2, 2):
        services.coupon_claim(coupon_id=coupon.pk, user_id=user_id)
    gate_build(coupon_id=coupon.pk)
    fields, users, held = state(redis_client, coupon.pk)
    assert (fields["taken"], users, held) == ("3", {1: 1, 2: 2}, 0)
    t = now_ms()

    # Two claims whose process died between the gate and PostgreSQL: never settled nor released.
    lost = [gate_claim(coupon_id=coupon.pk, user_id=u, now_ms=t) for u in (3, 4)]
    # One that committed but whose settle never reached Redis.
    unsettled = gate_claim(coupon_id=coupon.pk, user_id=5, now_ms=t)
    services.coupon_claim(coupon_id=coupon.pk, user_id=5)
    assert state(redis_client, coupon.pk)[0]["taken"] == "6"  # 4 in PostgreSQL
    assert gates_maintain() == []  # holds in flight and young: nothing to do yet

    settings.GATE_HOLD_STALE_S = 0
    assert gates_maintain() == [coupon.pk]
    fields, users, held = state(redis_client, coupon.pk)
    assert int(fields["taken"]) == pg_claimed(coupon.pk) == 4
    assert users == pg_users(coupon.pk) == {1: 1, 2: 2, 5: 1}
    assert held == 0
    # The dropped holds give nothing back when their claims report at last.
    for user_id, hold in zip((3, 4, 5), [*lost, unsettled], strict=True):
        gate_release(coupon_id=coupon.pk, user_id=user_id, hold=hold.hold)
    assert state(redis_client, coupon.pk)[0]["taken"] == "4"


@pytest.mark.django_db
def test_a_rebuild_counts_holds_from_after_its_snapshot_only(redis_client):
    coupon = new_coupon(total_stock=10)
    gate_build(coupon_id=coupon.pk)
    early = gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=now_ms())
    gate_build(coupon_id=coupon.pk)  # the hold may or may not be in the snapshot: dropped
    fields, users, held = state(redis_client, coupon.pk)
    assert (fields["taken"], users, held) == ("0", {}, 0)
    late = gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=now_ms())
    assert late.seq == 1 and early.hold != late.hold


@pytest.mark.django_db
def test_drift_while_nothing_is_in_flight_is_reconciled(redis_client):
    coupon = new_coupon(total_stock=10)
    gate_build(coupon_id=coupon.pk)
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)  # past the gate: it never knew
    assert state(redis_client, coupon.pk)[0]["taken"] == "0"
    assert gates_maintain() == [coupon.pk]
    fields, users, _ = state(redis_client, coupon.pk)
    assert (fields["taken"], users) == ("1", {1: 1})
    assert gates_maintain() == []


def burst(coupon_id: int, user_ids: list[int], threads: int = 8) -> list[tuple[int, object]]:
    """Every user id claimed at the gate from ``threads`` threads started together."""
    results: list[tuple[int, object]] = []
    start = threading.Barrier(threads)
    lock = threading.Lock()
    t = now_ms()

    def run(part: list[int]) -> None:
        start.wait(WAIT_S)
        mine = [(u, gate_claim(coupon_id=coupon_id, user_id=u, now_ms=t)) for u in part]
        with lock:
            results.extend(mine)

    workers = [threading.Thread(target=run, args=(user_ids[i::threads],)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT_S)
    assert len(results) == len(user_ids)
    return results


@pytest.mark.django_db
def test_a_concurrent_burst_never_passes_the_stock(redis_client):
    coupon = new_coupon(total_stock=30, per_user_limit=2)
    gate_build(coupon_id=coupon.pk)
    results = burst(coupon.pk, [u for u in range(1, 41) for _ in range(3)])
    passes = Counter(u for u, answer in results if isinstance(answer, GatePass))
    assert sum(passes.values()) == 30
    assert max(passes.values()) <= 2
    refusals = Counter(a.code for _, a in results if isinstance(a, GateRefusal))
    assert refusals["sold_out"] + refusals["limit_reached"] == len(results) - 30
    assert refusals["sold_out"] > 0
    assert state(redis_client, coupon.pk)[0]["taken"] == "30"


@pytest.mark.django_db
def test_a_concurrent_burst_never_passes_a_users_limit(redis_client):
    coupon = new_coupon(total_stock=1000, per_user_limit=3)
    gate_build(coupon_id=coupon.pk)
    results = burst(coupon.pk, [u for u in range(1, 21) for _ in range(8)])
    passes = Counter(u for u, answer in results if isinstance(answer, GatePass))
    assert passes == {u: 3 for u in range(1, 21)}
    seqs = {(u, a.seq) for u, a in results if isinstance(a, GatePass)}
    assert seqs == {(u, s) for u in range(1, 21) for s in (1, 2, 3)}


@pytest.mark.django_db(transaction=True)
def test_a_lost_gate_answers_none_until_it_is_built_again(redis_client):
    coupon = new_coupon(total_stock=5)  # the create's hook builds the gate
    services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    assert gate_claim(coupon_id=coupon.pk, user_id=2, now_ms=now_ms()).seq == 1
    delete_gate(redis_client, coupon.pk)  # what a FLUSHDB does to it

    assert gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=now_ms()) is None
    build = gate_build_soon(coupon_id=coupon.pk)
    assert build is not None
    build.join(WAIT_S)
    assert not build.is_alive()

    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=now_ms()) == GateRefusal(
        "limit_reached"
    )
    assert gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=now_ms()).seq == 1
    fields, users, _ = state(redis_client, coupon.pk)
    assert (fields["taken"], users) == ("2", {1: 1, 3: 1})  # user 2's hold died with the gate


@pytest.mark.django_db(transaction=True)
def test_one_build_at_a_time_across_processes(redis_client):
    coupon = new_coupon()
    lock = f"{gate._keys(coupon.pk)[0]}:building"
    redis_client.set(lock, "another process", px=30_000)
    assert gate_build_soon(coupon_id=coupon.pk) is None
    redis_client.delete(lock)
    build = gate_build_soon(coupon_id=coupon.pk)
    build.join(WAIT_S)
    assert not redis_client.exists(lock)  # released by its build


@pytest.mark.django_db(transaction=True)
def test_coupon_changes_rebuild_the_gate_on_commit(redis_client):
    coupon = new_coupon(total_stock=2)
    t = now_ms()
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=t).seq == 1
    services.coupon_claim(coupon_id=coupon.pk, user_id=2)
    assert state(redis_client, coupon.pk)[0]["stock"] == "2"

    services.coupon_update(coupon=coupon, total_stock=5)
    fields, users, _ = state(redis_client, coupon.pk)
    assert (fields["stock"], fields["taken"], users) == ("5", "1", {2: 1})

    later = timezone.now() + timedelta(hours=1)
    services.coupon_update(coupon=coupon, claim_opens_at=later)
    assert gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=now_ms()) == GateRefusal(
        "not_open", opens_ms=int(later.timestamp() * 1000)
    )

    services.coupon_cancel(coupon=coupon)
    assert gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=now_ms()) == GateRefusal("cancelled")


@pytest.mark.django_db(transaction=True)
def test_a_change_of_nothing_the_gate_holds_leaves_it_alone(redis_client):
    coupon = new_coupon(total_stock=5)
    in_flight = gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=now_ms())
    services.coupon_update(coupon=coupon, name="Renamed", description="No rebuild for this")
    assert state(redis_client, coupon.pk)[2] == 1  # a rebuild would have dropped the hold
    services.coupon_update(coupon=coupon, per_user_limit=2)
    fields, _, held = state(redis_client, coupon.pk)
    assert (fields["limit"], held) == ("2", 0)
    gate_release(coupon_id=coupon.pk, user_id=1, hold=in_flight.hold)


@pytest.mark.django_db(transaction=True)
def test_a_redeem_leaves_the_gate_alone(redis_client):
    coupon = new_coupon(total_stock=5)
    claimed = services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    gate_build(coupon_id=coupon.pk)
    before = state(redis_client, coupon.pk)
    services.coupon_redeem(user_coupon_id=claimed.pk, user_id=1)
    assert state(redis_client, coupon.pk) == before
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=now_ms()) == GateRefusal(
        "limit_reached"
    )


@pytest.mark.django_db
def test_upkeep_builds_coupons_opening_soon_and_skips_those_far_away(redis_client, settings):
    settings.GATE_BUILD_AHEAD_S = 600
    now = timezone.now()
    soon = new_coupon(claim_opens_at=now + timedelta(minutes=5))  # no commit: no hook build
    far = new_coupon(claim_opens_at=now + timedelta(days=2))
    over = new_coupon(claim_closes_at=now + timedelta(minutes=1))

    assert gates_maintain(now=now + timedelta(minutes=2)) == [soon.pk]
    assert gate_claim(coupon_id=soon.pk, user_id=1, now_ms=now_ms()).code == "not_open"
    assert gate_claim(coupon_id=far.pk, user_id=1, now_ms=now_ms()) is None
    assert gate_claim(coupon_id=over.pk, user_id=1, now_ms=now_ms()) is None
    assert gates_maintain(now=now + timedelta(minutes=3)) == []  # built already


@pytest.mark.django_db
def test_upkeep_rebuilds_a_gate_that_differs_from_its_coupon(redis_client):
    coupon = new_coupon(total_stock=5)
    gate_build(coupon_id=coupon.pk)
    services.coupon_update(coupon=coupon, total_stock=8)  # no commit: its hook never ran
    assert state(redis_client, coupon.pk)[0]["stock"] == "5"
    assert gates_maintain() == [coupon.pk]
    assert state(redis_client, coupon.pk)[0]["stock"] == "8"


@pytest.mark.django_db(transaction=True)
def test_the_worker_runs_the_upkeep_once_per_interval_across_processes(redis_client, settings):
    settings.GATE_MAINTAIN_INTERVAL_S = 3600
    coupon = new_coupon()
    delete_gate(redis_client, coupon.pk)
    first, second = GateUpkeep(background=True), GateUpkeep(background=True)
    try:
        running = first()
        assert running is not None
        assert running.result(timeout=WAIT_S) == [coupon.pk]
        assert second() is None and first() is None  # this interval's turn is taken
    finally:
        first.close()
        second.close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.django_db
def test_an_unreachable_redis_sends_claims_to_postgresql(settings):
    coupon = new_coupon()
    settings.REDIS_URL = f"redis://127.0.0.1:{closed_port()}/0"
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=now_ms()) is None
    # The rest neither raises nor waits for it.
    gate_settle(coupon_id=coupon.pk, holds=["1:x"])
    gate_release(coupon_id=coupon.pk, user_id=1, hold="1:x")
    gate_sold_out(coupon_id=coupon.pk)
    assert gate_build(coupon_id=coupon.pk) is False
    assert gate_build_soon(coupon_id=coupon.pk) is None
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=now_ms()) is None


@pytest.mark.cluster
@pytest.mark.django_db
def test_the_gate_on_a_redis_cluster(cluster_client, settings):
    """Every key of a coupon's gate in one slot: the scripts, the chunked build and the upkeep's
    pipeline over many slots work on a cluster as on one server."""
    node = cluster_client.get_primaries()[0]
    settings.REDIS_URL = f"redis+cluster://{node.host}:{node.port}"
    assert is_cluster(get_redis())
    coupons = [new_coupon(total_stock=3) for _ in range(6)]  # their ids land on several nodes
    assert len({cluster_client.keyslot(key) for key in gate._keys(coupons[0].pk)}) == 1
    for coupon in coupons:
        services.coupon_claim(coupon_id=coupon.pk, user_id=1)
    assert sorted(gates_maintain()) == sorted(c.pk for c in coupons)
    t = now_ms()
    for coupon in coupons:
        assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=t) == GateRefusal("limit_reached")
        passed = gate_claim(coupon_id=coupon.pk, user_id=2, now_ms=t)
        gate_release(coupon_id=coupon.pk, user_id=2, hold=passed.hold)
        assert gate_claim(coupon_id=coupon.pk, user_id=2, now_ms=t).seq == 1
        assert gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=t).seq == 1
        assert gate_claim(coupon_id=coupon.pk, user_id=4, now_ms=t) == GateRefusal("sold_out")
    settings.GATE_HOLD_STALE_S = 0
    assert sorted(gates_maintain()) == sorted(c.pk for c in coupons)
    for coupon in coupons:
        fields, users, held = state(get_redis(), coupon.pk)
        assert (fields["taken"], users, held) == ("1", {1: 1}, 0)


@pytest.mark.django_db
def test_a_coupon_wide_refusal_is_answered_again_by_the_process_until_a_unit_comes_back(
    redis_client, settings
):
    settings.GATE_LOCAL_MS = 60_000  # nothing in this test waits for it to lapse
    coupon = new_coupon(total_stock=1)
    gate_build(coupon_id=coupon.pk)
    winner = gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=now_ms())
    assert isinstance(winner, GatePass)
    assert gate_claim(coupon_id=coupon.pk, user_id=2, now_ms=now_ms()) == GateRefusal("sold_out")

    # Redis is not asked again: even with the gate gone, the process answers sold out itself.
    delete_gate(redis_client, coupon.pk)
    assert gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=now_ms()) == GateRefusal("sold_out")
    # A per-user refusal is never remembered, and a unit given back forgets the coupon's.
    gate_build(coupon_id=coupon.pk)
    held = gate_claim(coupon_id=coupon.pk, user_id=4, now_ms=now_ms())
    assert isinstance(held, GatePass)
    assert gate_claim(coupon_id=coupon.pk, user_id=5, now_ms=now_ms()) == GateRefusal("sold_out")
    gate_release(coupon_id=coupon.pk, user_id=4, hold=held.hold)
    assert isinstance(gate_claim(coupon_id=coupon.pk, user_id=5, now_ms=now_ms()), GatePass)


@pytest.mark.django_db
def test_a_remembered_not_open_ends_at_the_opening_it_names(redis_client, settings):
    settings.GATE_LOCAL_MS = 60_000
    opens = timezone.now() + timedelta(minutes=5)
    coupon = new_coupon(claim_opens_at=opens)
    gate_build(coupon_id=coupon.pk)
    opens_ms = int(opens.timestamp() * 1000)
    early = GateRefusal("not_open", opens_ms=opens_ms)
    assert gate_claim(coupon_id=coupon.pk, user_id=1, now_ms=opens_ms - 1000) == early
    assert gate_claim(coupon_id=coupon.pk, user_id=2, now_ms=opens_ms - 1) == early
    assert isinstance(gate_claim(coupon_id=coupon.pk, user_id=3, now_ms=opens_ms), GatePass)
