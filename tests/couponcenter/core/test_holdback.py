"""Background work's back-off decisions (couponcenter.core.holdback; docs/operations.md): wait
while an urgent path is behind, go on at once when none is, never past the job's window, and
the record the console shows; on a clock the test moves, with the signal's data in a real Redis
(an overdue reminder in the engine's queue)."""

from __future__ import annotations

import pytest

from couponcenter.core.holdback import (
    HELD,
    OVERRIDDEN,
    RUNNING,
    Holdback,
    holdback_gauges,
    holdback_rows,
)
from couponcenter.core.redis import get_redis, is_cluster
from couponcenter.core.urgency import UrgencySignal
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from tests.reminders.engine import conftest as engine_conftest

pytestmark = pytest.mark.django_db
# The engine tests' session-wide 3-master Redis Cluster.
redis_cluster, cluster_client = engine_conftest.redis_cluster, engine_conftest.cluster_client


class Clock:
    def __init__(self) -> None:
        self.ms = epoch_ms()
        self.sleeps: list[float] = []

    def __call__(self) -> int:
        return self.ms

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.ms += int(seconds * 1000)


@pytest.fixture
def clock(settings) -> Clock:
    settings.URGENT_REMINDERS_TARGET_MS = 1000
    settings.URGENCY_CACHE_MS = 0
    settings.HOLDBACK_POLL_MS = 1000
    settings.HOLDBACK_MAX_S = 600
    return Clock()


def behind(clock: Clock) -> None:
    queue.schedule(REMINDER_TOPIC, "late", clock.ms - 30_000, slot=0, now_ms=clock.ms)


def caught_up() -> None:
    queue.cancel(REMINDER_TOPIC, "late", slot=0)


def hold_of(clock: Clock, job: str = "retention", **kw) -> Holdback:
    return Holdback(job, signal=UrgencySignal(clock=clock), sleep=clock.sleep, **kw)


def row(job: str = "retention"):
    (found,) = [r for r in holdback_rows() if r.job == job]
    return found


def test_no_urgent_path_behind_never_holds_back_or_writes(clock, reminder_settings):
    hold = hold_of(clock)
    assert hold.check() is False
    hold.wait()
    assert clock.sleeps == [] and holdback_rows() == []


def test_waits_while_behind_and_goes_on_at_once_when_on_target(clock, reminder_settings):
    hold = hold_of(clock)
    behind(clock)
    start = clock.ms
    assert hold.check() is True
    first = row()
    assert (first.state, first.path, first.since_ms, first.held_today_ms) == (
        HELD,
        "reminders",
        start,
        0,
    )
    assert first.value_ms == 30_000 and first.target_ms == 1000
    for _ in range(3):
        clock.ms += 1000
        assert hold.check() is True
    assert row().held_today_ms == 3000 and row().value_ms == 33_000
    caught_up()
    clock.ms += 400
    assert hold.check() is False  # the catch-up starts on the first check that finds it so
    done = row()
    assert (done.state, done.ended_ms, done.held_today_ms) == (RUNNING, clock.ms, 3400)


def test_wait_polls_until_the_paths_are_on_target(clock, reminder_settings):
    hold = hold_of(clock)
    behind(clock)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 3:
            caught_up()

    hold.sleep = sleep
    hold.wait()
    assert clock.sleeps == [1.0, 1.0, 1.0]
    assert (row().state, row().held_today_ms) == (RUNNING, 3000)


def test_wait_returns_when_asked_to_stop(clock, reminder_settings):
    hold = hold_of(clock)
    behind(clock)
    hold.wait(stop=lambda: len(clock.sleeps) == 2)
    assert len(clock.sleeps) == 2 and hold.state == HELD


def test_a_maintenance_job_runs_after_its_longest_wait_until_the_paths_catch_up(
    clock, reminder_settings, settings
):
    settings.HOLDBACK_MAX_S = 10
    hold = hold_of(clock)
    behind(clock)
    assert hold.check() is True
    clock.ms += 9_999
    assert hold.check() is True
    clock.ms += 1
    assert hold.check() is False
    over = row()
    assert over.state == OVERRIDDEN and "HOLDBACK_MAX_S" in over.why
    assert over.held_today_ms == 10_000
    clock.ms += 60_000
    assert hold.check() is False  # still behind: it keeps running, and that is not held time
    caught_up()
    assert hold.check() is False and row().state == RUNNING
    assert row().held_today_ms == 10_000
    behind(clock)  # a new stretch waits again, from its own start
    assert hold.check() is True and row().since_ms == clock.ms


def test_the_jobs_own_deadline_ends_the_wait(clock, reminder_settings):
    deadline = clock.ms + 5000
    hold = hold_of(
        clock,
        must_run=lambda now: "the window closes" if now >= deadline else None,
        max_hold_s=None,
    )
    behind(clock)
    hold.wait()
    assert clock.sleeps == [1.0] * 5
    assert (row().state, row().why) == (OVERRIDDEN, "the window closes")


def test_holdback_max_0_never_waits(clock, reminder_settings, settings):
    settings.HOLDBACK_MAX_S = 0
    behind(clock)
    assert hold_of(clock).check() is False


def test_the_days_total_adds_up_every_process_of_a_job(clock, reminder_settings):
    behind(clock)
    one, two = hold_of(clock), hold_of(clock)
    assert one.check() and two.check()
    clock.ms += 2000
    assert one.check() and two.check()
    assert row().held_today_ms == 4000


def test_metrics_show_the_paths_and_each_jobs_state(clock, reminder_settings, settings):
    settings.HOLDBACK_MAX_S = 10
    behind(clock)
    waiting, overriding = hold_of(clock, "retention"), hold_of(clock, "gates")
    assert waiting.check() and overriding.check()
    clock.ms += 10_000
    assert overriding.check() is False
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in holdback_gauges()
        for s in family.samples
    }
    assert samples[("couponcenter_urgent_path_target_seconds", (("path", "reminders"),))] == 1.0
    assert samples[("couponcenter_urgent_path_seconds", (("path", "reminders"),))] >= 30.0
    assert samples[("couponcenter_holdback_state", (("job", "retention"), ("state", HELD)))] == 1
    state = ("couponcenter_holdback_state", (("job", "gates"), ("state", OVERRIDDEN)))
    assert samples[state] == 1
    assert samples[("couponcenter_holdback_today_seconds", (("job", "gates"),))] == 10.0


@pytest.mark.cluster
def test_on_a_redis_cluster(cluster_client, clock, reminder_settings, settings):
    """The signal's keys, the engine's slots and the records land on several nodes: every read
    and write is a pipeline a cluster takes as one server does."""
    node = cluster_client.get_primaries()[0]
    settings.REDIS_URL = f"redis+cluster://{node.host}:{node.port}"
    assert is_cluster(get_redis())
    hold = hold_of(clock)
    behind(clock)
    assert hold.check()
    clock.ms += 2000
    assert hold.check()
    assert (row().state, row().path, row().held_today_ms) == (HELD, "reminders", 2000)
    caught_up()
    assert hold.check() is False and row().state == RUNNING
    assert {f.name for f in holdback_gauges()} >= {"couponcenter_holdback_state"}
