"""The timeout center against real processes: reminder workers (``run_reminder_worker``, whose
executors fire in threads), a Celery worker for the reminders, and local HTTP receivers.

- a receiver that takes 3 s per call fills only its own topic's executor: another topic and the
  reminders keep firing, and no lease is lost;
- a receiver that fails: retries follow the backoff until the job is dead and an alert is raised;
- a topic added in the admin fires without a restart;
- a rate limit holds across two workers.

Observed, not timed: each test waits for what the processes write (rows, receiver requests).
Where a bound on time is asserted it is a lower one (a backoff, a rate), which a slow or loaded
machine only makes easier to meet.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from reminders.engine import leases, queue
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.services import timeout_job_create, timeout_topic_save
from tests.chaos.conftest import assert_each_notified_once, reminders_due_over, wait_all_notified
from tests.e2e.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
SECRET = "an-e2e-topic-secret-of-at-least-32-bytes"
Status = TimeoutJob.Status


def _http_topic(name: str, url: str, **fields) -> TimeoutTopic:
    return timeout_topic_save(topic=TimeoutTopic(name=name), type="http", target=url,
                              secret=SECRET, allow_http=True, **fields)  # fmt: skip


def _jobs(topic: str, count: int, *, in_s: float = 0, prefix: str = "j") -> list[TimeoutJob]:
    at = timezone.now() + timedelta(seconds=in_s)
    return [timeout_job_create(topic=topic, biz_type="order", biz_id=f"{prefix}-{i}",
                               action_time=at) for i in range(count)]  # fmt: skip


def _processed(jobs: list[TimeoutJob]) -> int:
    return TimeoutJob.objects.filter(pk__in=[j.pk for j in jobs], status=Status.PROCESSED).count()


def test_a_slow_receiver_holds_up_only_its_own_topic(stack, reminder_settings, receiver_factory):
    stack.env["WEBHOOK_ALLOW_PRIVATE"] = "1"
    reminder_settings.change(slots=8, prestage_ms=0)
    slow, fast = receiver_factory(), receiver_factory()
    slow.delay_s = 3.0
    _http_topic("t.slow", slow.url, concurrency=2, timeout_ms=5_000, visibility_ms=60_000)
    _http_topic("t.fast", fast.url, concurrency=4)
    stack.start()
    slow_jobs = _jobs("t.slow", 12, prefix="slow")  # 2 at a time, 3 s each: 18 s of calls
    wait_for(lambda: slow.snapshot(), timeout=30, what=f"the first slow call\n{stack.logs()}")

    # While the slow topic's executor is full: another topic's jobs and reminders fall due.
    fast_jobs = _jobs("t.fast", 30, in_s=1, prefix="fast")
    subs = reminders_due_over(users=200, start_s=1, spread_s=2, slots=8)
    wait_for(lambda: _processed(fast_jobs) == 30, timeout=60,
             what=f"the fast topic's jobs\n{stack.logs()}")  # fmt: skip
    wait_all_notified(subs, stack, timeout=60)
    # Fired while the slow topic still had calls to make: in a loop that waited for each call,
    # they would have come after all twelve.
    assert len(slow.snapshot()) < 12
    assert _processed(slow_jobs) < 12
    assert len(fast.snapshot()) == 30

    wait_for(lambda: _processed(slow_jobs) == 12, timeout=90,
             what=f"the slow topic's jobs\n{stack.logs()}")  # fmt: skip
    assert_each_notified_once(subs)
    assert len(slow.snapshot()) == 12  # each once: none was reaped while it waited its turn
    assert not re.search(r"lease lost", stack.logs(), re.IGNORECASE), stack.logs()
    assert {j.attempts for j in TimeoutJob.objects.filter(topic="t.slow")} == {1}


def test_a_failing_receiver_is_retried_with_backoff_until_dead_and_alerted(
    stack, reminder_settings, receiver_factory
):
    stack.env["WEBHOOK_ALLOW_PRIVATE"] = "1"
    failing = receiver_factory()
    failing.respond = lambda body: 503
    _http_topic("t.down", failing.url, max_attempts=4, backoff_base_ms=300,
                backoff_cap_ms=10_000)  # fmt: skip
    worker = stack.start_reminder_worker()
    [job] = _jobs("t.down", 1)
    wait_for(lambda: TimeoutJob.objects.filter(pk=job.pk, status=Status.DEAD).exists(),
             timeout=60, what=f"the job to die\n{worker.output()[-3000:]}")  # fmt: skip
    calls = [r.at for r in failing.snapshot()]
    assert len(calls) == 4
    # Retry n waits at least base * 2^(n-1): 300, 600, 1200 ms.
    gaps = [later - earlier for earlier, later in zip(calls, calls[1:], strict=False)]
    assert [gap >= 0.3 * 2**n for n, gap in enumerate(gaps)] == [True] * 3, gaps
    job.refresh_from_db()
    assert job.attempts == 4 and "HTTP 503" in job.last_error and "/hook" not in job.last_error
    # The row is settled dead first, in its transaction; the dead letter goes to Redis after it.
    wait_for(lambda: queue.list_dead("t.down", job.slot), timeout=30, what="the dead letter")
    [dead] = queue.list_dead("t.down", job.slot)
    assert (dead.job_id, dead.attempts) == (str(job.pk), 4)
    wait_for(lambda: "ALERT 1 timeout jobs dead after 4 attempts" in worker.output(),
             timeout=30, what=f"the alert\n{worker.output()[-3000:]}")  # fmt: skip


def test_a_topic_added_in_the_admin_fires_without_a_restart(stack, admin_user):
    worker = stack.start_reminder_worker()
    client = Client()
    client.force_login(admin_user)
    form = {"name": "t.added", "type": "log", "target": "", "secret": "", "slots": 4,
            "max_attempts": 16, "backoff_base_ms": 1000, "backoff_cap_ms": 300000,
            "visibility_ms": 30000, "concurrency": 8, "timeout_ms": 5000,
            "rate_limit_per_s": 0, "fair_key": ""}  # fmt: skip
    added = client.post("/admin/reminders/timeouttopic/add/", form)
    assert added.status_code == 302, added.content.decode()[:2000]
    jobs = _jobs("t.added", 5)
    wait_for(lambda: _processed(jobs) == 5, timeout=30,
             what=f"the new topic's jobs\n{worker.output()[-3000:]}")  # fmt: skip
    assert "timeout topic t.added ready" in worker.output()
    assert worker.alive()


def test_a_rate_limit_holds_across_two_workers(stack, receiver_factory):
    stack.env["WEBHOOK_ALLOW_PRIVATE"] = "1"
    receiver = receiver_factory()
    rate, count = 20, 100
    _http_topic("t.rated", receiver.url, slots=8, concurrency=4, rate_limit_per_s=rate)
    stack.start_reminder_worker()
    stack.start_reminder_worker()
    wait_for(
        lambda: sum(1 for w in leases.list_workers() if w.owned.get("t.rated")) == 2,
        timeout=30, what="both workers to own slots of the topic",
    )  # fmt: skip
    jobs = _jobs("t.rated", count)
    wait_for(lambda: _processed(jobs) == count, timeout=120,
             what=f"the rated jobs\n{stack.logs()}")  # fmt: skip
    times = sorted(r.at for r in receiver.snapshot())
    assert len(times) == count
    # Two workers sharing one bucket: the whole run takes at least (count - burst) / rate
    # seconds (each worker on its own bucket would take half that).
    burst = max(1, rate // 10)
    assert times[-1] - times[0] >= (count - burst) / rate - 1.0, times[-1] - times[0]
    # And no second holds more than a second's tokens, the burst, and what the executors held.
    in_flight = 2 * 4 * 2  # two workers, each up to twice its concurrency on the way
    busiest = max(sum(1 for t in times if start <= t < start + 1) for start in times)
    assert busiest <= rate + burst + in_flight, busiest


def test_a_recurring_job_across_worker_kills_fires_each_occurrence_as_one_job(
    stack, receiver_factory, settings
):
    """Every second, 20 times, while the worker is SIGKILLed and restarted: each occurrence that
    fires is one job row, created once (in the transaction that recorded the one before), and
    reaches the receiver; a kill between a POST and its recording sends that same job again,
    under the same Idempotency-Key, which the receiver uses to ignore it. What fell due while
    no worker ran fires once, late, and the series goes on from then: the past is not replayed
    one occurrence after another."""
    settings.RECURRENCE_MIN_INTERVAL_S = 1  # every second, for the test's sake
    stack.env["WEBHOOK_ALLOW_PRIVATE"] = "1"
    receiver = receiver_factory()
    _http_topic("t.every", receiver.url, slots=1, visibility_ms=20_000, timeout_ms=2_000)
    worker = stack.start_reminder_worker()
    first = timeout_job_create(topic="t.every", biz_type="report", biz_id="daily",
                               action_time=timezone.now() + timedelta(seconds=1),
                               recurrence="FREQ=SECONDLY;COUNT=20")  # fmt: skip
    series = TimeoutJob.objects.filter(topic="t.every", biz_type="report", biz_id="daily")
    for fired in (1, 2):  # kill it mid-series, twice
        wait_for(lambda n=fired: series.filter(status=Status.PROCESSED).count() >= n,
                 timeout=60, what=f"occurrence {fired}\n{stack.logs()}")  # fmt: skip
        worker.kill()
        worker = stack.start_reminder_worker()
    last = first.action_time.replace(microsecond=0) + timedelta(seconds=19)
    wait_for(lambda: not series.filter(status__in=[Status.PENDING, Status.RUNNING]).exists()
             and timezone.now() > last, timeout=120,
             what=f"the whole series\n{stack.logs()}")  # fmt: skip

    rows = list(series.order_by("action_time"))
    times = [r.action_time for r in rows]
    assert 3 <= len(rows) <= 20 and len(set(times)) == len(rows)  # none created twice
    # On its seconds (the rule drops the first time's fraction), each the first whole second after
    # the one before fired, however late a loaded machine fired it: after its first POST reached
    # the receiver (none replayed), and at most a second after its settle's gmt_modified, which is
    # read after the next time was asked for (none skipped beyond that).
    assert all(t.microsecond == 0 for t in times[1:]), times
    reached: dict[str, float] = {}
    for got in receiver.snapshot():
        reached.setdefault(got.headers["Idempotency-Key"], got.at)
    assert all(
        reached[f"t.every:{r.pk}"] < b.timestamp()
        and b <= max(r.action_time, r.gmt_modified) + timedelta(seconds=1)
        for r, b in zip(rows, times[1:], strict=False)
    ), [(r.action_time, r.gmt_modified, reached.get(f"t.every:{r.pk}")) for r in rows]
    assert times[-1] <= last
    assert rows[0].pk == first.pk and {r.series_start for r in rows} == {first.action_time}
    assert {r.status for r in rows} == {Status.PROCESSED}
    keys = [r.headers["Idempotency-Key"] for r in receiver.snapshot()]
    assert set(keys) == {f"t.every:{r.pk}" for r in rows}  # every occurrence reached it
    assert queue.stats("t.every", [0], now_ms=0)[0].store == 0  # the series is over
