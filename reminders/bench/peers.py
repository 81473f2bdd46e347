"""The peers in our own benchmark suite (``manage.py bench_peers``): BullMQ's delayed jobs and
Celery's ETA tasks, on the same Redis, with the same workload as ``bench_reminders``: a burst of
``count`` jobs due in the same second, then steady rates (2,000/s and 5,000/s by default).

Each peer's job is a no-op that records its lateness (when it ran, less when it was due), so the
peers' figures are their scheduling alone, with no inbox write; ours in ``bench_reminders`` include
the inbox. Lateness is summarised with the same HDR histogram.

- BullMQ runs through ``node`` when it is on the PATH: ``bullmq`` is installed into
  ``var/peers/bullmq`` (``npm_package``: ``npm install``, once), and ``js/bullmq_bench.mjs`` runs
  the phases with one Worker process (concurrency 50, BullMQ's advice for I/O-bound
  processors). Without ``node`` or ``npm`` the peer is skipped with the reason in the result.
- Celery ETA: ``count`` tasks published with ``eta`` at the due second to a queue of their own,
  consumed by one Celery worker (prefork, one process per core, as in ``bench_reminders``); each
  task appends its lateness to a Redis list under a key of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from celery import current_app
from django.conf import settings

from couponcenter.core.redis import get_redis
from couponcenter.coupons.bench.http import stop
from couponcenter.coupons.bench.lateness import lateness_summary
from reminders.bench.end_to_end import Progress
from reminders.bench.peer_tasks import record_lateness
from reminders.bench.processes import CELERY_CONCURRENCY, celery_answers
from reminders.engine.clock import epoch_ms

BULLMQ_VERSION = "5"
BULLMQ_CONCURRENCY = 50
JS = Path(__file__).parent / "js" / "bullmq_bench.mjs"
PUBLISH_BATCH = 1000
# A lower bound of Celery's publish rate here: jobs are due only after all are published.
PUBLISH_RATE = 700


def npm_package(name: str, version: str) -> tuple[Path | None, str]:
    """``(node_modules parent, "")`` or ``(None, why it cannot be had)``: ``name@version`` is
    installed into ``var/peers/<name>`` by ``npm install`` the first time, and used from there
    after (no registry needed once it is there). The BullMQ peer and the tests that verify our
    webhooks with the npm ``standardwebhooks`` library get theirs here."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return None, "node and npm are not on the PATH"
    folder = Path(settings.VAR_DIR) / "peers" / name
    if not (folder / "node_modules" / name).is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "package.json").exists():
            (folder / "package.json").write_text(f'{{"name": "ccpeer-{name}", "private": true}}\n')
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--silent", f"{name}@{version}"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            return None, f"npm install {name} failed: {done.stderr.strip()[-300:]}"
    return folder, ""


def bench_bullmq(count: int, rates: list[int], seconds: int) -> dict[str, Any]:
    folder, why = npm_package("bullmq", BULLMQ_VERSION)
    if folder is None:
        return {"bullmq_skipped": why}
    version = json.loads((folder / "node_modules" / "bullmq" / "package.json").read_text())
    args = {
        "redis": settings.REDIS_URL,
        "count": count,
        "rates": rates,
        "seconds": seconds,
        "concurrency": BULLMQ_CONCURRENCY,
        "prefix": f"ccpeer-{uuid.uuid4().hex[:8]}",
        "modules": str(folder),
        "timeout_s": 300,
        "out": str(folder / f"result-{uuid.uuid4().hex[:8]}.json"),
    }
    done = subprocess.run(
        [shutil.which("node"), str(JS), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        return {"bullmq_skipped": f"the BullMQ run failed: {done.stderr.strip()[-500:]}"}
    out = Path(args["out"])
    raw = json.loads(out.read_text())
    out.unlink()
    result: dict[str, Any] = {"bullmq_version": version["version"]}
    for phase, figures in raw.items():
        result.update(_phase_figures(f"bullmq_{phase}", figures))
    return result


def _phase_figures(name: str, figures: dict[str, Any]) -> dict[str, Any]:
    lateness = figures.pop("lateness_ms")
    drain = figures.get("drain_s") or None
    return {
        f"{name}_count": figures["count"],
        f"{name}_processed": figures["processed"],
        f"{name}_drain_s": round(drain, 3) if drain else None,
        f"{name}_per_s": round(figures["count"] / drain) if drain else None,
        **lateness_summary(lateness, prefix=f"{name}_lateness"),
    }


# --- Celery ETA ----------------------------------------------------------------------------------


def _celery_worker(queue: str, log_dir: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "couponcenter",
        "worker",
        "--pool",
        "prefork",
        "--concurrency",
        str(CELERY_CONCURRENCY),
        "-Q",
        queue,
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        "WARNING",
        "--include",
        "reminders.bench.peer_tasks",
    ]
    os.makedirs(log_dir, exist_ok=True)
    log = open(os.path.join(log_dir, "bench-peer-celery.log"), "w")  # noqa: SIM115
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the Celery worker exited with {proc.returncode}")
        if celery_answers(timeout=0.5):
            return proc
    proc.kill()
    raise RuntimeError("the Celery worker did not answer in time")


def _celery_phase(
    name: str, dues_ms: list[int], queue: str, progress: Progress | None, timeout_s: float
) -> dict[str, Any]:
    client = get_redis()
    key = f"ccpeer:{uuid.uuid4().hex[:8]}:{name}"
    started = time.perf_counter()
    with current_app.producer_or_acquire() as producer:
        for i, due in enumerate(dues_ms):
            record_lateness.apply_async(
                args=[key, due],
                eta=datetime.fromtimestamp(due / 1000, UTC),
                queue=queue,
                producer=producer,
            )
            if progress and i % PUBLISH_BATCH == 0:
                progress(f"celery {name} publish", i, len(dues_ms))
    publish_s = time.perf_counter() - started
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and client.llen(key) < len(dues_ms):
        if progress:
            progress(f"celery {name} run", client.llen(key), len(dues_ms))
        time.sleep(0.05)
    samples = [float(x) for x in client.lrange(key, 0, -1)]
    last = float(client.get(f"{key}:last") or 0)
    client.delete(key, f"{key}:last")
    figures = {
        "count": len(dues_ms),
        "processed": len(samples),
        "drain_s": (last - min(dues_ms)) / 1000 if samples else None,
        "lateness_ms": samples,
    }
    return {
        f"celery_eta_{name}_publish_per_s": round(len(dues_ms) / publish_s),
        **_phase_figures(f"celery_eta_{name}", figures),
    }


def bench_celery_eta(
    count: int, rates: list[int], seconds: int, progress: Progress | None, log_dir: str
) -> dict[str, Any]:
    queue = f"ccpeer-{uuid.uuid4().hex[:8]}"
    proc = _celery_worker(queue, log_dir)
    result: dict[str, Any] = {}
    try:
        # Due after the whole burst is published (about 1,000 a second here, one message each).
        due = epoch_ms() + int(count / PUBLISH_RATE * 1000) + 3000
        result.update(_celery_phase("burst", [due] * count, queue, progress, 600))
        for rate in rates:
            n = rate * seconds
            t0 = epoch_ms() + int(n / PUBLISH_RATE * 1000) + 3000
            dues = [t0 + (i * 1000) // rate for i in range(n)]
            result.update(_celery_phase(f"steady_{rate}", dues, queue, progress, seconds + 300))
    finally:
        stop(proc)
        get_redis().delete(queue)
    return result


def run(
    *,
    count: int,
    rates: list[int],
    seconds: int,
    peers: list[str],
    progress: Progress | None = None,
    log_dir: str | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"peer_count": count, "peer_rates": rates}
    if "bullmq" in peers:
        result.update(bench_bullmq(count, rates, seconds))
    if "celery" in peers:
        result.update(
            bench_celery_eta(count, rates, seconds, progress, log_dir or str(settings.VAR_DIR))
        )
    return result
