"""Each Lua script through its typed wrapper, asserting on the keyspace (standalone and cluster)."""

import re

import pytest

from reminders.engine import scripts
from reminders.engine.keys import slot_keys
from reminders.engine.scripts import Claimed, LeaseLost

T = "orders.timeout"
VIS = 30_000


@pytest.fixture
def k():
    return slot_keys(T, 0)


def test_enqueue_upserts_due_times(client, k, space):
    assert scripts.enqueue(client, k, [(300, "c"), (100, "a"), (200, "b")]) == 3
    assert scripts.enqueue(client, k, [(50, "c")]) == 0  # moved, not added
    assert space(T).store == {"a": 100, "b": 200, "c": 50}


def test_enqueue_nx_skips_jobs_anywhere_in_the_slot(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now - 10, "inflight"), (now + 10, "stored"), (now - 5, "dead")])
    token = lease(T)
    scripts.claim_due(client, k, token=token, now_ms=now, limit=10, visibility_ms=VIS)
    scripts.nack(client, k, token=token, now_ms=now, failures=[("dead", "x")], max_attempts=1,
                 backoff_base_ms=1, backoff_cap_ms=1)  # fmt: skip
    added = scripts.enqueue(client, k, [(1, "inflight"), (1, "stored"), (1, "dead"), (1, "new")],
                            nx=True)  # fmt: skip
    assert added == 1
    assert space(T).store == {"stored": now + 10, "new": 1}
    assert set(space(T).prepare) == {"inflight"} and set(space(T).dead) == {"dead"}


def test_enqueue_upsert_revives_a_dead_job_with_fresh_attempts(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, "j")])
    token = lease(T)
    scripts.claim_due(client, k, token=token, now_ms=now, limit=1, visibility_ms=VIS)
    scripts.nack(client, k, token=token, now_ms=now, failures=[("j", "boom")], max_attempts=1,
                 backoff_base_ms=1, backoff_cap_ms=1)  # fmt: skip
    assert set(space(T).dead) == {"j"}
    scripts.enqueue(client, k, [(now + 5, "j")])
    assert space(T).store == {"j": now + 5} and space(T).dead == {} and space(T).meta == {}


def test_claim_takes_due_jobs_oldest_first_up_to_the_limit(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now - 1, "b"), (now - 3, "a"), (now, "c"), (now + 1, "future")])
    token = lease(T)
    first = scripts.claim_due(client, k, token=token, now_ms=now, limit=2, visibility_ms=VIS)
    assert first == [Claimed("a", now - 3, 1), Claimed("b", now - 1, 1)]
    second = scripts.claim_due(client, k, token=token, now_ms=now, limit=2, visibility_ms=VIS)
    assert second == [Claimed("c", now, 1)]  # due exactly now counts; the future one stays
    assert scripts.claim_due(client, k, token=token, now_ms=now, limit=2, visibility_ms=VIS) == []
    assert space(T).store == {"future": now + 1}


def test_claim_encodes_deadline_and_attempt_in_the_prepare_score(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, "j")])
    scripts.claim_due(client, k, token=lease(T), now_ms=now, limit=1, visibility_ms=VIS)
    score = space(T).prepare["j"]
    assert score == (now + VIS) * 1000 + 1  # exact: 16 digits, below 2^53
    assert score < 2**53


def test_claim_without_due_times(client, k, lease, now):
    scripts.enqueue(client, k, [(now - 1, "a")])
    got = scripts.claim_due(client, k, token=lease(T), now_ms=now, limit=5, visibility_ms=VIS,
                            with_due=False)  # fmt: skip
    assert got == [Claimed("a", 0, 1)]


def test_large_batches_cross_the_lua_unpack_limit(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now - i, f"j{i}") for i in range(9000)])
    token = lease(T)
    got = scripts.claim_due(client, k, token=token, now_ms=now, limit=9000, visibility_ms=VIS)
    assert len(got) == 9000 and len(space(T).prepare) == 9000
    assert scripts.ack(client, k, token=token, job_ids=[c.job_id for c in got]) == 9000


def test_attempts_count_up_across_nacks_then_dead(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, "j")])
    token = lease(T)
    t = now
    for attempt in (1, 2, 3):
        (claimed,) = scripts.claim_due(client, k, token=token, now_ms=t, limit=1, visibility_ms=VIS)
        assert claimed.attempt == attempt
        result = scripts.nack(client, k, token=token, now_ms=t, failures=[("j", f"err{attempt}")],
                              max_attempts=3, backoff_base_ms=100, backoff_cap_ms=150)  # fmt: skip
        if attempt < 3:
            assert result == scripts.NackResult(1, 0, 0)
            assert space(T).store == {"j": t + min(150, 100 * 2 ** (attempt - 1))}
            t = space(T).store["j"]
    assert result == scripts.NackResult(0, 1, 0)
    assert space(T).dead == {"j": t} and space(T).store == {} and space(T).prepare == {}
    assert space(T).meta == {"a:j": "3", "e:j": "err3"}


def test_nack_of_a_job_no_longer_in_prepare_is_missing(client, k, lease, now):
    result = scripts.nack(client, k, token=lease(T), now_ms=now, failures=[("ghost", "x")],
                          max_attempts=3, backoff_base_ms=1, backoff_cap_ms=1)  # fmt: skip
    assert result == scripts.NackResult(0, 0, 1)


def test_ack_removes_from_prepare_and_forgets_meta(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, "a"), (now, "b")])
    token = lease(T)
    scripts.claim_due(client, k, token=token, now_ms=now, limit=2, visibility_ms=VIS)
    scripts.nack(client, k, token=token, now_ms=now, failures=[("a", "x")], max_attempts=5,
                 backoff_base_ms=0, backoff_cap_ms=0)  # fmt: skip
    scripts.claim_due(client, k, token=token, now_ms=now, limit=2, visibility_ms=VIS)
    assert scripts.ack(client, k, token=token, job_ids=["a", "b", "ghost"]) == 2
    assert space(T).prepare == {} and space(T).meta == {}


def test_reap_moves_only_expired_entries(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, "old")])
    token = lease(T)
    scripts.claim_due(client, k, token=token, now_ms=now, limit=1, visibility_ms=1000)
    scripts.enqueue(client, k, [(now + 500, "young")])
    scripts.claim_due(client, k, token=token, now_ms=now + 500, limit=1, visibility_ms=1000)
    assert scripts.reap(client, k, now_ms=now + 1000, limit=10, max_attempts=3).retried == 0
    assert scripts.reap(client, k, now_ms=now + 1001, limit=10, max_attempts=3).retried == 1
    assert space(T).store == {"old": now + 1001} and set(space(T).prepare) == {"young"}
    assert space(T).meta == {"a:old": "1", "e:old": "visibility timeout", "s:old": "1"}
    (again,) = scripts.claim_due(
        client, k, token=token, now_ms=now + 1001, limit=5, visibility_ms=1
    )
    assert again.attempt == 2


def _crash(client, k, token, now, ids):
    """Claim ``ids`` and let their visibility run out unanswered: the reaper brings them back."""
    got = scripts.claim_due(client, k, token=token, now_ms=now, limit=len(ids), visibility_ms=10)
    assert [c.job_id for c in got] == ids
    assert scripts.reap(client, k, now_ms=now + 11, limit=100, max_attempts=5).retried == len(ids)


def test_reaped_suspects_are_claimed_alone_and_a_batch_stops_before_one(
    client, k, space, lease, now
):
    token = lease(T)
    scripts.enqueue(client, k, [(now, "s1"), (now, "s2")])
    _crash(client, k, token, now, ["s1", "s2"])  # both back in store at now + 11
    scripts.enqueue(client, k, [(now - 5, "a"), (now - 4, "b"), (now + 20, "c"), (now + 21, "d")])
    claim = lambda: scripts.claim_due(client, k, token=token, now_ms=now + 30, limit=10,  # noqa: E731
                                      visibility_ms=VIS, isolate_suspects=True)  # fmt: skip
    assert claim() == [Claimed("a", now - 5, 1), Claimed("b", now - 4, 1)]
    assert claim() == [Claimed("s1", now + 11, 2, True)]
    assert claim() == [Claimed("s2", now + 11, 2, True)]
    assert claim() == [Claimed("c", now + 20, 1), Claimed("d", now + 21, 1)]
    assert claim() == []
    # Answered for (acked), a suspect is forgotten.
    assert scripts.ack(client, k, token=token, job_ids=["s1", "s2"]) == 2
    assert space(T).meta == {}


def test_suspects_flow_with_the_rest_unless_isolated(client, k, lease, now):
    token = lease(T)
    scripts.enqueue(client, k, [(now, "s1"), (now, "s2")])
    _crash(client, k, token, now, ["s1", "s2"])
    got = scripts.claim_due(client, k, token=token, now_ms=now + 30, limit=10, visibility_ms=VIS)
    assert [(c.job_id, c.attempt, c.suspect) for c in got] == [("s1", 2, False), ("s2", 2, False)]


def test_a_nacked_suspect_is_no_longer_isolated(client, k, space, lease, now):
    token = lease(T)
    scripts.enqueue(client, k, [(now, "s"), (now + 20, "t")])
    _crash(client, k, token, now, ["s"])
    (alone,) = scripts.claim_due(client, k, token=token, now_ms=now + 30, limit=10,
                                 visibility_ms=VIS, isolate_suspects=True)  # fmt: skip
    assert alone.suspect
    scripts.nack(client, k, token=token, now_ms=now + 30, failures=[("s", "handler said no")],
                 max_attempts=5, backoff_base_ms=0, backoff_cap_ms=0)  # fmt: skip
    assert "s:s" not in space(T).meta
    got = scripts.claim_due(client, k, token=token, now_ms=now + 40, limit=10, visibility_ms=VIS,
                            isolate_suspects=True)  # fmt: skip
    assert [(c.job_id, c.attempt, c.suspect) for c in got] == [("t", 1, False), ("s", 3, False)]


def test_reap_is_bounded_and_buries_at_max_attempts(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, f"j{i}") for i in range(5)])
    scripts.claim_due(client, k, token=lease(T), now_ms=now, limit=5, visibility_ms=10)
    assert scripts.reap(client, k, now_ms=now + 11, limit=2, max_attempts=1) == scripts.ReapResult(
        0, 2
    )
    assert len(space(T).dead) == 2 and len(space(T).prepare) == 3


def test_requeue_dead_selected_or_oldest(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, f"j{i}") for i in range(4)])
    token = lease(T)
    scripts.claim_due(client, k, token=token, now_ms=now, limit=4, visibility_ms=VIS)
    failures = [(f"j{i}", "bad") for i in range(4)]
    scripts.nack(client, k, token=token, now_ms=now, failures=failures, max_attempts=0,
                 backoff_base_ms=0, backoff_cap_ms=0)  # fmt: skip
    assert scripts.requeue_dead(client, k, now_ms=now + 1, limit=10, job_ids=["j2", "nope"]) == 1
    assert space(T).store == {"j2": now + 1}
    assert scripts.requeue_dead(client, k, now_ms=now + 2, limit=2) == 2
    assert set(space(T).store) == {"j0", "j1", "j2"} and space(T).dead == {"j3": now}
    assert space(T).meta == {"a:j3": "1", "e:j3": "bad"}


def test_purge_dead(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, "a"), (now, "b")])
    token = lease(T)
    scripts.claim_due(client, k, token=token, now_ms=now, limit=2, visibility_ms=VIS)
    scripts.nack(client, k, token=token, now_ms=now, failures=[("a", "x"), ("b", "y")],
                 max_attempts=0, backoff_base_ms=0, backoff_cap_ms=0)  # fmt: skip
    assert scripts.purge_dead(client, k, limit=10, job_ids=["a"]) == 1
    assert set(space(T).dead) == {"b"} and space(T).meta == {"a:b": "1", "e:b": "y"}
    assert scripts.purge_dead(client, k, limit=10) == 1
    assert space(T).dead == {} and space(T).meta == {}


def test_purge_dead_before_removes_only_what_died_before_the_moment(client, k, space, lease, now):
    scripts.enqueue(client, k, [(now, "a"), (now, "b"), (now, "c")])
    token = lease(T)
    scripts.claim_due(client, k, token=token, now_ms=now, limit=3, visibility_ms=VIS)
    for i, job in enumerate("abc"):  # dead at now, now + 10, now + 20
        scripts.nack(client, k, token=token, now_ms=now + 10 * i, failures=[(job, f"e{job}")],
                     max_attempts=0, backoff_base_ms=0, backoff_cap_ms=0)  # fmt: skip
    assert scripts.purge_dead_before(client, k, before_ms=now + 10, limit=10) == 1  # exclusive
    assert set(space(T).dead) == {"b", "c"} and "e:a" not in space(T).meta
    assert scripts.purge_dead_before(client, k, before_ms=now + 21, limit=1) == 1  # bounded
    assert set(space(T).dead) == {"c"} and space(T).meta == {"a:c": "1", "e:c": "ec"}
    assert scripts.purge_dead_before(client, k, before_ms=now, limit=10) == 0


@pytest.mark.parametrize("where", ["store", "prepare", "dead"])
def test_cancel_finds_the_job_in_any_set(client, k, space, lease, now, where):
    scripts.enqueue(client, k, [(now, "j")])
    if where != "store":
        token = lease(T)
        scripts.claim_due(client, k, token=token, now_ms=now, limit=1, visibility_ms=VIS)
    if where == "dead":
        scripts.nack(client, k, token=token, now_ms=now, failures=[("j", "x")], max_attempts=0,
                     backoff_base_ms=0, backoff_cap_ms=0)  # fmt: skip
    assert scripts.cancel(client, k, "j") == where
    assert space(T).store == space(T).prepare == space(T).dead == {} and space(T).meta == {}
    assert scripts.cancel(client, k, "j") is None


def test_a_stale_token_can_neither_claim_ack_nor_nack(client, k, space, now):
    scripts.enqueue(client, k, [(now, "a"), (now, "b")])
    old = scripts.lease_acquire(client, k, holder="w1", ttl_ms=60_000)
    scripts.claim_due(client, k, token=old, now_ms=now, limit=1, visibility_ms=VIS)
    client.delete(k.lease)  # the lease expired ...
    new = scripts.lease_acquire(client, k, holder="w1", ttl_ms=60_000)  # ... even the same worker
    assert new != old and int(new.split(":")[0]) > int(old.split(":")[0])
    before = (space(T).store, space(T).prepare)
    with pytest.raises(LeaseLost):
        scripts.claim_due(client, k, token=old, now_ms=now, limit=5, visibility_ms=VIS)
    with pytest.raises(LeaseLost):
        scripts.ack(client, k, token=old, job_ids=["a"])
    with pytest.raises(LeaseLost):
        scripts.nack(client, k, token=old, now_ms=now, failures=[("a", "x")], max_attempts=5,
                     backoff_base_ms=0, backoff_cap_ms=0)  # fmt: skip
    with pytest.raises(LeaseLost):
        scripts.ack(client, k, token="", job_ids=["a"])
    assert (space(T).store, space(T).prepare) == before
    assert scripts.ack(client, k, token=new, job_ids=["a"]) == 1


def test_lease_scripts(client, k):
    token = scripts.lease_acquire(client, k, holder="w1", ttl_ms=60_000)
    assert scripts.lease_acquire(client, k, holder="w2", ttl_ms=60_000) is None
    assert scripts.lease_acquire(client, k, holder="w1", ttl_ms=60_000, current=token) == token
    assert scripts.lease_renew(client, k.lease, token=token, ttl_ms=90_000)
    assert client.pttl(k.lease) > 60_000
    assert not scripts.lease_renew(client, k.lease, token="9:other", ttl_ms=1)
    assert not scripts.lease_release(client, k.lease, token="9:other")
    assert scripts.lease_release(client, k.lease, token=token)
    assert client.get(k.lease) is None


def test_every_script_documents_its_contract_and_bounds_its_ranges():
    for script in scripts.ALL:
        header = script.text.split("]]")[0]
        assert "KEYS[1]" in header and "ARGV[1]" in header and "Returns" in header, script.name
        assert "'TIME'" not in script.text, script.name
        for call in re.findall(r"redis\.call\('ZRANGEBYSCORE'[^\n]*", script.text):
            assert "'LIMIT'" in call, f"{script.name}: unbounded range"
        for call in re.findall(r"redis\.call\('ZRANGE'[^\n]*", script.text):
            assert "limit - 1" in call, f"{script.name}: unbounded range"
