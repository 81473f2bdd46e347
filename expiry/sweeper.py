"""The sweeper process: a loop around ``services.expiry_sweep_due`` and ``expiry_cleanup``.

Each pass re-reads ``ExpirySettings`` (so admin edits apply without a restart), sweeps every due
task in batches, deletes old processed tasks (on PostgreSQL: creates the processed-task partitions
ahead and drops the expired ones, ``partitioning.expiry_partitions_maintain``), and records its
figures in Redis. Between passes it sleeps until the next task falls due or the interval ends,
whichever comes first, measured from the start of the pass so the schedule does not drift.
``stop()`` (SIGTERM/SIGINT, wired by the command) sets a flag: the batch in flight commits, then
the process exits. A failed pass is logged and retried on the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from django.db import Error as DbError
from django.db import close_old_connections
from django.utils import timezone

from . import partitioning, services
from .services import SweepResult, SweepTotals

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
    def __init__(self, *, batch_size: int | None = None) -> None:
        self.batch_size = batch_size  # None: ExpirySettings.batch_size, re-read every pass
        self._stop = threading.Event()
        self._last_progress = 0.0
        self._pass_done = 0

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
                batch_size=batch_size, should_stop=self._stop.is_set, progress=self._progress
            )
            if partitioning.partitioned_tasks():
                result.cleaned = partitioning.expiry_partitions_maintain(
                    now=timezone.now(), retention=config.retention
                ).get("rows", 0)
            else:
                result.cleaned = services.expiry_cleanup(
                    retention=config.retention,
                    batch_size=batch_size,
                    should_stop=self._stop.is_set,
                )
        except DbError as exc:  # InterfaceError too: a connection closed under us
            result.error = f"{type(exc).__name__}: {exc}".strip()
            logger.exception("expiry: pass failed; its batch stays pending for the next pass")
            close_old_connections()  # a broken connection is replaced on the next pass
        self._log_pass(result)
        services.expiry_run_record(totals=result.totals, cleaned=result.cleaned, error=result.error)
        return result

    def _progress(self, batch: SweepResult) -> None:
        self._pass_done += batch.processed
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
