"""Recurring timeout jobs: an RRULE (RFC 5545, parsed by ``python-dateutil``) or a 5-field cron
expression (``cronsim``, in UTC).

A recurring job's first occurrence fires at its ``action_time``; that time starts the series
(``series_start``: an RRULE's ``COUNT`` and ``UNTIL`` count from it; an RRULE counts in whole
seconds, so later occurrences fall on whole seconds). A series created with its start further in
the past than ``START_GRACE`` begins at its next occurrence from now: the past is not replayed.
Each later occurrence is the rule's next time after both the one that fired and the moment it
settled (a worker that was down for an hour fires the overdue occurrence once, then goes on from
now), created as a new pending job in the transaction that records the firing
(``handlers.timeout_jobs.settle_fired``).

A rule is a tenant's input that the worker evaluates, so it is held to three bounds:

- on the rule, when a job is created (``check``): one line, ``INTERVAL`` >= 1, occurrences never
  closer than ``RECURRENCE_MIN_INTERVAL_S`` (worked out from the rule's parts, not from a sample),
  and no day filters on a ``SECONDLY`` rule (dateutil walks such a rule second by second through
  every day its filters refuse);
- on its evaluation, when a job is created (``first_occurrence``): the rule's next occurrences,
  found in a child process, each within a fifth of ``RECURRENCE_BUDGET_MS``, or the rule is
  refused;
- on every evaluation (``Calculator``): a child process that is killed once a query runs past
  ``RECURRENCE_BUDGET_MS``. A worker never evaluates a rule in its own process, and never inside
  a transaction: a rule that runs over its budget ends its series (the job is marked, an alert
  raised) and the worker goes on.

The cost of one evaluation does not grow with the series' age: a rule without ``COUNT`` is
evaluated from a start moved forward by whole periods of the rule to just before the moment asked
about (``_near``), which keeps every occurrence after it. A ``COUNT`` series is bounded by its own
length, which ``first_occurrence`` evaluates whole when the job is created.

Run as ``python -m reminders.recurrence``, this module is the child: it reads one JSON query a
line on stdin and answers one JSON line on stdout. It imports no Django.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

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
# Distinct rules one bulk request may carry: each is evaluated when the jobs are created, all of
# them within this many budgets (``request_limit_s``).
BULK_MAX_RULES = 20
REQUEST_LIMIT_BUDGETS = 10
# A rule is accepted when each of its probes costs at most this share of the budget, so that a
# machine a few times slower still evaluates it inside the budget when the job fires.
PROBE_SHARE = 5
# A series asked to start this little in the past (a client's "now", a clock a little behind)
# starts then, at once; one that starts further back begins at its next occurrence from now.
START_GRACE = timedelta(minutes=1)
STARTUP_TIMEOUT_S = 30  # a loaded machine may take seconds to start the child
PROBES = 4  # occurrences evaluated one after another when a job is created

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
_DAY_PARTS = ("bymonth", "bymonthday", "byyearday", "byweekno", "byweekday", "bysetpos", "byeaster")
# Time-of-day parts that expand a coarser rule into several times: (coarsest frequency they
# expand, name, values in their unit, seconds per unit).
_TIME_PARTS = (
    (HOURLY, "byhour", 24, 3600),
    (MINUTELY, "byminute", 60, 60),
    (SECONDLY, "bysecond", 60, 1),
)


_DIED = object()
_PARENT_ENV = "COUPONCENTER_RECURRENCE_PARENT"


class Exceeded(Exception):
    """The rule's evaluation ran past its time budget (the child was killed)."""


# --- the rule -----------------------------------------------------------------------------------


def check(rule: str, *, min_interval_s: int | None = None) -> None:
    """Raises ``ValueError`` with the reason when ``rule`` is not an RRULE or cron expression this
    service runs (see the module's bounds). ``min_interval_s``: ``RECURRENCE_MIN_INTERVAL_S``."""
    if min_interval_s is None:
        min_interval_s = _setting("RECURRENCE_MIN_INTERVAL_S")
    compiled = _compile(rule, datetime(2000, 1, 1, tzinfo=UTC))
    gap = _least_gap_s(compiled)
    if gap < min_interval_s:
        raise ValueError(
            f"its occurrences may come {_seconds(gap)} apart; at least {_seconds(min_interval_s)} "
            "(RECURRENCE_MIN_INTERVAL_S)"
        )


def next_after(rule: str, series_start: datetime, after: datetime) -> datetime | None:
    """The rule's first time strictly after ``after`` (None: the series is over). Evaluated in
    this process, without a budget: the child's work, and the tests'."""
    compiled = _compile(rule, series_start)
    if isinstance(compiled, rrule):
        return _near(compiled, after).after(after, inc=False)
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
        if parsed._freq == SECONDLY and any(parsed._original_rule.get(p) for p in _DAY_PARTS):
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
    return min([b - a for a, b in zip(values, values[1:], strict=False)]
               + [size - values[-1] + values[0]])  # fmt: skip


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


def _setting(name: str):
    from django.conf import settings

    return getattr(settings, name)


# --- evaluating under a budget --------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    at: datetime | None  # the next occurrence; None: the series is over
    ms: float  # what the evaluation cost in the child


class Calculator:
    """A child process that evaluates rules, one query at a time, killed when a query runs past
    ``budget_ms`` (and started again for the next query). Kept per process and name
    (``calculator()``); thread-safe; a forked process starts its own."""

    def __init__(self, budget_ms: int) -> None:
        self.budget_ms = budget_ms
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._buffer = b""

    def next_after(self, rule: str, series_start: datetime, after: datetime) -> Answer:
        """``Exceeded`` past the budget; ``ValueError`` for a rule that does not parse."""
        query = {"rule": rule, "start": series_start.isoformat(), "after": after.isoformat()}
        with self._lock:
            reply = self._ask(json.dumps(query).encode() + b"\n")
        if "error" in reply:
            raise ValueError(reply["error"])
        at = reply["at"]
        return Answer(datetime.fromisoformat(at) if at else None, reply["ms"])

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _ask(self, line: bytes) -> dict:
        for attempt in (1, 2):  # a child that died between queries is started again, once
            proc = self._child()
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self._kill()
                if attempt == 2:
                    raise
                continue
            reply = self._read_line(proc, time.monotonic() + self.budget_ms / 1000)
            if reply is not None and reply is not _DIED:
                return json.loads(reply)
            self._kill()
            if reply is None:  # still working: past its budget
                raise Exceeded(f"not found within {self.budget_ms} ms")
        raise OSError("the recurrence child process keeps dying")

    def _read_line(self, proc: subprocess.Popen, deadline: float) -> bytes | object | None:
        """The child's next line; None past the deadline, ``_DIED`` when its output ended."""
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 65536)
                if not chunk:  # the child died
                    return _DIED
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _child(self) -> subprocess.Popen:
        if self._pid != os.getpid():  # forked: the parent's child is not ours to talk to
            self._proc, self._pid, self._buffer = None, os.getpid(), b""
        if self._proc is None or self._proc.poll() is not None:
            root = str(Path(__file__).resolve().parent.parent)
            env = {
                **os.environ,
                _PARENT_ENV: str(os.getpid()),
                "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
            }
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "reminders.recurrence"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=root,
            )  # fmt: skip
            self._buffer = b""
            # The budget is for the rule, not for starting Python: wait for the child's word.
            if self._read_line(self._proc, time.monotonic() + STARTUP_TIMEOUT_S) != b"ready":
                self._kill()
                raise OSError("the recurrence child process did not start")
        return self._proc

    def _kill(self) -> None:
        proc, self._proc, self._buffer = self._proc, None, b""
        if proc is not None and self._pid == os.getpid():
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()


_calculators: dict[str, Calculator] = {}
_calculators_lock = threading.Lock()


def calculator(name: str = "") -> Calculator:
    """The calculator ``name`` of this process (a worker keeps one per topic, so one tenant's
    costly rules wait only on each other), with the budget of ``RECURRENCE_BUDGET_MS``."""
    budget = _setting("RECURRENCE_BUDGET_MS")
    with _calculators_lock:
        calc = _calculators.get(name)
        if calc is None or calc.budget_ms != budget:
            if calc is not None:
                calc.close()
            calc = _calculators[name] = Calculator(budget)
        return calc


def request_limit_s() -> float:
    """How long the rules of one request may take to check, all together."""
    return _setting("RECURRENCE_BUDGET_MS") * REQUEST_LIMIT_BUDGETS / 1000


def first_occurrence(rule: str, action_time: datetime, now: datetime) -> datetime:
    """The time the series of a new job starts: ``action_time``, or, when that is past, the rule's
    next occurrence from now (the past is not replayed). The rule is vetted first (``vet``)."""
    found = vet(rule, action_time, now)
    return action_time if action_time >= now - START_GRACE else found


def start_of(rule: str, action_time: datetime, now: datetime) -> datetime:
    """``first_occurrence`` of a rule ``vet`` accepted already (for another job of a bulk request):
    one evaluation, and only when ``action_time`` is past."""
    if action_time >= now - START_GRACE:
        return action_time
    at = _probe(calculator(), rule, action_time, now)
    if at is None:
        raise ValueError("it has no occurrence after now")
    return at


def vet(rule: str, action_time: datetime, now: datetime) -> datetime:
    """Checks the rule (``check``) and evaluates it for a series starting at ``action_time``: its
    next ``PROBES`` occurrences from now on (and, for a ``COUNT`` series, the whole series) must
    each be found within a ``PROBE_SHARE``-th of the budget. Returns the first of them.
    ``ValueError`` says why a rule is refused: a rule with no occurrence after its start is one
    (a job that fires once needs no recurrence)."""
    check(rule)
    compiled = _compile(rule, action_time)
    after = max(action_time, now)
    if isinstance(compiled, rrule) and compiled._until and compiled._until <= after:
        raise ValueError("its UNTIL is past")
    calc = calculator()
    found: list[datetime] = []
    for _ in range(PROBES):
        at = _probe(calc, rule, action_time, after)
        if at is None:
            break
        found.append(at)
        after = at
    if not found:
        since = "action_time" if action_time >= now else "now"
        raise ValueError(f"it has no occurrence after {since}")
    if isinstance(compiled, rrule):
        if compiled._count:  # each next walks the series from its start
            _probe(calc, rule, action_time, _END_OF_TIME)
        elif any(compiled._original_rule.get(p) for p in _DAY_PARTS):
            # The days it refuses come in runs whose length depends on the date: try a year of
            # them, a month apart, so a rule whose longest run is slow to cross is refused now.
            for month in range(1, 13):
                _probe(calc, rule, action_time, max(action_time, now) + timedelta(days=31 * month))
    return found[0]


_END_OF_TIME = datetime(9000, 1, 1, tzinfo=UTC)


def _probe(calc: Calculator, rule: str, series_start: datetime, after: datetime) -> datetime | None:
    limit_ms = calc.budget_ms / PROBE_SHARE
    try:
        answer = calc.next_after(rule, series_start, after)
    except Exceeded:
        raise ValueError(
            f"its next occurrence cannot be found within {calc.budget_ms} ms"
        ) from None
    if answer.ms > limit_ms:
        raise ValueError(
            f"its next occurrence takes {answer.ms:.0f} ms to find; at most {limit_ms:.0f} ms"
        )
    return answer.at


# --- the child ------------------------------------------------------------------------------------


def _serve() -> None:
    _die_with_parent()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin.buffer:
        started = time.perf_counter()
        try:
            query = json.loads(line)
            at = next_after(query["rule"], datetime.fromisoformat(query["start"]),
                            datetime.fromisoformat(query["after"]))  # fmt: skip
            reply = {"at": at.isoformat() if at else None}
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            reply = {"error": str(exc) or exc.__class__.__name__}
        reply["ms"] = (time.perf_counter() - started) * 1000
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def _die_with_parent() -> None:
    """Killed with its parent (Linux): a parent killed mid-query must not leave the child to
    finish a rule past its budget."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if str(os.getppid()) != os.environ.get(_PARENT_ENV):  # it died before the line above
            os._exit(1)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's kill on its budget still holds


if __name__ == "__main__":
    _serve()
