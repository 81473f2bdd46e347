"""Held jobs: a threaded worker claims a generic topic's jobs up to ``TIMEOUT_HOLD_MS`` before they
fall due and its executor takes and fires each one at its due time (not at the loop's next tick).
A cancel or a reschedule that commits before the due time still wins, and a worker stopped while
holding loses nothing.

The worker runs for real (threads, PostgreSQL, Redis, a local HTTP receiver); only its clock is
the test's, frozen and moved on by hand, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from reminders.engine import keys, queue, topic_model
from reminders.engine.dispatcher import Dispatcher
from reminders.models import TimeoutJob
from reminders.runtime.worker import build_worker
from reminders.services import timeout_job_cancel, timeout_job_create, timeout_job_reschedule
from tests.support.webhook import Webhook, serving_webhook

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "hold.http"
SECRET = "test-webhook-secret-of-thirty-two-bytes"
VISIBILITY_MS = 60_000
WAIT_S = 60


@pytest.fixture
def receiver() -> Iterator[Webhook]:
    with serving_webhook() as hook:
        yield hook


class Clock:
    """Epoch ms, frozen until the test moves it."""

    def __init__(self) -> None:
        self.now_ms = time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def topic(settings, receiver):
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.TIMEOUT_HOLD_MS = 1000
    settings.TIMEOUT_TOPICS = {
        TOPIC: {"type": "http", "url": receiver.url, "secret": SECRET, "slots": 1,
                "visibility_ms": VISIBILITY_MS, "concurrency": 2},
    }  # fmt: skip
    yield TOPIC
    topic_model.unregister_topic(TOPIC)


@pytest.fixture
def worker(topic, clock) -> Iterator[Dispatcher]:
    dispatcher = build_worker([topic], threaded=True, clock=clock)
    yield dispatcher
    dispatcher.shutdown()


def at(clock: Clock, in_ms: int) -> datetime:
    """The clock's time ``in_ms`` from now, as an action time."""
    return datetime.fromtimestamp((clock.now_ms + in_ms) / 1000, tz=UTC)


def job_due(clock: Clock, in_ms: int) -> TimeoutJob:
    return timeout_job_create(
        topic=TOPIC, action_time=at(clock, in_ms), biz_type="order", biz_id="B-1"
    )


def wait_for(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def status(job: TimeoutJob) -> int:
    job.refresh_from_db()
    return job.status


def in_redis(job: TimeoutJob) -> dict[str, int]:
    s = queue.stats(job.topic, [job.slot], now_ms=0)[0]
    return {k: v for k, v in (("store", s.store), ("prepare", s.prepare), ("dead", s.dead)) if v}


def where(redis_client, job: TimeoutJob) -> str | None:
    """The set of its slot that holds the job's entry (store, prepare, dead), if any."""
    k = keys.slot_keys(job.topic, job.slot)
    found = [name for name in ("store", "prepare", "dead")
             if redis_client.zscore(getattr(k, name), str(job.pk)) is not None]  # fmt: skip
    return found[0] if found else None


def in_flight(worker: Dispatcher, topic: str = TOPIC) -> int:
    return worker.maintenance.load()[topic][0]


def test_a_job_due_within_the_hold_is_claimed_early_and_fired_at_its_due_time(
    worker, clock, receiver
):
    job = job_due(clock, 500)
    report = worker.run_once()
    # Claimed half a second early, its row untouched: what the loop's tick did is only the claim.
    assert report.claimed == 1
    assert in_redis(job) == {"prepare": 1}
    assert status(job) == TimeoutJob.Status.PENDING
    assert receiver.keys == []
    assert in_flight(worker) == 1

    clock.now_ms += 500  # due now: the executor fires it without another tick of the loop
    wait_for(lambda: status(job) == TimeoutJob.Status.PROCESSED, "the held job to fire")
    wait_for(lambda: in_redis(job) == {}, "the fired job to be acked")
    assert receiver.keys == [f"{TOPIC}:{job.pk}"]
    assert job.attempts == 1
    wait_for(lambda: in_flight(worker) == 0, "nothing in flight")


def test_a_cancel_before_the_due_time_wins_over_the_hold(worker, clock, receiver):
    job = job_due(clock, 500)
    assert worker.run_once().claimed == 1
    timeout_job_cancel(job=job)  # commits while the job is held
    assert status(job) == TimeoutJob.Status.CANCELLED

    clock.now_ms += 600
    wait_for(lambda: in_flight(worker) == 0, "the held job to be let go")
    assert receiver.keys == []
    assert status(job) == TimeoutJob.Status.CANCELLED
    assert in_redis(job) == {}


def test_a_reschedule_to_later_while_held_fires_only_at_the_new_time(worker, clock, receiver):
    job = job_due(clock, 500)
    assert worker.run_once().claimed == 1
    timeout_job_reschedule(job=job, action_time=at(clock, 5_000))

    clock.now_ms += 600  # the old due time: the take finds the row moved and lets the entry go
    wait_for(lambda: in_flight(worker) == 0, "the held copy to be let go")
    assert receiver.keys == []
    assert status(job) == TimeoutJob.Status.PENDING
    assert in_redis(job) == {"store": 1}

    clock.now_ms += 4_400  # the new due time
    assert worker.run_once().claimed == 1
    wait_for(lambda: status(job) == TimeoutJob.Status.PROCESSED, "the job to fire")
    wait_for(lambda: in_flight(worker) == 0, "nothing in flight")
    assert receiver.keys == [f"{TOPIC}:{job.pk}"]
    assert in_redis(job) == {}


def test_a_reschedule_to_sooner_while_held_replaces_the_held_copy(worker, clock, receiver):
    job = job_due(clock, 800)
    assert worker.run_once().claimed == 1
    timeout_job_reschedule(job=job, action_time=at(clock, 300))
    assert worker.run_once().claimed == 1  # claimed again at the new time, still ahead

    clock.now_ms += 300
    wait_for(lambda: status(job) == TimeoutJob.Status.PROCESSED, "the job to fire")
    # The older copy was replaced, not left waiting to be taken again: nothing is held.
    wait_for(lambda: in_flight(worker) == 0, "nothing in flight")
    clock.now_ms += 500  # past the old due time: nothing more fires
    worker.run_once()
    assert receiver.keys == [f"{TOPIC}:{job.pk}"]
    assert in_redis(job) == {}


def test_a_worker_stopped_while_holding_gives_the_job_back_due_as_it_was(
    topic, clock, receiver, settings
):
    settings.TIMEOUT_HOLD_MS = 200  # how long the stop waits for held jobs, in real time
    job = job_due(clock, 100)
    worker = build_worker([topic], threaded=True, clock=clock)
    try:
        assert worker.run_once().claimed == 1
        assert in_redis(job) == {"prepare": 1}
    finally:
        worker.shutdown()  # the clock never reaches the due time: the job goes back to store
    assert receiver.keys == []
    assert status(job) == TimeoutJob.Status.PENDING
    assert in_redis(job) == {"store": 1}
    assert queue.earliest_due(TOPIC, [job.slot]) == clock.now_ms + 100  # due as it was

    clock.now_ms += 100  # the next worker fires it on time, its first attempt, not a suspect
    drain = build_worker([topic], clock=clock)
    try:
        assert drain.run_until_idle().claimed == 1
    finally:
        drain.shutdown()
    assert status(job) == TimeoutJob.Status.PROCESSED
    assert job.attempts == 1
    assert receiver.keys == [f"{TOPIC}:{job.pk}"]
    assert in_redis(job) == {}


SUSPECT_RELEASE = threading.Event()
SUSPECT_FIRING = threading.Event()
SLOW_RELEASE = threading.Event()
SLOW_FIRING = threading.Event()
CALLED: list[str] = []


def blocking_action(jobs: list[TimeoutJob]) -> None:
    """A ``callable`` action: a suspect's call (and a slow job's) blocks until the test lets it
    go."""
    for biz_id, firing, release in (("suspect", SUSPECT_FIRING, SUSPECT_RELEASE),
                                    ("slow", SLOW_FIRING, SLOW_RELEASE)):  # fmt: skip
        if any(job.biz_id == biz_id for job in jobs):
            firing.set()
            assert release.wait(WAIT_S)
    CALLED.extend(job.biz_id for job in jobs)


@pytest.fixture
def blocking_topic(settings) -> Iterator[str]:
    name = "hold.call"
    settings.TIMEOUT_HOLD_MS = 1000
    settings.TIMEOUT_TOPICS = {
        name: {"type": "callable", "path": f"{__name__}.blocking_action", "slots": 1,
               "visibility_ms": VISIBILITY_MS, "concurrency": 2},
    }  # fmt: skip
    CALLED.clear()
    for event in (SUSPECT_RELEASE, SUSPECT_FIRING, SLOW_RELEASE, SLOW_FIRING):
        event.clear()
    yield name
    SUSPECT_RELEASE.set()
    SLOW_RELEASE.set()
    topic_model.unregister_topic(name)


def suspect_due(redis_client, clock: Clock, topic: str) -> TimeoutJob:
    """A job due now that the reaper brought back from a worker that died firing it."""
    suspect = timeout_job_create(topic=topic, action_time=at(clock, 0), biz_type="t",
                                 biz_id="suspect")  # fmt: skip
    redis_client.hset(keys.slot_keys(topic, suspect.slot).meta, f"s:{suspect.pk}", 1)
    return suspect


def test_a_suspect_fires_with_nothing_else_claimed_and_what_was_held_fires_after_it(
    blocking_topic, clock, redis_client
):
    """A suspect (a job whose worker died firing it) may be a pill that kills its worker: it
    fires alone, with nothing else of the process in flight, not even held. What was held goes
    back to store, due as it was and its attempt not spent, and is claimed and fired once the
    suspect settled: a pill takes nobody with it."""
    held = timeout_job_create(topic=blocking_topic, action_time=at(clock, 500), biz_type="t",
                              biz_id="held")  # fmt: skip
    worker = build_worker([blocking_topic], threaded=True, clock=clock)
    try:
        assert worker.run_once().claimed == 1  # held, due in 500 ms
        assert where(redis_client, held) == "prepare"
        suspect = suspect_due(redis_client, clock, blocking_topic)
        assert worker.run_once().claimed == 1  # the suspect, alone: it fires in quarantine
        assert SUSPECT_FIRING.wait(WAIT_S)
        # Were the worker killed now, the held job would not come back as a suspect, attempt
        # spent: it is in store, as if never claimed.
        assert where(redis_client, held) == "store"
        assert where(redis_client, suspect) == "prepare"
        assert in_flight(worker, blocking_topic) == 1  # the suspect, and nothing else

        clock.now_ms += 1500  # due, and the hold past it: nothing is claimed while it fires
        assert worker.run_once().claimed == 0
        assert status(held) == TimeoutJob.Status.PENDING
        SUSPECT_RELEASE.set()
        wait_for(lambda: status(suspect) == TimeoutJob.Status.PROCESSED, "the suspect to settle")
        wait_for(lambda: worker.run_once().claimed == 1, "the held job to be claimed again")
        wait_for(lambda: status(held) == TimeoutJob.Status.PROCESSED, "the held job to fire")
    finally:
        SUSPECT_RELEASE.set()
        worker.shutdown()
    assert CALLED == ["suspect", "held"]
    assert held.attempts == 1
    assert in_redis(held) == {} and in_redis(suspect) == {}


def test_held_jobs_wait_for_a_waiting_suspect_no_longer_than_the_hold(
    blocking_topic, clock, redis_client
):
    """A suspect waits until what the process has in flight settled; a held job that falls due
    meanwhile waits for it, but at most the hold past its due time (a tenth of the visibility
    timeout: never reaped and fired twice behind a slow job). The suspect then waits for it
    too, and fires alone."""
    SUSPECT_RELEASE.set()  # here the suspect's call returns at once
    slow = timeout_job_create(topic=blocking_topic, action_time=at(clock, 0), biz_type="t",
                              biz_id="slow")  # fmt: skip
    worker = build_worker([blocking_topic], threaded=True, clock=clock)
    try:
        assert worker.run_once().claimed == 1
        assert SLOW_FIRING.wait(WAIT_S)  # in flight, and stays so until the test lets it go
        held = timeout_job_create(topic=blocking_topic, action_time=at(clock, 500), biz_type="t",
                                  biz_id="held")  # fmt: skip
        assert worker.run_once().claimed == 1  # held, due in 500 ms
        suspect = suspect_due(redis_client, clock, blocking_topic)
        assert worker.run_once().claimed == 1  # the suspect: it waits for the slow job

        clock.now_ms += 500  # the held job is due, and waits for the suspect
        assert status(held) == TimeoutJob.Status.PENDING
        clock.now_ms += 1000  # the hold past its due time: it fires, the suspect still waiting
        wait_for(lambda: status(held) == TimeoutJob.Status.PROCESSED, "the held job to fire")
        assert CALLED == ["held"]
        assert not SUSPECT_FIRING.is_set()
        SLOW_RELEASE.set()
        wait_for(lambda: status(suspect) == TimeoutJob.Status.PROCESSED, "the suspect to fire")
    finally:
        SLOW_RELEASE.set()
        SUSPECT_RELEASE.set()
        worker.shutdown()
    assert CALLED == ["held", "slow", "suspect"]
    assert [in_redis(j) for j in (slow, held, suspect)] == [{}, {}, {}]


def test_a_suspect_waits_for_what_a_retiring_executor_still_fires():
    """A topic's executor rebuilt (its spec changed) finishes what it fired in the background;
    a suspect that comes meanwhile waits for that too before it fires alone."""
    from reminders.runtime.executors import TopicExecutors
    from reminders.timeout_topic_rules import TimeoutTopicSpec

    fired: list[str] = []
    slow_release, slow_firing = threading.Event(), threading.Event()

    def fire(spec, jobs, session) -> dict[int, str | None]:
        if any(job.biz_id == "slow" for job in jobs):
            slow_firing.set()
            assert slow_release.wait(WAIT_S)
        fired.extend(job.biz_id for job in jobs)
        return {}

    executors = TopicExecutors(fire=fire, settle=lambda spec, done: {"acked": len(done)})
    spec = TimeoutTopicSpec(name="retire.call", type="callable", path="x.y", concurrency=1)
    try:
        executors.sync({spec.name: spec})
        executors.get(spec.name).submit(0, [(TimeoutJob(pk=1, biz_id="slow"), 1)])
        assert slow_firing.wait(WAIT_S)
        executors.sync({spec.name: replace(spec, concurrency=2)})  # the old one retires
        current = executors.get(spec.name)
        current.submit(0, [(TimeoutJob(pk=2, biz_id="suspect"), 2)], suspect=True)
        assert current.room() == 0  # in quarantine: nothing is claimed
        assert not current.wait_idle(0.2)  # the suspect waits: the retiring one still fires
        assert fired == []
        slow_release.set()
        assert current.wait_idle(WAIT_S)
        assert fired == ["slow", "suspect"]
        assert current.room() == current.capacity
    finally:
        slow_release.set()
        executors.close()


def test_the_hold_is_configured_by_a_whole_number_within_bounds(settings):
    """A bad ``TIMEOUT_HOLD_MS`` stops the settings from loading, with a clear message."""
    for bad in ("-1", "1001", "soon"):
        env = {**os.environ, "TIMEOUT_HOLD_MS": bad}
        done = subprocess.run(
            [sys.executable, "-c", "import django; django.setup()"],
            env={**env, "DJANGO_SETTINGS_MODULE": "couponcenter.settings"},
            cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode != 0
        assert "TIMEOUT_HOLD_MS must be a whole number of ms within 0..1000" in done.stderr
