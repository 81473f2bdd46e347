"""The sweeper process: a loop around ``services.expiry_sweep_due`` and the expiry tables'
retention (``expiry.retention``).

Each pass re-reads ``ExpirySettings`` (so admin edits apply without a restart), sweeps every due
task in batches, and records its figures in Redis; when its turn comes (one sweeper in the fleet
every ``RETENTION_EVERY_S``, ``RetentionTurn``) it then removes old processed tasks and aged-out
used and expired user coupons. Between passes it sleeps until the next task falls due or the
interval ends, whichever comes first, measured from the start of the pass so the schedule does
not drift. ``stop()`` (SIGTERM/SIGINT, wired by the command) sets a flag: the batch in flight
commits, then the process exits. A failed pass is logged and retried on the next one.

Both yield to the urgent paths (docs/operations.md, Resource-aware dispatch): before each batch
the sweep waits while one is behind, inside the expiry window (``expiry.window``); the retention
does not start, or stops after its batch, while one is (``couponcenter.core.holdback``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import Error as DbError
from django.db import close_old_connections
from django.utils import timezone

from couponcenter.core.holdback import Holdback
from couponcenter.core.retention import RetentionTurn
from couponcenter.core.urgency import UrgencySignal

from . import services
from .retention import EXPIRY_TASKS, expiry_retention
from .services import SweepResult, SweepTotals
from .window import EXPIRY_RETENTION, expiry_due, expiry_holdback

logger = logging.getLogger(__name__)

# After a failed pass, wait this long (or the interval, if shorter) before trying again.
ERROR_BACKOFF_SECONDS = 5.0
# Never spin: at least this long between passes, even when work is due right away.
MIN_SLEEP_SECONDS = 0.2
# A progress line at most this often during a long pass.
PROGRESS_EVERY_SECONDS = 5.0


@dataclass
class PassResult:
    totals: SweepTotals
    cleaned: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


class Sweeper:
    def __init__(
        self,
        *,
        batch_size: int | None = None,
        signal: UrgencySignal | None = None,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        """``signal`` and ``sleep``: the hold-backs' (the tests' clock); ``sleep`` defaults to a
        wait that ``stop()`` ends."""
        self.batch_size = batch_size  # None: ExpirySettings.batch_size, re-read every pass
        self._stop = threading.Event()
        self._last_progress = 0.0
        self._pass_done = 0
        self._turn = RetentionTurn("expiry", every_s=settings.RETENTION_EVERY_S)
        self._swept, self._sweep_s = 0, 0.0  # for the sweep's rate (expiry.window)
        sleep = sleep or self._stop.wait
        self.hold = expiry_holdback(rate_per_s=self._rate, signal=signal, sleep=sleep)
        self.retention_hold = Holdback(EXPIRY_RETENTION, signal=signal, sleep=sleep)

    # --- control ---------------------------------------------------------------------------------

    def stop(self, *_: object) -> None:
        """Finish the batch in flight, then leave (safe from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # --- one pass ---------------------------------------------------------------------------------

    def run_once(self) -> PassResult:
        """Sweep what is due now, clean up, record; never raises a database error."""
        totals = SweepTotals()
        result = PassResult(totals=totals)
        self._pass_done = 0
        try:
            config = services.expiry_settings_get(max_age_s=0)
            batch_size = self.batch_size or config.batch_size
            result.totals = totals = services.expiry_sweep_due(
                batch_size=batch_size, should_stop=self._before_batch, progress=self._progress
            )
            result.cleaned = self._retention()
        except DbError as exc:  # InterfaceError too: a connection closed under us
            result.error = f"{type(exc).__name__}: {exc}".strip()
            logger.exception("expiry: pass failed; its batch stays pending for the next pass")
            close_old_connections()  # a broken connection is replaced on the next pass
        self._log_pass(result)
        services.expiry_run_record(totals=result.totals, cleaned=result.cleaned, error=result.error)
        return result

    def _retention(self) -> int:
        """The retention pass if it is this sweeper's turn; the expiry tasks it removed."""
        if not self._turn.take():
            return 0
        if self.retention_hold.check():
            self._turn.give_back()  # taken again once the urgent paths are on target
            return 0
        try:
            runs = expiry_retention(
                should_stop=lambda: (
                    self.stopping or not self._turn.keep() or self.retention_hold.check()
                )
            )
        finally:
            self._turn.release()
        return sum(run.removed for run in runs if run.name == EXPIRY_TASKS)

    def _before_batch(self) -> bool:
        """Wait while an urgent path is behind and tasks are due, inside the expiry window;
        True: stop."""
        if self.hold.signal.read() and expiry_due(self.hold.clock()):
            self.hold.wait(stop=self._stop.is_set)
        return self._stop.is_set()

    def _rate(self) -> float:
        """Tasks swept per second of sweeping so far (a batch a second before any)."""
        if self._swept and self._sweep_s > 0:
            return self._swept / self._sweep_s
        return float(self.batch_size or services.expiry_settings_get().batch_size)

    def _progress(self, batch: SweepResult) -> None:
        self._pass_done += batch.processed
        self._swept += batch.processed
        self._sweep_s += batch.seconds
        logger.debug(
            "expiry: batch claimed=%d processed=%d expired=%d in %.3fs",
            batch.claimed,
            batch.processed,
            batch.expired,
            batch.seconds,
        )
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_EVERY_SECONDS:
            self._last_progress = now
            if self._pass_done:  # an idle pass has nothing to say every minute
                logger.info("expiry: %d tasks processed so far this pass", self._pass_done)

    def _log_pass(self, result: PassResult) -> None:
        totals = result.totals
        if totals.processed or result.cleaned or result.error:
            logger.info(
                "expiry: pass batches=%d processed=%d expired=%d cleaned=%d in %.2fs (%.0f/s)%s",
                totals.batches,
                totals.processed,
                totals.expired,
                result.cleaned,
                totals.seconds,
                totals.per_s,
                f" error={result.error}" if result.error else "",
            )

    # --- the loop ---------------------------------------------------------------------------------

    def run_forever(self) -> None:
        logger.info("expiry: sweeper started")
        while not self.stopping:
            started = time.monotonic()
            result = self.run_once()
            if self.stopping:
                break
            self._stop.wait(self._sleep_seconds(started, result))
        logger.info("expiry: sweeper stopped")

    def _sleep_seconds(self, started: float, result: PassResult) -> float:
        """Until the next due task or the end of the interval (from ``started``), first wins."""
        try:
            interval = services.expiry_settings_get().interval.total_seconds()
            if result.error:
                return max(MIN_SLEEP_SECONDS, min(ERROR_BACKOFF_SECONDS, interval))
            deadline = started + interval
            due = services.next_due_at()
        except DbError:
            logger.exception("expiry: could not read the schedule")
            close_old_connections()
            return ERROR_BACKOFF_SECONDS
        if due is not None:
            wait = max(timedelta(0), due - timezone.now()).total_seconds()
            deadline = min(deadline, time.monotonic() + wait)
        return max(MIN_SLEEP_SECONDS, deadline - time.monotonic())
