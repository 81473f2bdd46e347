"""``bench_fanout``: how fast our timeout workers post webhooks when the receiver is not the limit.

``bench_timeouts``' receiver is Python, slower than our sender, so its burst says nothing of what
sending costs. Here the receiver is nginx answering 204 (``reminders.bench.nginx``), started and
stopped by the run, and three senders take turns at it with the same number of connections
(``concurrency``), each on its own path so its arrivals are counted apart in nginx's access log:

- **wrk** (``/wrk``): the raw limit, the same signed body and headers on every request, for
  ``wrk_seconds``;
- **ours** (``/ours``): ``count`` jobs of an ``http`` topic due in the same second, fired by one
  ``run_reminder_worker`` (the production path: claim, take the rows, a signed POST per job,
  settle), timed from the first arrival to the last;
- **BullMQ** (``/bullmq``): the same number of jobs, each the same payload, posted by one Node
  ``Worker`` with ``fetch`` (``js/bullmq_fanout.mjs``), timed the same way; skipped with the
  reason when node or the package is missing.

Rates are arrivals in nginx's log, never a sender's own count: a run fails when a sender's
arrivals are not its jobs exactly (each with its own ``webhook-id``, each signed). Beside the
rates, each worker's CPU seconds per thousand webhooks, read (psutil) from the process doing the
sending while it sends: ours includes its dispatch loop and settling, BullMQ's its Redis moves.
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
from django.conf import settings
from django.utils import timezone

from couponcenter.core.webhooks import SECRET_PREFIX, signature, signed_headers
from couponcenter.coupons.bench import load_generators
from couponcenter.coupons.bench.http import WRK_PLAIN_SCRIPT
from couponcenter.coupons.bench.progress import Progress
from reminders.bench.namespace import bench_namespace
from reminders.bench.nginx import LOG_FLUSH_S, Arrival, Nginx, nginx_binary, nginx_receiver
from reminders.bench.peers import BULLMQ_VERSION, npm_package
from reminders.bench.processes import timeout_worker_process
from reminders.bench.timeouts import (
    FAR,
    _cleanup_rows,
    _create,
    _move_due,
    _topic,
    quiet_database,
)
from reminders.handlers.timeout_jobs import job_payload
from reminders.models import TimeoutJob

TOPIC = "bench.fanout"
JS = Path(__file__).parent / "js" / "bullmq_fanout.mjs"
# docs/performance.md: ours against wrk on the same nginx, and against BullMQ in the same run.
OF_WRK_TARGET = 0.2
OF_BULLMQ_TARGET = 1.0


class ToolMissing(RuntimeError):
    """nginx or wrk is not installed (``make bench`` and ``.ci/run`` install both)."""


def missing_tools() -> list[str]:
    """The Debian packages this benchmark needs and does not find."""
    found = {"nginx-light": nginx_binary(), "wrk": shutil.which("wrk")}
    return [package for package, path in found.items() if path is None]


def _noop(what: str, done: int, total: int) -> None:
    pass


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _span(arrivals: list[Arrival]) -> float:
    """First to last arrival (s), at least nginx's millisecond."""
    return max(1e-3, arrivals[-1].at - arrivals[0].at) if arrivals else 0.0


def _checked(arrivals: list[Arrival], expected_ids: set[str], who: str) -> dict[str, Any]:
    """What arrived is each job once (a retry arrives again under its id: counted apart), every
    one answered 204 and signed; the figures are of those."""
    ids = [a.webhook_id for a in arrivals]
    missing, unexpected = expected_ids - set(ids), set(ids) - expected_ids
    unsigned = sum(1 for a in arrivals if not a.webhook_signature.startswith("v1,"))
    if missing or unexpected or unsigned or any(a.status != 204 for a in arrivals):
        raise RuntimeError(
            f"{who}: {len(missing)} of {len(expected_ids)} webhooks never arrived, "
            f"{len(unexpected)} not of its jobs, {unsigned} unsigned, "
            f"{sum(a.status != 204 for a in arrivals)} not answered 204"
        )
    return {"arrived": len(arrivals), "repeated": len(ids) - len(set(ids))}


def _signed_by(secret: str, arrival: Arrival, job: TimeoutJob) -> bool:
    """The arrival's signature is the job's body signed with ``secret``, at the arrival's
    timestamp (the body is the job's payload, as ``fire_jobs`` makes it)."""
    body = json.dumps(job_payload(job), sort_keys=True).encode()
    expected = signature(secret, arrival.webhook_id, int(arrival.webhook_timestamp), body)
    return expected in arrival.webhook_signature.split(" ")


# --- wrk: the raw limit ---------------------------------------------------------------------------


def _lua_string(text: str) -> str:
    return "[==[" + text + "]==]"


def bench_wrk(nginx: Nginx, *, seconds: float, connections: int, secret: str) -> dict[str, Any]:
    """wrk posting one signed body of our payload's size, ``connections`` connections."""
    body = json.dumps(
        {
            "job_id": 1,
            "topic": TOPIC,
            "biz_type": "bench",
            "biz_id": "f-1",
            "action_time": timezone.now().isoformat(),
            "attribute": {},
        },
        sort_keys=True,
    ).encode()
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": f"{TOPIC}:1",
        **signed_headers(
            body, secrets=[secret], message_id=f"{TOPIC}:1", timestamp=int(time.time())
        ),
    }
    script = 'wrk.method = "POST"\n' + f"wrk.body = {_lua_string(body.decode())}\n"
    script += "".join(
        f"wrk.headers[ {_lua_string(k)} ] = {_lua_string(v)}\n" for k, v in headers.items()
    )
    summary, cpu = load_generators.run_wrk(
        url=f"{nginx.url}/wrk",
        script=script + WRK_PLAIN_SCRIPT,
        args=[],
        seconds=seconds,
        connections=connections,
        threads=min(2, connections),
    )
    if summary["errors"] or summary["non2xx"]:
        raise RuntimeError(f"wrk: {summary['errors']} errors, {summary['non2xx']} not 2xx")
    per_s = summary["requests"] / (summary["duration_us"] / 1e6)
    return {
        "wrk_per_s": round(per_s),
        "wrk_requests": summary["requests"],
        "wrk_cpu_s_per_1k": round(cpu / summary["requests"] * 1000, 4),
    }


# --- ours -----------------------------------------------------------------------------------------


def bench_ours(
    nginx: Nginx, *, count: int, concurrency: int, secret: str, prefix: str, progress: Progress
) -> dict[str, Any]:
    _topic(TOPIC, f"{nginx.url}/ours", concurrency=concurrency, slots=16, secret=secret)
    _create(
        TOPIC,
        count,
        at=timezone.now() + FAR,
        prefix="f",
        progress=progress,
        what="ours: create jobs",
    )
    quiet_database()
    with timeout_worker_process(prefix, (TOPIC,), str(settings.VAR_DIR)) as worker:
        cpu_before = _cpu_s(worker.pid)
        _move_due(TOPIC, timezone.now() + timedelta(seconds=2))
        pending = TimeoutJob.objects.filter(topic=TOPIC, status=TimeoutJob.Status.PENDING)
        deadline = time.monotonic() + max(120, count / 100)
        while time.monotonic() < deadline:
            arrived = nginx.count("/ours")
            progress("ours: webhooks arrived", min(arrived, count), count)
            if arrived >= count and not pending.exists():
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"ours: {nginx.count('/ours')} of {count} arrived in time")
        cpu = _cpu_s(worker.pid) - cpu_before
    time.sleep(LOG_FLUSH_S)  # a retry still in flight at the last settle is logged too
    arrivals = nginx.arrivals("/ours")
    jobs = {f"{TOPIC}:{job.pk}": job for job in TimeoutJob.objects.filter(topic=TOPIC)}
    checked = _checked(arrivals, set(jobs), "ours")
    forged = [a.webhook_id for a in arrivals if not _signed_by(secret, a, jobs[a.webhook_id])]
    if forged:
        raise RuntimeError(f"ours: {len(forged)} webhooks whose signature does not verify")
    seconds = _span(arrivals)
    return {
        "ours_per_s": round(len(jobs) / seconds),
        "ours_seconds": round(seconds, 3),
        "ours_arrived": checked["arrived"],
        "ours_repeated": checked["repeated"],
        "ours_verified": len(arrivals),
        "ours_cpu_s_per_1k": round(cpu / len(jobs) * 1000, 4),
    }


# --- BullMQ ---------------------------------------------------------------------------------------


def bench_bullmq(
    nginx: Nginx, *, count: int, concurrency: int, secret: str, progress: Progress
) -> dict[str, Any]:
    folder, why = npm_package("bullmq", BULLMQ_VERSION)
    if folder is None:
        return {"bullmq_skipped": why}
    args = {
        "redis": settings.REDIS_URL,
        "count": count,
        "concurrency": concurrency,
        "prefix": f"ccpeer-{uuid.uuid4().hex[:8]}",
        "modules": str(folder),
        "url": f"{nginx.url}/bullmq",
        "secret": secret,
        "topic": TOPIC,
        "timeout_s": max(120, count / 100),
    }
    proc = subprocess.Popen(
        [shutil.which("node") or "node", str(JS), json.dumps(args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    try:
        first = proc.stdout.readline()
        if first.strip() != "READY":
            proc.wait(timeout=30)
            return {"bullmq_skipped": f"the BullMQ run failed: {proc.stderr.read()[-500:]}"}
        reader.start()
        cpu_before = _cpu_s(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        while not any(line.startswith("DONE ") for line in lines):
            if proc.poll() is not None:
                raise RuntimeError(f"the BullMQ worker exited: {proc.stderr.read()[-500:]}")
            progress("BullMQ: webhooks arrived", min(nginx.count("/bullmq"), count), count)
            time.sleep(0.1)
        cpu = _cpu_s(proc.pid) - cpu_before
        done = json.loads(next(line for line in lines if line.startswith("DONE "))[5:])
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    nginx.wait_logged("/bullmq", count)
    arrivals = nginx.arrivals("/bullmq")
    checked = _checked(arrivals, {f"{TOPIC}:{n}" for n in range(1, count + 1)}, "BullMQ")
    seconds = _span(arrivals)
    return {
        "bullmq_per_s": round(count / seconds),
        "bullmq_seconds": round(seconds, 3),
        "bullmq_arrived": checked["arrived"],
        "bullmq_failed": done["failed"],
        "bullmq_cpu_s_per_1k": round(cpu / count * 1000, 4),
    }


def run(
    *,
    count: int = 20_000,
    concurrency: int = 16,
    wrk_seconds: float = 5,
    bullmq: bool = True,
    progress: Progress | None = None,
    say: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    missing = missing_tools()
    if missing:
        raise ToolMissing(
            f"bench_fanout needs {' and '.join(missing)}: apt-get install "
            f"{' '.join(missing)} (make bench does)"
        )
    progress = progress or _noop
    secret = SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
    result: dict[str, Any] = {"fanout_count": count, "fanout_concurrency": concurrency}
    with (
        bench_namespace(lambda: _cleanup_rows((TOPIC,)), say) as (prefix, _),
        nginx_receiver() as nginx,
    ):
        say(f"fan-out: wrk, {concurrency} connections, {wrk_seconds:.0f} s, on nginx (204)")
        result.update(bench_wrk(nginx, seconds=wrk_seconds, connections=concurrency, secret=secret))
        say(f"fan-out: ours, {count:,} http jobs due together, concurrency {concurrency}")
        result.update(
            bench_ours(
                nginx,
                count=count,
                concurrency=concurrency,
                secret=secret,
                prefix=prefix,
                progress=progress,
            )
        )
        if bullmq:
            say(f"fan-out: BullMQ, {count:,} jobs, concurrency {concurrency}, fetch")
            result.update(
                bench_bullmq(
                    nginx,
                    count=count,
                    concurrency=concurrency,
                    secret=secret,
                    progress=progress,
                )
            )
    result.update(ratios(result))
    return result


def ratios(result: dict[str, Any]) -> dict[str, Any]:
    ours, wrk, bull = result.get("ours_per_s"), result.get("wrk_per_s"), result.get("bullmq_per_s")
    return {
        "fanout_of_wrk": round(ours / wrk, 3) if ours and wrk else None,
        "fanout_of_bullmq": round(ours / bull, 3) if ours and bull else None,
        "fanout_cpu_s_per_1k": result.get("ours_cpu_s_per_1k"),
        "fanout_bullmq_cpu_s_per_1k": result.get("bullmq_cpu_s_per_1k"),
    }


def verdicts(result: dict[str, Any]) -> list[str]:
    """The run's figures beside docs/performance.md's targets, one line each."""
    of_wrk, of_bullmq = result.get("fanout_of_wrk"), result.get("fanout_of_bullmq")
    lines = [
        f"fan-out: ours {result.get('ours_per_s', 0):,}/s, wrk {result.get('wrk_per_s', 0):,}/s "
        f"on the same nginx: {of_wrk} of wrk (target >= {OF_WRK_TARGET}: "
        f"{_met(of_wrk, OF_WRK_TARGET)})"
    ]
    if result.get("bullmq_per_s"):
        lines.append(
            f"fan-out: BullMQ {result['bullmq_per_s']:,}/s: ours {of_bullmq} of it (target: "
            f"ahead, > {OF_BULLMQ_TARGET}: {_met(of_bullmq, OF_BULLMQ_TARGET, strict=True)})"
        )
    lines.append(
        f"fan-out: worker CPU seconds per 1,000 webhooks: ours {result.get('ours_cpu_s_per_1k')}, "
        f"BullMQ {result.get('bullmq_cpu_s_per_1k', '—')}, wrk {result.get('wrk_cpu_s_per_1k')}"
    )
    return lines


def _met(value: float | None, target: float, *, strict: bool = False) -> str:
    if value is None:
        return "not measured"
    return "met" if (value > target if strict else value >= target) else "NOT met"
