"""The urgency signal (couponcenter.core.urgency; docs/operations.md, Resource-aware dispatch):
which urgent path is behind, by how much and since when, read through the probes the apps
register, on a clock the test moves and a real Redis and database."""

from __future__ import annotations

import pytest

from couponcenter.core import urgency
from couponcenter.core.urgency import Reading, UrgencySignal, urgency_since
from couponcenter.coupons.claim_latency import FRESH_MS, ClaimLatency, claims_readings
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC

pytestmark = pytest.mark.django_db


class Clock:
    def __init__(self) -> None:
        self.ms = epoch_ms()

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


def overdue_reminder(clock: Clock, *, late_ms: int, job: str = "r1") -> None:
    queue.schedule(REMINDER_TOPIC, job, clock.ms - late_ms, slot=0, now_ms=clock.ms)


def by_path(reading) -> dict[str, Reading]:
    return {r.path: r for r in reading.readings}


def test_nothing_due_is_on_target(clock, reminder_settings):
    reading = UrgencySignal(clock=clock).read()
    assert not reading and reading.worst is None
    assert {r.path: r.value_ms for r in reading.readings} == {
        "reminders": 0,
        "timeouts": 0,
        "claims": 0,
    }
    assert urgency_since() == {}


def test_an_overdue_reminder_puts_the_reminders_behind_since_the_first_reading(
    clock, reminder_settings, settings
):
    settings.URGENT_REMINDERS_TARGET_MS = 1000
    settings.URGENCY_CACHE_MS = 500
    signal = UrgencySignal(clock=clock)
    overdue_reminder(clock, late_ms=1000)
    assert not signal.read()  # at its target is not past it
    clock.ms += 500
    first = signal.read()
    assert [(b.path, b.value_ms, b.since_ms) for b in first.behind] == [
        ("reminders", 1500, clock.ms)
    ]
    since = clock.ms
    # Within the cache the process answers from memory, whatever Redis holds meanwhile.
    queue.cancel(REMINDER_TOPIC, "r1", slot=0)
    overdue_reminder(clock, late_ms=9000, job="r2")
    clock.ms += 499
    assert signal.read() is first
    clock.ms += 1
    later = signal.read()
    assert [(b.value_ms, b.since_ms) for b in later.behind] == [(9500, since)]
    assert urgency_since() == {"reminders": since}  # every process and the console see it
    queue.cancel(REMINDER_TOPIC, "r2", slot=0)
    clock.ms += 500
    assert not signal.read()
    assert urgency_since() == {}


def test_paused_reminders_wait_on_purpose_and_hold_nothing_back(clock, reminder_settings):
    overdue_reminder(clock, late_ms=60_000)
    reminder_settings.change(paused=True)
    assert not UrgencySignal(clock=clock).read()
    reminder_settings.change(paused=False)
    assert UrgencySignal(clock=clock).read().worst.path == "reminders"


def test_claims_are_behind_when_their_p99_of_a_second_passes_the_target(clock, settings):
    settings.URGENT_CLAIMS_TARGET_MS = 500
    second = clock.ms // 1000 * 1000
    fast, slow = ClaimLatency(), ClaimLatency()
    fast.field, slow.field = "web-1", "web-2"
    for i in range(100):  # one slow answer in a hundred: the p99 is still a fast one
        fast.observe(900 if i == 0 else 20, now_ms=second + i)
    for i in range(100):  # two in a hundred: the p99 is a slow one
        slow.observe(900 if i < 2 else 20, now_ms=second + i)
    assert claims_readings(second + 999) == [Reading("claims", 0, 500)]  # nothing closed yet
    fast.observe(20, now_ms=second + 1000)  # the first answer of the next second writes
    assert claims_readings(second + 1000) == [Reading("claims", 20, 500)]
    slow.observe(20, now_ms=second + 1001)
    clock.ms = second + 1001
    reading = UrgencySignal(clock=clock).read()
    assert [(b.path, b.value_ms) for b in reading.behind] == [("claims", 900)]
    # A process that answered nothing since says nothing, and its figure is dropped.
    assert claims_readings(second + 1001 + FRESH_MS + 1) == [Reading("claims", 0, 500)]
    assert UrgencySignal(clock=lambda: second + 1001 + FRESH_MS + 1).read().behind == ()


def test_a_probe_that_fails_holds_nothing_back(clock, monkeypatch, reminder_settings):
    def broken(now_ms):
        raise ConnectionError("unreachable")

    monkeypatch.setitem(urgency._probes, "broken", broken)
    overdue_reminder(clock, late_ms=5000)
    reading = UrgencySignal(clock=clock).read()
    assert [b.path for b in reading.behind] == ["reminders"]  # the others still count
    monkeypatch.setitem(urgency._probes, "queues", broken)
    monkeypatch.delitem(urgency._probes, "claims")
    assert not UrgencySignal(clock=clock).read()
