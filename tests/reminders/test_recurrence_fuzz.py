"""The recurrence validator over a corpus of generated RRULE and cron strings (a fixed seed, so
a failure comes back the same): no rule it accepts takes longer than ``RECURRENCE_BUDGET_MS`` to
yield its next occurrence, at any age of its series, in the child process that evaluates rules
for the workers. No database or Redis: the rules are the whole input."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from reminders.recurrence import budget, vetting

pytestmark = pytest.mark.slow
SEED = 20261126
RULES = 160
AGES = [timedelta(0), timedelta(hours=1), timedelta(days=1), timedelta(days=45),
        timedelta(days=200), timedelta(days=400), timedelta(days=3 * 365),
        timedelta(days=10 * 365 + 3), timedelta(days=30 * 365 + 7)]  # fmt: skip
FREQS = ["SECONDLY", "MINUTELY", "HOURLY", "DAILY", "WEEKLY", "MONTHLY", "YEARLY"]
DAYS = ["MO", "TU", "WE", "TH", "FR", "SA", "SU"]


def _some(rng: random.Random, values: list, most: int = 3) -> str:
    return ",".join(str(v) for v in rng.sample(values, rng.randint(1, most)))


def _rrule(rng: random.Random) -> str:
    parts = [f"FREQ={rng.choice(FREQS)}"]
    if rng.random() < 0.5:
        parts.append(f"INTERVAL={rng.choice([0, 1, 2, 3, 7, 13, 60, 61, 90, 1000])}")
    by = {
        "BYMONTH": lambda: _some(rng, list(range(1, 13))),
        "BYMONTHDAY": lambda: _some(rng, [*range(1, 32), -1, -2]),
        "BYDAY": lambda: _some(rng, DAYS + [f"{n}{d}" for n in (1, 2, -1) for d in DAYS]),
        "BYHOUR": lambda: _some(rng, list(range(24))),
        "BYMINUTE": lambda: _some(rng, list(range(0, 60, 5)), 2),
        "BYSECOND": lambda: _some(rng, [0, 15, 30, 59], 2),
        "BYYEARDAY": lambda: _some(rng, [1, 100, 200, 365, 366, -1]),
        "BYWEEKNO": lambda: _some(rng, [1, 20, 52, 53]),
        "BYSETPOS": lambda: _some(rng, [1, 2, -1]),
    }
    for name in rng.sample(sorted(by), rng.choice([0, 1, 1, 2, 2, 3])):
        parts.append(f"{name}={by[name]()}")
    ending = rng.random()
    if ending < 0.2:
        parts.append(f"COUNT={rng.choice([1, 3, 50, 2000, 10**6])}")
    elif ending < 0.3:
        parts.append(f"UNTIL={rng.choice(['20200101T000000Z', '20400101T000000Z'])}")
    return ";".join(parts)


def _cron(rng: random.Random) -> str:
    def field(low: int, high: int) -> str:
        pick = rng.random()
        if pick < 0.35:
            return "*"
        if pick < 0.55:
            return f"*/{rng.choice([2, 5, 7, 15])}"
        if pick < 0.8:
            return _some(rng, list(range(low, high + 1)))
        start = rng.randint(low, high)
        return f"{start}-{rng.randint(start, high)}"

    return " ".join([field(0, 59), field(0, 23), field(1, 31), field(1, 12), field(0, 6)])


def corpus() -> list[str]:
    rng = random.Random(SEED)
    rules = dict.fromkeys(
        _rrule(rng) if rng.random() < 0.7 else _cron(rng) for _ in range(RULES * 2)
    )
    return list(rules)[:RULES]


def test_no_accepted_rule_takes_longer_than_the_budget_at_any_series_age():
    now = timezone.now()
    calc = budget.calculator()
    accepted, refused, over = [], [], []
    for rule in corpus():
        try:
            vetting.first_occurrence(rule, now, now)
        except ValueError as exc:
            assert str(exc), rule  # every refusal says why
            refused.append(rule)
            continue
        accepted.append(rule)
        for age in AGES:
            try:
                answer = calc.next_after(rule, now - age, now)
            except budget.Exceeded:
                over.append((rule, age))
                continue
            assert answer.ms < settings.RECURRENCE_BUDGET_MS, (rule, age, answer)
    assert over == []
    # The corpus exercises both sides: it is no use if everything passes or nothing does.
    assert len(accepted) >= RULES // 4 and len(refused) >= RULES // 4, (len(accepted), refused)
