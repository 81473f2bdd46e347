"""Claims over HTTP: gunicorn on a loopback port, a load generator, and an oversell audit.

The run: create a coupon (stock S, one per user) and a service-account token; start
``gunicorn couponcenter.wsgi -c gunicorn.conf.py`` against the configured database and Redis
(``DEBUG=0``: production code paths, no query log); measure the raw limit of the same HTTP stack
on ``/healthz/live/``; then POST ``/api/users/{id}/coupons/`` with a distinct user per request
for ``duration`` seconds; then check the database: ``claimed_count`` equals the number of
``UserCoupon`` rows (and of expiry tasks), is at most the stock, and no user holds two.

The generator is ``wrk`` (C, a Lua script that numbers the users) when it is installed, else a
small asyncio client (both in ``load_generators``). Every process's CPU time is measured, so the
report says how much of the machine the generator took from gunicorn and PostgreSQL.

This module also starts and stops the production server the HTTP benchmarks measure
(``Gunicorn``, with ``server_env`` for its settings): ``bench_timeouts`` and the tests that run
real processes start theirs with it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import psutil
from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from couponcenter.coupons import accounts, selectors, services
from couponcenter.coupons.bench import load_generators
from couponcenter.coupons.models import Coupon, UserCoupon

ROOT = Path(__file__).resolve().parents[3]  # the project root: gunicorn runs from there
BENCH_ACCOUNT = "bench-claims-http"
USER_ID_BASE = 10**12  # far above any real end-user id the bench database may hold

WRK_SCRIPT = r"""
-- Claim as a new user on every request; count statuses per thread; print one JSON line.
local threads, counter, base, coupon, token = {}, 0, 0, 0, ""
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function init(args)
  coupon, token, base = args[1], args[2], tonumber(args[3])
  base = base + tid * 100000000
  s201, s409, sother = 0, 0, 0
end
function request()
  counter = counter + 1
  return wrk.format("POST", "/api/users/" .. (base + counter) .. "/coupons/",
    {["Authorization"] = "Token " .. token, ["Content-Type"] = "application/json"},
    '{"coupon": ' .. coupon .. '}')
end
function response(status, headers, body)
  if status == 201 then s201 = s201 + 1
  elseif status == 409 then s409 = s409 + 1
  else sother = sother + 1 end
end
function done(summary, latency, requests)
  local c201, c409, cother = 0, 0, 0
  for _, t in ipairs(threads) do
    c201 = c201 + t:get("s201"); c409 = c409 + t:get("s409"); cother = cother + t:get("sother")
  end
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "s201": %d, "s409": %d, "sother": %d, ' ..
    '"errors": %d, "p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, c201, c409, cother,
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.timeout, latency:percentile(50), latency:percentile(99)))
end
"""

WRK_PLAIN_SCRIPT = r"""
function done(summary, latency, requests)
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "duration_us": %d, "errors": %d, "non2xx": %d, ' ..
    '"p50_us": %d, "p99_us": %d, "p999_us": %d}\n', summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.9)))
end
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    """The URL of the database this process uses now (under pytest, the test database), for the
    processes it starts."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = quote(db["USER"] or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def server_env(**extra: str) -> dict[str, str]:
    """Production-like settings for the child processes, on this run's database and Redis."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url(),
        REDIS_URL=settings.REDIS_URL,
        REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX,
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="127.0.0.1,localhost",
        SECURE_SSL_REDIRECT="0",
        LOG_LEVEL="ERROR",
        GUNICORN_ACCESS_LOG="0",
        GUNICORN_LOG_LEVEL="warning",
        COUPONCENTER_REDIS_AUTOSTART="0",
        PYTHONPATH=str(ROOT),
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.update(extra)
    return env


class Gunicorn:
    """``gunicorn couponcenter.wsgi -c gunicorn.conf.py`` on a free loopback port."""

    def __init__(self, *, workers: int, worker_class: str, threads: int, env: dict[str, str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in stop()
        env = {
            **env,
            "GUNICORN_BIND": f"127.0.0.1:{self.port}",
            "WEB_CONCURRENCY": str(workers),
            "GUNICORN_WORKER_CLASS": worker_class,
            "GUNICORN_THREADS": str(threads),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "couponcenter.wsgi", "-c", "gunicorn.conf.py"],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.workers = workers

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(self.url + "/healthz/live/", timeout=2) as response:
                    if response.status == 200 and len(self.worker_pids()) >= self.workers:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.log.seek(0)
        raise RuntimeError(f"gunicorn did not start:\n{self.log.read()[-3000:]}")

    def worker_pids(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children()]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        stop(self.proc)
        self.log.close()


def stop(*procs: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM to each process still running, then a wait of up to ``timeout`` seconds for each,
    and a kill (reaped) for one that is still running: a server or worker drains what it holds
    before it exits."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class CpuMeter:
    """CPU seconds used by the machine, by gunicorn (master + workers) and by PostgreSQL."""

    def __init__(self, gunicorn: Gunicorn) -> None:
        self.gunicorn = gunicorn
        self.start = self._sample()

    def _procs(self) -> dict[str, list[psutil.Process]]:
        groups: dict[str, list[psutil.Process]] = {"gunicorn": [], "postgres": []}
        try:
            master = psutil.Process(self.gunicorn.proc.pid)
            groups["gunicorn"] = [master, *master.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] and proc.info["name"].startswith("postgres"):
                groups["postgres"].append(proc)
        return groups

    def _sample(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for name, procs in self._procs().items():
            out[name] = {}
            for proc in procs:
                try:
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                out[name][proc.pid] = times.user + times.system
        total = psutil.cpu_times()
        out["machine"] = {0: total.user + total.system + total.nice + total.irq + total.softirq}
        return out

    def used(self) -> dict[str, float]:
        end = self._sample()
        return {
            name: round(sum(v - self.start[name].get(pid, 0.0) for pid, v in end[name].items()), 2)
            for name in end
        }


# --- the run --------------------------------------------------------------------------------------


def _claim_load(
    gunicorn: Gunicorn,
    *,
    generator: str,
    coupon_id: int,
    token: str,
    seconds: float,
    connections: int,
    threads: int,
) -> tuple[dict, float]:
    if generator == "wrk":
        args = [str(coupon_id), token, str(USER_ID_BASE)]
        return load_generators.run_wrk(
            url=gunicorn.url,
            script=WRK_SCRIPT,
            args=args,
            seconds=seconds,
            connections=connections,
            threads=threads,
        )
    return load_generators.run_python(
        port=gunicorn.port,
        path_for=lambda n: f"/api/users/{n}/coupons/",
        body_for=lambda n: b'{"coupon": %d}' % coupon_id,
        headers=f"Authorization: Token {token}\r\nContent-Type: application/json\r\n",
        seconds=seconds,
        connections=connections,
        first=USER_ID_BASE,
    )


def _raw_load(
    gunicorn: Gunicorn, *, generator: str, seconds: float, connections: int, threads: int
) -> tuple[dict, float]:
    if generator == "wrk":
        return load_generators.run_wrk(
            url=gunicorn.url + "/healthz/live/",
            script=WRK_PLAIN_SCRIPT,
            args=[],
            seconds=seconds,
            connections=connections,
            threads=threads,
        )
    return load_generators.run_python(
        port=gunicorn.port,
        path_for=lambda n: "/healthz/live/",
        body_for=None,
        headers="",
        seconds=seconds,
        connections=connections,
        first=0,
    )


def audit(*, coupon_id: int) -> dict:
    """The zero-oversell check, straight from the database."""
    coupon = Coupon.objects.get(pk=coupon_id)
    rows = UserCoupon.objects.filter(coupon_id=coupon_id).count()
    # Each claim's expiry task, through its reverse relation (the domain does not import expiry).
    tasks = UserCoupon.objects.filter(coupon_id=coupon_id, expiry_task__isnull=False).count()
    doubles = (
        UserCoupon.objects.filter(coupon_id=coupon_id)
        .values("user_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    shard_claims = selectors.coupon_claims_count(coupon=coupon)
    return {
        "stock": coupon.total_stock,
        "claimed_count": coupon.claimed_count,
        "shard_claims": shard_claims,
        "user_coupon_rows": rows,
        "expiry_tasks": tasks,
        "users_holding_two": doubles,
        "oversell": not (
            coupon.claimed_count == shard_claims == rows == tasks <= coupon.total_stock
            and not doubles
        ),
    }


def run(
    *,
    seconds: float = 20,
    stock: int = 0,
    workers: int = 4,
    worker_class: str = "sync",
    threads: int = 1,
    connections: int = 32,
    generator: str = "auto",
    raw_seconds: float = 5,
    progress: Callable[[str], None] = lambda message: None,
) -> dict:
    if generator == "auto":
        generator = "wrk" if shutil.which("wrk") else "python"
    gen_threads = 1  # one generator thread: on 2 cores every cycle it takes is gunicorn's loss
    stock = stock or int(seconds * 1500)
    coupon = services.coupon_create(
        name=f"bench-http {timezone.now():%H:%M:%S}",
        claim_opens_at=timezone.now() - timedelta(minutes=1),
        total_stock=stock,
        per_user_limit=1,
        valid_for=timedelta(days=1),
    )
    _, token = accounts.account_ensure(username=BENCH_ACCOUNT, act_for_any_user=True)
    connection.close()  # gunicorn's workers need the connection slots more than we do

    gunicorn = Gunicorn(
        workers=workers,
        worker_class=worker_class,
        threads=threads,
        env=server_env(THROTTLE_CLAIM="1000000000/min"),
    )
    try:
        progress(f"gunicorn: {workers} x {worker_class} on {gunicorn.url}")
        gunicorn.wait_ready()
        _raw_load(
            gunicorn, generator=generator, seconds=1, connections=connections, threads=gen_threads
        )  # warm-up: every worker imported and connected
        progress(f"raw limit: {raw_seconds}s of GET /healthz/live/")
        meter = CpuMeter(gunicorn)
        raw, raw_gen_cpu = _raw_load(
            gunicorn,
            generator=generator,
            seconds=raw_seconds,
            connections=connections,
            threads=gen_threads,
        )
        raw_cpu = meter.used()["gunicorn"]
        progress(f"claims: {seconds}s of POST /api/users/{{id}}/coupons/ (stock {stock})")
        meter = CpuMeter(gunicorn)
        load, gen_cpu = _claim_load(
            gunicorn,
            generator=generator,
            coupon_id=coupon.pk,
            token=token,
            seconds=seconds,
            connections=connections,
            threads=gen_threads,
        )
        cpu = meter.used()
    finally:
        gunicorn.stop()

    wall = load["duration_us"] / 1e6
    cores = psutil.cpu_count() or 1
    result = {
        "generator": generator,
        "gunicorn": f"{workers} x {worker_class}" + (f", {threads} threads" if threads > 1 else ""),
        "connections": connections,
        "database": connection.vendor,
        "cores": cores,
        "seconds": round(wall, 2),
        "claims_per_s": round(load["s201"] / wall, 1),
        "requests_per_s": round(load["requests"] / wall, 1),
        "total_requests": load["requests"],
        "status_counts": {"201": load["s201"], "409": load["s409"], "other": load["sother"]},
        "socket_errors": load["errors"],
        "p50_ms": round(load["p50_us"] / 1000, 2),
        "p99_ms": round(load["p99_us"] / 1000, 2),
        "raw_limit_per_s": round(raw["requests"] / (raw["duration_us"] / 1e6), 1),
        "raw_p99_ms": round(raw["p99_us"] / 1000, 2),
        "raw_non_2xx": raw.get("non2xx", 0),
        "cpu_share": {
            "generator": round(gen_cpu / (wall * cores), 3),
            "gunicorn": round(cpu["gunicorn"] / (wall * cores), 3),
            "postgres": round(cpu["postgres"] / (wall * cores), 3),
            "machine_busy": round(cpu["machine"] / (wall * cores), 3),
        },
        "raw_cpu_share": {
            "generator": round(raw_gen_cpu / (raw["duration_us"] / 1e6 * cores), 3),
            "gunicorn": round(raw_cpu / (raw["duration_us"] / 1e6 * cores), 3),
        },
    }
    result.update(audit(coupon_id=coupon.pk))
    delete_bench_coupon(coupon.pk)
    return result


def delete_bench_coupon(coupon_id: int) -> None:
    """The run's coupon with its claims (their expiry tasks go with them), once audited: runs
    left them behind, and every run's claims stayed in the tables later runs measure."""
    UserCoupon.objects.filter(coupon_id=coupon_id).delete()
    Coupon.objects.filter(pk=coupon_id).delete()
