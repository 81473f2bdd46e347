"""The dispatch loop: handler outcomes, batching, pause, several workers, lease loss, waking."""

import contextlib
import threading
import time

import pytest

from reminders.engine import leases, queue
from reminders.engine.clock import epoch_ms
from reminders.engine.dispatcher import Dispatcher, Hooks
from reminders.engine.keys import slot_for, slot_keys
from reminders.engine.topic_model import (
    DROP,
    HANDED_ON,
    OK,
    Dead,
    EngineSettings,
    Retry,
    Topic,
    TopicSettings,
)

T = "orders.timeout"


class Recorder:
    """A handler that records what it saw and answers with ``decide(entry)``."""

    def __init__(self, decide=lambda entry: OK):
        self.seen, self.decide = [], decide

    def __call__(self, entries):
        self.seen.extend(entries)
        return [self.decide(e) for e in entries]


def load(client, n: int, slots: int = 4, due_ms: int | None = None) -> list[str]:
    due_ms = epoch_ms() - 10 if due_ms is None else due_ms
    items = [(f"j{i}", due_ms, slot_for(i, slots)) for i in range(n)]
    queue.schedule_many(T, items, client=client)
    return [job for job, _, _ in items]


def totals(client, slots: int = 4) -> dict[str, int]:
    stats = queue.stats(T, range(slots), now_ms=epoch_ms(), client=client)
    return {name: sum(getattr(s, name) for s in stats) for name in ("store", "prepare", "dead")}


def settings(**kw):
    return lambda: EngineSettings(
        topics={T: TopicSettings(**{"slots": 4, **kw})}, **kw.pop("e", {})
    )


def test_outcomes_are_acked_retried_buried_or_dropped(redis_client):
    load(redis_client, 4, slots=1)
    outcome = {"j0": OK, "j1": DROP, "j2": Retry("later"), "j3": Dead("never")}
    handler = Recorder(lambda e: outcome[e.job_id])
    report = Dispatcher([Topic(T, handler, slots=1)], client=redis_client).run_once()
    assert (report.claimed, report.acked, report.dropped, report.retried, report.dead) == (
        4,
        2,
        1,
        1,
        1,
    )
    assert totals(redis_client, 1) == {"store": 1, "prepare": 0, "dead": 1}
    (dead,) = queue.list_dead(T, 0, client=redis_client)
    assert (dead.job_id, dead.last_error) == ("j3", "never")


def test_a_mapping_result_and_a_raising_handler(redis_client):
    load(redis_client, 3, slots=1)
    topic = Topic(T, lambda entries: {"j1": Retry("no")}, slots=1, backoff_base_ms=60_000)
    first = Dispatcher([topic], client=redis_client)
    report = first.run_once()
    assert (report.acked, report.retried) == (2, 1)
    first.shutdown()  # hands its slot over at once

    def boom(entries):
        raise RuntimeError("handler bug")

    queue.schedule(T, "j9", epoch_ms() - 1, slot=0, client=redis_client)
    report = Dispatcher([Topic(T, boom, slots=1)], client=redis_client).run_once()
    assert report.retried == 1
    (entry,) = [e for e in queue.list_dead(T, 0, client=redis_client)] or [None]
    assert entry is None  # retried, not dead
    assert redis_client.hget(slot_keys(T, 0).meta, "e:j9") == b"RuntimeError: handler bug"


@pytest.mark.parametrize("answer", [OK, DROP, Retry("later"), Dead("never"), HANDED_ON])
def test_one_result_answers_for_the_whole_batch(redis_client, answer):
    load(redis_client, 3, slots=1)
    topic = Topic(T, lambda entries: answer, slots=1, backoff_base_ms=60_000)
    report = Dispatcher([topic], client=redis_client).run_once()
    assert report.claimed == 3
    counts = (report.acked, report.dropped, report.retried, report.dead)
    where = totals(redis_client, 1)
    expected = {
        OK: ((3, 0, 0, 0), {"store": 0, "prepare": 0, "dead": 0}),
        DROP: ((3, 3, 0, 0), {"store": 0, "prepare": 0, "dead": 0}),
        Retry("later"): ((0, 0, 3, 0), {"store": 3, "prepare": 0, "dead": 0}),
        Dead("never"): ((0, 0, 0, 3), {"store": 0, "prepare": 0, "dead": 3}),
        HANDED_ON: ((0, 0, 0, 0), {"store": 0, "prepare": 3, "dead": 0}),  # left to settle later
    }[answer]
    assert (counts, where) == expected


def test_run_until_idle_drains_full_batches_across_slots(redis_client):
    jobs = load(redis_client, 2500)
    handler = Recorder()
    topic = Topic(T, handler, slots=4, batch_size=100)
    report = Dispatcher([topic], client=redis_client).run_until_idle()
    assert report.acked == 2500 and sorted(e.job_id for e in handler.seen) == sorted(jobs)
    assert totals(redis_client) == {"store": 0, "prepare": 0, "dead": 0}


def test_paused_topics_are_not_claimed(redis_client):
    load(redis_client, 10)
    config = lambda: EngineSettings(paused=True)  # noqa: E731
    report = Dispatcher(
        [Topic(T, Recorder(), slots=4)], config=config, client=redis_client
    ).run_once()
    assert report.claimed == 0 and totals(redis_client)["store"] == 10


def test_config_changes_apply_on_the_next_tick(redis_client):
    load(redis_client, 10, slots=4)
    current = {"batch": 1}
    config = lambda: EngineSettings(topics={T: TopicSettings(slots=8, batch_size=current["batch"])})  # noqa: E731
    dispatcher = Dispatcher([Topic(T, Recorder(), slots=4)], config=config, client=redis_client)
    report = dispatcher.run_once()
    assert sorted(sum(report.owned.values(), [])) == list(range(8))  # serves the new layout
    assert queue.slot_layouts(T, client=redis_client) == [8]
    current["batch"] = 100
    dispatcher.run_until_idle()
    assert totals(redis_client)["store"] == 0


def test_three_workers_split_the_slots_and_handle_each_job_once(redis_client):
    jobs = load(redis_client, 3000, slots=16)
    handler = Recorder()
    workers = [Dispatcher([Topic(T, handler, slots=16, batch_size=200)], worker_id=f"w{i}",
                          client=redis_client) for i in range(3)]  # fmt: skip
    for _ in range(3):  # heartbeats first, then the leases settle as everyone sees everyone
        for worker in workers:
            worker.run_once()
    owned = [worker.leases.owned(T) for worker in workers]
    assert sorted(sum(owned, [])) == list(range(16)) and all(len(o) >= 5 for o in owned)
    for worker in workers:
        worker.run_until_idle()
    assert sorted(e.job_id for e in handler.seen) == sorted(jobs)


def test_a_worker_that_lost_its_lease_mid_batch_cannot_ack(redis_client):
    load(redis_client, 5, slots=1)
    thief = leases.SlotLeases("thief", client=redis_client)

    def slow_handler(entries):
        redis_client.delete(slot_keys(T, 0).lease)  # our lease expires while we work ...
        thief.sync({T: [0]})  # ... and another worker takes the slot
        return [OK] * len(entries)

    dispatcher = Dispatcher([Topic(T, slow_handler, slots=1)], client=redis_client)
    report = dispatcher.run_once()
    assert (report.claimed, report.acked, report.lease_lost) == (5, 0, 1)
    assert totals(redis_client, 1)["prepare"] == 5  # left for the reaper after the visibility
    assert dispatcher.leases.owned(T) == []


def test_the_reaper_runs_under_a_singleton_lease(redis_client):
    load(redis_client, 3, slots=1)
    token = leases.SlotLeases("gone", client=redis_client)
    token.sync({T: [0]})
    queue.claim(T, 0, now_ms=epoch_ms(), limit=3, visibility_ms=1, lease_token=token.token(T, 0),
                client=redis_client)  # fmt: skip
    token.release_all()
    time.sleep(0.01)
    report = Dispatcher([Topic(T, Recorder(), slots=1)], client=redis_client).run_once()
    assert report.reaped == 3
    other = Dispatcher([Topic(T, Recorder(), slots=1)], client=redis_client)
    assert not leases.try_singleton("reaper", other.worker_id, 5000, client=redis_client)


class RecordedWaits(threading.Event):
    """The loop's wake event, recording how long each sleep would be instead of sleeping."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_run_forever_wakes_early_for_due_work_and_stops(redis_client):
    """The loop sleeps until the next due entry, not a whole tick; with nothing due it sleeps at
    most a tick, so an entry scheduled meanwhile is seen at the next tick at the latest; a stop
    ends it and deregisters the worker. Time is the injected clock, sleeps are recorded."""
    now = [1_750_000_000_000]
    handled = []
    topic = Topic(T, Recorder(lambda e: handled.append(e.job_id) or OK), slots=1)
    config = lambda: EngineSettings(tick_ms=2000, lease_ms=60_000)  # noqa: E731
    dispatcher = Dispatcher([topic], config=config, client=redis_client, clock=lambda: now[0])
    dispatcher._wake = sleeps = RecordedWaits()
    queue.schedule(T, "soon", now[0] + 500, slot=0, client=redis_client)

    report = dispatcher.run_once()
    assert report.claimed == 0 and report.next_due_ms == now[0] + 500
    dispatcher._sleep(report, time.monotonic())
    assert sleeps.waits[-1] == pytest.approx(0.5, abs=1e-6)  # until "soon" is due, not 2 s

    now[0] += 500
    report = dispatcher.run_once()
    assert handled == ["soon"] and report.next_due_ms is None
    dispatcher._sleep(report, time.monotonic())
    assert 0 < sleeps.waits[-1] <= 2.0  # nothing due: at most one tick

    queue.schedule(T, "late", now[0], slot=0, client=redis_client)  # while it slept
    dispatcher.run_once()
    assert handled == ["soon", "late"]
    assert [w.worker_id for w in leases.list_workers(client=redis_client)] == [dispatcher.worker_id]
    dispatcher.wake()  # room again somewhere: the next sleep ends at once
    assert sleeps.is_set()
    dispatcher.stop()
    dispatcher.run_forever()  # stopped: returns at once
    assert leases.list_workers(client=redis_client) == []  # deregistered on stop


def test_jobs_reaped_into_dead_are_reported_to_the_owner(redis_client):
    load(redis_client, 3, slots=1)
    holder = leases.SlotLeases("gone", client=redis_client)
    holder.sync({T: [0]})
    queue.claim(T, 0, now_ms=epoch_ms(), limit=2, visibility_ms=1, lease_token=holder.token(T, 0),
                client=redis_client)  # fmt: skip
    holder.release_all()
    time.sleep(0.01)
    dead_reported = []
    topic = Topic(T, Recorder(), slots=1, max_attempts=1, on_dead=dead_reported.extend)
    report = Dispatcher([topic], client=redis_client).run_once()
    assert report.reaped == 2
    assert sorted(dead_reported) == ["j0", "j1"]
    assert sorted(d.job_id for d in queue.list_dead(T, 0, client=redis_client)) == ["j0", "j1"]


def test_handed_on_entries_stay_in_prepare_until_settled(redis_client):
    load(redis_client, 3, slots=1)
    handler = Recorder(lambda e: HANDED_ON)
    report = Dispatcher([Topic(T, handler, slots=1)], client=redis_client).run_once()
    assert (report.claimed, report.acked) == (3, 0)
    assert totals(redis_client, 1) == {"store": 0, "prepare": 3, "dead": 0}
    assert queue.ack_handed(T, 0, ["j0"], client=redis_client) == 1
    result = queue.nack_handed(
        T, 0, [("j1", "boom")], now_ms=epoch_ms(), max_attempts=1, backoff_base_ms=0,
        backoff_cap_ms=0, client=redis_client,
    )  # fmt: skip
    assert (result.retried, result.dead) == (0, 1)
    assert totals(redis_client, 1) == {"store": 0, "prepare": 1, "dead": 1}


def test_flush_runs_once_per_round_after_every_slot_was_handled(redis_client):
    load(redis_client, 40)
    events = []

    def handler(entries):
        events.append(("handle", len(entries)))
        return [HANDED_ON] * len(entries)

    topic = Topic(T, handler, slots=4, flush=lambda: events.append(("flush", 0)))
    report = Dispatcher([topic], client=redis_client).run_once()
    assert report.claimed == 40
    assert [kind for kind, _ in events] == ["handle"] * 4 + ["flush"]
    assert sum(n for _, n in events) == 40


def test_a_failing_flush_is_reported_and_the_next_topic_still_flushes(redis_client):
    load(redis_client, 4, slots=1)
    errors, flushed = [], []

    def broken_flush():
        raise ConnectionError("broker gone")

    high = Topic("orders.high", lambda e: [OK] * len(e), slots=1, priority=1, flush=broken_flush)
    low = Topic(T, lambda e: [HANDED_ON] * len(e), slots=1, flush=lambda: flushed.append(1))
    worker = Dispatcher([high, low], client=redis_client, hooks=Hooks(on_error=errors.append))
    report = worker.run_once()
    assert report.claimed == 4 and flushed == [1]
    assert [type(e) for e in errors] == [ConnectionError]


def test_flush_runs_even_when_the_round_is_cut_short(redis_client):
    load(redis_client, 4, slots=1)
    flushed = []

    def crash(entries):
        raise KeyboardInterrupt  # not an Exception: escapes the handler guard

    topic = Topic(T, crash, slots=1, flush=lambda: flushed.append(1))
    with pytest.raises(KeyboardInterrupt):
        Dispatcher([topic], client=redis_client).run_once()
    assert flushed == [1]


def test_a_poison_pill_dies_alone_and_its_batch_mates_are_delivered(redis_client):
    """A job whose handler kills the worker every time: after the first crash its batch-mates
    are each handled alone and delivered; only the pill goes dead at the attempt limit."""
    jobs = load(redis_client, 6, slots=1)
    delivered = []

    class WorkerDied(BaseException):  # not an Exception: the dispatcher's guard lets it through
        pass

    def handler(entries):
        for entry in entries:
            if entry.job_id == "j2":
                raise WorkerDied
        delivered.extend(e.job_id for e in entries)
        return [OK] * len(entries)

    clock = [epoch_ms()]
    topic = Topic(T, handler, slots=1, max_attempts=3, visibility_ms=1000)
    for _ in range(12):
        worker = Dispatcher([topic], client=redis_client, clock=lambda: clock[0])
        with contextlib.suppress(WorkerDied):  # the worker "died", its claimed entries left behind
            worker.run_until_idle()
        worker.leases.release_all()
        leases.release_singleton("reaper", worker.worker_id, client=redis_client)
        clock[0] += 6000  # past the visibility deadline and the dead worker's heartbeat
    assert sorted(delivered) == sorted(j for j in jobs if j != "j2")
    assert [d.job_id for d in queue.list_dead(T, 0, client=redis_client)] == ["j2"]
    assert totals(redis_client, 1) == {"store": 0, "prepare": 0, "dead": 1}


class HalfBudget:
    """Grants half of each claim; ``rated`` says whether the cut is a rate limit's (worth
    counting as held back) or, like an executor's room, not."""

    def __init__(self, *, rated: bool):
        self.rated, self.noted, self.last_cut = rated, [], 0

    def take(self, topic, want):
        self.last_cut = want - want // 2
        return want // 2

    def give_back(self, topic, unused):
        pass

    def held_back(self, topic, due_left):
        self.noted.append(due_left)

    def rate_cut(self, topic):
        return self.last_cut if self.rated else 0


@pytest.mark.parametrize("rated", [True, False])
def test_only_a_rate_limits_cut_counts_the_jobs_it_held_back(redis_client, rated, monkeypatch):
    """A claim cut short that came back full counts the due entries left behind (one more round
    trip) only when the cut was the rate limit's: a cut for want of room counts nothing."""
    load(redis_client, 10, slots=1)
    counts = []
    real = queue.due_count
    monkeypatch.setattr(queue, "due_count", lambda *a, **kw: counts.append(a) or real(*a, **kw))
    budget = HalfBudget(rated=rated)
    topic = Topic(T, Recorder(), slots=1, batch_size=4)
    report = Dispatcher([topic], client=redis_client, hooks=Hooks(budget=budget)).run_once()
    assert report.claimed >= 2  # claims of 2 (half of 4), each one full
    if rated:
        assert counts and budget.noted[0] == 2  # 8 still due, at most the 2 the cut refused
    else:
        assert counts == [] and budget.noted == []
