"""Parcels: a claimed batch as one in-flight entry (claim_parcel, settle_parcel, reap), through
the typed wrappers, asserting on the keyspace (standalone and cluster)."""

import pytest

from reminders.engine import queue, scripts
from reminders.engine.clock import epoch_ms
from reminders.engine.dispatcher import Dispatcher
from reminders.engine.keys import slot_keys
from reminders.engine.scripts import LeaseLost, Parcel
from reminders.engine.topic_model import HANDED_ON, EngineSettings, Topic, TopicSettings

T = "coupon.reminder"
VIS = 30_000


@pytest.fixture
def k():
    return slot_keys(T, 0)


def _settle(client, slot, parcel_id, failures=(), *, now, max_attempts=3):
    return queue.settle_parcels(T, [(slot, parcel_id, list(failures))], now_ms=now,
                                max_attempts=max_attempts, backoff_base_ms=1000,
                                backoff_cap_ms=60_000, client=client)  # fmt: skip


def _in_flight(client, now) -> int:
    return queue.stats(T, [0], now_ms=now, client=client)[0].prepare


def test_a_claim_moves_due_jobs_oldest_first_into_one_prepare_entry(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now - 1, "b"), (now - 3, "a"), (now, "c"), (now + 1, "later")])
    token = lease(T)
    parcel = scripts.claim_parcel(client, k, token=token, now_ms=now, limit=10, visibility_ms=VIS)
    assert parcel == Parcel(0, now, 3, "a,b,c", {})  # the first parcel is numbered from now
    assert parcel.job_ids() == ["a", "b", "c"]
    assert space(T).store == {"later": now + 1}
    assert space(T).prepare == {f"#{now}": (now + VIS) * 1000 + 1}
    assert space(T).parcels == {"#seq": str(now), "#n": "3", str(now): "a,b,c"}
    assert _in_flight(client, now) == 3  # jobs, not prepare entries
    assert scripts.claim_parcel(client, k, token=token, now_ms=now, limit=10,
                                visibility_ms=VIS) is None  # fmt: skip


def test_a_claim_is_bounded_and_fenced(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now - i, f"j{i}") for i in range(5)])
    token = lease(T)
    parcel = scripts.claim_parcel(client, k, token=token, now_ms=now, limit=2, visibility_ms=VIS)
    assert parcel.job_ids() == ["j4", "j3"] and len(space(T).store) == 3
    with pytest.raises(LeaseLost):
        scripts.claim_parcel(client, k, token="1:someone-else", now_ms=now, limit=2,
                             visibility_ms=VIS)  # fmt: skip
    assert len(space(T).store) == 3  # nothing moved


def test_settling_drops_the_parcel_and_retries_only_the_failed(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, j) for j in ("a", "b", "c")])
    parcel = scripts.claim_parcel(client, k, token=lease(T), now_ms=now, limit=10,
                                  visibility_ms=VIS)  # fmt: skip
    result = _settle(client, 0, parcel.parcel_id, [("b", "HTTP 503"), ("zz", "not in it")],
                     now=now)  # fmt: skip
    assert (result.retried, result.dead, result.missing) == (1, 0, 0)
    assert space(T).store == {"b": now + 1000}  # backoff base, attempt 1
    assert space(T).prepare == {}
    assert space(T).parcels == {"#seq": str(now), "#n": "0"}
    assert space(T).meta == {"a:b": "1", "e:b": "HTTP 503"}  # the done ones have none
    assert _in_flight(client, now) == 0


def test_attempts_count_on_until_a_job_is_dead(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, "a"), (now, "b")])
    token = lease(T)
    for attempt in (1, 2, 3):
        parcel = scripts.claim_parcel(client, k, token=token, now_ms=now + 10**6, limit=10,
                                      visibility_ms=VIS)  # fmt: skip
        assert parcel.job_ids() == ["a"] if attempt > 1 else ["a", "b"]
        assert parcel.attempts == ({} if attempt == 1 else {"a": attempt})
        failed = [("a", f"failure {attempt}")]
        result = _settle(client, 0, parcel.parcel_id, failed, now=now, max_attempts=3)
        assert (result.retried, result.dead) == ((1, 0) if attempt < 3 else (0, 1))
    assert space(T).dead == {"a": now} and space(T).store == {}
    assert space(T).meta == {"a:a": "3", "e:a": "failure 3"}
    (dead,) = queue.list_dead(T, 0, client=client)
    assert (dead.job_id, dead.attempts, dead.last_error) == ("a", 3, "failure 3")


def test_an_expired_parcel_is_reaped_whole_and_its_late_settle_does_nothing(
    client, k, space, lease, now
):
    scripts.enqueue(client, k, [(now, "a"), (now, "b")])
    token = lease(T)
    parcel = scripts.claim_parcel(client, k, token=token, now_ms=now, limit=10, visibility_ms=VIS)
    assert queue.reap(T, [0], now_ms=now + VIS - 1, limit=10, max_attempts=2,
                      client=client) == scripts.ReapResult(0, 0)  # not yet  # fmt: skip
    reaped = queue.reap(T, [0], now_ms=now + VIS + 1, limit=10, max_attempts=2, client=client)
    assert (reaped.retried, reaped.dead) == (2, 0)
    assert space(T).store == {"a": now + VIS + 1, "b": now + VIS + 1}
    assert space(T).parcels == {"#seq": str(now), "#n": "0"} and space(T).prepare == {}
    assert space(T).meta["s:a"] == "1" and space(T).meta["a:a"] == "1"  # suspects, attempt 1
    # The deliverer comes back late: the parcel is gone, so it settles nothing twice.
    late = _settle(client, 0, parcel.parcel_id, [("a", "x")], now=now + VIS + 2)
    assert (late.retried, late.dead, late.missing) == (0, 0, 1)
    assert space(T).store == {"a": now + VIS + 1, "b": now + VIS + 1}
    # Claimed again and timed out again: dead at max_attempts, reported for the owner.
    again = scripts.claim_parcel(client, k, token=token, now_ms=now + VIS + 1, limit=10,
                                 visibility_ms=VIS)  # fmt: skip
    assert again.attempts == {"a": 2, "b": 2}
    reaped = queue.reap(T, [0], now_ms=now + 3 * VIS, limit=10, max_attempts=2, client=client)
    assert (reaped.retried, reaped.dead, sorted(reaped.dead_ids)) == (0, 2, ["a", "b"])
    assert set(space(T).dead) == {"a", "b"}


def test_a_parcel_id_is_not_given_again_after_redis_lost_its_data(client, k, space, lease, now):
    """A deliverer may still hold a parcel from before a flush: the parcel numbered after the
    flush must not carry its id, or the stale settle would settle the new one."""
    scripts.enqueue(client, k, [(now, "a")])
    token = lease(T)
    old = scripts.claim_parcel(client, k, token=token, now_ms=now, limit=10, visibility_ms=VIS)
    client.delete(k.store, k.prepare, k.parcels, k.meta)  # the data is gone; the lease is not
    scripts.enqueue(client, k, [(now + 5, "b")])
    new = scripts.claim_parcel(client, k, token=token, now_ms=now + 5, limit=10,
                               visibility_ms=VIS)  # fmt: skip
    assert new.parcel_id != old.parcel_id

    stale = _settle(client, 0, old.parcel_id, [("a", "x")], now=now + 6)
    assert stale.missing == 1
    assert _in_flight(client, now) == 1 and space(T).parcels[str(new.parcel_id)] == "b"


def test_a_reap_is_bounded_by_jobs_and_takes_a_parcel_whole(client, k, space, lease, now):
    """The limit counts jobs, not prepare entries: after a Celery outage, a thousand parcels
    of thousands of ids must not move in one script call (Redis would stall past the lease)."""
    scripts.enqueue(client, k, [(now - 10 + i, f"j{i}") for i in range(9)])
    token = lease(T)
    for _ in range(3):
        scripts.claim_parcel(client, k, token=token, now_ms=now, limit=3, visibility_ms=VIS)
    assert len(space(T).prepare) == 3

    first = queue.reap(T, [0], now_ms=now + VIS + 1, limit=4, max_attempts=3, client=client)
    assert first.retried == 6  # two parcels: the second starts below the limit, goes whole
    assert len(space(T).prepare) == 1 and _in_flight(client, now) == 3
    assert set(space(T).store) == {f"j{i}" for i in range(6)}
    second = queue.reap(T, [0], now_ms=now + VIS + 1, limit=4, max_attempts=3, client=client)
    assert second.retried == 3 and space(T).prepare == {}


def test_a_parcel_handler_that_fails_retries_the_whole_parcel(redis_client):
    queue.schedule_many(T, [(f"j{i}", epoch_ms() - 10, 0) for i in range(5)], client=redis_client)
    answers = iter([RuntimeError("handler bug"), HANDED_ON])
    seen = []

    def handler(parcel, slot):
        seen.append(parcel)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    topic = Topic(T, handler, slots=1, pass_slot=True, parcels=True, backoff_base_ms=0,
                  backoff_cap_ms=0)  # fmt: skip
    config = lambda: EngineSettings(  # noqa: E731
        topics={T: TopicSettings(slots=1, backoff_base_ms=0, backoff_cap_ms=0)}
    )
    dispatcher = Dispatcher([topic], config=config, client=redis_client)
    try:
        first = dispatcher.run_once()
        assert (first.claimed, first.retried) == (5, 5)
        stats = queue.stats(T, [0], now_ms=epoch_ms(), client=redis_client)[0]
        assert (stats.store, stats.prepare) == (5, 0)  # back in store, none left for the reaper
        second = dispatcher.run_once()
        assert second.claimed == 5 and seen[1].attempts == {f"j{i}": 2 for i in range(5)}
        stats = queue.stats(T, [0], now_ms=epoch_ms(), client=redis_client)[0]
        assert (stats.store, stats.prepare) == (0, 5)  # handed on: in flight until settled
    finally:
        dispatcher.shutdown()


def test_in_parcels_lists_the_ids_in_flight_per_slot(client, lease, now):
    for slot in (0, 1):
        k = slot_keys(T, slot)
        scripts.enqueue(client, k, [(now - 2, f"x{slot}"), (now - 1, f"y{slot}"), (now, "1"),
                                    (now, "2")])  # fmt: skip
        scripts.claim_parcel(client, k, token=lease(T, slot), now_ms=now, limit=2,
                             visibility_ms=VIS)  # fmt: skip
    # The parcels hashes also hold "#seq" and "#n" = 2: counters, not ids in flight.
    assert queue.in_parcels(T, [0, 1, 2], client=client) == {0: {"x0", "y0"}, 1: {"x1", "y1"}}
