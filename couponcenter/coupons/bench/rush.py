"""The rush: a coupon opens at T and N distinct users claim it from T - 1 s, through gunicorn.

One gunicorn (``gunicorn.conf.py`` as production runs it, with gthread workers so a process holds
several claims at once) answers, in the same run and under the same wrk settings, once per
stock: ``GET /healthz/live/`` (the raw rate of the HTTP stack), the rush, and healthz again (the
faster healthz window is the reference). Stock 1,000 against 100,000 users is mostly refusals,
stock 100,000 mostly winners.

wrk runs one connection per thread, so on a thread ``response()`` always answers the
``request()`` just before it. Each thread claims for one user at a time, the next one nobody
has taken from a queue all threads share: a user answered 409 ``not_open`` taps again; any other
answer is that user's final one (201, 409 ``sold_out`` / ``limit_reached`` / ``closed``; anything
else counts as an error). Why a shared queue: with a fixed slice of the users per connection,
the connections a less loaded worker served finished in half the time of the slowest, and for
the rest of the rush their workers sat idle, which no crowd of independent users would allow
(the run's rate was the slowest connection's). A thread notes the monotonic time of its last
final answer and stops once the queue is empty; once every thread has, wrk is stopped and
prints the summary. The winners
are counted in the database afterwards (``http.audit``): they must equal the stock (or the
users, when fewer), and no user may hold more than the limit.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil
from django.db import connection
from django.utils import timezone

from couponcenter.coupons import accounts, services
from couponcenter.coupons.bench import load_generators
from couponcenter.coupons.bench.http import (
    BENCH_ACCOUNT,
    USER_ID_BASE,
    WRK_PLAIN_SCRIPT,
    CpuMeter,
    Gunicorn,
    audit,
    delete_bench_coupon,
    server_env,
)
from couponcenter.coupons.bench.progress import Progress
from couponcenter.coupons.models import Coupon

LEAD_S = 1.0  # the users start tapping this long before the coupon opens
# Load before anything is measured: a fresh gunicorn's first 5 s of healthz stalled (p99 over
# 2 s, against 0.1-0.5 s in the windows after it), and a stalled reference would flatter every
# ratio against it.
WARMUP_S = 10.0
PREPARE_S = 1.0  # time to create the coupon (and build what its opening needs) before the taps
PER_USER_LIMIT = 1

RUSH_SCRIPT = r"""
-- The rush: each thread (one connection) claims for the next user nobody has taken yet, one
-- user after the other, until the users run out. 409 not_open: the user taps again. Any other
-- answer is the user's final one.
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } rush_timespec;
int clock_gettime(int clock_id, rush_timespec *tp);
typedef struct { long next; char mutex[64]; } rush_queue;  /* pthread_mutex_t: 40 bytes */
void *calloc(size_t count, size_t size);
int pthread_mutex_init(void *mutex, const void *attr);
int pthread_mutex_lock(void *mutex);
int pthread_mutex_unlock(void *mutex);
]]
local CLOCK_MONOTONIC, ts = 1, ffi.new("rush_timespec")
local function now_us()  -- Python's time.monotonic() reads the same clock
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) * 1000000 + math.floor(tonumber(ts.tv_nsec) / 1000)
end

local threads = {}
local COUNTS = {"answered", "retries", "s201", "sold_out", "limit_reached", "closed", "errors"}
local FINAL_409 = {"sold_out", "limit_reached", "closed"}

-- The users' queue: a counter under a mutex in wrk's memory, which its threads share (each has
-- a Lua state of its own, so it goes to them as an address: ``queue_address``, a global, as
-- thread:set makes it in each). Allocated once, never freed: it lives as long as wrk.

function setup(thread)
  if queue_address == nil then
    local queue = ffi.cast("rush_queue *", ffi.C.calloc(1, ffi.sizeof("rush_queue")))
    ffi.C.pthread_mutex_init(queue.mutex, nil)
    queue_address = tonumber(ffi.cast("intptr_t", queue))
  end
  thread:set("queue_address", queue_address)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

local function take()
  ffi.C.pthread_mutex_lock(queue.mutex)
  local i = tonumber(queue.next)
  queue.next = i + 1
  ffi.C.pthread_mutex_unlock(queue.mutex)
  if i < users then return base + i end
  return nil
end

function init(args)
  queue = ffi.cast("rush_queue *", ffi.cast("intptr_t", queue_address))
  base, users = tonumber(args[3]), tonumber(args[4])
  for _, name in ipairs(COUNTS) do _G[name] = 0 end
  errors_by_status, first_us, last_us, finished = {}, 0, 0, false
  every = math.max(1, math.floor(users / tonumber(args[5]) / 10))
  headers = {["Authorization"] = "Token " .. args[2], ["Content-Type"] = "application/json"}
  body = '{"coupon": ' .. args[1] .. '}'
  user = take()
end

function request()
  if user == nil then  -- stopping: whatever goes out now is not a claim
    return wrk.format("GET", "/healthz/live/")
  end
  return wrk.format("POST", string.format("/api/users/%.0f/coupons/", user), headers, body)
end

local function finish()
  if finished then return end
  finished = true
  io.write(string.format("BENCH_DONE %d %d\n", tid, answered))
  io.stdout:flush()
  wrk.thread:stop()
end

local function final_code(status, body)
  if status == 201 then return "s201" end
  if status == 409 then
    for _, code in ipairs(FINAL_409) do
      if body:find('"' .. code .. '"', 1, true) then return code end
    end
    return nil, "409 other"
  end
  return nil, tostring(status)
end

function response(status, headers, body)
  if user == nil then return finish() end
  if status == 409 and body:find('"not_open"', 1, true) then
    retries = retries + 1
    return
  end
  local code, err = final_code(status, body)
  if code then _G[code] = _G[code] + 1 else
    errors = errors + 1
    errors_by_status[err] = (errors_by_status[err] or 0) + 1
  end
  answered, last_us = answered + 1, now_us()
  if first_us == 0 then first_us = last_us end
  user = take()
  if user == nil then
    finish()
  elseif answered % every == 0 then
    io.write(string.format("BENCH_PROGRESS %d %d\n", tid, answered))
    io.stdout:flush()
  end
end

function done(summary, latency, requests)
  local total, by_status, first, last = {}, {}, 0, 0
  for _, name in ipairs(COUNTS) do total[name] = 0 end
  for _, t in ipairs(threads) do
    for _, name in ipairs(COUNTS) do total[name] = total[name] + t:get(name) end
    for status, n in pairs(t:get("errors_by_status")) do
      by_status[status] = (by_status[status] or 0) + n
    end
    local f, l = t:get("first_us"), t:get("last_us")
    if f > 0 and (first == 0 or f < first) then first = f end
    if l > last then last = l end
  end
  local unanswered = threads[1]:get("users") - total.answered
  local parts, errs = {}, {}
  for _, name in ipairs(COUNTS) do
    table.insert(parts, string.format('"%s": %d', name, total[name]))
  end
  for status, n in pairs(by_status) do
    table.insert(errs, string.format('"%s": %d', status, n))
  end
  io.write(string.format(
    'BENCH_JSON {%s, "errors_by_status": {%s}, "unanswered": %d, "first_answer_us": %.0f, ' ..
    '"last_answer_us": %.0f, "requests": %d, "duration_us": %d, "socket_errors": %d, ' ..
    '"p50_us": %d, "p99_us": %d, "p999_us": %d}\n',
    table.concat(parts, ", "), table.concat(errs, ", "), unanswered, first, last,
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
"""


class WrkMissing(RuntimeError):
    pass


def _noop(what: str, done: int, total: int) -> None:
    pass


def run(
    *,
    users: int = 100_000,
    stocks: tuple[int, ...] = (1_000, 100_000),
    connections: int = 64,
    workers: int = 0,
    threads: int = 8,
    healthz_seconds: float = 5,
    max_seconds: float = 600,
    progress: Progress | None = None,
    say: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """One gunicorn; per stock, its healthz rate and then the rush (see the module's text)."""
    if not shutil.which("wrk"):
        raise WrkMissing("bench_rush needs wrk: apt-get install wrk (make bench does)")
    progress = progress or _noop
    cores = psutil.cpu_count() or 1
    workers = workers or 2 * cores + 1
    connections = min(connections, users)  # a thread with no users would never say it is done
    _, token = accounts.account_ensure(username=BENCH_ACCOUNT, act_for_any_user=True)
    gunicorn = Gunicorn(
        workers=workers,
        worker_class="gthread",
        threads=threads,
        # No worker recycled mid-rush: a restart would stall its connections and hide its CPU
        # from the meter; recycling is an operator's choice, not the path measured here.
        env=server_env(THROTTLE_CLAIM="1000000000/min", GUNICORN_MAX_REQUESTS="0"),
    )
    runs = []
    try:
        say(f"gunicorn: {workers} x gthread, {threads} threads, on {gunicorn.url}")
        gunicorn.wait_ready(timeout=120)  # every worker imports Django, on a shared machine
        say(f"warming up: {WARMUP_S:g} s of GET /healthz/live/")
        _healthz(gunicorn, seconds=WARMUP_S, connections=connections)
        for stock in stocks:
            say(f"healthz: {healthz_seconds:g} s of GET /healthz/live/, {connections} connections")
            before = _healthz(gunicorn, seconds=healthz_seconds, connections=connections)
            say(f"rush: {users:,} users, stock {stock:,}, claims from {LEAD_S:g} s before it opens")
            rush = _rush(
                gunicorn,
                token=token,
                stock=stock,
                users=users,
                connections=connections,
                max_seconds=max_seconds,
                progress=progress,
            )
            say(f"healthz again: {healthz_seconds:g} s")
            after = _healthz(gunicorn, seconds=healthz_seconds, connections=connections)
            runs.append(_figures(rush, (before, after), users=users))
    finally:
        gunicorn.stop()
    return {
        "generator": "wrk",
        "gunicorn": f"{workers} x gthread, {threads} threads",
        "connections": connections,
        "cores": cores,
        "users": users,
        "runs": runs,
    }


def _healthz(gunicorn: Gunicorn, *, seconds: float, connections: int) -> dict:
    summary, _ = load_generators.run_wrk(
        url=gunicorn.url + "/healthz/live/",
        script=WRK_PLAIN_SCRIPT,
        args=[],
        seconds=seconds,
        connections=connections,
        threads=connections,
    )
    return summary


def _rush(
    gunicorn: Gunicorn,
    *,
    token: str,
    stock: int,
    users: int,
    connections: int,
    max_seconds: float,
    progress: Progress,
) -> dict:
    """The coupon opens at T; the users tap from T - LEAD_S. Times are on the monotonic clock,
    which wrk's script reads too."""
    wall, mono = time.time(), time.monotonic()
    opens_mono = mono + PREPARE_S + LEAD_S
    name = f"bench-rush {timezone.now():%H:%M:%S} stock {stock} pid {os.getpid()}"
    try:  # Ctrl-C or SIGTERM anywhere from here deletes the run's coupon
        # The row commits before coupon_create's on-commit hooks (the gate's build) return: a
        # signal inside them leaves it in the table with nothing bound to it, so the cleanup
        # finds it by its name, which holds this process's id.
        coupon = services.coupon_create(
            name=name,
            claim_opens_at=datetime.fromtimestamp(wall + PREPARE_S + LEAD_S, UTC),
            total_stock=stock,
            per_user_limit=PER_USER_LIMIT,
            valid_for=timedelta(days=1),
        )
        connection.close()  # gunicorn's workers need the connection slots more than we do
        time.sleep(max(0.0, opens_mono - LEAD_S - time.monotonic()))
        answered: dict[str, int] = {}
        what = f"rush, stock {stock:,}: users answered"

        done_at: list[float] = []

        def on_line(line: str) -> None:
            if line.startswith("BENCH_DONE "):
                done_at.append(time.monotonic())
            if line.startswith(("BENCH_PROGRESS ", "BENCH_DONE ")):
                _, tid, n = line.split()
                answered[tid] = int(n)
                progress(what, sum(answered.values()), users)

        started = time.monotonic()
        meter = CpuMeter(gunicorn)
        summary, generator_cpu = load_generators.run_wrk_until_done(
            url=gunicorn.url,
            script=RUSH_SCRIPT,
            args=[str(coupon.pk), token, str(USER_ID_BASE), str(users), str(connections)],
            connections=connections,
            max_seconds=max_seconds,
            on_line=on_line,
        )
        summary.update(
            stock=stock,
            lead_s=opens_mono - started,
            opens_us=opens_mono * 1e6,
            started_us=started * 1e6,
            generator_cpu=generator_cpu,
            cpu=meter.used(),
            audit=audit(coupon_id=coupon.pk),
            done_us=[t * 1e6 for t in done_at],
        )
    finally:
        for coupon_id in Coupon.objects.filter(name=name).values_list("pk", flat=True):
            delete_bench_coupon(coupon_id)
    return summary


def _first_median_last(values: list[float]) -> list[float]:
    ordered = sorted(values)
    if not ordered:
        return []
    return [round(ordered[0], 3), round(ordered[len(ordered) // 2], 3), round(ordered[-1], 3)]


def _figures(rush: dict, healthz: tuple[dict, dict], *, users: int) -> dict[str, Any]:
    """One stock's figures: the answers beside the healthz rate, the latency, the time until
    every claimer had an answer, and the exactness from the database. ``healthz``: its windows
    just before and just after the rush; the faster is the reference (a stall in one window
    must not flatter the ratio)."""
    stock, found = rush["stock"], rush["audit"]
    since_open_s = max(1e-6, (rush["last_answer_us"] - rush["opens_us"]) / 1e6)
    answers_per_s = round(rush["answered"] / since_open_s, 1)
    windows = [round(w["requests"] / (w["duration_us"] / 1e6), 1) for w in healthz]
    healthz_per_s = max(windows)
    wall = rush["duration_us"] / 1e6
    cores = psutil.cpu_count() or 1
    winners = found["user_coupon_rows"]
    expected = min(stock, users)
    return {
        "stock": stock,
        "answers": rush["answered"],
        "answers_per_s": answers_per_s,
        "healthz_per_s": healthz_per_s,
        "answers_of_healthz": round(answers_per_s / healthz_per_s, 3) if healthz_per_s else None,
        "p50_ms": round(rush["p50_us"] / 1000, 2),
        "p99_ms": round(rush["p99_us"] / 1000, 2),
        "p999_ms": round(rush["p999_us"] / 1000, 2),
        "all_answered_s": round((rush["last_answer_us"] - rush["started_us"]) / 1e6, 3),
        "first_answer_after_open_ms": round((rush["first_answer_us"] - rush["opens_us"]) / 1e3, 1),
        # When the connections ran out of users (first, median, last), from the opening: the
        # answers per second above include the tail where fewer connections were still busy.
        "connections_done_after_open_s": _first_median_last(
            [(t - rush["opens_us"]) / 1e6 for t in rush["done_us"]]
        ),
        "lead_s": round(rush["lead_s"], 3),
        "winners": winners,
        "users_over_limit": found["users_holding_two"],  # the limit is one
        "exact": (
            winners == expected
            and found["users_holding_two"] == 0
            and not found["oversell"]
            and rush["s201"] <= winners  # every 201 a client saw is a row
            and rush["unanswered"] == 0
        ),
        "answers_by_code": {
            "201": rush["s201"],
            "sold_out": rush["sold_out"],
            "limit_reached": rush["limit_reached"],
            "closed": rush["closed"],
            "errors": rush["errors"],
        },
        "errors_by_status": rush["errors_by_status"],
        "unanswered": rush["unanswered"],
        "not_open_taps": rush["retries"],
        "requests": rush["requests"],
        "socket_errors": rush["socket_errors"],
        "healthz_before_after_per_s": windows,
        "healthz_p99_ms": [round(w["p99_us"] / 1000, 2) for w in healthz],
        "healthz_non_2xx": sum(w["non2xx"] for w in healthz),
        "cpu_share": {
            "generator": round(rush["generator_cpu"] / (wall * cores), 3),
            "gunicorn": round(rush["cpu"]["gunicorn"] / (wall * cores), 3),
            "postgres": round(rush["cpu"]["postgres"] / (wall * cores), 3),
            "machine_busy": round(rush["cpu"]["machine"] / (wall * cores), 3),
        },
        "audit": found,
    }
