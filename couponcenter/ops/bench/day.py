"""``bench_day``: a campaign day, compressed, against the production processes (issue 30;
docs/performance.md, "A campaign day").

The processes are ``day_fleet``'s: two web pods (gunicorn), the reminder worker, a Celery worker,
the expiry sweeper, on this run's key prefix and delivery queue, with PostgreSQL and Redis.

First each path **alone**, a short phase each, the others quiet: the steady paths
(``day_traffic``: reminders falling due, order timeouts created and fired, claims, API reads),
then the events (a reminder burst, the claim rush, a burst of timeouts due together, an expiry
sweep). Then the **day**, ``seconds`` long, every path at once: the steady traffic throughout, the
events on the script (``Script``), and a rolling deploy in the middle (``Fleet.rolling_deploy``).

Per path its figure alone and in the day, and ``<path>_together_of_alone``: a latency in the day
over the same latency alone (above 1: slower together), a rate in the day over the rate alone
(below 1: slower together). Then the deliveries of the whole run, judged as users see them:
every reminder subscribed is once in its user's inbox, every order timeout was called once at the
receiver and shows ``processed`` by its key, every claim answered 201 is one of that user's
coupons; ``lost`` and ``duplicated`` must both be 0. And what the background work did: the
hold-back records (``couponcenter.core.holdback``) of the jobs that waited for an urgent path.

Everything it makes is marked (coupon names, user ids from ``USER_BASE``, topics ``TOPIC_PREFIX``)
and deleted at the end with its Redis keys.
"""

from __future__ import annotations

import itertools
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction

from couponcenter.core.holdback import holdback_rows
from couponcenter.coupons import accounts
from couponcenter.coupons.bench import rush as bench_rush
from couponcenter.coupons.bench.http import USER_ID_BASE
from couponcenter.coupons.bench.lateness import lateness_summary
from couponcenter.coupons.bench.progress import Progress
from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.ops.bench.day_fleet import Fleet
from couponcenter.ops.bench.day_traffic import (
    COUPON_NAME,
    USER_BASE,
    Samples,
    Traffic,
    reminder_base,
)
from expiry.bench.sweep import CLAIMS_LOAD_SQL
from expiry.models import ExpiryTask
from reminders.bench.end_to_end import _inbox_lateness_ms
from reminders.bench.namespace import bench_namespace
from reminders.bench.nginx import Nginx, nginx_receiver
from reminders.engine import queue
from reminders.engine.clock import epoch_ms
from reminders.engine.keys import slot_for
from reminders.members import REMINDER_TOPIC, member
from reminders.models import Notification, ReminderSubscription, TimeoutJob, TimeoutTopic
from reminders.selectors import reminder_settings_get
from reminders.services import timeout_jobs_bulk_create, timeout_topic_save

TOPIC_PREFIX = "bench.day."
ACCOUNT = "bench-day"
CHUNK = 10_000
WAIT_S = 900  # the longest the run waits for a path to drain before it gives up

# The targets (this machine, ratios in one run).
TARGETS = {
    "reminders_burst_p99_ms": 1000,
    "reminders_steady_p99_ms": 250,
    "claims_rush_p99_ms": 500,
    "claims_together_of_alone": 0.7,
    "timeouts_p99_ms": 1000,
}


@dataclass(frozen=True)
class Shape:
    """The day's length and load. Rates are per second; the events' sizes are counts."""

    seconds: float = 20 * 60
    alone_s: float = 60  # each steady path alone
    reminders_rate: float = 200
    timeouts_rate: float = 100
    claims_rate: float = 20
    reads_rate: float = 30
    burst: int = 200_000
    rush_users: int = 20_000
    timeout_burst: int = 20_000
    expiry: int = 1_000_000


@dataclass(frozen=True)
class Script:
    """When each event happens, seconds from the day's start."""

    burst_at: float
    rush_at: float
    timeout_burst_at: float
    sweep_at: float
    deploy_at: float
    deploy_order: tuple[str, ...] | None = None  # None: the fleet's order
    # Seconds between a pod's exit and its successor's start (the orchestrator placing it), per
    # pod; none by default.
    deploy_gaps: tuple[tuple[str, float], ...] = ()

    @classmethod
    def for_day(cls, seconds: float) -> Script:
        """The burst early, the rush a compressed minute later (the issue's order), the
        timeouts after, the sweep started while all of that runs, the deploy in the middle."""
        return cls(
            burst_at=0.10 * seconds,
            rush_at=0.15 * seconds,
            timeout_burst_at=0.25 * seconds,
            sweep_at=0.35 * seconds,
            deploy_at=0.50 * seconds,
        )


Say = Callable[[str], None]


# --- the run --------------------------------------------------------------------------------------


def run(
    shape: Shape,
    script: Script | None = None,
    *,
    progress: Progress | None = None,
    say: Say = lambda line: None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole run; ``env``: settings for the processes it starts, over the production ones."""
    if connection.vendor != "postgresql":
        raise RuntimeError("bench_day needs PostgreSQL (the production processes share it)")
    script = script or Script.for_day(shape.seconds)
    progress = progress or (lambda what, done, total: None)
    result: dict[str, Any] = {"shape": asdict(shape), "script": asdict(script)}
    with bench_namespace(_cleanup, say) as (prefix, delivery_queue):
        fleet = Fleet(prefix, delivery_queue, str(settings.VAR_DIR), env_extra=env or {})
        try:
            queue.record_layout(REMINDER_TOPIC, reminder_settings_get().slots)
            with nginx_receiver() as receiver:
                account, token = accounts.account_ensure(
                    username=ACCOUNT, permissions=("act_for_any_user", "manage_timeouts")
                )
                for phase in ("alone", "together"):
                    for kind in ("steady", "burst"):
                        _topic(
                            f"{TOPIC_PREFIX}{kind}-{phase}",
                            f"{receiver.url}/{kind}-{phase}",
                            account,
                        )
                say(
                    "starting the production processes"
                    " (2 web pods, reminder worker, Celery, sweeper)"
                )
                fleet.start()
                day = Day(shape, script, fleet, token, receiver, progress, say)
                try:
                    day.alone()
                    day.together()
                    day.drain()
                    result.update(day.figures())
                finally:
                    day.traffic.stop()
        finally:
            fleet.close()
    return result


class Day:
    """The phases of one run and what they measured."""

    def __init__(
        self,
        shape: Shape,
        script: Script,
        fleet: Fleet,
        token: str,
        receiver: Nginx,
        progress: Progress,
        say: Say,
    ) -> None:
        self.shape, self.script, self.fleet, self.token = shape, script, fleet, token
        self.receiver, self.progress, self.say = receiver, progress, say
        self.samples = Samples()
        self.claim_coupon = _coupon("claims", opens=_now() - timedelta(minutes=1))
        claim_users = itertools.count(USER_ID_BASE + 5 * 10**11)
        self.timeout_ids = itertools.count()
        self.traffic = Traffic(
            samples=self.samples,
            urls=fleet.urls,
            token=token,
            claim_coupon=self.claim_coupon.pk,
            claim_users=claim_users,
            read_users=self._read_users,
            timeout_topic=f"{TOPIC_PREFIX}steady-together",
            timeout_ids=self.timeout_ids,
        )
        self.events: dict[str, dict[str, dict[str, Any]]] = {"alone": {}, "together": {}}
        self.burst_coupons: list[Coupon] = []
        self.expiry_coupons: list[Coupon] = []
        self.rush_audits: list[dict[str, Any]] = []
        self.deploy: list[dict[str, Any]] = []
        self.timeline: list[tuple[float, str]] = []

    def _read_users(self) -> tuple[int, int]:
        claimed = self.traffic.claimed
        claimer = claimed[len(claimed) // 2] if claimed else USER_ID_BASE
        coupons = self.traffic.reminder_coupons
        reminded = reminder_base(coupons[-1]) if coupons else USER_BASE
        return claimer, reminded

    # --- the phases -------------------------------------------------------------------------------

    def alone(self) -> None:
        s = self.shape
        steady = {
            "reminders": s.reminders_rate,
            "timeouts": s.timeouts_rate,
            "claims": s.claims_rate,
            "api_reads": s.reads_rate,
        }
        for path, rate in steady.items():
            self.say(f"alone: {path} at {rate:g}/s for {s.alone_s:g} s")
            self.traffic.start("alone", {path: rate}, timeout_topic=f"{TOPIC_PREFIX}steady-alone")
            _tick(f"alone: {path}", s.alone_s, self.progress)
            self.traffic.stop()
            self._settle()
        ev = self.events["alone"]
        self.say(f"alone: a {s.burst:,}-reminder burst, pre-staged")
        ev["burst"] = self._burst("alone", self._prepare_burst("alone", now=True))
        self._settle()
        self.say(f"alone: the claim rush, {s.rush_users:,} users")
        ev["rush"] = self._rush()
        self.say(f"alone: {s.timeout_burst:,} order timeouts due together")
        ev["timeout_burst"] = self._timeout_burst("alone", lead_s=3)
        self._settle()
        self.say(f"alone: an expiry sweep of {s.expiry:,} coupons")
        ev["sweep"] = self._sweep(self._load_expiry(lead_s=3))
        self._settle()

    def together(self) -> None:
        s, sc = self.shape, self.script
        self.say(f"the day: {s.seconds:g} s, every path at once; preparing its events")
        burst_coupon = self._prepare_burst("together", now=False)
        sweep_coupon = self._load_expiry(lead_s=None)
        timeout_topic = f"{TOPIC_PREFIX}burst-together"
        made = self._create_timeouts(timeout_topic, s.timeout_burst, at=_now() + timedelta(days=1))
        # The day's start: far enough ahead for the events' due times to be set before it.
        start = time.time() + 5 + (s.burst + s.timeout_burst) / 25_000 + s.expiry / 25_000
        self._due(burst_coupon, start + sc.burst_at)
        _expiry_due(sweep_coupon, start + sc.sweep_at)
        _timeouts_due(timeout_topic, start + sc.timeout_burst_at)
        if time.time() > start:
            raise RuntimeError("the day's events were set after its start: machine too busy")
        time.sleep(start - time.time())
        self.traffic.start(
            "together",
            {
                "reminders": s.reminders_rate,
                "timeouts": s.timeouts_rate,
                "claims": s.claims_rate,
                "api_reads": s.reads_rate,
            },
            timeout_topic=f"{TOPIC_PREFIX}steady-together",
        )
        ev = self.events["together"]
        events = [
            (sc.rush_at - bench_rush.PREPARE_S - bench_rush.LEAD_S, "rush", self._rush),
            (sc.burst_at, "burst", lambda: self._burst("together", burst_coupon)),
            (
                sc.timeout_burst_at,
                "timeout_burst",
                lambda: self._timeout_burst_wait(
                    timeout_topic, made, start + sc.timeout_burst_at, "together"
                ),
            ),
            (sc.sweep_at, "sweep", lambda: self._sweep(sweep_coupon, due=start + sc.sweep_at)),
            (sc.deploy_at, "deploy", self._deploy),
        ]
        threads = []
        errors: list[BaseException] = []
        for at, name, fn in sorted(events, key=lambda e: e[0]):

            def event(name: str = name, fn: Callable[[], Any] = fn) -> None:
                try:
                    value = fn()
                    if name != "deploy":
                        ev[name] = value
                except BaseException as exc:  # reported by the run, after the others finish
                    errors.append(exc)
                finally:
                    connection.close()

            thread = threading.Thread(target=event, name=f"day-{name}")
            threads.append((at, name, thread))
        pending = list(threads)
        while time.time() < start + s.seconds:
            elapsed = time.time() - start
            while pending and pending[0][0] <= elapsed:
                _, name, thread = pending.pop(0)
                self.timeline.append((round(elapsed, 1), name))
                self.say(f"the day, {elapsed:.0f} s: {name}")
                thread.start()
            self.progress("the day", int(elapsed), int(s.seconds))
            time.sleep(0.2)  # the script's resolution
        for _, name, thread in pending:  # an event scripted past the end still happens
            self.timeline.append((round(time.time() - start, 1), name))
            thread.start()
        self.traffic.stop()
        self.progress("the day", int(s.seconds), int(s.seconds))
        for _, _, thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def drain(self) -> None:
        """Until every reminder subscribed is in an inbox and every timeout fired."""
        subs = ReminderSubscription.objects.filter(coupon__name__startswith=COUPON_NAME)
        total = subs.count()
        users = subs.values("user_id")
        _wait(
            "drain: reminders in the inbox",
            lambda: (
                Notification.objects.filter(user_id__in=users).values("user_id").distinct().count()
            ),  # fmt: skip
            total,
            self.progress,
        )
        pending = TimeoutJob.objects.filter(
            topic__startswith=TOPIC_PREFIX, status=TimeoutJob.Status.PENDING
        )
        created = TimeoutJob.objects.filter(topic__startswith=TOPIC_PREFIX).count()
        _wait("drain: timeouts fired", lambda: created - pending.count(), created, self.progress)

    # --- the events -------------------------------------------------------------------------------

    def _prepare_burst(self, phase: str, *, now: bool) -> Coupon:
        """``burst`` subscriptions; ``now``: due as soon as they can be scheduled and the
        pre-stage window opened before, else a day ahead until ``_due``."""
        coupon = _coupon(f"burst {phase}", opens=_now() + timedelta(hours=1))
        self.burst_coupons.append(coupon)
        base = reminder_base(coupon)
        slots = reminder_settings_get().slots
        far = _now() + timedelta(days=1)
        for lo in range(0, self.shape.burst, CHUNK):
            hi = min(lo + CHUNK, self.shape.burst)
            ReminderSubscription.objects.bulk_create(
                ReminderSubscription(
                    coupon=coupon, user_id=base + i, remind_at=far, slot=slot_for(base + i, slots)
                )
                for i in range(lo, hi)
            )
            self.progress(f"{phase}: burst subscriptions", hi, self.shape.burst)
        if now:
            window = reminder_settings_get().prestage_ms / 1000
            self._due(coupon, time.time() + self.shape.burst / 25_000 + 3 + window)
        return coupon

    def _due(self, coupon: Coupon, at: float) -> None:
        due = datetime.fromtimestamp(at, UTC)
        ReminderSubscription.objects.filter(coupon=coupon).update(remind_at=due)
        subs = ReminderSubscription.objects.filter(coupon=coupon).values_list("pk", "slot")
        queue.schedule_many(REMINDER_TOPIC, [(member(pk), epoch_ms(due), s) for pk, s in subs])

    def _burst(self, phase: str, coupon: Coupon) -> dict[str, Any]:
        """Until the burst is all in the inbox; its lateness."""
        inbox = Notification.objects.filter(
            user_id__in=ReminderSubscription.objects.filter(coupon=coupon).values("user_id")
        )
        _wait(f"{phase}: burst in the inbox", inbox.count, self.shape.burst, self.progress)
        return lateness_summary(_inbox_lateness_ms(coupon), prefix="lateness")

    def _rush(self) -> dict[str, Any]:
        """``bench_rush``'s rush (wrk, users tapping from a second before the opening) against
        one web pod: the figures it reports, the latency and answers per second."""
        if not shutil.which("wrk"):
            return {"skipped": "wrk is not installed (apt-get install wrk; make bench does)"}
        pod = self.fleet.web()
        users = self.shape.rush_users
        connections = min(64, users)
        summary = bench_rush._rush(
            pod,
            token=self.token,
            stock=users,
            users=users,
            connections=connections,
            max_seconds=WAIT_S,
            progress=self.progress,
        )
        self.rush_audits.append(summary["audit"])
        since_open_s = max(1e-6, (summary["last_answer_us"] - summary["opens_us"]) / 1e6)
        return {
            "answered": summary["answered"],
            "answers_per_s": round(summary["answered"] / since_open_s, 1),
            "p99_ms": round(summary["p99_us"] / 1000, 1),
            "errors": summary["errors"],
            "oversell": summary["audit"]["oversell"],
        }

    def _create_timeouts(self, topic: str, count: int, *, at: datetime) -> int:
        for lo in range(0, count, CHUNK):
            hi = min(lo + CHUNK, count)
            timeout_jobs_bulk_create(
                [
                    {"topic": topic, "biz_type": "order", "biz_id": f"b{i}", "action_time": at}
                    for i in range(lo, hi)
                ]
            )
            self.progress(f"{topic}: created", hi, count)
        return count

    def _timeout_burst(self, phase: str, *, lead_s: float) -> dict[str, Any]:
        topic = f"{TOPIC_PREFIX}burst-{phase}"
        made = self._create_timeouts(topic, self.shape.timeout_burst, at=_now() + timedelta(days=1))
        due = time.time() + lead_s
        _timeouts_due(topic, due)
        return self._timeout_burst_wait(topic, made, due, phase)

    def _timeout_burst_wait(self, topic: str, made: int, due: float, phase: str) -> dict[str, Any]:
        path = f"/burst-{phase}"
        _wait(f"{phase}: timeout burst fired", lambda: self.receiver.count(path), made,
              self.progress)  # fmt: skip
        return lateness_summary(_firing_lateness(self.receiver, path), prefix="lateness")

    def _load_expiry(self, *, lead_s: float | None) -> Coupon:
        """``expiry`` claimed coupons, each with its task; with ``lead_s`` due that long after
        the load, else a day ahead until ``_expiry_due``."""
        count = self.shape.expiry
        coupon = _coupon("expiry", opens=_now() - timedelta(days=2), stock=count)
        self.expiry_coupons.append(coupon)
        claimed, far = _now() - timedelta(hours=1), _now() + timedelta(days=1)
        for lo in range(1, count + 1, CHUNK * 5):
            hi = min(lo + CHUNK * 5 - 1, count)
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    CLAIMS_LOAD_SQL,
                    {"coupon": coupon.pk, "claimed": claimed, "due": far, "lo": lo, "hi": hi},
                )
            self.progress("expiry: claims loaded", hi, count)
        Coupon.objects.filter(pk=coupon.pk).update(claimed_count=count)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE expiry_expirytask")
        if lead_s is not None:  # room for the UPDATE of every task first
            _expiry_due(coupon, time.time() + lead_s + count / 50_000)
        return coupon

    def _sweep(self, coupon: Coupon, *, due: float | None = None) -> dict[str, Any]:
        """The production sweeper's completion time: from the due second until every task of
        ``coupon`` is done."""
        due = due if due is not None else coupon.expiry_due  # type: ignore[attr-defined]
        pending = ExpiryTask.objects.filter(
            user_coupon__coupon=coupon, status=ExpiryTask.Status.PENDING
        )
        count = self.shape.expiry
        done = _wait("expiry sweep", lambda: count - pending.count(), count, self.progress)
        expired = UserCoupon.objects.filter(coupon=coupon, status=UserCoupon.Status.EXPIRED).count()
        return {"expired": expired, "completion_s": round(done - due, 2)}

    def _deploy(self) -> None:
        self.deploy = self.fleet.rolling_deploy(
            order=self.script.deploy_order, gaps=dict(self.script.deploy_gaps), say=self.say
        )

    def _settle(self) -> None:
        """Between phases alone: what the last one left (inbox writes, timeouts) done first."""
        self.drain()

    # --- the figures ------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        paths: dict[str, dict[str, Any]] = {}
        for phase in ("alone", "together"):
            ev = self.events[phase]
            coupons = [c for c in self.traffic.reminder_coupons if c.name.endswith(phase)]
            steady = [ms for c in coupons for ms in _inbox_lateness_ms(c)]
            paths.setdefault("reminders_steady", {})[phase] = lateness_summary(
                steady, prefix="lateness"
            )
            paths.setdefault("reminders_burst", {})[phase] = ev.get("burst")
            paths.setdefault("claims", {})[phase] = {
                "rush": ev.get("rush"),
                "steady": self._latency("claims", phase),
            }
            paths.setdefault("timeouts", {})[phase] = {
                "burst": ev.get("timeout_burst"),
                "steady": lateness_summary(
                    _firing_lateness(self.receiver, f"/steady-{phase}"), prefix="lateness"
                ),
            }
            paths.setdefault("api_reads", {})[phase] = self._latency("api_reads", phase)
            paths.setdefault("expiry", {})[phase] = ev.get("sweep")
        ratios = _ratios(paths)
        deliveries = self._deliveries()
        holdback = [
            {
                "job": row.job,
                "state": row.state,
                "held_today_ms": row.held_today_ms,
                "path": row.path,
                "why": row.why,
            }
            for row in holdback_rows()
        ]
        result: dict[str, Any] = {
            "paths": paths,
            "ratios": ratios,
            "deliveries": deliveries,
            "deploy": self.deploy,
            "timeline": self.timeline,
            "holdback": holdback,
            "restarts": {pod.name: pod.restarts for pod in self.fleet.pods},
        }
        result["met"] = _met(paths, ratios, deliveries, self.deploy, self.fleet)
        return result

    def _latency(self, path: str, phase: str) -> dict[str, Any]:
        samples = self.samples.latency_ms.get((path, phase), [])
        figures = lateness_summary(samples, prefix="latency")
        figures["errors"] = dict(self.samples.errors.get((path, phase), {}))
        return figures

    def _deliveries(self) -> dict[str, dict[str, int]]:
        """Lost and duplicated, over the whole run, as users see them."""
        out: dict[str, dict[str, int]] = {}
        with connection.cursor() as cursor:
            cursor.execute(
                f"""SELECT count(*) FILTER (WHERE n = 0),
                          coalesce(sum(n - 1) FILTER (WHERE n > 1), 0)
                    FROM (SELECT (SELECT count(*) FROM {Notification._meta.db_table} x
                                  WHERE x.user_id = s.user_id) AS n
                          FROM {ReminderSubscription._meta.db_table} s
                          JOIN {Coupon._meta.db_table} c ON c.id = s.coupon_id
                          WHERE c.name LIKE %s) t""",
                [f"{COUPON_NAME}%"],
            )
            lost, dup = cursor.fetchone()
        out["reminders"] = {"lost": int(lost), "duplicated": int(dup)}
        lost = dup = 0
        for topic in TimeoutTopic.objects.filter(name__startswith=TOPIC_PREFIX):
            jobs = TimeoutJob.objects.filter(topic=topic.name)
            made = jobs.count()
            processed = jobs.filter(status=TimeoutJob.Status.PROCESSED).count()
            # The log is written in buffers: wait for the last one before counting.
            path = "/" + topic.name.removeprefix(TOPIC_PREFIX)
            arrived = self.receiver.wait_logged(path, made)
            lost += made - min(processed, arrived)
            dup += max(0, arrived - made)
        out["timeouts"] = {"lost": lost, "duplicated": dup}
        claimed = set(self.traffic.claimed)
        holders = UserCoupon.objects.filter(coupon=self.claim_coupon)
        held = dict(
            holders.values("user_id").annotate(n=models.Count("id")).values_list("user_id", "n")
        )
        rush_dup = sum(a["users_holding_two"] for a in self.rush_audits)
        rush_over = sum(1 for a in self.rush_audits if a["oversell"])
        out["claims"] = {
            "lost": sum(1 for user in claimed if user not in held),
            "duplicated": sum(n - 1 for n in held.values() if n > 1) + rush_dup + rush_over,
        }
        out["total"] = {
            "lost": sum(v["lost"] for v in out.values()),
            "duplicated": sum(v["duplicated"] for v in out.values()),
        }
        return out


# --- figures and targets --------------------------------------------------------------------------


def _p99(figures: dict[str, Any] | None, key: str = "lateness") -> float | None:
    return (figures or {}).get(f"{key}_p99_ms")


def _ratio(together: float | None, alone: float | None) -> float | None:
    return round(together / alone, 3) if together is not None and alone else None


def _ratios(paths: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """``<path>_together_of_alone``: latencies and times together over alone (above 1: slower
    together); the claims' answers per second together over alone (below 1: slower)."""
    p = paths

    def rush(phase: str) -> dict[str, Any]:
        return p["claims"][phase]["rush"] or {}

    return {
        "reminders_burst_together_of_alone": _ratio(
            _p99(p["reminders_burst"]["together"]), _p99(p["reminders_burst"]["alone"])
        ),
        "reminders_steady_together_of_alone": _ratio(
            _p99(p["reminders_steady"]["together"]), _p99(p["reminders_steady"]["alone"])
        ),
        "claims_together_of_alone": _ratio(
            rush("together").get("answers_per_s"), rush("alone").get("answers_per_s")
        ),
        "timeouts_together_of_alone": _ratio(
            _p99(p["timeouts"]["together"]["burst"]), _p99(p["timeouts"]["alone"]["burst"])
        ),
        "api_reads_together_of_alone": _ratio(
            _p99(p["api_reads"]["together"], "latency"), _p99(p["api_reads"]["alone"], "latency")
        ),
        "expiry_together_of_alone": _ratio(
            (p["expiry"]["together"] or {}).get("completion_s"),
            (p["expiry"]["alone"] or {}).get("completion_s"),
        ),
    }


def _met(
    paths: dict[str, Any],
    ratios: dict[str, Any],
    deliveries: dict[str, Any],
    deploy: list[dict[str, Any]],
    fleet: Fleet,
) -> dict[str, bool | None]:
    def at_most(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    together = {name: path["together"] for name, path in paths.items()}
    timeouts = [_p99(together["timeouts"]["burst"]), _p99(together["timeouts"]["steady"])]
    sweep = together["expiry"] or {}
    return {
        "reminders_burst_p99_ms": at_most(
            _p99(together["reminders_burst"]), TARGETS["reminders_burst_p99_ms"]
        ),
        "reminders_steady_p99_ms": at_most(
            _p99(together["reminders_steady"]), TARGETS["reminders_steady_p99_ms"]
        ),
        "claims_rush_p99_ms": at_most(
            (together["claims"]["rush"] or {}).get("p99_ms"), TARGETS["claims_rush_p99_ms"]
        ),
        "claims_together_of_alone": None
        if ratios["claims_together_of_alone"] is None
        else ratios["claims_together_of_alone"] >= TARGETS["claims_together_of_alone"],
        "timeouts_p99_ms": None
        if None in timeouts
        else max(timeouts) <= TARGETS["timeouts_p99_ms"],  # fmt: skip
        "expiry_inside_window": at_most(sweep.get("completion_s"), settings.EXPIRY_WINDOW_S),
        "nothing_lost": deliveries["total"]["lost"] == 0,
        "nothing_duplicated": deliveries["total"]["duplicated"] == 0,
        "rolling_deploy": len(deploy) == len(fleet.pods),
    }


def report_lines(result: dict[str, Any]) -> list[str]:
    """The run as text: per path alone and in the day, the ratios, the deliveries, the targets."""
    p, r, met = result["paths"], result["ratios"], result["met"]

    def v(x: Any) -> str:
        return "-" if x is None else f"{x:,}" if isinstance(x, int | float) else str(x)

    def verdict(key: str) -> str:
        value = met.get(key)
        return "n/a" if value is None else ("met" if value else "NOT MET")

    rows = [
        ("reminders burst, p99 / p99.9 ms", "reminders_burst", None, "lateness"),
        ("reminders steady, p99 / p99.9 ms", "reminders_steady", None, "lateness"),
        ("timeouts burst firing, p99 ms", "timeouts", "burst", "lateness"),
        ("timeouts steady firing, p99 ms", "timeouts", "steady", "lateness"),
        ("claims steady, p99 ms", "claims", "steady", "latency"),
        ("API reads, p99 ms", "api_reads", None, "latency"),
    ]
    lines = ["| path | alone | the day |", "| --- | --- | --- |"]
    for label, path, sub, key in rows:
        cells = []
        for phase in ("alone", "together"):
            figures = p[path][phase]
            figures = (figures or {}).get(sub) if sub else figures
            figures = figures or {}
            cell = v(figures.get(f"{key}_p99_ms"))
            if "p99.9" in label:
                cell += f" / {v(figures.get(f'{key}_p999_ms'))}"
            cells.append(cell)
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    for phase_label, key in (("claims rush, p99 ms", "p99_ms"), ("claims rush, answers/s",
                                                                  "answers_per_s")):  # fmt: skip
        cells = [v((p["claims"][ph]["rush"] or {}).get(key)) for ph in ("alone", "together")]
        lines.append(f"| {phase_label} | {cells[0]} | {cells[1]} |")
    cells = [v((p["expiry"][ph] or {}).get("completion_s")) for ph in ("alone", "together")]
    lines.append(f"| expiry sweep, completion s | {cells[0]} | {cells[1]} |")
    lines += ["", "| ratio | value |", "| --- | --- |"]
    lines += [f"| {name} | {v(value)} |" for name, value in r.items()]
    d = result["deliveries"]
    lines += ["", "| deliveries | lost | duplicated |", "| --- | --- | --- |"]
    lines += [f"| {name} | {x['lost']:,} | {x['duplicated']:,} |" for name, x in d.items()]
    lines.append("")
    lines.append(
        "rolling deploy: " + ", ".join(f"{s['pod']} down {s['down_s']} s" for s in result["deploy"])
    )
    held = [h for h in result["holdback"] if h["held_today_ms"]]
    lines.append(
        "background work held back: "
        + (", ".join(f"{h['job']} {h['held_today_ms'] / 1000:.1f} s" for h in held) or "none")
    )
    lines.append("")
    targets = [
        ("reminders_burst_p99_ms", f"burst p99 <= {TARGETS['reminders_burst_p99_ms']} ms"),
        ("reminders_steady_p99_ms", f"steady p99 <= {TARGETS['reminders_steady_p99_ms']} ms"),
        ("claims_rush_p99_ms", f"rush p99 <= {TARGETS['claims_rush_p99_ms']} ms"),
        (
            "claims_together_of_alone",
            f"claims_together_of_alone >= {TARGETS['claims_together_of_alone']}",
        ),
        ("timeouts_p99_ms", f"timeouts p99 <= {TARGETS['timeouts_p99_ms']} ms"),
        ("expiry_inside_window", f"expiry inside its window ({settings.EXPIRY_WINDOW_S} s)"),
        ("nothing_lost", "lost = 0"),
        ("nothing_duplicated", "duplicated = 0"),
        ("rolling_deploy", "every process replaced"),
    ]
    lines += [f"target: {text}: {verdict(key)}" for key, text in targets]
    return lines


# --- helpers --------------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


def _coupon(what: str, *, opens: datetime, stock: int = 2_000_000_000) -> Coupon:
    return Coupon.objects.create(
        name=f"{COUPON_NAME} {what}",
        claim_opens_at=opens,
        total_stock=stock,
        valid_for=timedelta(days=1),
    )


def _expiry_due(coupon: Coupon, at: float) -> None:
    due = datetime.fromtimestamp(at, UTC)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {ExpiryTask._meta.db_table} SET expire_at = %s WHERE user_coupon_id IN "
            f"(SELECT id FROM {UserCoupon._meta.db_table} WHERE coupon_id = %s)",
            [due, coupon.pk],
        )
        cursor.execute(
            f"UPDATE {UserCoupon._meta.db_table} SET expires_at = %s WHERE coupon_id = %s",
            [due, coupon.pk],
        )
    coupon.expiry_due = at  # type: ignore[attr-defined]


def _timeouts_due(topic: str, at: float) -> None:
    """Every pending job of ``topic`` due at ``at``, in the database and in Redis."""
    from reminders.bench.timeouts import _move_due

    _move_due(topic, datetime.fromtimestamp(at, UTC))


def _topic(name: str, url: str, owner) -> None:
    """A topic of the bench's own: owned by its API account, which looks its jobs up by key (a
    topic without an owner is staff's alone, and the account is not staff)."""
    TimeoutTopic.objects.filter(name=name).delete()
    timeout_topic_save(
        topic=TimeoutTopic(name=name, owner_user=owner),
        type="http",
        target=url,
        secret=secrets.token_urlsafe(32),
        allow_http=True,
        concurrency=16,
    )


def _firing_lateness(receiver: Nginx, path: str) -> list[float]:
    """Each job's first arrival at the receiver after its due time, in ms. The access log names
    the job (its ``webhook-id`` is ``<topic>:<job id>``); its due time is its row's."""
    first: dict[int, float] = {}
    for arrival in receiver.arrivals(path):
        job_id = int(arrival.webhook_id.rpartition(":")[2])
        first.setdefault(job_id, arrival.at)
    ids = list(first)
    lateness = []
    for lo in range(0, len(ids), CHUNK):
        due = TimeoutJob.objects.filter(pk__in=ids[lo : lo + CHUNK]).values_list(
            "pk", "action_time"
        )
        lateness += [(first[pk] - action_time.timestamp()) * 1000 for pk, action_time in due]
    return lateness


def _tick(what: str, seconds: float, progress: Progress) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        progress(what, int(seconds - left), int(seconds))
        time.sleep(min(left, 0.5))  # progress only: the traffic runs in its threads
    progress(what, int(seconds), int(seconds))


def _wait(what: str, done: Callable[[], int], total: int, progress: Progress) -> float:
    """Poll ``done()`` until it reaches ``total``; the wall time then."""
    deadline = time.monotonic() + WAIT_S
    while (n := done()) < total:
        progress(what, n, total)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {n:,} of {total:,} after {WAIT_S} s")
        time.sleep(0.05)  # the figures' resolution
    progress(what, n, total)
    return time.time()


def _cleanup() -> None:
    """Every row the bench made (also at the start: a run that was killed left its own)."""
    coupons = Coupon.objects.filter(name__startswith=COUPON_NAME).values("pk")
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {Notification._meta.db_table} WHERE user_id >= %s AND user_id < %s",
            [USER_BASE, USER_BASE + 10**15],
        )
    for model, field in (
        (ExpiryTask, "user_coupon__coupon__in"),
        (ReminderSubscription, "coupon__in"),
        (UserCoupon, "coupon__in"),
    ):
        model.objects.filter(**{field: coupons})._raw_delete(connection.alias)
    TimeoutJob.objects.filter(topic__startswith=TOPIC_PREFIX)._raw_delete(connection.alias)
    TimeoutTopic.objects.filter(name__startswith=TOPIC_PREFIX).delete()
    Coupon.objects.filter(name__startswith=COUPON_NAME).delete()  # with its shards and gates
