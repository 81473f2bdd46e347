"""The reminders benchmark (``manage.py bench_reminders``): real processes, real Redis and database.

It runs one reminder worker process and one Celery worker (subprocesses of this one, started by
``reminders.bench.processes``) under a key prefix and a Celery queue of their own, with the inbox
gateway, and measures:

- ``schedule_per_s``: the engine's bulk API scheduling ``count`` reminders;
- ``dispatch_s``: from the due second until every reminder was claimed, merged and handed to
  Celery (the worker's own "dispatched" counter, read from Redis);
- ``end_to_end_s``: from the due second until every one is in the inbox (checked in the database);
- ``steady_lateness_p99_ms``: at a steady rate (2,000/s by default), inbox ``created_at`` minus
  ``remind_at``, per reminder, from the database;
- ``raw_limit_per_s``: a bare Lua pop-and-ack loop on the same Redis, the machine's raw limit.

Everything it creates (a coupon per phase, subscriptions, notifications, Redis keys) is its own and
is deleted afterwards. End users are ids from ``BENCH_USER_BASE`` up, far from real ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from couponcenter.core.db.times import aware_time
from couponcenter.coupons.bench.lateness import lateness_summary
from couponcenter.coupons.bench.progress import Progress
from couponcenter.coupons.models import Coupon
from reminders import metrics
from reminders.bench import backlog as backlog_bench
from reminders.bench import engine as engine_bench
from reminders.bench.namespace import bench_namespace
from reminders.bench.processes import bench_processes
from reminders.bench.tables import delete_bench_rows, vacuum_analyze
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.keys import slot_for
from reminders.handlers.coupon_reminders import delivery_queue_depth
from reminders.members import REMINDER_TOPIC, member
from reminders.models import Notification, ReminderSettings, ReminderSubscription
from reminders.selectors import SETTINGS_MAX_AGE_S, reminder_settings_get
from reminders.services import reminder_settings_save

logger = logging.getLogger(__name__)

BENCH_USER_BASE = 9_000_000_000
CREATE_BATCH = 5000
# The pre-staged burst's window (the model's default).
DEFAULT_PRESTAGE_MS = ReminderSettings._meta.get_field("prestage_ms").default


# --- data ------------------------------------------------------------------------------------


def _coupon(opens_at: datetime, name: str) -> Coupon:
    return Coupon.objects.create(
        name=name, claim_opens_at=opens_at, total_stock=2_000_000_000, valid_for=timedelta(days=1)
    )


def _subscriptions(
    coupon: Coupon, count: int, user_base: int, progress: Progress | None
) -> list[tuple[int, int, int]]:
    """Bulk-create ``count`` subscriptions; returns (sub id, user id, slot)."""

    slots = reminder_settings_get().slots
    for start in range(0, count, CREATE_BATCH):
        batch = [
            ReminderSubscription(
                coupon=coupon,
                user_id=user_base + i,
                remind_at=coupon.claim_opens_at - coupon.reminder_lead,
                slot=slot_for(user_base + i, slots),
            )
            for i in range(start, min(start + CREATE_BATCH, count))
        ]
        ReminderSubscription.objects.bulk_create(batch, batch_size=CREATE_BATCH)
        if progress:
            progress("create subscriptions", min(start + CREATE_BATCH, count), count)
    return list(
        ReminderSubscription.objects.filter(coupon=coupon)
        .order_by("pk")
        .values_list("pk", "user_id", "slot")
    )


# --- measuring ------------------------------------------------------------------------------------


def _wait(
    what: str, done: Callable[[], int], total: int, timeout: float, progress: Progress | None
) -> float | None:
    """Poll ``done()`` until it reaches ``total``; returns the wall time then (None: timed out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = done()
        if progress:
            progress(what, n, total)
        if n >= total:
            return time.time()
        time.sleep(0.01)  # the figures' resolution; the poller's own CPU stays negligible
    return None


def _counter(name: str) -> Callable[[], int]:
    return lambda: metrics.count(REMINDER_TOPIC, name, minutes=15)


def _inbox_lateness_ms(coupon: Coupon) -> list[float]:
    """Per reminder of ``coupon``: when it showed in the inbox (written, and visible: a
    pre-staged row shows at ``visible_at``), less its due time."""
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT n.created_at, n.visible_at, s.remind_at
               FROM reminders_notification n
               JOIN reminders_remindersubscription s ON s.user_id = n.user_id
               WHERE s.coupon_id = %s""",
            [coupon.pk],
        )
        rows = cursor.fetchall()
    return [
        (max(aware_time(created), aware_time(visible)) - aware_time(remind_at)).total_seconds()
        * 1000
        for created, visible, remind_at in rows
    ]


# A steady-phase reminder this late is reported with its rows (the bench log, WARNING).
LATE_REPORT_MS = 5_000


def _report_late_rows(coupon: Coupon, sample: int = 5) -> None:
    """How many reminders of ``coupon`` showed late, and the latest few of them, row by row:
    enough to tell a late write from a late due time or a row of another phase."""
    late = f"""FROM {Notification._meta.db_table} n
               JOIN {ReminderSubscription._meta.db_table} s ON s.user_id = n.user_id
               WHERE s.coupon_id = %s
                 AND GREATEST(n.created_at, n.visible_at) > s.remind_at + %s"""
    params = [coupon.pk, timedelta(milliseconds=LATE_REPORT_MS)]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) {late}", params)
        count = cursor.fetchone()[0]
        cursor.execute(
            f"SELECT s.id, s.status, s.remind_at, s.sent_at, n.id, n.created_at, n.visible_at "
            f"{late} ORDER BY GREATEST(n.created_at, n.visible_at) - s.remind_at DESC LIMIT %s",
            [*params, sample],
        )
        rows = cursor.fetchall()
    logger.warning(
        "bench: %d inbox rows of coupon %s's users over %d ms late; the latest: %s",
        count,
        coupon.pk,
        LATE_REPORT_MS,
        rows,
    )


def settle(progress: Progress | None, timeout: float = 120) -> None:
    """Let a burst's aftermath finish before the next phase measures: the delivery queue empty,
    then a CHECKPOINT, so that the dirty pages of 200,000 inbox rows written, deleted and
    vacuumed are flushed here instead of during the steady phase (whose p99 they would raise
    tenfold)."""
    deadline = time.monotonic() + timeout
    while delivery_queue_depth() and time.monotonic() < deadline:
        if progress:
            progress("settle: delivery queue", 0, 1)
        time.sleep(0.05)
    if connection.vendor == "postgresql":
        try:
            with connection.cursor() as cursor:
                cursor.execute("CHECKPOINT")
        except DatabaseError as exc:  # not a superuser (nor pg_checkpoint): flushed in time
            logger.warning("bench: CHECKPOINT refused (%s); the next phase may pay for it", exc)
    if progress:
        progress("settle", 1, 1)


@contextmanager
def prestage_window(ms: int):
    """The live pre-stage window set for a phase (the workers pick it up within their settings
    poll), and the operator's value restored afterwards."""
    live = reminder_settings_get(max_age_s=0)
    before = live.prestage_ms
    _set_prestage(ms)
    try:
        yield
    finally:
        _set_prestage(before)


def _set_prestage(ms: int) -> None:
    live = ReminderSettings.objects.get(pk=reminder_settings_get(max_age_s=0).pk)
    live.prestage_ms = ms
    reminder_settings_save(instance=live)
    # The workers poll the change marker every SETTINGS_MAX_AGE_S; wait until they could have.
    time.sleep(SETTINGS_MAX_AGE_S * 3)


def bench_burst(
    count: int, user_base: int, progress: Progress | None, *, prestage_ms: int = 0
) -> dict[str, Any]:
    """``count`` reminders due in the same second, with the given pre-stage window.

    Without pre-staging the figures are the pipeline's speed (dispatch, end to end). With it,
    the burst is scheduled far enough ahead for the window to open before its due second, as
    real subscriptions are (they are made hours ahead); ``staged_by_due`` says how many were in
    the inbox, hidden, when the second came."""
    tag = "prestaged" if prestage_ms else "burst"
    coupon = _coupon(timezone.now() + timedelta(hours=1), f"bench {tag}")
    try:
        subs = _subscriptions(coupon, count, user_base, progress)
        # Room for the UPDATE, the VACUUM and the scheduling below before the due second
        # (or before the window opens).
        due = timezone.now() + timedelta(seconds=count / 25_000 + 4, milliseconds=prestage_ms)
        ReminderSubscription.objects.filter(coupon=coupon).update(remind_at=due)
        vacuum_analyze()
        due_ms = epoch_ms(due)
        items = [(member(pk), due_ms, slot) for pk, user, slot in subs]
        started = time.perf_counter()
        queue.schedule_many(REMINDER_TOPIC, items)
        schedule_s = time.perf_counter() - started
        if time.time() > due.timestamp() - prestage_ms / 1000:
            raise RuntimeError("the burst was scheduled after its due second: machine too busy")
        base = {name: _counter(name)() for name in ("dispatched", "delivered")}
        staged_by_due = None
        if prestage_ms:
            time.sleep(max(0.0, due.timestamp() - time.time()))
            staged_by_due = _in_inbox(user_base, count)
        dispatched = _wait(f"{tag} dispatch", _since(base, "dispatched"), count, 120, progress)
        delivered = _wait(f"{tag} deliver", _since(base, "delivered"), count, 300, progress)
        figures = {
            "in_inbox": _in_inbox(user_base, count),
            **lateness_summary(_inbox_lateness_ms(coupon), prefix="burst_lateness"),
        }
        if prestage_ms:
            return {"prestage_ms": prestage_ms, "staged_by_due": staged_by_due, **figures}
        return {
            "count": count,
            "schedule_s": round(schedule_s, 3),
            "schedule_per_s": round(count / schedule_s),
            "dispatch_s": round(dispatched - due.timestamp(), 3) if dispatched else None,
            "dispatch_per_s": round(count / (dispatched - due.timestamp())) if dispatched else None,
            "end_to_end_s": round(delivered - due.timestamp(), 3) if delivered else None,
            **figures,
        }
    finally:
        delete_bench_rows([coupon], user_base, count)
        vacuum_analyze()


def _since(base: dict[str, int], name: str) -> Callable[[], int]:
    counter = _counter(name)
    return lambda: counter() - base[name]


def _in_inbox(user_base: int, count: int) -> int:
    return Notification.objects.filter(user_id__range=(user_base, user_base + count - 1)).count()


def bench_steady(
    rate: int, seconds: int, user_base: int, progress: Progress | None
) -> dict[str, Any]:
    """``rate`` reminders due per second for ``seconds``: lateness per reminder."""
    count = rate * seconds
    coupon = _coupon(timezone.now() + timedelta(hours=2), "bench steady")
    try:
        subs = _subscriptions(coupon, count, user_base, progress)
        start = timezone.now() + timedelta(seconds=count / 5_000 + 4)
        start_ms = epoch_ms(start)
        due = {pk: start_ms + (i * 1000) // rate for i, (pk, _, _) in enumerate(subs)}
        _set_remind_at(due)
        vacuum_analyze()
        queue.schedule_many(REMINDER_TOPIC, [(member(pk), due[pk], slot) for pk, u, slot in subs])
        base = _counter("delivered")()
        _wait("steady", lambda: _counter("delivered")() - base, count, seconds + 120, progress)
        lateness = _inbox_lateness_ms(coupon)
        if lateness and max(lateness) > LATE_REPORT_MS:
            _report_late_rows(coupon)
        return {
            "steady_rate_per_s": rate,
            "steady_count": count,
            "steady_delivered": len(lateness),
            **lateness_summary(lateness, prefix="steady_lateness"),
        }
    finally:
        delete_bench_rows([coupon], user_base, count)
        vacuum_analyze()


def _set_remind_at(due: dict[int, int]) -> None:
    """remind_at per subscription: one UPDATE per chunk on PostgreSQL, row by row on SQLite."""
    items = list(due.items())
    if connection.vendor != "postgresql":
        for pk, ms in items:
            ReminderSubscription.objects.filter(pk=pk).update(
                remind_at=datetime.fromtimestamp(ms / 1000, UTC)
            )
        return
    for i in range(0, len(items), 2000):
        chunk = items[i : i + 2000]
        with connection.cursor() as cursor:
            values = ",".join(["(%s, to_timestamp(%s / 1000.0))"] * len(chunk))
            cursor.execute(
                f"""UPDATE reminders_remindersubscription s SET remind_at = v.at
                    FROM (VALUES {values}) AS v(id, at) WHERE s.id = v.id""",
                [x for pair in chunk for x in pair],
            )


def run(
    *,
    count: int,
    steady_rate: int = 2000,
    steady_seconds: int = 10,
    prestage_ms: int = DEFAULT_PRESTAGE_MS,
    backlog: int = 0,
    progress: Progress | None = None,
    log_dir: str | None = None,
) -> dict[str, Any]:
    """The burst and steady phases, without and with pre-staging. ``backlog``: then once more
    the steady phase without pre-staging, with that many reminders pending a day ahead in the
    same slots (``steady_*_with_backlog``)."""
    live = reminder_settings_get(max_age_s=0)
    result: dict[str, Any] = {
        "database": connection.vendor,
        "gateway": live.gateway,
        "batch_size": live.batch_size,
        "slots": live.slots,
    }
    # Each phase deletes its own rows as it ends; the namespace's keys and queue go with it.
    with bench_namespace(lambda: None, logger.warning) as (prefix, delivery_queue):
        raw = engine_bench.bench_raw_lua(count)
        claim_ack = engine_bench.bench_claim_ack(count)
        result.update(
            raw_limit_per_s=raw["per_second"], engine_claim_ack_per_s=claim_ack["per_second"]
        )
        queue.record_layout(REMINDER_TOPIC, live.slots)
        with bench_processes(prefix, delivery_queue, log_dir=log_dir or str(settings.VAR_DIR)):
            with prestage_window(0):
                result.update(bench_burst(count, BENCH_USER_BASE, progress))
                settle(progress)
                if steady_seconds > 0:
                    steady = bench_steady(
                        steady_rate, steady_seconds, BENCH_USER_BASE + count, progress
                    )
                    result.update({f"{k}_without_prestage": v for k, v in steady.items()})
            if prestage_ms:
                with prestage_window(prestage_ms):
                    staged = bench_burst(count, BENCH_USER_BASE, progress, prestage_ms=prestage_ms)
                    result.update({f"prestaged_{k}": v for k, v in staged.items()})
                    settle(progress)
                    if steady_seconds > 0:
                        result.update(
                            bench_steady(
                                steady_rate, steady_seconds, BENCH_USER_BASE + count, progress
                            )
                        )
            if backlog and steady_seconds > 0:
                with prestage_window(0):
                    day_ahead = epoch_ms(timezone.now() + timedelta(days=1))
                    backlog_bench.schedule_backlog(
                        REMINDER_TOPIC,
                        backlog,
                        due_ms=day_ahead,
                        slots=live.slots,
                        progress=progress,
                    )
                    steady = bench_steady(
                        steady_rate, steady_seconds, BENCH_USER_BASE + count, progress
                    )
                    result["backlog_pending"] = backlog
                    result.update({f"{k}_with_backlog": v for k, v in steady.items()})
        # The headline of the burst: p99 from the due second to the inbox, with and without.
        result["burst_p99_ms_without_prestage"] = result.get("burst_lateness_p99_ms")
        result["burst_p99_ms"] = result.get("prestaged_burst_lateness_p99_ms")
    return result
