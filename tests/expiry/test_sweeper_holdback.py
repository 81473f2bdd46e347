"""The sweeper yields to the urgent paths and still expires a night's coupons inside the expiry
window (expiry.window; docs/operations.md, Resource-aware dispatch): its clock and its sleep are
the test's, the signal's data (an overdue reminder) is in a real Redis, the tasks in the real
database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from couponcenter.core.holdback import OVERRIDDEN, RUNNING, holdback_rows
from couponcenter.core.urgency import UrgencySignal
from couponcenter.coupons.models import UserCoupon
from expiry.models import ExpiryTask
from expiry.sweeper import Sweeper
from expiry.window import EXPIRY_RETENTION, EXPIRY_SWEEP, SAFETY
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from tests.support.factories import ExpiryTaskFactory, UserCouponFactory

pytestmark = pytest.mark.django_db
COUNT, BATCH = 30, 10


class Clock:
    """Epoch ms; each sleep moves it on. ``on_sleep(n)`` runs after the n-th sleep."""

    def __init__(self, ms: int) -> None:
        self.ms = ms
        self.sleeps = 0
        self.on_sleep = lambda n: None
        self.batches_at: list[int] = []

    def __call__(self) -> int:
        return self.ms

    def sleep(self, seconds: float) -> bool:
        self.sleeps += 1
        self.ms += int(seconds * 1000)
        self.on_sleep(self.sleeps)
        return False  # as Event.wait: not stopped


@pytest.fixture
def night(settings, reminder_settings):
    """``COUNT`` coupons that expired ten minutes ago, a window of 20 minutes, a poll of 10 s."""
    settings.EXPIRY_WINDOW_S = 1200
    settings.HOLDBACK_POLL_MS = 10_000
    settings.URGENCY_CACHE_MS = 0
    settings.URGENT_REMINDERS_TARGET_MS = 1000
    expired_at = timezone.now() - timedelta(minutes=10)
    for _ in range(COUNT):
        ExpiryTaskFactory(
            user_coupon=UserCouponFactory(
                expires_at=expired_at, claimed_at=expired_at - timedelta(days=1)
            ),
            expire_at=expired_at,
        )
    return expired_at


def sweeper_on(clock: Clock) -> Sweeper:
    sweeper = Sweeper(batch_size=BATCH, signal=UrgencySignal(clock=clock), sleep=clock.sleep)
    record = sweeper._progress

    def progress(batch):
        clock.batches_at.append(clock.ms)
        record(batch)

    sweeper._progress = progress
    return sweeper


def reminders_behind(clock: Clock) -> None:
    queue.schedule(REMINDER_TOPIC, "late", clock.ms - 60_000, slot=0, now_ms=clock.ms)


def expired() -> int:
    return UserCoupon.objects.filter(status=UserCoupon.Status.EXPIRED).count()


def row(job: str):
    return {r.job: r for r in holdback_rows()}[job]


def test_on_target_the_sweep_never_waits(night):
    clock = Clock(epoch_ms())
    result = sweeper_on(clock).run_once()
    assert result.totals.processed == COUNT and expired() == COUNT
    assert clock.sleeps == 0 and holdback_rows() == []


def test_behind_the_sweep_yields_then_finishes_inside_the_window(night):
    clock = Clock(epoch_ms())
    reminders_behind(clock)  # and it stays behind the whole night
    sweeper = sweeper_on(clock)
    window_end = int((night + timedelta(seconds=1200)).timestamp() * 1000)
    # Before it has swept anything the sweeper assumes a batch a second: 30 tasks, twice over.
    needed_ms = int(SAFETY * COUNT / BATCH * 1000)
    result = sweeper.run_once()
    assert result.totals.processed == COUNT and expired() == COUNT
    assert not ExpiryTask.objects.filter(status=ExpiryTask.Status.PENDING).exists()
    # It waited as long as it could, and no longer: the first batch ran within a poll before the
    # last moment it could start, and the last one before the window's end.
    latest_start = window_end - needed_ms
    assert latest_start - 10_000 <= clock.batches_at[0] <= latest_start
    assert clock.batches_at[-1] <= window_end
    sweep = row(EXPIRY_SWEEP)
    assert sweep.state == OVERRIDDEN and "expiry window" in sweep.why
    assert sweep.path == "reminders"
    assert sweep.held_today_ms == clock.batches_at[0] - sweep.since_ms > 0
    # The retention waited too: it yields without a window of its own this early.
    assert row(EXPIRY_RETENTION).state == "held"


def test_the_sweep_catches_up_as_soon_as_the_paths_are_on_target(night):
    clock = Clock(epoch_ms())
    reminders_behind(clock)
    clock.on_sleep = lambda n: n == 3 and queue.cancel(REMINDER_TOPIC, "late", slot=0)
    start = clock.ms
    result = sweeper_on(clock).run_once()
    assert result.totals.processed == COUNT and expired() == COUNT
    assert clock.sleeps == 3 and clock.batches_at[0] == start + 30_000
    sweep = row(EXPIRY_SWEEP)
    assert (sweep.state, sweep.held_today_ms, sweep.why) == (RUNNING, 30_000, "")


def test_coupons_past_the_window_already_are_swept_at_once(night, settings):
    settings.EXPIRY_WINDOW_S = 600  # the night's coupons are due since ten minutes: no time left
    clock = Clock(epoch_ms())
    reminders_behind(clock)
    result = sweeper_on(clock).run_once()
    assert result.totals.processed == COUNT and clock.sleeps == 0
    assert row(EXPIRY_SWEEP).state == OVERRIDDEN


def test_nothing_due_yet_is_nothing_to_keep_inside_a_window(settings, reminder_settings):
    settings.URGENCY_CACHE_MS = 0
    clock = Clock(epoch_ms())
    reminders_behind(clock)
    later = datetime.now(tz=UTC) + timedelta(hours=1)
    ExpiryTaskFactory(user_coupon=UserCouponFactory(expires_at=later), expire_at=later)
    sweeper = sweeper_on(clock)
    sweeper.hold.wait(stop=lambda: clock.sleeps == 2)  # waits: the sweep has no deadline now
    assert clock.sleeps == 2


def test_with_nothing_due_the_sweep_does_not_wait_or_say_it_was_held(settings, reminder_settings):
    settings.URGENCY_CACHE_MS = 0
    clock = Clock(epoch_ms())
    reminders_behind(clock)
    later = datetime.now(tz=UTC) + timedelta(hours=1)
    ExpiryTaskFactory(user_coupon=UserCouponFactory(expires_at=later), expire_at=later)
    result = sweeper_on(clock).run_once()
    assert result.ok and result.totals.processed == 0
    assert clock.sleeps == 0 and EXPIRY_SWEEP not in {r.job for r in holdback_rows()}
