"""The recurrence rule itself: parsing an RRULE or a cron expression, the bounds a rule is held to
when a job is created (``check``), and its next occurrence (``next_after``), evaluated without a
time budget: the child process of ``budget`` runs it for the worker and the API. The child imports
this module, so it loads no Django.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError
from dateutil.relativedelta import relativedelta
from dateutil.rrule import (
    DAILY,
    HOURLY,
    MINUTELY,
    SECONDLY,
    WEEKLY,
    YEARLY,
    rrule,
    rrulestr,
)

MAX_CHARS = 500

_DAY_S = 86_400
_PERIOD = {
    SECONDLY: timedelta(seconds=1),
    MINUTELY: timedelta(minutes=1),
    HOURLY: timedelta(hours=1),
    DAILY: timedelta(days=1),
    WEEKLY: timedelta(weeks=1),
}
_SUB_DAILY_S = {HOURLY: 3600, MINUTELY: 60, SECONDLY: 1}
# The parts that pick days: refused on a SECONDLY rule.
DAY_PARTS = ("bymonth", "bymonthday", "byyearday", "byweekno", "byweekday", "bysetpos", "byeaster")
# Time-of-day parts that expand a coarser rule into several times: (coarsest frequency they
# expand, name, values in their unit, seconds per unit).
_TIME_PARTS = (
    (HOURLY, "byhour", 24, 3600),
    (MINUTELY, "byminute", 60, 60),
    (SECONDLY, "bysecond", 60, 1),
)


def check(rule: str, *, min_interval_s: int | None = None) -> None:
    """Raises ``ValueError`` with the reason when ``rule`` is not an RRULE or cron expression this
    service runs (the bounds of ``reminders.recurrence``). ``min_interval_s``:
    ``RECURRENCE_MIN_INTERVAL_S``."""
    if min_interval_s is None:
        from django.conf import settings  # here, not above: the child imports this module

        min_interval_s = settings.RECURRENCE_MIN_INTERVAL_S
    compiled = compile_rule(rule, datetime(2000, 1, 1, tzinfo=UTC))
    gap = _least_gap_s(compiled)
    if gap < min_interval_s:
        raise ValueError(
            f"its occurrences may come {_seconds(gap)} apart; at least {_seconds(min_interval_s)} "
            "(RECURRENCE_MIN_INTERVAL_S)"
        )


def next_after(rule: str, series_start: datetime, after: datetime) -> datetime | None:
    """The rule's first time strictly after ``after`` (None: the series is over). Evaluated in
    this process, without a budget: the child's work, and the tests'."""
    compiled = compile_rule(rule, series_start)
    if isinstance(compiled, rrule):
        return _near(compiled, after).after(after, inc=False)
    return next(CronSim(compiled, after.astimezone(UTC)), None)


def compile_rule(rule: str, start: datetime) -> rrule | str:
    """The rule as dateutil's ``rrule`` starting at ``start``, or a cron expression's text once it
    parses. ``ValueError`` says why a rule is refused."""
    text = rule.strip()
    if not text:
        raise ValueError("empty")
    if len(text) > MAX_CHARS:
        raise ValueError(f"longer than {MAX_CHARS} characters")
    upper = text.upper()
    if upper.startswith(("RRULE:", "FREQ=")):
        if "DTSTART" in upper or "\n" in text:
            raise ValueError("one RRULE line without DTSTART: the series starts at action_time")
        if "BYEASTER" in upper:
            raise ValueError("BYEASTER is not supported")
        try:
            parsed = rrulestr(text, dtstart=start.astimezone(UTC))
        except (ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"not a valid RRULE: {exc}") from None
        if not isinstance(parsed, rrule):
            raise ValueError("one RRULE, not a set")
        if parsed._interval < 1:
            raise ValueError("INTERVAL must be 1 or more")
        if parsed._freq == SECONDLY and any(parsed._original_rule.get(p) for p in DAY_PARTS):
            raise ValueError("a SECONDLY rule cannot pick days: use MINUTELY or coarser")
        return parsed
    if len(text.split()) != 5:
        raise ValueError("an RRULE (FREQ=...) or a cron expression of 5 fields")
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(f"not a valid cron expression: {exc}") from None
    return text


def _least_gap_s(compiled: rrule | str) -> int:
    """A lower bound of the time between two occurrences, from the rule's parts alone: its
    period for a sub-daily frequency (one day for a coarser one), and the closest two values of
    each time-of-day part that expands it into several times (with the wrap to the next unit)."""
    if isinstance(compiled, str):
        cron = CronSim(compiled, datetime(2000, 1, 1, tzinfo=UTC))
        parts = ((sorted(cron.minutes), 60, 60), (sorted(cron.hours), 24, 3600))
        gap = _DAY_S
        for values, size, unit in parts:
            if len(values) > 1:
                return min(gap, _closest(values, size) * unit)
        return gap
    freq, given = compiled._freq, compiled._original_rule
    gap = compiled._interval * _SUB_DAILY_S[freq] if freq in _SUB_DAILY_S else _DAY_S
    for coarsest, name, size, unit in _TIME_PARTS:
        values = sorted(set(given.get(name) or ()))
        if freq < coarsest and len(values) > 1:  # dateutil numbers YEARLY 0 .. SECONDLY 6
            gap = min(gap, _closest(values, size) * unit)
    return gap


def _closest(values: list[int], size: int) -> int:
    gaps = [b - a for a, b in zip(values, values[1:], strict=False)]
    return min([*gaps, size - values[-1] + values[0]])


def _near(compiled: rrule, after: datetime) -> rrule:
    """The same rule started from a moment at most one period before ``after``, moved from its
    start by whole periods (of ``INTERVAL`` units), so every occurrence after ``after`` is kept:
    the time of day, the weekday (weekly), the day of the month (monthly) and the date (yearly)
    that the rule takes from its start stay the same. A ``COUNT`` rule counts from its start and
    is left there."""
    start = compiled._dtstart
    if compiled._count or after <= start:
        return compiled
    freq, n = compiled._freq, compiled._interval
    if freq in _PERIOD:
        step = _PERIOD[freq] * n
        return compiled.replace(dtstart=start + step * ((after - start) // step))
    unit = 12 if freq == YEARLY else 1
    months = (after.year - start.year) * 12 + after.month - start.month
    k = months // (n * unit)
    for back in range(13):  # a 31st, or a 29 February: the latest period that has the date
        if k - back <= 0:
            break
        moved = start + relativedelta(months=(k - back) * n * unit)
        if moved.day == start.day and moved <= after:
            return compiled.replace(dtstart=moved)
    return compiled


def _seconds(value: int) -> str:
    return f"{value} s" if value < 120 else f"{value // 60} min"
