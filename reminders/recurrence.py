"""Recurring timeout jobs: an RRULE (RFC 5545, parsed by ``python-dateutil``) or a 5-field cron
expression (``cronsim``, in UTC).

A recurring job's first occurrence fires at its ``action_time``; that time starts the series
(``series_start``: an RRULE's ``COUNT`` and ``UNTIL`` count from it; an RRULE counts in whole
seconds, so later occurrences fall on whole seconds). Each later occurrence is the
rule's next time strictly after the one that fired, created as a new pending job in the same
transaction that records the firing (``handlers.timeout_jobs.settle_fired``): a worker that dies
before that commit fires the same occurrence again (same job, same ``Idempotency-Key``) and then
creates its successor once; one that dies after it leaves the successor in the database, where
the reconcile finds it. Occurrences that fell due while nothing ran fire one after another: none
is skipped.
"""

from __future__ import annotations

from datetime import UTC, datetime

from cronsim import CronSim, CronSimError
from dateutil.rrule import rrule, rrulestr

MAX_CHARS = 500


def check(rule: str) -> None:
    """Raises ``ValueError`` with the reason when ``rule`` is neither a valid RRULE nor cron."""
    _compile(rule, datetime(2000, 1, 1, tzinfo=UTC))


def next_after(rule: str, series_start: datetime, after: datetime) -> datetime | None:
    """The rule's first time strictly after ``after`` (None: the series is over)."""
    compiled = _compile(rule, series_start)
    if isinstance(compiled, rrule):
        return compiled.after(after, inc=False)
    return next(CronSim(compiled, after.astimezone(UTC)), None)


def _compile(rule: str, start: datetime) -> rrule | str:
    text = rule.strip()
    if not text:
        raise ValueError("empty")
    if len(text) > MAX_CHARS:
        raise ValueError(f"longer than {MAX_CHARS} characters")
    upper = text.upper()
    if upper.startswith(("RRULE:", "FREQ=")):
        if "DTSTART" in upper or "\n" in text:
            raise ValueError("one RRULE line without DTSTART: the series starts at action_time")
        try:
            parsed = rrulestr(text, dtstart=start.astimezone(UTC))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"not a valid RRULE: {exc}") from None
        if not isinstance(parsed, rrule):
            raise ValueError("one RRULE, not a set")
        return parsed
    if len(text.split()) != 5:
        raise ValueError("an RRULE (FREQ=...) or a cron expression of 5 fields")
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(f"not a valid cron expression: {exc}") from None
    return text
