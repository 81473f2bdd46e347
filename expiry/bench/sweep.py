"""The expiry benchmark behind ``manage.py bench_expiry`` (docs/performance.md).

It loads N claimed coupons with N due expiry tasks under a dedicated bench coupon, runs K sweeper
processes at once (``services.expiry_sweep_due``, the code path of ``run_expiry_sweeper``) until
nothing is due, checks that every coupon was expired exactly once, then reloads the same rows and
times a bare SQL update loop over them with K processes: the machine's raw limit for this work.

With ``rounds`` > 1 the two take turns, in the order ours, bare, bare, ours (and so on), and each
side's time is the mean of its rounds: a drift of the machine during the run (another process,
autovacuum, the disk's cache) falls on both sides alike, and one slow phase weighs half as much.

Before them, an untimed warm-up phase (the bare loop over a full load, ``warmup``): the first
phase of a run is the slowest one whichever side it is (cold caches after a quiet spell), and
with the turns above that first phase would always be ours. Its time is reported, never counted.

On PostgreSQL each timed phase starts right after a ``CHECKPOINT``, so both pay the same full-page
images for every page they touch first (as a nightly sweep over rows claimed long before does),
and neither inherits the other's, or the load's, checkpoint half done. The WAL each phase wrote
is reported beside its time: that volume, not the SQL, is what bounds this work.

Real data is never touched: bench rows fall due in 2000 (``BENCH_NOW``), and the sweepers run with
that ``now``, so they claim bench tasks only; every bench row is deleted afterwards, in batches.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, connection, connections, transaction
from django.db.models import Count, Max, Min
from tqdm import tqdm

from couponcenter.coupons.models import Coupon, UserCoupon
from expiry import services
from expiry.models import ExpiryTask

BENCH_COUPON_NAME = "__bench_expiry__"
# Bench tasks are due at BENCH_DUE and swept "at" BENCH_NOW: long before any real task.
BENCH_NOW = datetime(2000, 1, 1, tzinfo=UTC)
BENCH_DUE = BENCH_NOW - timedelta(seconds=1)
LOAD_CHUNK = 50_000
DELETE_CHUNK = 50_000


@dataclass
class BenchReport:
    count: int
    workers: int
    batch_size: int
    seconds: float
    raw_sql_seconds: float
    load_seconds: float
    batches: int
    vendor: str
    wal_bytes: int | None = None
    raw_sql_wal_bytes: int | None = None
    seconds_each: tuple[float, ...] = ()  # per round, when there were several
    raw_sql_seconds_each: tuple[float, ...] = ()
    warmup_seconds: float | None = None  # the untimed warm-up phase, when there was one

    def as_dict(self) -> dict:
        per_s = self.count / self.seconds if self.seconds else 0.0
        raw_per_s = self.count / self.raw_sql_seconds if self.raw_sql_seconds else 0.0
        return {
            "count": self.count,
            "workers": self.workers,
            "batch_size": self.batch_size,
            "seconds": round(self.seconds, 3),
            "per_s": round(per_s),
            "raw_sql_seconds": round(self.raw_sql_seconds, 3),
            "raw_sql_per_s": round(raw_per_s),
            "of_raw": round(per_s / raw_per_s, 3) if raw_per_s else None,
            "load_seconds": round(self.load_seconds, 3),
            "batches": self.batches,
            "database": self.vendor,
            "wal_mb": _mb(self.wal_bytes),
            "raw_sql_wal_mb": _mb(self.raw_sql_wal_bytes),
            "rounds": max(1, len(self.seconds_each)),
            "seconds_each": [round(x, 3) for x in self.seconds_each],
            "raw_sql_seconds_each": [round(x, 3) for x in self.raw_sql_seconds_each],
            "warmup_seconds": None
            if self.warmup_seconds is None
            else round(self.warmup_seconds, 3),
        }


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


def run_bench(
    *,
    count: int,
    workers: int,
    batch_size: int,
    progress: bool = True,
    rounds: int = 1,
    warmup: bool = True,
) -> BenchReport:
    ours: list[float] = []
    raw: list[float] = []
    warm: list[float] = []
    wal: dict[str, int | None] = {}
    batches = 0
    load_seconds = 0.0
    bench_data_delete()
    try:
        for phase in _phases(rounds, warmup=warmup):
            coupon = _bench_coupon(count)
            started = time.perf_counter()
            bench_data_load(coupon=coupon, count=count, progress=progress)
            load_seconds = load_seconds or time.perf_counter() - started
            wal_start = _checkpoint()
            if phase == "ours":
                seconds, batches = _timed_sweepers(
                    workers=workers, batch_size=batch_size, count=count
                )
                _check_all_expired_once(coupon=coupon, count=count)
                ours.append(seconds)
            else:
                seconds = _timed_raw_loop(coupon=coupon, workers=workers, batch_size=batch_size)
                (warm if phase == "warm-up" else raw).append(seconds)
            wal.setdefault(phase, _wal_since(wal_start))
            bench_data_delete(progress=progress)
    finally:
        bench_data_delete(progress=progress)
    return BenchReport(
        count,
        workers,
        batch_size,
        sum(ours) / len(ours),
        sum(raw) / len(raw),
        load_seconds,
        batches,
        connection.vendor,
        wal_bytes=wal.get("ours"),
        raw_sql_wal_bytes=wal.get("raw"),
        seconds_each=tuple(ours) if rounds > 1 else (),
        raw_sql_seconds_each=tuple(raw) if rounds > 1 else (),
        warmup_seconds=warm[0] if warm else None,
    )


def _phases(rounds: int, *, warmup: bool = False) -> list[str]:
    """Ours and the bare loop taking turns, ours, raw, raw, ours, ...: each side as often first;
    after an untimed warm-up phase (the bare loop) when ``warmup``."""
    turns = [p for r in range(rounds) for p in (("ours", "raw") if r % 2 == 0 else ("raw", "ours"))]
    return ["warm-up", *turns] if warmup else turns


def _checkpoint() -> str | None:
    """PostgreSQL: flush everything the load dirtied; return the WAL position to count from."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        # CHECKPOINT needs superuser or pg_checkpoint; without them the bench still runs.
        with contextlib.suppress(DatabaseError):
            cursor.execute("CHECKPOINT")
        cursor.execute("SELECT pg_current_wal_lsn()")
        return cursor.fetchone()[0]


def _wal_since(lsn: str | None) -> int | None:
    if lsn is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", [lsn])
        return int(cursor.fetchone()[0])


# --- data ----------------------------------------------------------------------------------------


def _bench_coupon(count: int) -> Coupon:
    return Coupon.objects.create(
        name=BENCH_COUPON_NAME,
        claim_opens_at=BENCH_NOW - timedelta(days=2),
        total_stock=max(count, 1),
        valid_for=timedelta(days=1),
    )


# Claimed coupons and their pending expiry tasks, in one statement (also bench_day's and
# bench_days's loads).
CLAIMS_LOAD_SQL = """
WITH uc AS (
    INSERT INTO couponcenter_usercoupon
        (coupon_id, user_id, seq, status, claimed_at, expires_at)
    SELECT %(coupon)s, g, 1, 'unused', %(claimed)s, %(due)s FROM generate_series(%(lo)s, %(hi)s) g
    RETURNING id
)
INSERT INTO expiry_expirytask (user_coupon_id, expire_at, status, created_at, updated_at)
SELECT id, %(due)s, 'pending', %(claimed)s, %(claimed)s FROM uc
"""


def bench_data_load(*, coupon: Coupon, count: int, progress: bool = True) -> None:
    """N unused user coupons of ``coupon``, each with a task due at ``BENCH_DUE``."""
    claimed = BENCH_DUE - timedelta(days=1)
    with tqdm(total=count, desc="load", unit="row", disable=None if progress else True) as bar:
        for lo in range(1, count + 1, LOAD_CHUNK):
            hi = min(lo + LOAD_CHUNK - 1, count)
            with transaction.atomic(), connection.cursor() as cursor:
                if connection.vendor == "postgresql":
                    params = {"coupon": coupon.pk, "claimed": claimed, "due": BENCH_DUE}
                    cursor.execute(CLAIMS_LOAD_SQL, {**params, "lo": lo, "hi": hi})
                else:
                    _load_chunk_portable(cursor, coupon, lo, hi, claimed)
            bar.update(hi - lo + 1)
    Coupon.objects.filter(pk=coupon.pk).update(claimed_count=count)
    if connection.vendor == "postgresql":
        # VACUUM too: autovacuum may be off (it is on this project's CI machine), and the dead
        # rows of the last run's cleanup would otherwise be swept past on every batch.
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE couponcenter_usercoupon")
            cursor.execute("VACUUM ANALYZE expiry_expirytask")


def _load_chunk_portable(cursor, coupon: Coupon, lo: int, hi: int, claimed: datetime) -> None:
    uc_table, task_table = UserCoupon._meta.db_table, ExpiryTask._meta.db_table
    cursor.executemany(
        f"INSERT INTO {uc_table} (coupon_id, user_id, seq, status, claimed_at, expires_at) "
        "VALUES (%s, %s, 1, 'unused', %s, %s)",
        [(coupon.pk, user_id, claimed, BENCH_DUE) for user_id in range(lo, hi + 1)],
    )
    cursor.execute(
        f"INSERT INTO {task_table} (user_coupon_id, expire_at, status, created_at, updated_at) "
        f"SELECT id, expires_at, 'pending', claimed_at, claimed_at FROM {uc_table} "
        "WHERE coupon_id = %s AND user_id BETWEEN %s AND %s",
        [coupon.pk, lo, hi],
    )


def bench_data_delete(*, progress: bool = False) -> None:
    """Delete every bench coupon with its claims and tasks, an id range per transaction."""
    uc_table, task_table = UserCoupon._meta.db_table, ExpiryTask._meta.db_table
    for coupon_id in Coupon.objects.filter(name=BENCH_COUPON_NAME).values_list("pk", flat=True):
        claims = UserCoupon.objects.filter(coupon_id=coupon_id)
        span = claims.aggregate(lo=Min("pk"), hi=Max("pk"), n=Count("pk"))
        with tqdm(
            total=span["n"], desc="delete", unit="row", disable=None if progress else True
        ) as bar:
            for lo in range(span["lo"] or 0, (span["hi"] or -1) + 1, DELETE_CHUNK):
                params = [coupon_id, lo, lo + DELETE_CHUNK - 1]
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(
                        f"DELETE FROM {task_table} WHERE user_coupon_id IN (SELECT id FROM "
                        f"{uc_table} WHERE coupon_id = %s AND id BETWEEN %s AND %s)",
                        params,
                    )
                    cursor.execute(
                        f"DELETE FROM {uc_table} WHERE coupon_id = %s AND id BETWEEN %s AND %s",
                        params,
                    )
                    bar.update(cursor.rowcount)
        with connection.cursor() as cursor:  # raw: the bench coupon has nothing else hanging off it
            cursor.execute(f"DELETE FROM {Coupon._meta.db_table} WHERE id = %s", [coupon_id])


def _check_all_expired_once(*, coupon: Coupon, count: int) -> None:
    expired = UserCoupon.objects.filter(coupon=coupon, status=UserCoupon.Status.EXPIRED).count()
    tasks = ExpiryTask.objects.filter(user_coupon__coupon=coupon)
    pending = tasks.filter(status=ExpiryTask.Status.PENDING).count()
    processed = tasks.filter(status=ExpiryTask.Status.PROCESSED).count()
    if (expired, processed, pending) != (count, count, 0):
        raise AssertionError(
            f"expected {count} expired and processed, 0 pending; got expired={expired} "
            f"processed={processed} pending={pending}"
        )


# --- timed runs ----------------------------------------------------------------------------------


def _sweeper_process(batch_size: int, start, results) -> None:
    start.wait()
    totals = services.expiry_sweep_due(now=BENCH_NOW, batch_size=batch_size)
    results.put((totals.processed, totals.expired, totals.batches))
    connection.close()


def _raw_process(worker: int, workers: int, span: tuple, batch_size: int, start, results) -> None:
    # The bare limit: the same two UPDATEs per chunk, by primary-key range, no queue, no locks,
    # committed as the sweepers commit theirs (without waiting for the WAL flush).
    uc_table, task_table = UserCoupon._meta.db_table, ExpiryTask._meta.db_table
    lo, hi = span
    start.wait()
    if connection.vendor == "postgresql":  # once for the session, not a round trip per chunk
        with connection.cursor() as cursor:
            cursor.execute("SET synchronous_commit = off")
    done = 0
    for first in range(lo + worker * batch_size, hi + 1, workers * batch_size):
        params = [first, first + batch_size - 1]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {uc_table} SET status = 'expired' "
                "WHERE id BETWEEN %s AND %s AND status = 'unused'",
                params,
            )
            done += cursor.rowcount
            cursor.execute(
                f"UPDATE {task_table} SET status = 'processed', updated_at = %s "
                "WHERE user_coupon_id BETWEEN %s AND %s AND status = 'pending'",
                [BENCH_NOW, *params],
            )
    results.put((done, done, 0))
    connection.close()


def _run_processes(target, args_for: list[tuple]) -> tuple[float, list[tuple]]:
    """Start one process per args tuple, release them together, time until all are done."""
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Event(), ctx.Queue()
    connections.close_all()  # a forked child must not share the parent's socket
    procs = [ctx.Process(target=target, args=(*args, start, results)) for args in args_for]
    for proc in procs:
        proc.start()
    time.sleep(0.5)  # let every child get to the start line
    started = time.perf_counter()
    start.set()
    outcomes = [results.get() for _ in procs]
    seconds = time.perf_counter() - started
    for proc in procs:
        proc.join()
    if any(proc.exitcode for proc in procs):
        raise RuntimeError("a bench process failed; see its traceback above")
    return seconds, outcomes


def _timed_sweepers(*, workers: int, batch_size: int, count: int) -> tuple[float, int]:
    seconds, outcomes = _run_processes(_sweeper_process, [(batch_size,)] * workers)
    processed = sum(o[0] for o in outcomes)
    expired = sum(o[1] for o in outcomes)
    if processed != count or expired != count:
        raise AssertionError(f"sweepers processed {processed} and expired {expired}, not {count}")
    return seconds, sum(o[2] for o in outcomes)


def _timed_raw_loop(*, coupon: Coupon, workers: int, batch_size: int) -> float:
    span = UserCoupon.objects.filter(coupon=coupon).aggregate(lo=Min("pk"), hi=Max("pk"))
    bounds = (span["lo"], span["hi"])
    args = [(worker, workers, bounds, batch_size) for worker in range(workers)]
    seconds, outcomes = _run_processes(_raw_process, args)
    done = sum(o[0] for o in outcomes)
    expected = UserCoupon.objects.filter(coupon=coupon).count()
    if done != expected:
        raise AssertionError(f"raw loop updated {done} rows, expected {expected}")
    return seconds
