"""Vetting a recurrence rule when a job is created: its next occurrences are evaluated by the
child process of ``budget``, and a rule that is slow to evaluate is refused then rather than
ending its series when the job fires (see ``reminders.recurrence``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from dateutil.rrule import rrule
from django.conf import settings

from reminders.recurrence import budget, rules

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
PROBES = 4  # occurrences evaluated one after another when a job is created
_END_OF_TIME = datetime(9000, 1, 1, tzinfo=UTC)  # asked about, a COUNT series is walked whole


def request_limit_s() -> float:
    """How long the rules of one request may take to check, all together."""
    return settings.RECURRENCE_BUDGET_MS * REQUEST_LIMIT_BUDGETS / 1000


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
    at = _probe(budget.calculator(), rule, action_time, now)
    if at is None:
        raise ValueError("it has no occurrence after now")
    return at


def vet(rule: str, action_time: datetime, now: datetime) -> datetime:
    """Checks the rule (``rules.check``) and evaluates it for a series starting at
    ``action_time``: its next ``PROBES`` occurrences from now on (and, for a ``COUNT`` series, the
    whole series) must each be found within a ``PROBE_SHARE``-th of the budget. Returns the first
    of them. ``ValueError`` says why a rule is refused: a rule with no occurrence after its start
    is one (a job that fires once needs no recurrence)."""
    rules.check(rule)
    compiled = rules.compile_rule(rule, action_time)
    after = max(action_time, now)
    if isinstance(compiled, rrule) and compiled._until and compiled._until <= after:
        raise ValueError("its UNTIL is past")
    calc = budget.calculator()
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
        elif any(compiled._original_rule.get(p) for p in rules.DAY_PARTS):
            # The days it refuses come in runs whose length depends on the date: try a year of
            # them, a month apart, so a rule whose longest run is slow to cross is refused now.
            for month in range(1, 13):
                _probe(calc, rule, action_time, max(action_time, now) + timedelta(days=31 * month))
    return found[0]


def _probe(
    calc: budget.Calculator, rule: str, series_start: datetime, after: datetime
) -> datetime | None:
    limit_ms = calc.budget_ms / PROBE_SHARE
    try:
        answer = calc.next_after(rule, series_start, after)
    except budget.Exceeded:
        raise ValueError(
            f"its next occurrence cannot be found within {calc.budget_ms} ms"
        ) from None
    if answer.ms > limit_ms:
        # The same refusal as past the whole budget, in the same words: which of the two a costly
        # rule meets depends only on how fast the machine is today.
        raise ValueError(
            f"its next occurrence cannot be found within {limit_ms:.0f} ms "
            f"(it took {answer.ms:.0f} ms)"
        )
    return answer.at
