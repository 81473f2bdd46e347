"""``bench_timeouts``: the timeout center as another team would use it.

One run, one machine, each figure beside its raw limit where there is one:

- **burst**: ``count`` ``http`` jobs due in the same second, fired by one worker
  (``run_reminder_worker``, executors in threads) at a local keep-alive receiver (its own
  process, ``reminders.bench.receiver``): delivered per second from the due second to the last
  arrival, beside the receiver's raw rate from a plain client (``requests`` sessions in as many
  threads as the topic's concurrency, the same body) measured just before;
- **isolation**: a slow topic (its receiver takes 1 s per call) kept saturated while a fast topic
  fires a steady ``steady_rate`` jobs/s for ``steady_seconds``: the fast topic's lateness p99
  (due time to arrival, an HDR histogram);
- **bulk create** through the API (gunicorn, ``POST /api/timeouts/bulk/``, 10,000 jobs per
  request): jobs per second;
- **cancel by key** through the API (``DELETE /api/timeouts/by-key/``, 8 client threads):
  requests per second.

Everything it makes lives under its own Redis key prefix and ``bench.*`` topics, removed at the
end (the rows too). The worker and the receiver it runs beside itself are in
``reminders.bench.processes``; the phases and their measuring are here.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import requests
from django.conf import settings
from django.db import connection
from django.utils import timezone

from couponcenter.core.redis import get_redis
from couponcenter.coupons import accounts
from couponcenter.coupons.bench.http import Gunicorn, server_env
from couponcenter.coupons.bench.lateness import lateness_summary
from couponcenter.coupons.bench.progress import Progress
from reminders.bench.namespace import bench_namespace
from reminders.bench.processes import receiver_process, timeout_worker_process
from reminders.models import TimeoutJob, TimeoutTopic
from reminders.services import timeout_jobs_bulk_create, timeout_jobs_rebuild, timeout_topic_save

logger = logging.getLogger(__name__)

BURST_TOPIC, SLOW_TOPIC, STEADY_TOPIC, API_TOPIC = (
    "bench.http",
    "bench.slow",
    "bench.steady",
    "bench.api",
)
TOPICS = (BURST_TOPIC, SLOW_TOPIC, STEADY_TOPIC, API_TOPIC)
CHUNK = 10_000  # jobs per bulk create (the API's limit)
BENCH_ACCOUNT = "bench-timeouts"
FAR = timedelta(days=3650)


def _noop(what: str, done: int, total: int) -> None:
    pass


def _stats(receiver: str, lateness_of: str | None = None) -> dict:
    params = {"lateness": lateness_of} if lateness_of else None
    return requests.get(f"{receiver}/stats", params=params, timeout=30).json()


def _arrived(receiver: str, path: str) -> Callable[[], int]:
    return lambda: _stats(receiver).get(path, {}).get("count", 0)


def _wait(
    what: str, done: Callable[[], int], total: int, timeout: float, progress: Progress
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = done()
        progress(what, n, total)
        if n >= total:
            return True
        time.sleep(0.05)
    return False


# --- phases ---------------------------------------------------------------------------------------


def bench_raw(receiver: str, *, count: int, threads: int) -> dict[str, Any]:
    """The receiver's ceiling: a plain keep-alive client, ``threads`` sessions, no code of ours."""
    body = b'{"job_id": 1, "topic": "raw", "biz_type": "order", "biz_id": "1"}'
    per_thread = count // threads

    def hammer() -> None:
        with requests.Session() as session:
            for _ in range(per_thread):
                session.post(
                    f"{receiver}/raw",
                    data=body,
                    timeout=30,
                    headers={"Content-Type": "application/json"},
                )

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(hammer) for _ in range(threads)]:
            future.result()
    elapsed = time.perf_counter() - started
    return {"raw_receiver_per_s": round(per_thread * threads / elapsed)}


def _topic(name: str, url: str, *, secret: str | None = None, **fields) -> TimeoutTopic:
    TimeoutTopic.objects.filter(name=name).delete()
    return timeout_topic_save(
        topic=TimeoutTopic(name=name),
        type="http",
        target=url,
        secret=secret or secrets.token_urlsafe(32),
        allow_http=True,
        **fields,
    )


def _create(
    topic: str,
    count: int,
    *,
    at,
    step_s: float = 0.0,
    prefix: str = "b",
    progress: Progress,
    what: str,
) -> None:
    made = 0
    while made < count:
        size = min(CHUNK, count - made)
        timeout_jobs_bulk_create(
            [
                {
                    "topic": topic,
                    "biz_type": "bench",
                    "biz_id": f"{prefix}-{made + i}",
                    "action_time": at + timedelta(seconds=step_s * (made + i)),
                }
                for i in range(size)
            ]
        )
        made += size
        progress(what, made, count)


def _move_due(topic: str, at) -> None:
    """Every pending job of ``topic`` due at ``at``, in the database and in Redis."""
    TimeoutJob.objects.filter(topic=topic, status=TimeoutJob.Status.PENDING).update(action_time=at)
    client = get_redis()
    for key in client.scan_iter(match=f"{settings.REDIS_KEY_PREFIX}:{{{topic}:*", count=1000):
        client.delete(key)
    timeout_jobs_rebuild()


def bench_burst(receiver: str, *, count: int, progress: Progress) -> dict[str, Any]:
    _create(BURST_TOPIC, count, at=timezone.now() + FAR, progress=progress, what="burst: create")
    due = timezone.now() + timedelta(seconds=3)
    _move_due(BURST_TOPIC, due)
    done = _wait(
        "burst: fired",
        _arrived(receiver, "/fast"),
        count,
        timeout=max(120, count / 200),
        progress=progress,
    )
    stats = _stats(receiver, "/fast")
    fast = stats.get("/fast", {})
    elapsed = max(1e-3, fast.get("last", due.timestamp()) - due.timestamp())
    result = {
        "burst_count": count,
        "burst_completed": done,
        "burst_delivered_per_s": round(fast.get("count", 0) / elapsed),
        "burst_seconds": round(elapsed, 2),
    }
    result.update(lateness_summary(stats.get("lateness_ms", []), prefix="burst_lateness"))
    return result


def quiet_database() -> None:
    """No dead rows of an earlier run left for autovacuum to chew on mid-measurement, and the
    dirty pages written out (as the other benchmarks do before a timed phase)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {TimeoutJob._meta.db_table}")
        cursor.execute("CHECKPOINT")


def bench_isolation(receiver: str, *, rate: int, seconds: int, progress: Progress) -> dict:
    """The fast topic's lateness while the slow one's executor is full the whole time."""
    slow_jobs = 4 * 2 * (seconds + 10)  # concurrency 4, 1 s a call: busy past the window
    _create(
        SLOW_TOPIC,
        slow_jobs,
        at=timezone.now(),
        prefix="slow",
        progress=progress,
        what="isolation: slow jobs",
    )
    _wait(
        "isolation: slow topic busy", _arrived(receiver, "/slow"), 4, timeout=60, progress=progress
    )
    total = rate * seconds
    _create(
        STEADY_TOPIC,
        total,
        at=timezone.now() + timedelta(seconds=2),
        step_s=1 / rate,
        prefix="steady",
        progress=progress,
        what="isolation: steady jobs",
    )
    done = _wait(
        "isolation: steady fired",
        _arrived(receiver, "/steady"),
        total,
        timeout=seconds + 120,
        progress=progress,
    )
    stats = _stats(receiver, "/steady")
    result = {
        "isolation_steady_rate": rate,
        "isolation_completed": done,
        "isolation_slow_calls": stats.get("/slow", {}).get("count", 0),
    }
    result.update(lateness_summary(stats.get("lateness_ms", []), prefix="isolation_lateness"))
    return result


def _drop_slow_jobs() -> None:
    """The slow topic's jobs still waiting: paused and cancelled, so the burst has the worker."""
    timeout_topic_save(topic=TimeoutTopic.objects.get(name=SLOW_TOPIC), paused=True)
    TimeoutJob.objects.filter(topic=SLOW_TOPIC, status=TimeoutJob.Status.PENDING).update(
        status=TimeoutJob.Status.CANCELLED, gmt_modified=timezone.now()
    )


def bench_api(*, bulk_jobs: int, cancels: int, progress: Progress) -> dict[str, Any]:
    timeout_topic_save(topic=TimeoutTopic(name=API_TOPIC), type="log", paused=True, slots=16)
    user, token = accounts.account_ensure(username=BENCH_ACCOUNT, permissions=("manage_timeouts",))
    user.is_staff = True  # staff use every topic, the bench's unowned one included
    user.save(update_fields=["is_staff"])
    connection.close()
    gunicorn = Gunicorn(workers=2, worker_class="gthread", threads=4, env=server_env())
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    at = (timezone.now() + FAR).isoformat()
    try:
        gunicorn.wait_ready()
        # The request bodies are made before the clock starts (a client has its jobs at hand);
        # two requests at a time, one per gunicorn worker, as a client with jobs to spare would.
        bodies = [
            json.dumps(
                {
                    "jobs": [
                        {
                            "topic": API_TOPIC,
                            "biz_type": "bulk",
                            "biz_id": str(n),
                            "action_time": at,
                        }
                        for n in range(start, min(start + CHUNK, bulk_jobs))
                    ]
                }
            )
            for start in range(0, bulk_jobs, CHUNK)
        ]
        lock, sent = threading.Lock(), [0]

        def post(body: str) -> None:
            local = getattr(_sessions, "s", None) or requests.Session()
            _sessions.s = local
            response = local.post(
                f"{gunicorn.url}/api/timeouts/bulk/", data=body, headers=headers, timeout=120
            )
            if response.status_code != 201:
                raise RuntimeError(f"bulk create: {response.status_code} {response.text[:300]}")
            with lock:
                sent[0] += response.json()["created"]
                progress("api: bulk create", sent[0], bulk_jobs)

        started = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(post, bodies))
        bulk_per_s = sent[0] / (time.perf_counter() - started)
        sent = sent[0]

        lock, done = threading.Lock(), [0]

        def cancel(i: int) -> int:
            local = getattr(_sessions, "s", None) or requests.Session()
            _sessions.s = local
            response = local.delete(
                f"{gunicorn.url}/api/timeouts/by-key/",
                headers=headers,
                params={"topic": API_TOPIC, "biz_type": "bulk", "biz_id": str(i)},
                timeout=30,
            )
            with lock:
                done[0] += 1
                progress("api: cancel by key", done[0], cancels)
            return response.status_code

        started = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(cancel, range(min(cancels, sent))))
        cancel_per_s = len(codes) / (time.perf_counter() - started)
        bad = [c for c in codes if c != 200]
        if bad:
            raise RuntimeError(f"cancel by key: {len(bad)} answers were not 200: {bad[:5]}")
    finally:
        gunicorn.stop()
    return {
        "bulk_create_jobs_per_s": round(bulk_per_s),
        "bulk_jobs": sent,
        "cancel_by_key_per_s": round(cancel_per_s),
        "cancels": len(codes),
    }


_sessions = threading.local()


def _cleanup_rows(topics: tuple[str, ...] = TOPICS) -> None:
    """The bench topics' rows and topics (also at the start: a run that was killed left its
    own, which a new worker's rebuild would index and fire in the middle of this run)."""
    for topic in topics:
        while True:
            ids = list(TimeoutJob.objects.filter(topic=topic).values_list("pk", flat=True)[:50_000])
            if not ids:
                break
            TimeoutJob.objects.filter(pk__in=ids).delete()
    TimeoutTopic.objects.filter(name__in=topics).delete()


def run(
    *,
    count: int = 200_000,
    raw_count: int = 20_000,
    concurrency: int = 16,
    steady_rate: int = 200,
    steady_seconds: int = 10,
    bulk_jobs: int = 100_000,
    cancels: int = 5_000,
    progress: Progress | None = None,
    log_dir: str | None = None,
) -> dict[str, Any]:
    progress = progress or _noop
    result: dict[str, Any] = {"database": connection.vendor, "concurrency": concurrency}
    with bench_namespace(_cleanup_rows, logger.warning) as (prefix, _):
        quiet_database()
        with receiver_process() as receiver:
            result.update(bench_raw(receiver, count=raw_count, threads=concurrency))
            _topic(BURST_TOPIC, f"{receiver}/fast", concurrency=concurrency, slots=16)
            _topic(
                SLOW_TOPIC,
                f"{receiver}/slow?delay=1",
                concurrency=4,
                timeout_ms=5_000,
                visibility_ms=60_000,
            )
            _topic(STEADY_TOPIC, f"{receiver}/steady", concurrency=concurrency)
            with timeout_worker_process(
                prefix, (BURST_TOPIC, SLOW_TOPIC, STEADY_TOPIC), log_dir or str(settings.VAR_DIR)
            ):
                # Isolation first, on a quiet database: after the burst, autovacuum of its
                # 200,000 updated rows would be measured too.
                isolation = bench_isolation(
                    receiver, rate=steady_rate, seconds=steady_seconds, progress=progress
                )
                result.update(isolation)
                _drop_slow_jobs()
                quiet_database()
                result.update(bench_burst(receiver, count=count, progress=progress))
        result["burst_ratio_to_raw"] = round(
            result["burst_delivered_per_s"] / max(1, result["raw_receiver_per_s"]), 2
        )
        result.update(bench_api(bulk_jobs=bulk_jobs, cancels=cancels, progress=progress))
    return result
