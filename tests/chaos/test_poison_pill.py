"""Chaos: a poison-pill job whose action kills its worker (SIGKILL from inside) every time.

The worker is restarted after each death. Each death leaves the pill in flight; the reaper puts
it back after its visibility timeout and counts the attempt, so after ``max_attempts`` deaths the
pill is in the dead queue, its ``TimeoutJob`` row DEAD (the engine's ``on_dead`` hook) and an
alert raised. The pill's batch-mates (its slot, due with it) come back with it after the first
death as suspects; each is then claimed alone, so they run once, on their second delivery, and the
pill dies alone from then on: a suspect fires in quarantine (``runtime.quarantine.Quarantine``),
once nothing else of its process is in flight or held (what was held goes back to store, its
attempt not spent) and with nothing new taken until it settled. So the
jobs due while the pill keeps killing workers, in the other slots and in another topic, run once
each, on their first delivery. (On its first run nobody knows the pill is one: what its process
had in flight then, in its executors' threads, is delivered again, as at-least-once promises.
Those jobs are created after the first death here.)
"""

from __future__ import annotations

import json
from datetime import timedelta
from functools import partial

import pytest
from django.utils import timezone

from reminders.engine import queue
from reminders.engine.keys import slot_for
from reminders.models import TimeoutJob
from reminders.services import timeout_job_create
from tests.chaos.conftest import wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PILL_TOPIC, OTHER_TOPIC, SLOTS, MAX_ATTEMPTS = "chaos.pill", "chaos.other", 4, 3
TOPICS = {
    PILL_TOPIC: {"type": "callable", "path": "tests.chaos.actions.poison_or_ok", "slots": SLOTS,
                 "visibility_ms": 1500, "max_attempts": MAX_ATTEMPTS, "backoff_base_ms": 100},
    OTHER_TOPIC: {"type": "log", "slots": SLOTS},
}  # fmt: skip
Status = TimeoutJob.Status


def _biz_ids(slot: int, *, inside: bool, count: int) -> list[str]:
    """``count`` business ids whose jobs land in (or outside) ``slot`` of the pill topic."""
    ids = (f"ok-{i}" for i in range(10_000))
    return [b for b in ids if (slot_for(b, SLOTS) == slot) == inside][:count]


def _dead_or_killed(worker, pill: TimeoutJob) -> bool:
    return not worker.alive() or TimeoutJob.objects.filter(pk=pill.pk, status=Status.DEAD).exists()


def test_poison_pill_ends_dead_after_the_attempt_limit_and_spares_the_others(
    stack, reminder_settings, settings
):
    settings.TIMEOUT_TOPICS = TOPICS
    stack.env["TIMEOUT_TOPICS_JSON"] = json.dumps(TOPICS)
    stack.env["LOG_LEVEL"] = "WARNING"  # one line per death, not the INFO chatter
    now = timezone.now()
    pill = timeout_job_create(topic=PILL_TOPIC, biz_type="chaos", biz_id="pill",
                              action_time=now, attribute={"poison": True})  # fmt: skip
    pill_slot = slot_for("pill", SLOTS)
    mates = [
        # Due 1 ms after the pill: claimed in its batch, behind it.
        timeout_job_create(topic=PILL_TOPIC, biz_type="chaos", biz_id=b,
                           action_time=now + timedelta(milliseconds=1))
        for b in _biz_ids(pill_slot, inside=True, count=5)
    ]  # fmt: skip

    def create_others() -> list[TimeoutJob]:
        """Due now and over the next seconds while the pill keeps killing workers: other slots
        of the pill's topic, and another topic."""
        now = timezone.now()
        return [
            timeout_job_create(topic=PILL_TOPIC, biz_type="chaos", biz_id=b,
                               action_time=now + timedelta(seconds=i % 10))
            for i, b in enumerate(_biz_ids(pill_slot, inside=False, count=30))
        ] + [
            timeout_job_create(topic=OTHER_TOPIC, biz_type="chaos", biz_id=f"other-{i}",
                               action_time=now + timedelta(seconds=i % 10))
            for i in range(30)
        ]  # fmt: skip

    others: list[TimeoutJob] = []
    deaths = 0
    worker = stack.start_reminder_worker(wait=False)
    while not TimeoutJob.objects.filter(pk=pill.pk, status=Status.DEAD).exists():
        assert deaths <= MAX_ATTEMPTS, f"the pill killed {deaths} workers\n{stack.logs()}"
        wait_for(partial(_dead_or_killed, worker, pill), timeout=60, interval=0.05,
                 what=f"the pill\n{stack.logs()}")  # fmt: skip
        if not worker.alive():
            deaths += 1
            assert f"chaos-poison job={pill.pk}" in worker.output(), worker.output()[-3000:]
            if deaths == 1:
                others = create_others()
            worker = stack.start_reminder_worker(wait=False)

    assert deaths == MAX_ATTEMPTS
    dead = {d.job_id: d for d in queue.list_dead(PILL_TOPIC, pill_slot, limit=100)}
    assert set(dead) == {str(pill.pk)} and dead[str(pill.pk)].attempts == MAX_ATTEMPTS
    pill.refresh_from_db()
    assert pill.last_error == "visibility timeout"
    wait_for(lambda: "ALERT 1 timeout jobs dead" in worker.output(), timeout=30,
             what=f"the alert\n{worker.output()[-3000:]}")  # fmt: skip

    # The others: each processed once, on its first delivery; the last worker is still alive.
    wait_for(lambda: TimeoutJob.objects.filter(pk__in=[j.pk for j in others],
                                               status=Status.PROCESSED).count() == len(others),
             timeout=60, what=f"the other jobs\n{stack.logs()}")  # fmt: skip
    rows = TimeoutJob.objects.filter(pk__in=[j.pk for j in others])
    assert set(rows.values_list("attempts", flat=True)) == {1}
    assert worker.alive()
    # The batch-mates: in the batch the pill killed, then each alone, on attempt 2; processed,
    # none dead with the pill.
    mate_rows = TimeoutJob.objects.filter(pk__in=[j.pk for j in mates])
    assert list(mate_rows.values_list("status", "attempts").distinct()) == [(Status.PROCESSED, 2)]
    for topic in (PILL_TOPIC, OTHER_TOPIC):
        stats = queue.stats(topic, range(SLOTS), now_ms=0)
        assert sum(s.store + s.prepare for s in stats) == 0
        assert sum(s.dead for s in stats) == (1 if topic == PILL_TOPIC else 0)
