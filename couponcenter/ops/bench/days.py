"""``bench_days``: D days of a campaign calendar, compressed in time, against the production
processes, with autovacuum on (docs/performance.md, "Day 100 as fast as day 1").

Each simulated day:

- **claims**: ``claims`` user coupons of the day's coupon, each with its expiry task (loaded in
  bulk, as ``bench_expiry`` loads them); a tenth are used during the day;
- **the night**: the rest expire, swept by ``SWEEPERS`` processes running the sweeper's code
  path (``expiry_sweep_due``) in ``NIGHT_ROUNDS`` rounds, one cohort of the claims each, spread
  over the day; the sweep rate is expired coupons per second, the median of the rounds';
- **a reminder burst**: ``reminders`` subscriptions due in the same second, claimed by the
  reminder worker and written to the inbox by the Celery worker (both production processes,
  ``reminders.bench.processes``); the rate is reminders in the inbox per second from the due
  second;
- **order timeouts**: ``timeouts`` http jobs created in bulk (the creation rate), four in five
  cancelled by the service, the rest fired by the reminder worker at nginx answering 204
  (``reminders.bench.nginx``: the rate is the sender's and the database's, not a receiver's that
  would share the two cores), from the due second to the last one processed; every one fired
  must be in nginx's access log;
- **retention**: ``day_retention`` (below), the app's retention and partition maintenance.

Compressed time. The hot paths run on the real clock: the production processes fire what is due
now, and a reminder due days ago would be dropped as hopeless. So each day runs now, and once its
rows are final (every coupon expired or used, every job fired or cancelled, every reminder sent)
they are *re-dated*: every timestamp of the day's rows moves back by ``D - d`` days, and the
retention of day ``d`` runs with ``now = real now - (D - d) days``. The rows of day ``d - k`` are
then ``k`` days old to it, as in a calendar of D days that ends today. The re-dating is the
benchmark's own ``UPDATE`` of each of the day's rows, once: it leaves one dead version of each row
for autovacuum, on top of the hot paths' own (the figures include it; BENCHMARKS.md says so).

The production processes run their own retention on the real clock; the bench processes are
started with ``RETENTION_EVERY_S`` at its maximum (a day), so within a run the retention is the
one this harness calls with the simulated ``now``.

Every row it makes is marked (its coupons' name, user ids from ``USER_BASE``, its timeout topic)
and deleted at the end, with its Redis keys; the live retention settings and ``autovacuum`` are
restored whatever happens (``autovacuum_on``; a run killed outright has ``autovacuum`` put back
by its guard process, its processes stopped by the kernel, its Redis keys and queue deleted by
``namespace_guard`` once they have, and its rows deleted by the next run).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from queue import Empty
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError
from django.db import connection, models, transaction
from django.utils import timezone

from couponcenter.core.redis import get_redis
from couponcenter.coupons.bench.progress import Progress
from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.ops.bench import autovacuum_guard, machine_reference, sweeper_child
from couponcenter.ops.bench.report import DAYS_RATE_KEEPS as RATE_KEEPS
from couponcenter.ops.bench.report import DAYS_SIZE_GROWS as SIZE_GROWS
from expiry import services as expiry_services
from expiry.bench.sweep import CLAIMS_LOAD_SQL
from expiry.models import ExpirySettings, ExpiryTask
from expiry.partitioning import pending_tasks_table
from expiry.retention import expiry_retention
from reminders.bench.end_to_end import prestage_window
from reminders.bench.namespace import bench_namespace
from reminders.bench.nginx import Nginx, NginxMissing, nginx_missing, nginx_receiver
from reminders.bench.processes import bench_processes
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.keys import slot_for
from reminders.members import REMINDER_TOPIC, member
from reminders.models import (
    Notification,
    ReminderSettings,
    ReminderSubscription,
    TimeoutJob,
    TimeoutTopic,
)
from reminders.selectors import reminder_settings_get
from reminders.services import (
    reminder_settings_save,
    timeout_job_cancel,
    timeout_jobs_bulk_create,
    timeout_jobs_rebuild,
    timeout_topic_save,
)
from reminders.services.retention import reminders_retention

COUPON_NAME = "__bench_days__"
TOPIC = "bench.days"
USER_BASE = 9_500_000_000  # the reminders' users, far from real ones; each day its own range
SWEEPERS = 2
USED_EVERY = 10  # one claim in ten is used during the day; the night expires the rest
CANCEL_OF_FIVE = 4  # four timeout jobs in five are cancelled, the fifth fires
FIRE_PATH = "/days"  # where the timeouts fire, on the run's nginx
CHUNK = 10_000
# The order timeouts are created, and their firing measured, in this many rounds, and each rate is
# the rounds' median: the day's 25,000 are created in about a second and its 5,000 fire in about
# five, and a one-second window on two shared cores swung by a third from one day to the next on
# the same code (docs/performance.md, "Why the night is swept in rounds").
TIMEOUT_ROUNDS = 3
# The night is swept in this many rounds, one between each of the day's other phases, and its rate
# is their median. A sweep of a day's claims lasts under a second here, and the same sweep of the
# same rows ran up to a quarter slower from one minute to the next (its CPU time too: the
# machine's, not the data's); three samples a minute apart, instead of one, keep one slow second
# from being the day's figure. ``_day`` places the rounds, so it names them one by one.
NIGHT_ROUNDS = 3
WAIT_S = 600  # the longest a phase may take before the run gives up
# How often a phase's end is polled. The rates do not depend on it: the end is read from the
# rows' own write times. The polls are kept rare and bounded to the day's rows because they share
# the two cores with the paths they measure.
POLL_S = 0.25
# How often the sweep's parent looks for autovacuum workers while it waits for the sweepers (it
# has nothing else to do then; the sweep lasts about a second).
BESIDE_POLL_S = 0.05

# The tables a day writes, each with the rows the bench made (its markers), for sizes, dead
# tuples, the re-dating and the final cleanup.
TABLES: tuple[type[models.Model], ...] = (
    Coupon,
    UserCoupon,
    ExpiryTask,
    ReminderSubscription,
    Notification,
    TimeoutJob,
)
RATES = ("expiry_sweep", "inbox_burst", "timeout_create", "timeout_fire")
# The live retention settings the run sets to ``retention_days`` (and restores).
RETENTION_FIELDS: dict[type[models.Model], tuple[str, ...]] = {
    ExpirySettings: ("retention", "user_coupon_retention"),
    ReminderSettings: (
        "timeout_job_retention",
        "notification_read_retention",
        "notification_unread_retention",
        "subscription_retention",
        "dead_letter_retention",
    ),
}
# Dead tuples under this share of live tuples on the partitioned tables (issue 28's target).
DEAD_SHARE = 0.10
# A day's end waits at most this long for autovacuum to vacuum what it would (two of its default
# one-minute naptimes and the vacuum itself).
AUTOVACUUM_WAIT_S = 150.0


def day_retention(now: datetime) -> dict[str, int]:
    """The apps' retention passes (and, where the tables are partitioned, their partition upkeep),
    one each, as of ``now``: what the sweeper and the reminder worker run on their own schedule,
    called here once per simulated day. Returns the rows removed by retention name; a pass that
    failed raises (a benchmark must not go on as if it had removed nothing)."""
    runs = [*expiry_retention(now=now), *reminders_retention(now=now)]
    failed = [f"{run.name}: {run.error}" for run in runs if run.error]
    if failed:
        raise CommandError("retention failed: " + "; ".join(failed))
    return {run.name: run.removed for run in runs}


# --- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    days: int
    retention_days: int
    claims: int
    reminders: int
    timeouts: int
    # The longest a day's end waits for autovacuum's round (``autovacuum_round``); 0: not at all.
    autovacuum_wait_s: float = AUTOVACUUM_WAIT_S


def run(
    shape: Shape,
    *,
    progress: Progress | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """The whole calendar; the result (per day, the ratios and the targets)."""
    if connection.vendor != "postgresql":
        raise RuntimeError("bench_days needs PostgreSQL (autovacuum, table sizes, dead tuples)")
    if missing := nginx_missing("bench_days"):  # before anything is changed
        raise NginxMissing(missing)
    progress = progress or (lambda what, done, total: None)
    days: list[dict[str, Any]] = []
    result: dict[str, Any] = {"shape": shape.__dict__, "days": days}
    with (
        bench_namespace(_cleanup, say) as (prefix, delivery_queue),
        autovacuum_on(say) as autovacuum,
        retention_settings(timedelta(days=shape.retention_days)),
        _environ(WEBHOOK_ALLOW_PRIVATE="1", RETENTION_EVERY_S="86400"),
        nginx_receiver() as receiver,
    ):
        result["autovacuum"] = autovacuum
        _topic(receiver.url)
        log_dir = str(settings.VAR_DIR)
        # The burst without pre-staging: its rate is the pipeline's, due second to inbox.
        with bench_processes(prefix, delivery_queue, log_dir=log_dir), prestage_window(0):
            # Partitions for the first simulated day exist before its rows are re-dated.
            day_retention(_simulated_now(1, shape) - timedelta(days=1))
            for day in range(1, shape.days + 1):
                figures = _day(day, shape, progress, receiver)
                days.append(figures)
                say(day_line(figures))
                progress("days", day, shape.days)
    result.update(summary(days, shape))
    return result


def _simulated_now(day: int, shape: Shape) -> datetime:
    return timezone.now() - timedelta(days=shape.days - day)


def _day(day: int, shape: Shape, progress: Progress, receiver: Nginx) -> dict[str, Any]:
    marks = {model: _max_pk(model) for model in TABLES}
    buffers = buffer_stats()
    figures: dict[str, Any] = {"day": day, "block_size": _block_size()}
    # The machine's own speed, sampled between the day's phases (``machine_reference``).
    reference = [_reference_sample()]
    coupon, rounds = _claims(day, shape, progress)
    # The night's rounds between the day's other phases (NIGHT_ROUNDS).
    night = [_night_round(day, coupon, rounds[0])]
    figures["inbox_burst_per_s"], figures["inbox"] = _reminder_burst(day, shape, progress)
    reference.append(_reference_sample())
    night.append(_night_round(day, coupon, rounds[1]))
    timeouts = _order_timeouts(day, shape, progress, receiver, before=marks[TimeoutJob])
    figures.update(timeouts)
    night.append(_night_round(day, coupon, rounds[2]))
    reference.append(_reference_sample())
    figures["reference"] = machine_reference.day_reference(reference)
    figures["reference_per_s"] = figures["reference"]["per_s"]
    figures["night_rounds"] = night
    figures["expiry_sweep_per_s"] = round(statistics.median(r["per_s"] for r in night))
    figures["expired"] = sum(r["expired"] for r in night)
    figures["buffers"] = _since(buffers, buffer_stats())  # the hot paths', not the re-dating's
    back = timedelta(days=shape.days - day)
    _redate(marks, back)
    figures["retention_removed"] = day_retention(timezone.now() - back)
    figures["dead_tuples_at_day_end"] = {t: s["dead_tuples"] for t, s in table_stats().items()}
    figures["autovacuum_wait_s"] = autovacuum_round(shape.autovacuum_wait_s)
    figures["tables"] = table_stats()
    return figures


def _reference_sample() -> dict[str, Any]:
    with service_heap():  # the harness's heap is not the machine's speed
        return machine_reference.measure()


# --- claims and the night ------------------------------------------------------------------------


def even_parts(total: int, parts: int) -> list[tuple[int, int]]:
    """``range(total)`` as ``parts`` half-open ranges ``(lo, hi)``, contiguous and as even as
    whole items allow."""
    bounds = [total * k // parts for k in range(parts + 1)]
    return list(zip(bounds, bounds[1:], strict=False))


def night_cohorts(claims: int) -> list[tuple[int, int]]:
    """The day's claimers (user ids ``1..claims``) as ``NIGHT_ROUNDS`` ranges ``(lo, hi)``,
    contiguous and as even as whole users allow: one range a round of the night."""
    return [(lo + 1, hi) for lo, hi in even_parts(claims, NIGHT_ROUNDS)]


def firing_rounds_per_s(due: datetime, settled: list[datetime]) -> list[float]:
    """The firing's rate in ``TIMEOUT_ROUNDS`` rounds of the jobs in the order they settled:
    each round's jobs over the time from the settle before its first (the due moment for the
    first round) to its last."""
    rates = []
    for lo, hi in even_parts(len(settled), TIMEOUT_ROUNDS):
        if hi > lo:
            start = due if lo == 0 else settled[lo - 1]
            rates.append((hi - lo) / max((settled[hi - 1] - start).total_seconds(), 1e-3))
    return rates


@dataclass(frozen=True)
class _Round:
    due: datetime
    expected: int  # the round's unused coupons: what its sweep must expire


def _claims(day: int, shape: Shape, progress: Progress) -> tuple[Coupon, list[_Round]]:
    """The day's claims with their expiry tasks, a tenth used; one cohort a night round, each
    due a second after the one before, all in the past, so a sweep as of a cohort's due moment
    takes that cohort and none after it."""
    now = timezone.now()
    coupon = Coupon.objects.create(
        name=f"{COUPON_NAME} claims {day}",
        claim_opens_at=now - timedelta(hours=1),
        claim_closes_at=now,
        total_stock=shape.claims,
        valid_for=timedelta(hours=1),
    )
    dues = [now - timedelta(seconds=NIGHT_ROUNDS - k) for k in range(NIGHT_ROUNDS)]
    for (first, last), due in zip(night_cohorts(shape.claims), dues, strict=True):
        for lo in range(first, last + 1, CHUNK):
            hi = min(lo + CHUNK - 1, last)
            params = {"coupon": coupon.pk, "claimed": now - timedelta(hours=1), "due": due}
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(CLAIMS_LOAD_SQL, {**params, "lo": lo, "hi": hi})
            progress(f"day {day}: claims", hi, shape.claims)
    Coupon.objects.filter(pk=coupon.pk).update(claimed_count=shape.claims)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {UserCoupon._meta.db_table} SET status = %s, used_at = %s "
            "WHERE coupon_id = %s AND user_id %% %s = 0",
            [UserCoupon.Status.USED, now, coupon.pk, USED_EVERY],
        )
    _analyze_pending()
    unused = dict(
        UserCoupon.objects.filter(coupon=coupon, status=UserCoupon.Status.UNUSED)
        .values_list("expires_at")
        .annotate(n=models.Count("id"))
    )
    return coupon, [_Round(due, unused.get(due, 0)) for due in dues]


def _analyze_pending() -> None:
    """The planner's statistics of the pending tasks brought up to the day's claims, which were
    loaded a moment ago in one go. A production night's tasks arrive over the day and autovacuum
    analyzes them as they do; here the first round of the night would otherwise begin with the
    sweep's own ANALYZE (``expiry.sql.statistics_catch_up``), a fixed cost inside one sub-second
    round and not the others, and a later round would pay it or not as autovacuum's timing fell."""
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(pending_tasks_table())}")


def _pending_analyzes() -> int:
    """How often the pending tasks have been analyzed by hand (autovacuum's are counted apart)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(max(analyze_count), 0) FROM pg_stat_user_tables "
            "WHERE relid = %s::regclass",
            [pending_tasks_table()],
        )
        return int(cursor.fetchone()[0])


def _night_round(day: int, coupon: Coupon, night: _Round) -> dict[str, Any]:
    """One round of the night: the sweep as of its cohort's due moment, checked to have expired
    exactly that cohort's unused coupons and left no task due by then pending."""
    analyzes = _pending_analyzes()
    swept = _sweep(night.due)
    seconds = swept.pop("seconds")
    # The sweep's own ANALYZEs (expected none: ``_analyze_pending``); the statistics collector
    # has the sweepers' counts once they have exited, as they have.
    swept["sweep_analyzed"] = _pending_analyzes() - analyzes
    expired = UserCoupon.objects.filter(
        coupon=coupon, status=UserCoupon.Status.EXPIRED, expires_at=night.due
    ).count()
    pending = ExpiryTask.objects.filter(
        user_coupon__coupon=coupon, status=ExpiryTask.Status.PENDING, expire_at__lte=night.due
    ).count()
    if expired != night.expected or pending:
        raise AssertionError(
            f"day {day}: {expired} of {night.expected} expired in a night round, {pending} pending"
        )
    return {"per_s": round(expired / seconds), "expired": expired, **swept}


def _sweep(now: datetime) -> dict[str, Any]:
    """``SWEEPERS`` processes sweeping what is due at ``now``, released together: the seconds
    until all are done, and what it met: the WAL written meanwhile, its shared-buffer reads,
    the autovacuum workers beside it. Spawned, not forked: this
    process talks to Celery's broker, and a fork after that can hang in kombu's after-fork
    cleanup."""
    ctx = multiprocessing.get_context("spawn")
    ready, start, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=sweeper_child.sweep,
            args=(os.getpid(), now, ready, start, results),
            daemon=True,
        )
        for _ in range(SWEEPERS)
    ]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + WAIT_S
        for _ in procs:
            while True:
                with contextlib.suppress(Empty):
                    ready.get(timeout=0.5)
                    break
                if any(p.exitcode for p in procs) or time.monotonic() > deadline:
                    raise RuntimeError("a sweeper process did not start; see its traceback above")
        wal, buffers, beside = wal_stats(), buffer_stats(), set()
        started = time.perf_counter()
        start.set()
        for _ in procs:
            while True:
                with contextlib.suppress(Empty):
                    results.get(timeout=BESIDE_POLL_S)
                    break
                if time.perf_counter() - started > WAIT_S:
                    raise RuntimeError(f"the sweep did not end within {WAIT_S} s")
                beside |= autovacuum_now()
        seconds = time.perf_counter() - started
    finally:
        # On an error or Ctrl-C too: a sweeper still waiting for the start would hold the exit.
        for proc in procs:
            if proc.is_alive() and not start.is_set():
                proc.terminate()
            proc.join()
    if any(proc.exitcode for proc in procs):
        raise RuntimeError("a sweeper process failed; see its traceback above")
    # The sweepers have exited, so their statistics are in; the WAL counters are the server's,
    # so they hold whatever else wrote meanwhile too (autovacuum, ``beside``).
    wal_after = wal_stats()
    return {
        "seconds": max(seconds, 1e-3),
        "wal_fpi": wal_after["fpi"] - wal["fpi"],
        "wal_bytes": wal_after["bytes"] - wal["bytes"],
        "buffers": _since(buffers, buffer_stats()),
        "autovacuum_beside": sorted(beside),
    }


# --- the reminder burst --------------------------------------------------------------------------


def _reminder_burst(day: int, shape: Shape, progress: Progress) -> tuple[int, int]:
    users = USER_BASE + day * shape.reminders
    coupon = Coupon.objects.create(
        name=f"{COUPON_NAME} reminders {day}",
        claim_opens_at=timezone.now() + timedelta(hours=1),
        total_stock=shape.reminders,
        valid_for=timedelta(days=1),
    )
    slots = reminder_settings_get().slots
    due = timezone.now() + timedelta(seconds=shape.reminders / 5_000 + 3)
    for lo in range(0, shape.reminders, CHUNK):
        ReminderSubscription.objects.bulk_create(
            ReminderSubscription(
                coupon=coupon, user_id=users + i, remind_at=due, slot=slot_for(users + i, slots)
            )
            for i in range(lo, min(lo + CHUNK, shape.reminders))
        )
        progress(f"day {day}: subscriptions", min(lo + CHUNK, shape.reminders), shape.reminders)
    subs = ReminderSubscription.objects.filter(coupon=coupon).values_list("pk", "slot")
    if timezone.now() + timedelta(seconds=len(subs) / 50_000 + 1) > due:
        # The machine was slower than planned: the burst falls due a little later instead.
        due = timezone.now() + timedelta(seconds=len(subs) / 50_000 + 2)
        ReminderSubscription.objects.filter(coupon=coupon).update(remind_at=due)
    queue.schedule_many(REMINDER_TOPIC, [(member(pk), epoch_ms(due), slot) for pk, slot in subs])
    if timezone.now() >= due:
        raise RuntimeError(f"day {day}: the burst was scheduled after its due second")
    inbox = Notification.objects.filter(user_id__range=(users, users + shape.reminders - 1))
    written = _wait(f"day {day}: inbox", inbox.count, shape.reminders, progress)
    # The gateway stamps a batch's rows with the moment it writes them.
    done = inbox.aggregate(last=models.Max("created_at"))["last"]
    return round(shape.reminders / max((done - due).total_seconds(), 1e-3)), written


# --- order timeouts ------------------------------------------------------------------------------


def _topic(url: str) -> None:
    TimeoutTopic.objects.filter(name=TOPIC).delete()
    timeout_topic_save(
        topic=TimeoutTopic(name=TOPIC),
        type="http",
        target=f"{url}{FIRE_PATH}",
        secret=secrets.token_urlsafe(32),
        allow_http=True,
        concurrency=16,
    )


def _order_timeouts(
    day: int, shape: Shape, progress: Progress, receiver: Nginx, *, before: int
) -> dict[str, Any]:
    """``before``: the largest job id before the day, so its jobs are the ids above."""
    arrived_before = receiver.count(FIRE_PATH)
    far = timezone.now() + timedelta(hours=1)
    create_rates, create_s = [], 0.0
    for first, end in even_parts(shape.timeouts, TIMEOUT_ROUNDS):
        with service_heap():
            started = time.perf_counter()
            for lo in range(first, end, CHUNK):
                timeout_jobs_bulk_create(
                    [
                        {
                            "topic": TOPIC,
                            "biz_type": "order",
                            "biz_id": f"d{day}-{i}",
                            "action_time": far,
                        }
                        for i in range(lo, min(lo + CHUNK, end))
                    ]
                )
                progress(f"day {day}: timeouts created", min(lo + CHUNK, end), shape.timeouts)
            took = max(time.perf_counter() - started, 1e-3)
        create_rates.append((end - first) / took)
        create_s += took
    jobs = TimeoutJob.objects.filter(topic=TOPIC, biz_id__startswith=f"d{day}-").order_by("pk")
    cancel = [job for i, job in enumerate(jobs) if i % 5 < CANCEL_OF_FIVE]
    for n, job in enumerate(cancel, 1):
        with transaction.atomic():
            timeout_job_cancel(job=job)
        if n % 500 == 0 or n == len(cancel):
            progress(f"day {day}: timeouts cancelled", n, len(cancel))
    # The rest falls due in a few seconds, in the database and in Redis (as an operator's
    # reschedule would): the firing rate runs from that second to the last one processed.
    due = timezone.now() + timedelta(seconds=3)
    fire = shape.timeouts - len(cancel)
    TimeoutJob.objects.filter(topic=TOPIC, status=TimeoutJob.Status.PENDING).update(action_time=due)
    _forget_topic_keys()
    timeout_jobs_rebuild()
    # By the day's job ids, which every partition's index answers: the business key's prefix
    # would be a scan of every finished job kept, growing with the days until retention.
    processed = TimeoutJob.objects.filter(
        pk__gt=before, topic=TOPIC, status=TimeoutJob.Status.PROCESSED
    )
    beside: set[str] = set()
    fired = _wait(
        f"day {day}: timeouts fired",
        processed.count,
        fire,
        progress,
        each=lambda: beside.update(autovacuum_now()),
    )
    # A fired job's gmt_modified is the moment its firing was recorded.
    settled = sorted(processed.values_list("gmt_modified", flat=True))
    done = settled[-1]
    # Each one fired reached the receiver (more than once is allowed: at least once).
    arrived = receiver.wait_logged(FIRE_PATH, arrived_before + fired) - arrived_before
    if arrived < fired:
        raise AssertionError(f"day {day}: {fired} timeouts fired, {arrived} reached the receiver")
    fire_rates = firing_rounds_per_s(due, settled)
    return {
        # Each rate is the median of its rounds' (``TIMEOUT_ROUNDS``); the whole span's beside it.
        "timeout_create_per_s": round(statistics.median(create_rates)),
        "timeout_create_rounds_per_s": [round(r) for r in create_rates],
        "timeout_create_whole_per_s": round(shape.timeouts / create_s),
        "timeout_fire_per_s": round(statistics.median(fire_rates)),
        "timeout_fire_rounds_per_s": [round(r) for r in fire_rates],
        "timeout_fire_whole_per_s": round(fire / max((done - due).total_seconds(), 1e-3)),
        # Where the firing's seconds went: from the due second to the first settle, to half of
        # them, to the last; and what autovacuum did meanwhile.
        "timeout_fire_settled_s": [
            round((at - due).total_seconds(), 3)
            for at in (settled[0], settled[len(settled) // 2], done)
        ],
        "timeout_fire_autovacuum_beside": sorted(beside),
        "timeouts_cancelled": len(cancel),
        "timeouts_fired": fired,
        "timeouts_arrived": arrived,
    }


@contextlib.contextmanager
def service_heap() -> Iterator[None]:
    """Run a timed call of a service made in this process on a heap like a server's: the
    harness's own objects (earlier phases' rows, the query log ``DEBUG`` keeps) are collected,
    then frozen out of the collector's view until the block ends. A full collection walks every
    tracked object, so the creation's rounds otherwise paid for the harness's heap, which is
    larger on later days than on the first and changes with what the poll before happened to
    keep; its own garbage is still collected on the clock."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _forget_topic_keys() -> None:
    client = get_redis()
    for key in client.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}:{{{TOPIC}:*", count=1000):
        client.delete(key)


def _wait(
    what: str,
    done: Callable[[], int],
    total: int,
    progress: Progress,
    *,
    each: Callable[[], None] = lambda: None,
) -> int:
    """Poll ``done()`` every ``POLL_S`` until it reaches ``total``, calling ``each()`` at every
    poll; the last answer."""
    deadline = time.monotonic() + WAIT_S
    while (n := done()) < total:
        each()
        progress(what, n, total)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {n} of {total} after {WAIT_S} s")
        time.sleep(POLL_S)
    progress(what, n, total)
    return n


# --- compressed time -----------------------------------------------------------------------------


def _max_pk(model: type[models.Model]) -> int:
    return model.objects.aggregate(m=models.Max("pk"))["m"] or 0


def _marker(model: type[models.Model]) -> tuple[str, list[Any]]:
    """SQL that picks the bench's own rows of ``model``'s table."""
    coupons = f"SELECT id FROM {Coupon._meta.db_table} WHERE name LIKE %s"
    like = [f"{COUPON_NAME}%"]
    if model is Coupon:
        return "name LIKE %s", like
    if model is UserCoupon:
        return f"coupon_id IN ({coupons})", like
    if model is ExpiryTask:
        return (
            f"user_coupon_id IN (SELECT id FROM {UserCoupon._meta.db_table} "
            f"WHERE coupon_id IN ({coupons}))",
            like,
        )
    if model is ReminderSubscription:
        return f"coupon_id IN ({coupons})", like
    if model is Notification:
        return "user_id >= %s", [USER_BASE]
    return "topic = %s", [TOPIC]


def _redate(marks: dict[type[models.Model], int], back: timedelta) -> None:
    """Every timestamp of the day's rows (the bench's, newer than ``marks``) ``back`` earlier."""
    if not back:
        return
    for model in TABLES:
        columns = [
            f.column
            for f in model._meta.concrete_fields
            if isinstance(f, models.DateTimeField) and not f.primary_key
        ]
        where, params = _marker(model)
        sets = ", ".join(f"{c} = {c} - %s" for c in columns)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {model._meta.db_table} SET {sets} "
                f"WHERE {model._meta.pk.column} > %s AND {where}",
                [*[back] * len(columns), marks[model], *params],
            )


# --- sizes and dead tuples -----------------------------------------------------------------------


# A table and, when it is partitioned, each of its partitions (``pg_partition_tree`` alone lists
# nothing for a plain table); the parameters are the table's name, twice.
_TREE = "(SELECT relid FROM pg_partition_tree(%s::regclass) UNION SELECT %s::regclass)"


def table_stats() -> dict[str, dict[str, Any]]:
    """Per table (a partitioned one summed over its partitions): heap and index bytes, live and
    dead tuples (``pg_stat_user_tables``, which the statistics collector updates within a
    second or so of each commit), and whether it is partitioned."""
    stats: dict[str, dict[str, Any]] = {}
    with connection.cursor() as cursor:
        for model in TABLES:
            table = model._meta.db_table
            cursor.execute(
                """SELECT coalesce(sum(pg_table_size(t.relid)), 0),
                          coalesce(sum(pg_indexes_size(t.relid)), 0),
                          coalesce(sum(s.n_live_tup), 0), coalesce(sum(s.n_dead_tup), 0),
                          bool_or(c.relkind = 'p')
                   FROM """
                + _TREE
                + """ t
                   JOIN pg_class c ON c.oid = t.relid
                   LEFT JOIN pg_stat_user_tables s ON s.relid = t.relid""",
                [table, table],
            )
            heap, index, live, dead, partitioned = cursor.fetchone()
            stats[table] = {
                "table_bytes": int(heap),
                "index_bytes": int(index),
                "live_tuples": int(live),
                "dead_tuples": int(dead),
                "partitioned": bool(partitioned),
            }
    return stats


def buffer_stats() -> dict[str, dict[str, int]]:
    """Per table (a partitioned one summed over its partitions, its indexes and TOAST included):
    the blocks found in PostgreSQL's shared buffers (``hit``) and those read into them from the
    operating system (``read``), as counted so far (``pg_statio_user_tables``). A day's
    difference says whether its hot paths ran from shared buffers or paid for the data's size."""
    stats: dict[str, dict[str, int]] = {}
    with connection.cursor() as cursor:
        for model in TABLES:
            table = model._meta.db_table
            cursor.execute(
                """SELECT coalesce(sum(coalesce(heap_blks_read, 0) + coalesce(idx_blks_read, 0)
                                       + coalesce(toast_blks_read, 0)
                                       + coalesce(tidx_blks_read, 0)), 0),
                          coalesce(sum(coalesce(heap_blks_hit, 0) + coalesce(idx_blks_hit, 0)
                                       + coalesce(toast_blks_hit, 0)
                                       + coalesce(tidx_blks_hit, 0)), 0)
                   FROM pg_statio_user_tables WHERE relid IN """
                + _TREE,
                [table, table],
            )
            read, hit = cursor.fetchone()
            stats[table] = {"read": int(read), "hit": int(hit)}
    return stats


def _since(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict:
    """``after - before`` per table and counter; a partition dropped meanwhile takes its counts
    with it, so a difference is never below 0."""
    return {
        table: {k: max(v - before.get(table, {}).get(k, 0), 0) for k, v in counts.items()}
        for table, counts in after.items()
    }


def _hit_share(buffers: dict[str, dict[str, int]]) -> float | None:
    read = sum(t["read"] for t in buffers.values())
    hit = sum(t["hit"] for t in buffers.values())
    return round(hit / (hit + read), 4) if hit + read else None


def wal_stats() -> dict[str, int]:
    """The server's WAL so far (``pg_stat_wal``): records, full-page images, bytes. A page's
    first change after a checkpoint began is written whole, so a phase that runs just after one
    writes many times the WAL of the same phase just before one."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal")
        records, fpi, written = cursor.fetchone()
    return {"records": int(records), "fpi": int(fpi), "bytes": int(written)}


def autovacuum_now() -> set[str]:
    """What autovacuum's workers are doing in this database now, as each says
    (``VACUUM ANALYZE public.couponcenter_usercoupon``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE backend_type = 'autovacuum worker' "
            "AND datname = current_database() AND query LIKE 'autovacuum: %%'"
        )
        return {autovacuum_label(query) for (query,) in cursor.fetchall()}


def autovacuum_label(query: str) -> str:
    """``autovacuum: VACUUM ANALYZE public.t`` -> ``VACUUM ANALYZE t``."""
    return query.removeprefix("autovacuum: ").replace("public.", "")


def autovacuum_round(wait_s: float) -> float:
    """Wait, at most ``wait_s``, until autovacuum has vacuumed every table the day wrote (each
    partition of a partitioned one) whose dead tuples are past its threshold
    (``autovacuum_vacuum_threshold`` + ``autovacuum_vacuum_scale_factor`` x its rows, the table's
    own settings where it has them: ``vacuum_thresholds``): the tables it would vacuum on its next
    round. The seconds waited.

    A day of production lasts 1,440 of autovacuum's rounds (its one-minute naptime); a compressed
    day lasts seconds and would count a whole day's dead tuples before autovacuum had looked once.
    So each day ends with one round, and the dead tuples are counted before it (the day's churn)
    and after it (what vacuum leaves: the target's figure)."""
    started = time.monotonic()
    while time.monotonic() - started < wait_s:
        if not any(dead > threshold for dead, threshold in vacuum_thresholds().values()):
            break
        time.sleep(1)  # autovacuum's rounds come a minute apart: a second's poll is plenty
    return round(time.monotonic() - started, 1)


def _option(name: str) -> str:
    """A table's own autovacuum setting where it has one (``ALTER TABLE ... SET``), else the
    server's."""
    return (
        f"coalesce((SELECT option_value::float FROM pg_options_to_table(c.reloptions) "
        f"WHERE option_name = '{name}'), current_setting('{name}')::float)"
    )


def vacuum_thresholds() -> dict[str, tuple[int, float]]:
    """Each table the day writes (each partition of a partitioned one, and a table that is not
    partitioned itself: ``pg_partition_tree`` has no rows for one): its dead tuples and the count
    past which autovacuum vacuums it, by its own settings where it has them."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT c.relname, s.n_dead_tup,
                       {_option("autovacuum_vacuum_threshold")}
                       + {_option("autovacuum_vacuum_scale_factor")} * greatest(c.reltuples, 0)
                FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
                WHERE s.relid IN (SELECT coalesce(p.relid, t.name::regclass)
                                  FROM unnest(%s::text[]) t(name)
                                  LEFT JOIN LATERAL pg_partition_tree(t.name::regclass) p ON true)
                  AND c.relkind = 'r'""",
            [[model._meta.db_table for model in TABLES]],
        )
        return {name: (dead, threshold) for name, dead, threshold in cursor.fetchall()}


def _total_bytes(day: dict[str, Any]) -> int:
    return sum(t["table_bytes"] + t["index_bytes"] for t in day["tables"].values())


# --- the report ----------------------------------------------------------------------------------


def summary(days: list[dict[str, Any]], shape: Shape) -> dict[str, Any]:
    """The ratios and the targets: the last day's rates over the first's; the total size of the
    last day over the first day at full retention (day ``retention_days + 1``); the largest
    share of dead tuples seen, per table."""
    if not days:
        return {}
    first, last = days[0], days[-1]
    keeps = {
        rate: round(last[f"{rate}_per_s"] / first[f"{rate}_per_s"], 3)
        if first[f"{rate}_per_s"]
        else None
        for rate in RATES
    }
    # Beside the target's two days, the straight line fitted through every day's rate: one day's
    # rate swings by a fifth or more on a shared machine, and the line says whether the days
    # between trend down or only the end points differ.
    trend = {rate: _fitted_last_of_first([d[f"{rate}_per_s"] for d in days]) for rate in RATES}
    # Each rate over the machine's own speed that day (``machine_reference``): the service's
    # figure with the machine's drift between the days taken out, and the machine's drift alone.
    machine = (
        round(last["reference_per_s"] / first["reference_per_s"], 3)
        if first["reference_per_s"]
        else None
    )
    of_reference = {rate: _of_reference(first, last, rate) for rate in RATES}
    trend_of_reference = {
        rate: _fitted_last_of_first([d[f"{rate}_per_s"] / d["reference_per_s"] for d in days])
        for rate in RATES
    }
    steady_day = min(shape.retention_days + 1, len(days))
    steady = _total_bytes(days[steady_day - 1])
    grows = round(_total_bytes(last) / steady, 3) if steady else None
    dead: dict[str, float] = {}
    churn: dict[str, float] = {}
    for day in days:
        for table, t in day["tables"].items():
            live = t["live_tuples"]
            share = t["dead_tuples"] / live if live else 0.0
            dead[table] = round(max(dead.get(table, 0.0), share), 3)
            at_end = day["dead_tuples_at_day_end"][table] / live if live else 0.0
            churn[table] = round(max(churn.get(table, 0.0), at_end), 3)
    partitioned = [t for t, s in last["tables"].items() if s["partitioned"]]
    return {
        "day_last_of_first": keeps,
        "day_trend_last_of_first": trend,
        "reference_last_of_first": machine,
        "day_last_of_first_of_reference": of_reference,
        "day_trend_last_of_first_of_reference": trend_of_reference,
        "steady_day": steady_day,
        "table_bytes_steady": steady,
        "table_bytes_last": _total_bytes(last),
        "table_bytes_last_of_steady": grows,
        "dead_share_max": dead,
        "dead_share_max_at_day_end": churn,
        "autovacuum_wait_s_max": max(day["autovacuum_wait_s"] for day in days),
        "targets": {
            "day_last_of_first": f">= {RATE_KEEPS}",
            "table_bytes_last_of_steady": f"<= {SIZE_GROWS}",
            "dead_share_max": f"< {DEAD_SHARE} on the partitioned tables",
        },
        "met": {
            **{
                f"day_last_of_first.{r}": k is not None and k >= RATE_KEEPS
                for r, k in keeps.items()
            },  # fmt: skip
            "days_at_least_3x_retention": shape.days >= 3 * shape.retention_days,
            "table_bytes_last_of_steady": grows is not None and grows <= SIZE_GROWS,
            "dead_share_max": all(dead[t] < DEAD_SHARE for t in partitioned)
            if partitioned
            else None,
        },
        # The same target read on the rates over the machine's speed of their day: beside the
        # verdict above, not instead of it.
        "met_of_reference": {
            f"day_last_of_first_of_reference.{r}": k is not None and k >= RATE_KEEPS
            for r, k in of_reference.items()
        },
        "partitioned_tables": partitioned,
    }


def _of_reference(first: dict[str, Any], last: dict[str, Any], rate: str) -> float | None:
    """The last day's ``rate`` over its reference, against the first day's over its own."""
    key = f"{rate}_per_s"
    if not (first[key] and first["reference_per_s"] and last["reference_per_s"]):
        return None
    return round((last[key] / last["reference_per_s"]) / (first[key] / first["reference_per_s"]), 3)


def _fitted_last_of_first(rates: list[float]) -> float | None:
    """The least-squares line through ``rates`` (one a day): its value on the last day over its
    value on the first; None with fewer than two days or a line that reaches 0 on the first."""
    n = len(rates)
    if n < 2:
        return None
    mean_x, mean_y = (n - 1) / 2, sum(rates) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(rates)) / sum(
        (x - mean_x) ** 2 for x in range(n)
    )
    first = mean_y - slope * mean_x
    return round((first + slope * (n - 1)) / first, 3) if first > 0 else None


def day_line(day: dict[str, Any]) -> str:
    total = _total_bytes(day) / 2**20
    dead = sum(t["dead_tuples"] for t in day["tables"].values())
    live = sum(t["live_tuples"] for t in day["tables"].values())
    read = _read_mib(day["buffers"], day["block_size"])
    first, half, last = day["timeout_fire_settled_s"]
    fire_beside = ", ".join(day["timeout_fire_autovacuum_beside"]) or "none"
    rounds = " / ".join(f"{night['per_s']:,}" for night in day["night_rounds"])
    created = " / ".join(f"{r:,}" for r in day["timeout_create_rounds_per_s"])
    fired = " / ".join(f"{r:,}" for r in day["timeout_fire_rounds_per_s"])
    references = " / ".join(f"{r['per_s']:,}" for r in day["reference"]["samples"])
    return (
        f"day {day['day']}: machine reference {day['reference_per_s']:,} rows/s (median of "
        f"{references}); sweep {day['expiry_sweep_per_s']:,}/s (median of rounds {rounds}), "
        f"inbox {day['inbox_burst_per_s']:,}/s, timeouts created {day['timeout_create_per_s']:,}/s "
        f"(median of rounds {created}; whole {day['timeout_create_whole_per_s']:,}/s) "
        f"fired {day['timeout_fire_per_s']:,}/s (median of rounds {fired}; whole "
        f"{day['timeout_fire_whole_per_s']:,}/s; settled {first} / {half} / {last} s after due, "
        f"autovacuum beside: {fire_beside}); tables {total:,.1f} MiB, dead tuples "
        f"{dead:,} of {live:,} live after autovacuum's round ({day['autovacuum_wait_s']} s; "
        f"{sum(day['dead_tuples_at_day_end'].values()):,} before it); shared buffers "
        f"{_hit_share(day['buffers'])} of blocks hit, {read:,.1f} MiB read into them; "
        f"retention removed {day['retention_removed']}"
    )


def _read_mib(buffers: dict[str, dict[str, int]], block_size: int) -> float:
    return sum(t["read"] for t in buffers.values()) * block_size / 2**20


def _block_size() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('block_size')::int")
        return cursor.fetchone()[0]


def report_lines(result: dict[str, Any]) -> list[str]:
    """The run as text: the autovacuum note, a table per day, the ratios beside their targets."""
    lines = [result.get("autovacuum", ""), ""]
    lines.append(
        "| day | "
        + " | ".join(f"{r} /s" for r in RATES)
        + " | machine reference rows/s | MiB | dead at day end | autovacuum's round s "
        "| dead / live after it | buffer hits | MiB read |"
    )
    lines.append("| --- " * (len(RATES) + 8) + "|")
    for day in result["days"]:
        tables = day["tables"].values()
        dead = sum(t["dead_tuples"] for t in tables)
        live = sum(t["live_tuples"] for t in tables)
        rates = " | ".join(f"{day[f'{r}_per_s']:,}" for r in RATES)
        read = _read_mib(day["buffers"], day["block_size"])
        lines.append(
            f"| {day['day']} | {rates} | {day['reference_per_s']:,} "
            f"| {_total_bytes(day) / 2**20:,.1f} "
            f"| {sum(day['dead_tuples_at_day_end'].values()):,} | {day['autovacuum_wait_s']} "
            f"| {dead:,} / {live:,} | {_hit_share(day['buffers'])} | {read:,.1f} |"
        )
    lines += [
        "",
        "What each round of the night's sweep met (WAL: the server's while it ran; the day's "
        "sweep rate is the median of its rounds'):",
        "",
        "| day | round | sweep /s | expired | WAL MiB | full-page images | MiB read "
        "| autovacuum beside it |",
        "| --- " * 8 + "|",
    ]
    for day in result["days"]:
        for number, night in enumerate(day["night_rounds"], 1):
            read = _read_mib(night["buffers"], day["block_size"])
            beside = ", ".join(night["autovacuum_beside"]) or "-"
            lines.append(
                f"| {day['day']} | {number} | {night['per_s']:,} | {night['expired']:,} "
                f"| {night['wal_bytes'] / 2**20:,.1f} | {night['wal_fpi']:,} | {read:,.1f} "
                f"| {beside} |"
            )
    lines += [
        "",
        "What each day's firing met (seconds after the due second when the first, half and the "
        "last of its jobs were settled):",
        "",
        "| day | fire /s | first s | half s | last s | autovacuum beside it |",
        "| --- " * 6 + "|",
    ]
    for day in result["days"]:
        first, half, last = day["timeout_fire_settled_s"]
        beside = ", ".join(day["timeout_fire_autovacuum_beside"]) or "-"
        lines.append(
            f"| {day['day']} | {day['timeout_fire_per_s']:,} | {first} | {half} | {last} "
            f"| {beside} |"
        )
    lines += [
        "",
        "| table | heap MiB | index MiB | live | dead (last day) | max dead share | "
        "max at day end |",
    ]
    lines.append("| --- " * 7 + "|")
    last = result["days"][-1]["tables"] if result["days"] else {}
    for table, t in last.items():
        mark = " (partitioned)" if t["partitioned"] else ""
        lines.append(
            f"| {table}{mark} | {t['table_bytes'] / 2**20:,.1f} | {t['index_bytes'] / 2**20:,.1f} "
            f"| {t['live_tuples']:,} | {t['dead_tuples']:,} | {result['dead_share_max'][table]} "
            f"| {result['dead_share_max_at_day_end'][table]} |"
        )
    met = {**result.get("met", {}), **result.get("met_of_reference", {})}

    def verdict(key: str) -> str:
        value = met.get(key)
        return "n/a" if value is None else ("met" if value else "NOT MET")

    lines.append("")
    trend = result.get("day_trend_last_of_first", {})
    of_reference = result.get("day_last_of_first_of_reference", {})
    trend_of_reference = result.get("day_trend_last_of_first_of_reference", {})
    lines.append(
        f"the machine's own speed (the reference): last day / first day = "
        f"{result.get('reference_last_of_first')}"
    )
    for rate, ratio in result.get("day_last_of_first", {}).items():
        lines.append(
            f"{rate}: last day / first day = {ratio} (target >= {RATE_KEEPS}): "
            f"{verdict(f'day_last_of_first.{rate}')}; the line fitted through every day: "
            f"{trend.get(rate)}; over the machine's speed of each day: {of_reference.get(rate)} "
            f"({verdict(f'day_last_of_first_of_reference.{rate}')}), fitted "
            f"{trend_of_reference.get(rate)}"
        )
    lines.append(
        f"total size: last day / day {result.get('steady_day')} (first at full retention) = "
        f"{result.get('table_bytes_last_of_steady')} (target <= {SIZE_GROWS}): "
        f"{verdict('table_bytes_last_of_steady')}"
    )
    partitioned = result.get("partitioned_tables") or []
    lines.append(
        f"dead tuples under {DEAD_SHARE:.0%} of live on the partitioned tables "
        f"({', '.join(partitioned) or 'none here'}) after each day's autovacuum round: "
        f"{verdict('dead_share_max')}"
    )
    lines.append(
        f"days >= 3 x retention ({result['shape']['days']} >= 3 x "
        f"{result['shape']['retention_days']}): {verdict('days_at_least_3x_retention')}"
    )
    return lines


# --- what the run changes and puts back ----------------------------------------------------------


@contextlib.contextmanager
def autovacuum_on(say: Callable[[str], None]) -> Iterator[str]:
    """``autovacuum = on`` for the run (``ALTER SYSTEM`` and a reload: the server's, so every
    database on it), and the setting as it was afterwards, on an error or Ctrl-C too, and by
    ``autovacuum_guard`` if the run is killed outright. Yields the sentence the report prints."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        before = cursor.fetchone()[0]
        cursor.execute(
            "SELECT setting FROM pg_file_settings WHERE name = 'autovacuum' "
            "AND sourcefile LIKE '%%postgresql.auto.conf' ORDER BY seqno DESC LIMIT 1"
        )
        row = cursor.fetchone()
        own = row[0] if row else None
    guard = _autovacuum_guard(own) if before != "on" else None
    if guard is not None:
        with connection.cursor() as cursor:
            cursor.execute("ALTER SYSTEM SET autovacuum = on")
            cursor.execute("SELECT pg_reload_conf()")
        _until_setting("on")
    note = (
        "autovacuum was on already (as in production)"
        if before == "on"
        else "autovacuum switched on for this run (ALTER SYSTEM, as in production); "
        f"it was {before}, and is put back afterwards"
    )
    say(note)
    try:
        yield note
    finally:
        if guard is not None:
            with connection.cursor() as cursor:
                cursor.execute(autovacuum_guard.put_back_statement(own))
                cursor.execute("SELECT pg_reload_conf()")
            guard.communicate(autovacuum_guard.DONE, timeout=30)
            _until_setting(before)
            say(f"autovacuum put back: {before}")


def _autovacuum_guard(own: str | None) -> subprocess.Popen:
    """``autovacuum_guard`` started on this connection's server, before the setting changes."""
    params = connection.settings_dict
    env = {
        **os.environ,
        "PGHOST": params["HOST"] or "",
        "PGPORT": str(params["PORT"] or ""),
        "PGUSER": params["USER"] or "",
        "PGPASSWORD": params["PASSWORD"] or "",
        "PGDATABASE": params["NAME"],
    }
    argv = [sys.executable, "-m", "couponcenter.ops.bench.autovacuum_guard", own or ""]
    return subprocess.Popen(
        argv, stdin=subprocess.PIPE, env=env, cwd=settings.BASE_DIR, start_new_session=True
    )


def _until_setting(value: str) -> None:
    """Until this session sees ``autovacuum`` at ``value`` (a reload reaches it within moments)."""
    deadline = time.monotonic() + 10
    while True:
        with connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            if cursor.fetchone()[0] == value:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"autovacuum did not become {value} after pg_reload_conf()")
        time.sleep(0.05)  # polls the setting


@contextlib.contextmanager
def retention_settings(retention: timedelta) -> Iterator[None]:
    """Every live retention field set to ``retention``; the operator's put back."""
    saved: list[tuple[models.Model, dict[str, Any]]] = []
    try:
        for model, fields in RETENTION_FIELDS.items():
            row = model.objects.order_by("pk").first() or model.objects.create()
            saved.append((row, {f: getattr(row, f) for f in fields}))
            _settings_save(row, dict.fromkeys(fields, retention))
        yield
    finally:
        for row, values in saved:
            row.refresh_from_db()
            _settings_save(row, values)


def _settings_save(row: models.Model, values: dict[str, Any]) -> None:
    for name, value in values.items():
        setattr(row, name, value)
    if isinstance(row, ReminderSettings):
        reminder_settings_save(instance=row)
    else:
        expiry_services.expiry_settings_save(instance=row)


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Environment variables for the processes started inside (they copy this one's)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _cleanup() -> None:
    """Every row the bench made (also at the start: a run that was killed left its own), in
    batches, children first."""
    for model in (Notification, TimeoutJob, ExpiryTask, ReminderSubscription, UserCoupon, Coupon):
        where, params = _marker(model)
        table, pk = model._meta.db_table, model._meta.pk.column
        while True:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {table} WHERE {pk} IN "
                    f"(SELECT {pk} FROM {table} WHERE {where} LIMIT 50000)",
                    params,
                )
                if cursor.rowcount < 50_000:
                    break
    TimeoutTopic.objects.filter(name=TOPIC).delete()
    machine_reference.drop()
