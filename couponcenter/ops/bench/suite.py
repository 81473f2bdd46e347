"""The whole benchmark suite in one sitting (``manage.py bench_all``, ``make bench``).

Each part measures our figure beside the raw limit of the same work in the same run
(docs/performance.md; ``report`` turns the results into the figures and ratios):

- dispatch rate / the bare Lua pop-and-ack loop;
- reminders end to end (200,000 in the inbox) / a bare SQL loop doing the same inbox writes;
- the burst's p99 lateness with pre-staging, beside the same burst without it;
- a steady 5,000 reminders/s: p99 and p99.9 lateness;
- expiry / the bare SQL expiry loop;
- claims over HTTP / the same gunicorn answering ``/healthz/live/``;
- the rush (a coupon opens, N users claim it from a second before; stock 1,000 and stock N) / the
  same gunicorn answering ``/healthz/live/`` under the same wrk settings;
- cost as the backlog grows: Redis bytes per pending reminder and the claim rate at 1M and 10M;
- the timeout center: 200,000 http jobs due in one second / a plain client on the same
  receiver, a fast topic's p99 while a slow one is saturated, bulk create and cancel by key;
- days of a campaign calendar (``bench_days`` in a shorter form): each hot path's rate on the
  last day over the first, and the tables' size on the last day over the first at full retention;
- webhook fan-out against nginx answering 204: our worker's rate / wrk's on the same nginx and
  connections, beside a BullMQ worker (Node, ``fetch``) posting the same webhooks, and each
  worker's CPU seconds per thousand webhooks;
- a campaign day (``bench_day`` in a shorter form): every path alone, then all at once with a
  rolling deploy; ``<path>_together_of_alone``, lost and duplicated deliveries;
- the peers (BullMQ, Celery ETA) on the same Redis and workload, when asked for.

It writes one JSON file and one Markdown table under ``var/bench/`` and returns the JSON.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings
from django.db import connection

from couponcenter.core.redis import get_redis
from couponcenter.coupons.bench import http as bench_http
from couponcenter.coupons.bench import rush as bench_rush
from couponcenter.coupons.bench.progress import Progress
from couponcenter.ops.bench import day as bench_day
from couponcenter.ops.bench import days as bench_days
from couponcenter.ops.bench.report import RATIO_TARGETS, at_a_glance, figures, markdown, ratios
from expiry import services as expiry_services
from expiry.bench import sweep as bench_expiry
from reminders.bench import backlog as bench_backlog
from reminders.bench import end_to_end as bench_reminders
from reminders.bench import fanout as bench_fanout
from reminders.bench import peers as bench_peers
from reminders.bench import timeouts as bench_timeouts
from reminders.bench.nginx import nginx_missing
from reminders.bench.raw_inbox import bench_raw_inbox
from reminders.selectors import reminder_settings_get

STEADY_RATE = 5000
# bench_days's shorter form: D = 3 x the retention, as the target asks, in a few minutes.
DAYS = bench_days.Shape(days=6, retention_days=2, claims=150_000, reminders=20_000, timeouts=5_000)
# bench_day's shorter form: a 4-minute day at a tenth of the events' load.
DAY = bench_day.Shape(
    seconds=240, alone_s=15, burst=20_000, rush_users=5_000, timeout_burst=5_000, expiry=100_000
)
PARTS = (
    "expiry",
    "timeouts",
    "fanout",
    "raw_inbox",
    "reminders",
    "days",
    "day",
    "claims",
    "rush",
    "backlog",
)
FANOUT_COUNT = 20_000  # webhooks per sender in the fan-out part
RUSH_REFUSALS_STOCK = 1_000  # the rush of mostly refusals; the other has a unit for every user


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in info if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()" if connection.vendor == "postgresql" else "SELECT 1")
        database = cursor.fetchone()[0] if connection.vendor == "postgresql" else connection.vendor
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "database": str(database).split(",")[0],
        "redis": get_redis().info("server").get("redis_version"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _rush(users: int, *, progress: Progress | None, say: Callable[[str], None]) -> dict:
    stocks = (min(RUSH_REFUSALS_STOCK, users), users)
    if not shutil.which("wrk"):
        return {"skipped": "wrk is not installed (apt-get install wrk; make bench does)"}
    say(f"the rush: {users:,} users, stock {stocks[0]:,} then {stocks[1]:,}, beside /healthz/live/")
    return bench_rush.run(users=users, stocks=stocks, progress=progress, say=say)


def _fanout(*, bullmq: bool, progress: Progress | None, say: Callable[[str], None]) -> dict:
    missing = bench_fanout.missing_tools()
    if missing:
        return {"skipped": f"{' and '.join(missing)} not installed (make bench installs them)"}
    say(f"fan-out: {FANOUT_COUNT:,} webhooks to nginx (204), beside wrk and BullMQ")
    return bench_fanout.run(count=FANOUT_COUNT, bullmq=bullmq, progress=progress, say=say)


def run(
    *,
    count: int = 200_000,
    expiry_count: int = 1_000_000,
    claims_seconds: float = 20,
    rush_users: int = 20_000,
    peers: bool = True,
    parts: tuple[str, ...] = PARTS,
    progress: Progress | None = None,
    out_dir: Path | None = None,
    say: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    started = time.time()
    result: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    live = reminder_settings_get(max_age_s=0)
    # The parts that fork worker processes run first: a process forked after Celery's broker
    # connections were used (the reminders part pings its workers) can hang in kombu's
    # after-fork cleanup.
    if "expiry" in parts:
        say(
            f"expiry: {expiry_count:,} coupons, 2 sweepers, beside the bare SQL loop "
            f"(an untimed warm-up, then two rounds each, taking turns)"
        )
        result["expiry"] = bench_expiry.run_bench(
            count=expiry_count,
            workers=2,
            batch_size=expiry_services.DEFAULT_BATCH_SIZE,
            progress=False,
            rounds=2,
        ).as_dict()
    if "timeouts" in parts:
        say(f"timeouts: a {count:,} http burst beside a plain client, isolation, bulk, cancel")
        result["timeouts"] = bench_timeouts.run(count=count, progress=progress)
    if "fanout" in parts:
        result["fanout"] = _fanout(bullmq=peers, progress=progress, say=say)
    if "raw_inbox" in parts:
        say("raw limit: the bare SQL inbox-write loop")
        result["raw_inbox"] = bench_raw_inbox(
            count, bench_reminders.BENCH_USER_BASE, batch_size=live.batch_size, progress=progress
        )
    if "reminders" in parts:
        say(f"reminders: a {count:,} burst with and without pre-staging, steady {STEADY_RATE}/s")
        result["reminders"] = bench_reminders.run(
            count=count, steady_rate=STEADY_RATE, steady_seconds=10, progress=progress
        )
    if "days" in parts:
        say(
            f"days: {DAYS.days} days of a campaign calendar, retention {DAYS.retention_days} "
            f"days, {DAYS.claims:,} claims, {DAYS.reminders:,} reminders and "
            f"{DAYS.timeouts:,} order timeouts a day"
        )
        if missing := nginx_missing("bench_days"):
            result["days"] = {"skipped": missing}
        else:
            result["days"] = bench_days.run(DAYS, progress=progress, say=say)
    if "day" in parts:
        say(
            f"day: a campaign day of {DAY.seconds / 60:g} minutes, every path alone first, a "
            f"{DAY.burst:,} burst, a {DAY.rush_users:,}-user rush, {DAY.timeout_burst:,} "
            f"timeouts, a {DAY.expiry:,} sweep, a rolling deploy"
        )
        if missing := nginx_missing("bench_day"):
            result["day"] = {"skipped": missing}
        else:
            result["day"] = bench_day.run(DAY, progress=progress, say=say)
    if "claims" in parts:
        say(f"claims over HTTP: {claims_seconds:.0f} s, beside /healthz/live/")
        result["claims"] = bench_http.run(seconds=claims_seconds, progress=say)
    if "rush" in parts:
        result["rush"] = _rush(rush_users, progress=progress, say=say)
    if "backlog" in parts:
        say("cost as the backlog grows: 1M and 10M pending reminders in Redis")
        result["backlog"] = bench_backlog.run(
            sizes=[1_000_000, 10_000_000], rebuild=True, progress=progress
        )
    if peers:
        say("peers: BullMQ and Celery ETA on the same Redis")
        result["peers"] = bench_peers.run(
            count=count,
            rates=[2000, STEADY_RATE],
            seconds=10,
            peers=["bullmq", "celery"],
            progress=progress,
        )
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.time() - started, 1)
    result["figures"] = [asdict(row) for row in figures(result)]
    result["ratios"] = ratios(result)
    result["targets"] = RATIO_TARGETS
    result.update(at_a_glance(result))
    result.setdefault("peers", {"skipped": "not asked for (--no-peers)"})
    folder = out_dir or Path(settings.VAR_DIR) / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    result["json_path"] = str(folder / f"bench-{stamp}.json")
    result["markdown_path"] = str(folder / f"bench-{stamp}.md")
    Path(result["json_path"]).write_text(json.dumps(result, indent=2, default=str))
    Path(result["markdown_path"]).write_text(markdown(result))
    return result
