"""The queue API: bulk scheduling, per-slot grouping, stats, dead letters and slot-count changes."""

import pytest

from reminders.engine import queue
from reminders.engine.keys import slot_for
from reminders.engine.topic_model import Topic, TopicSettings, get_topic, register_topic

T = "coupon.reminder"


def test_slot_for_is_crc32_masked_to_a_power_of_two():
    assert slot_for(42, 1) == 0
    assert all(0 <= slot_for(user, 16) < 16 for user in range(1000))
    assert slot_for("42", 64) == slot_for(42, 64)  # the basis is hashed as text
    assert slot_for(42, 64) & 15 == slot_for(42, 16)  # a smaller layout is a prefix of a larger


def test_schedule_many_groups_per_slot(client, space, now):
    items = [(f"j{i}", now + i, slot_for(i, 8)) for i in range(5000)]
    assert queue.schedule_many(T, items, client=client) == 5000
    stats = queue.stats(T, range(8), now_ms=now + 4999, client=client)
    assert sum(s.store for s in stats) == 5000 and all(s.store > 400 for s in stats)
    for job_id, due, slot in items[:50]:
        assert space(T, slot).store[job_id] == due
    assert queue.schedule_many(T, items[:10], nx=True, client=client) == 0


def test_schedule_then_cancel_by_stored_slot(client, now):
    slot = slot_for(7, 4)
    assert queue.schedule(T, "sub-1", now, slot=slot, client=client)
    assert not queue.schedule(T, "sub-1", now + 5, slot=slot, client=client)  # moved
    assert queue.cancel(T, "sub-1", slot=slot, client=client) == "store"
    assert queue.cancel(T, "sub-1", slot=slot, client=client) is None


def test_claim_ack_nack_through_the_queue_api(client, lease, now, space):
    queue.schedule_many(T, [(f"j{i}", now - i, 0) for i in range(10)], client=client)
    token = lease(T)
    got = queue.claim(T, 0, now_ms=now, limit=4, visibility_ms=1000, lease_token=token,
                      client=client)  # fmt: skip
    assert [c.job_id for c in got] == ["j9", "j8", "j7", "j6"]
    assert queue.ack(T, 0, ["j9", "j8"], lease_token=token, client=client) == 2
    result = queue.nack(T, 0, [("j7", "timeout")], now_ms=now, max_attempts=3, backoff_base_ms=10,
                        backoff_cap_ms=10, lease_token=token, client=client)  # fmt: skip
    assert result.retried == 1
    assert queue.bury(T, 0, [("j6", "bad payload")], now_ms=now, lease_token=token,
                      client=client).dead == 1  # fmt: skip
    assert space(T).store["j7"] == now + 10 and space(T).prepare == {}
    (dead,) = queue.list_dead(T, 0, client=client)
    assert dead == queue.DeadEntry("j6", now, 1, "bad payload")


def test_stats_report_backlog(client, lease, now):
    queue.schedule_many(T, [("late", now - 500, 1), ("due", now, 1), ("later", now + 9, 1)],
                        client=client)  # fmt: skip
    queue.schedule_many(T, [("x", now - 1, 1)], client=client)
    queue.claim(T, 1, now_ms=now, limit=1, visibility_ms=10, lease_token=lease(T, 1), client=client)
    (s0, s1) = queue.stats(T, [0, 1], now_ms=now, client=client)
    assert s0 == queue.SlotStats(T, 0, 0, 0, 0, 0, 0)
    assert s1 == queue.SlotStats(T, 1, store=3, due=2, oldest_overdue_ms=1, prepare=1, dead=0)
    assert queue.earliest_due(T, [0, 1], client=client) == now - 1
    assert queue.earliest_due(T, [0], client=client) is None


def test_list_dead_pages_newest_first_and_requeue_purge(client, lease, now):
    queue.schedule_many(T, [(f"j{i}", now, 0) for i in range(5)], client=client)
    token = lease(T)
    queue.claim(T, 0, now_ms=now, limit=5, visibility_ms=10, lease_token=token, client=client)
    for i in range(5):
        queue.bury(T, 0, [(f"j{i}", f"e{i}")], now_ms=now + i, lease_token=token, client=client)
    page = queue.list_dead(T, 0, offset=1, limit=2, client=client)
    assert [(d.job_id, d.died_ms, d.last_error) for d in page] == [
        ("j3", now + 3, "e3"),
        ("j2", now + 2, "e2"),
    ]
    assert queue.requeue_dead(T, 0, now_ms=now, job_ids=["j4"], client=client) == 1
    assert queue.purge_dead(T, 0, job_ids=["j0"], client=client) == 1
    assert [d.job_id for d in queue.list_dead(T, 0, client=client)] == ["j3", "j2", "j1"]
    assert queue.requeue_dead(T, 0, now_ms=now, limit=2, client=client) == 2  # the oldest two


def test_reap_over_many_slots(client, lease, now):
    queue.schedule_many(T, [(f"j{s}", now, s) for s in range(4)], client=client)
    for s in range(4):
        queue.claim(T, s, now_ms=now, limit=1, visibility_ms=5, lease_token=lease(T, s),
                    client=client)  # fmt: skip
    assert (
        queue.reap(T, range(4), now_ms=now + 6, limit=10, max_attempts=5, client=client).retried
        == 4
    )
    assert sum(s.store for s in queue.stats(T, range(4), now_ms=now, client=client)) == 4


def test_slot_count_change_keeps_every_entry_reachable(client, lease, now):
    old = {f"u{u}": slot_for(u, 16) for u in range(200)}
    queue.record_layout(T, 16, client=client)
    queue.schedule_many(T, [(job, now, slot) for job, slot in old.items()], client=client)
    # the operator shrinks to 4 slots: new jobs go to the new layout ...
    queue.record_layout(T, 4, client=client)
    queue.schedule(T, "new", now, slot=slot_for(999, 4), client=client)
    # ... but workers keep serving 16 until the old slots are drained
    assert queue.served_slot_count(T, 4, client=client) == 16
    assert queue.prune_layouts(T, 4, client=client) == []
    # a cancel finds its entry through the stored slot, or by trying every live layout
    assert queue.cancel(T, "u1", slot=old["u1"], client=client) == "store"
    assert queue.cancel_anywhere(T, "u2", slot_basis=2, client=client) == "store"
    for slot in range(16):
        token = lease(T, slot)
        while got := queue.claim(T, slot, now_ms=now, limit=50, visibility_ms=10, lease_token=token,
                                 client=client):  # fmt: skip
            queue.ack(T, slot, [c.job_id for c in got], lease_token=token, client=client)
    assert queue.prune_layouts(T, 4, client=client) == [16]
    assert queue.served_slot_count(T, 4, client=client) == 4
    # growing back: the 4-slot layout is a prefix of the 16-slot one
    queue.record_layout(T, 16, client=client)
    assert queue.prune_layouts(T, 16, client=client) == [4]


def test_topics_validate_and_register():
    with pytest.raises(ValueError, match="power of two"):
        Topic("t", handler=list, slots=12)
    with pytest.raises(ValueError, match="topic name"):
        Topic("bad}name", handler=list)
    with pytest.raises(ValueError, match="max_attempts"):
        TopicSettings(max_attempts=1000)
    topic = register_topic(Topic("test.topic", handler=list, slots=8))
    assert get_topic("test.topic") is topic
    with pytest.raises(KeyError, match="unknown topic"):
        get_topic("nope")


def test_unclaim_gives_back_only_the_claim_it_names_due_as_it_was(client, lease, now, space):
    queue.schedule_many(T, [("a", now + 50, 0), ("b", now + 60, 0), ("c", now + 70, 0)],
                        client=client)  # fmt: skip
    token = lease(T)
    got = queue.claim(T, 0, now_ms=now + 100, limit=3, visibility_ms=1000, lease_token=token,
                      client=client)  # fmt: skip
    a, b, c = got
    assert (a.due_ms, a.attempt) == (now + 50, 1)
    queue.ack(T, 0, ["b"], lease_token=token, client=client)  # b fired and was acked since
    queue.schedule(T, "c", now + 500, slot=0, client=client)  # c was rescheduled since
    assert queue.unclaim(T, 0, [a, b, c, a._replace(job_id="nope")], client=client) == 2
    # a is back as it was, not a suspect and no attempt spent; c keeps its new time.
    assert space(T).store == {"a": now + 50, "c": now + 500}
    assert space(T).prepare == {}
    again = queue.claim(T, 0, now_ms=now + 100, limit=3, visibility_ms=1000, lease_token=token,
                        client=client)  # fmt: skip
    assert again == [a]


def test_unclaim_leaves_a_job_claimed_again_on_another_attempt(client, lease, now, space):
    queue.schedule(T, "a", now, slot=0, client=client)
    token = lease(T)
    (first,) = queue.claim(T, 0, now_ms=now, limit=1, visibility_ms=10, lease_token=token,
                           client=client)  # fmt: skip
    queue.reap(T, [0], now_ms=now + 20, limit=10, max_attempts=5, client=client)
    (second,) = queue.claim(T, 0, now_ms=now + 20, limit=1, visibility_ms=1000,
                            lease_token=token, client=client)  # fmt: skip
    assert second.attempt == 2
    assert queue.unclaim(T, 0, [first], client=client) == 0  # the older claim is not this one
    assert list(space(T).prepare) == ["a"]
