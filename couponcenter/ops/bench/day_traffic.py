"""``bench_day``'s steady traffic: threads of this process, each at its own pace, until told to
stop. Every answer's latency is kept (``Samples``) under the path and the phase (``alone`` or
``together``), so the same code measures a path alone and beside the others.

- ``claims``: distinct users claiming one coupon over HTTP (the web pods, any that answers);
- ``api_reads``: a user's coupons, a user's inbox, a timeout job looked up by key, in turn;
- ``reminders``: subscriptions made a little ahead of their due time, ``rate`` falling due per
  second (scheduled as the service schedules them); their lateness is read from the inbox later;
- ``timeouts``: order timeouts created in bulk every ``TICK_S``, each due ``TIMEOUT_LEAD_S`` after,
  fired at the run's nginx (``day``: their lateness is each job's first arrival in its access
  log less the job's due time).

A request that finds its pod gone (the rolling deploy) is sent again to a pod that answers, as a
client behind a balancer would; its latency includes the retry. An answer the path does not
expect counts as an error and is kept with its status.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from django.db import connection

from couponcenter.coupons.models import Coupon
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.keys import slot_for
from reminders.members import REMINDER_TOPIC, member
from reminders.models import ReminderSubscription
from reminders.selectors import reminder_settings_get
from reminders.services import timeout_jobs_bulk_create

# The bench's rows: its coupons by name, its reminder users from USER_BASE (far from real ones and
# from the other benchmarks').
COUPON_NAME = "__bench_day__"
USER_BASE = 9_700_000_000
TICK_S = 0.25  # the reminder feeder's and the timeout creator's step
REMINDER_LEAD_S = 20  # subscriptions are made this long before they fall due
TIMEOUT_LEAD_S = 2  # an order timeout falls due this long after it is created
RETRY_S = 30  # a request retried this long without an answer is an error


class Samples:
    """Latencies (ms) and statuses per (path, phase), from many threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latency_ms: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.errors: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, path: str, phase: str, ms: float, error: str | None = None) -> None:
        with self._lock:
            self.latency_ms[path, phase].append(ms)
            if error:
                self.errors[path, phase][error] += 1


class Client:
    """One keep-alive connection to a web pod; another pod when this one goes away."""

    def __init__(self, urls: Callable[[], list[str]], token: str) -> None:
        self.urls = urls
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        deadline = time.monotonic() + RETRY_S
        payload = json.dumps(body) if body is not None else None
        while True:
            try:
                if self.conn is None:
                    url = urlsplit(random.choice(self.urls()))
                    self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=RETRY_S)
                self.conn.request(method, path, body=payload, headers=self.headers)
                response = self.conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException, IndexError):
                # The pod went away (or none answers yet): another one, as a balancer would.
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if time.monotonic() > deadline:
                    return 0, b"no pod answered"
                time.sleep(0.05)  # the balancer's retry back-off

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def paced(rate: float, stop: threading.Event, step: Callable[[int], None]) -> None:
    """``step(n)`` ``rate`` times a second until ``stop``; behind, it goes on at once."""
    started = time.monotonic()
    for n in itertools.count():
        if stop.is_set():
            return
        wait = started + n / rate - time.monotonic()
        if wait > 0 and stop.wait(wait):
            return
        step(n)


class Traffic:
    """The steady paths, started for a phase and stopped at its end."""

    def __init__(
        self,
        *,
        samples: Samples,
        urls: Callable[[], list[str]],
        token: str,
        claim_coupon: int,
        claim_users: itertools.count,
        read_users: Callable[[], tuple[int, int]],
        timeout_topic: str,
        timeout_ids: itertools.count,
    ) -> None:
        self.samples = samples
        self.urls, self.token = urls, token
        self.claim_coupon, self.claim_users = claim_coupon, claim_users
        self.read_users, self.timeout_topic, self.timeout_ids = (
            read_users,
            timeout_topic,
            timeout_ids,
        )
        self.claimed: list[int] = []  # users answered 201 (or limit_reached on a retry)
        self.timeouts_created: dict[str, int] = defaultdict(int)  # topic -> jobs
        self.reminder_coupons: list[Coupon] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, phase: str, rates: dict[str, float], *, timeout_topic: str = "") -> None:
        """The paths of ``rates`` (per second; 0 or absent: not run) in this phase."""
        self._stop.clear()
        runners: dict[str, Callable[[str, float], None]] = {
            "claims": self._claims,
            "api_reads": self._reads,
            "reminders": self._reminders,
            "timeouts": lambda phase, rate: self._timeouts(phase, rate, timeout_topic),
        }
        for path, rate in rates.items():
            if rate:
                thread = threading.Thread(
                    target=_closing(runners[path]), args=(phase, rate), name=f"day-{path}"
                )
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    # --- the paths --------------------------------------------------------------------------------

    def _claims(self, phase: str, rate: float) -> None:
        client = Client(self.urls, self.token)

        def claim(n: int) -> None:
            user = next(self.claim_users)
            body = {"coupon": self.claim_coupon}
            began = time.perf_counter()
            status, answer = client.request("POST", f"/api/users/{user}/coupons/", body)
            ms = (time.perf_counter() - began) * 1000
            ok = status == 201 or (status == 409 and b"limit_reached" in answer)
            self.samples.add("claims", phase, ms, None if ok else str(status))
            if ok:
                with self._lock:
                    self.claimed.append(user)

        try:
            paced(rate, self._stop, claim)
        finally:
            client.close()

    def _reads(self, phase: str, rate: float) -> None:
        client = Client(self.urls, self.token)

        def read(n: int) -> None:
            claimer, reminded = self.read_users()
            kind = n % 3
            if kind == 0:
                path = f"/api/users/{claimer}/coupons/"
            elif kind == 1:
                path = f"/api/users/{reminded}/notifications/"
            else:
                job = random.randrange(max(1, next(self.timeout_ids)))
                path = (
                    f"/api/timeouts/by-key/?topic={self.timeout_topic}&biz_type=order&biz_id={job}"
                )
            began = time.perf_counter()
            status, _ = client.request("GET", path)
            ms = (time.perf_counter() - began) * 1000
            self.samples.add("api_reads", phase, ms, None if status in (200, 404) else str(status))

        try:
            paced(rate, self._stop, read)
        finally:
            client.close()

    def _reminders(self, phase: str, rate: float) -> None:
        """Subscriptions for each ``TICK_S`` of due times, ``REMINDER_LEAD_S`` ahead."""
        per_tick = max(1, round(rate * TICK_S))
        coupon = Coupon.objects.create(
            name=f"{COUPON_NAME} reminders {phase}",
            claim_opens_at=datetime.now(UTC) + timedelta(hours=1),
            total_stock=2_000_000_000,
            valid_for=timedelta(days=1),
        )
        self.reminder_coupons.append(coupon)
        base = reminder_base(coupon)
        slots = reminder_settings_get().slots
        due_at = time.time() + REMINDER_LEAD_S

        def feed(n: int) -> None:
            nonlocal due_at
            subs = ReminderSubscription.objects.bulk_create(
                ReminderSubscription(
                    coupon=coupon,
                    user_id=user,
                    remind_at=datetime.fromtimestamp(due_at + i * TICK_S / per_tick, UTC),
                    slot=slot_for(user, slots),
                )
                for i, user in enumerate(range(base + n * per_tick, base + (n + 1) * per_tick))
            )
            queue.schedule_many(
                REMINDER_TOPIC, [(member(s.pk), epoch_ms(s.remind_at), s.slot) for s in subs]
            )
            due_at += TICK_S

        paced(1 / TICK_S, self._stop, feed)

    def _timeouts(self, phase: str, rate: float, topic: str) -> None:
        per_tick = max(1, round(rate * TICK_S))

        def create(n: int) -> None:
            at = datetime.now(UTC) + timedelta(seconds=TIMEOUT_LEAD_S)
            ids = [next(self.timeout_ids) for _ in range(per_tick)]
            timeout_jobs_bulk_create(
                [
                    {
                        "topic": topic,
                        "biz_type": "order",
                        "biz_id": str(i),
                        "action_time": at + timedelta(seconds=TICK_S * k / per_tick),
                    }
                    for k, i in enumerate(ids)
                ]
            )
            with self._lock:
                self.timeouts_created[topic] += len(ids)

        paced(1 / TICK_S, self._stop, create)


def _closing(fn: Callable[[str, float], None]) -> Callable[[str, float], None]:
    """The thread's database connection closed when it ends."""

    def run(phase: str, rate: float) -> None:
        try:
            fn(phase, rate)
        finally:
            connection.close()

    return run


def reminder_base(coupon: Coupon) -> int:
    """Each reminder coupon's users: their own range (the inbox is joined on the user)."""
    return USER_BASE + coupon.pk * 10_000_000
