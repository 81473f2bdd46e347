"""An executor's room (how many more jobs the loop may claim for its topic): jobs that fired and
wait for the settler take none, so the next jobs are claimed while the last ones settle; a
settler round's worth of them waiting does, so a settler that is behind stops the claims.

The executor runs for real (its pool and settler threads); the firing and the settling are the
test's, and the settling waits for the test to let it go.
"""

from __future__ import annotations

import threading
import time

import pytest

from reminders.models import TimeoutJob
from reminders.runtime import topic_executor
from reminders.runtime.topic_executor import TopicExecutor
from reminders.timeout_topic_rules import TimeoutTopicSpec

WAIT_S = 60


class Settler:
    """The settle callable: it records what it is given and waits for ``release`` each time."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.settled: list[int] = []

    def __call__(self, spec, fired) -> dict[str, int]:
        self.entered.set()
        assert self.release.wait(WAIT_S)
        self.settled.extend(f.job.pk for f in fired)
        return {"acked": len(fired)}


@pytest.fixture
def settler() -> Settler:
    return Settler()


@pytest.fixture
def woken() -> list[int]:
    return []


@pytest.fixture
def executor(settler, woken):
    spec = TimeoutTopicSpec(name="room.call", type="callable", path="x.y", concurrency=1)
    executor = TopicExecutor(
        spec,
        fire=lambda spec, jobs, session: {},
        settle=settler,
        on_room=lambda: woken.append(1),
    )
    yield executor
    settler.release.set()
    executor.close()


def jobs(first: int, n: int) -> list[tuple[TimeoutJob, int]]:
    return [(TimeoutJob(pk=pk), 1) for pk in range(first, first + n)]


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)  # polls the executor's counts


def test_jobs_waiting_for_the_settler_take_no_room(executor, settler, woken):
    batch = executor.batch_size
    executor.submit(0, jobs(1, batch))
    assert settler.entered.wait(WAIT_S)
    wait_until(lambda: executor.occupying == 0, "the batch to have fired")
    # Fired, not settled: still in flight (the close waits for them), but the room is whole.
    assert executor.in_flight == batch
    assert executor.room() == executor.capacity
    settler.release.set()
    assert executor.wait_idle(WAIT_S)
    assert sorted(settler.settled) == list(range(1, batch + 1))
    assert executor.room() == executor.capacity


def test_a_settler_round_waiting_stops_the_claims_until_it_is_settled(
    executor, settler, woken, monkeypatch
):
    monkeypatch.setattr(topic_executor, "SETTLE_MAX", 3)
    executor.submit(0, jobs(1, 1))
    assert settler.entered.wait(WAIT_S)  # the settler is busy with job 1
    executor.submit(0, jobs(2, 3))
    wait_until(lambda: executor.occupying == 0, "jobs 2 to 4 to have fired")
    assert executor.in_flight == 4
    assert executor.room() == 0  # four wait to be settled: a round's worth and more
    woken.clear()
    settler.release.set()
    assert executor.wait_idle(WAIT_S)
    assert sorted(settler.settled) == [1, 2, 3, 4]
    assert executor.room() == executor.capacity
    assert woken  # the loop was told it may claim again
