"""``bench_console``: how fast the console pages answer over a big data set.

Loads ``count`` user coupons (with their expiry tasks) and ``count`` pending reminder
subscriptions with a single ``INSERT ... SELECT`` per chunk (``generate_series`` on PostgreSQL, a
recursive CTE on SQLite), indexes the reminders in Redis under a key prefix of its own, buries a
few thousand of them as dead letters, then times every console page, admin changelist and ops
endpoint through the Django test client as a logged-in staff user: in process, so a page's time
is Django's and the database's, without a server or network in it. Everything it made is
deleted afterwards (rows by bench coupon, Redis keys by prefix).

Redis is written through the timeout engine's public API (``reminders.engine``) under a slot
lease of its own, as a worker would.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from couponcenter.core.redis import get_redis
from couponcenter.coupons.models import Coupon, UserCoupon
from expiry.models import ExpiryTask
from reminders import engine
from reminders.engine.clock import epoch_ms
from reminders.engine.leases import SlotLeases
from reminders.members import REMINDER_TOPIC, member
from reminders.models import ReminderSubscription
from reminders.selectors import reminder_settings_get

CHUNK = 100_000
DEAD = 2000  # dead letters, spread over the first few slots (DEAD_SLOTS)
DEAD_SLOTS = 4
USER_BASE = 900_000_000  # bench end-user ids start here, far from real ones


@dataclass
class Timing:
    page: str
    status: int
    best_ms: float
    median_ms: float
    worst_ms: float


def _series_sql(start: int, stop: int) -> tuple[str, str]:
    """A ``WITH`` prefix and a FROM clause yielding column ``i`` over [start, stop)."""
    if connection.vendor == "postgresql":
        return "", f"generate_series({start}, {stop - 1}) AS s(i)"
    return (
        f"WITH RECURSIVE s(i) AS (SELECT {start} UNION ALL "
        f"SELECT i + 1 FROM s WHERE i < {stop - 1}) ",
        "s",
    )


def _now_sql() -> str:
    return "NOW()" if connection.vendor == "postgresql" else "CURRENT_TIMESTAMP"


class ConsoleBench:
    def __init__(self, *, count: int, repeat: int, progress: Callable | None = None) -> None:
        self.count = count
        self.repeat = repeat
        self.progress = progress or (lambda total, desc: _NullBar())
        self.tag = f"bench-console-{uuid.uuid4().hex[:8]}"
        self.prefix_before = settings.REDIS_KEY_PREFIX
        self.coupons: list[Coupon] = []
        self.user = None

    # --- load -------------------------------------------------------------------------------------

    def load(self) -> dict[str, float]:
        settings.REDIS_KEY_PREFIX = self.tag  # the bench's Redis keys never mix with live ones
        started = time.perf_counter()
        now = timezone.now()
        claimed = Coupon.objects.create(
            name=f"{self.tag} claimed",
            claim_opens_at=now - timedelta(days=1),
            total_stock=self.count,
            valid_for=timedelta(days=30),
        )
        upcoming = Coupon.objects.create(
            name=f"{self.tag} upcoming",
            claim_opens_at=now + timedelta(days=1),
            total_stock=self.count,
            valid_for=timedelta(days=30),
        )
        self.coupons = [claimed, upcoming]
        self._insert_user_coupons(claimed, now)
        t_coupons = time.perf_counter() - started
        slots = reminder_settings_get(max_age_s=0).slots
        self._insert_subscriptions(upcoming, now + timedelta(days=1) - timedelta(minutes=1), slots)
        t_subs = time.perf_counter() - started - t_coupons
        now_ms = int(now.timestamp() * 1000)
        self._index_in_redis(upcoming, slots, now_ms)
        self._bury_some(slots, now_ms)
        with connection.cursor() as cursor:
            for model in (UserCoupon, ExpiryTask, ReminderSubscription):
                cursor.execute(f"ANALYZE {model._meta.db_table}")
        return {
            "user_coupons_s": t_coupons,
            "reminders_s": t_subs,
            "total_s": time.perf_counter() - started,
        }

    def _insert_user_coupons(self, coupon: Coupon, now) -> None:
        uc, et = UserCoupon._meta.db_table, ExpiryTask._meta.db_table
        bar = self.progress(self.count, "user coupons")
        for start in range(0, self.count, CHUNK):
            stop = min(start + CHUNK, self.count)
            with_, series = _series_sql(start, stop)
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    f"{with_}INSERT INTO {uc} (coupon_id, user_id, seq, status, claimed_at, "
                    f"expires_at, used_at) SELECT %s, {USER_BASE} + i, 1, "
                    "CASE WHEN i %% 10 = 0 THEN 'used' WHEN i %% 10 = 1 THEN 'expired' "
                    "ELSE 'unused' END, %s, %s, CASE WHEN i %% 10 = 0 THEN %s END FROM " + series,
                    [
                        coupon.pk,
                        now - timedelta(hours=1),
                        now + timedelta(days=30),
                        now,
                    ],
                )
                cursor.execute(
                    f"INSERT INTO {et} (user_coupon_id, expire_at, status, created_at, updated_at)"
                    f" SELECT id, expires_at, 'pending', {_now_sql()}, {_now_sql()} FROM {uc}"
                    " WHERE coupon_id = %s AND user_id >= %s AND user_id < %s",
                    [coupon.pk, USER_BASE + start, USER_BASE + stop],
                )
            bar.update(stop - start)
        bar.close()
        Coupon.objects.filter(pk=coupon.pk).update(claimed_count=self.count)

    def _insert_subscriptions(self, coupon: Coupon, remind_at, slots: int) -> None:
        table = ReminderSubscription._meta.db_table
        bar = self.progress(self.count, "reminders")
        for start in range(0, self.count, CHUNK):
            stop = min(start + CHUNK, self.count)
            with_, series = _series_sql(start, stop)
            with transaction.atomic(), connection.cursor() as cursor:
                # The row's slot column is left 0 (crc32 is not SQL); Redis gets the real slot.
                # Bench rows are deleted after the run, so no cancel ever needs the column.
                cursor.execute(
                    f"{with_}INSERT INTO {table} (coupon_id, user_id, remind_at, status, slot, "
                    "priority, drop_reason, created_at, updated_at) SELECT %s, "
                    f"{USER_BASE} + i, %s, 'scheduled', 0, 'normal', '', {_now_sql()}, "
                    f"{_now_sql()} FROM " + series,
                    [coupon.pk, remind_at],
                )
            bar.update(stop - start)
        bar.close()

    def _index_in_redis(self, coupon: Coupon, slots: int, now_ms: int) -> None:
        """Index the reminders as subscribing does; the first ``DEAD`` of them in the first
        ``DEAD_SLOTS`` slots are indexed due now, for ``_bury_some`` to claim."""
        rows = ReminderSubscription.objects.filter(coupon=coupon).values_list(
            "pk", "user_id", "remind_at"
        )
        dying = dict.fromkeys(range(min(slots, DEAD_SLOTS)), DEAD // min(slots, DEAD_SLOTS))
        bar = self.progress(self.count, "redis index")
        batch = []
        for pk, user_id, remind_at in rows.iterator(chunk_size=20_000):
            slot = engine.slot_for(user_id, slots)
            due_ms = epoch_ms(remind_at)
            if dying.get(slot):
                dying[slot] -= 1
                due_ms = now_ms
            batch.append((member(pk), due_ms, slot))
            if len(batch) >= 50_000:
                engine.schedule_many(REMINDER_TOPIC, batch)
                bar.update(len(batch))
                batch = []
        if batch:
            engine.schedule_many(REMINDER_TOPIC, batch)
            bar.update(len(batch))
        bar.close()
        engine.record_layout(REMINDER_TOPIC, slots)

    def _bury_some(self, slots: int, now_ms: int) -> None:
        """Claim and bury the reminders indexed due now, so the dead list has pages."""
        dead_slots = range(min(slots, DEAD_SLOTS))
        leases = SlotLeases(self.tag, ttl_ms=60_000)
        leases.sync({REMINDER_TOPIC: dead_slots})
        try:
            for slot in dead_slots:
                token = leases.token(REMINDER_TOPIC, slot)
                claimed = engine.claim(
                    REMINDER_TOPIC,
                    slot,
                    now_ms=now_ms,
                    limit=DEAD,
                    visibility_ms=60_000,
                    lease_token=token,
                    with_due=False,
                )
                died = [(c.job_id, "bench: gateway 503") for c in claimed]
                engine.bury(REMINDER_TOPIC, slot, died, now_ms=now_ms, lease_token=token)
        finally:
            leases.release_all()

    # --- measure ----------------------------------------------------------------------------------

    def pages(self) -> list[str]:
        claimed, upcoming = self.coupons
        some_user = USER_BASE + self.count // 2
        sub = ReminderSubscription.objects.filter(coupon=upcoming).order_by("pk").first()
        return [
            "/admin/",
            "/admin/console/",
            "/admin/reminders/deadletter/",
            f"/admin/reminders/deadletter/?topic={REMINDER_TOPIC}&slot=1",
            "/admin/reminders/deadletter/?p=5",
            f"/admin/reminders/deadletter/?q={USER_BASE + 3}",
            f"/admin/reminders/deadletter/?q={sub.pk if sub else 1}",
            "/admin/reminders/remindersettings/",
            f"/admin/reminders/remindersettings/{reminder_settings_get().pk}/change/",
            "/admin/expiry/expirysettings/",
            "/admin/couponcenter/coupon/",
            f"/admin/couponcenter/coupon/{claimed.pk}/change/",
            "/admin/couponcenter/usercoupon/",
            "/admin/couponcenter/usercoupon/?status__exact=used",
            f"/admin/couponcenter/usercoupon/?q={some_user}",
            "/admin/reminders/remindersubscription/",
            "/admin/reminders/remindersubscription/?status__exact=scheduled",
            f"/admin/reminders/remindersubscription/?q={some_user}",
            "/admin/reminders/timeoutjob/",
            "/admin/reminders/notification/",
            "/admin/expiry/expirytask/",
            "/admin/expiry/expirytask/?status__exact=pending",
            "/api/ops/backlog/",
            "/api/ops/dead-letters/",
            "/api/ops/config/",
        ]

    def measure(self) -> list[Timing]:
        User = get_user_model()  # noqa: N806
        self.user = User.objects.create(username=self.tag, is_staff=True, is_superuser=True)
        client = Client()
        client.force_login(self.user)
        if "testserver" not in settings.ALLOWED_HOSTS and "*" not in settings.ALLOWED_HOSTS:
            settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
        out = []
        pages = self.pages()
        bar = self.progress(len(pages), "pages")
        for url in pages:
            client.get(url)  # warm caches and connections
            times, status = [], 0
            for _ in range(self.repeat):
                t0 = time.perf_counter()
                status = client.get(url).status_code
                times.append((time.perf_counter() - t0) * 1000)
            out.append(Timing(url, status, min(times), statistics.median(times), max(times)))
            bar.update(1)
        bar.close()
        return out

    # --- clean up ---------------------------------------------------------------------------------

    def cleanup(self) -> None:
        ids = [c.pk for c in self.coupons]
        with connection.cursor() as cursor:
            if ids:
                marks = ",".join(["%s"] * len(ids))
                uc, et = UserCoupon._meta.db_table, ExpiryTask._meta.db_table
                cursor.execute(
                    f"DELETE FROM {et} WHERE user_coupon_id IN "
                    f"(SELECT id FROM {uc} WHERE coupon_id IN ({marks}))",
                    ids,
                )
                cursor.execute(f"DELETE FROM {uc} WHERE coupon_id IN ({marks})", ids)
                cursor.execute(
                    f"DELETE FROM {ReminderSubscription._meta.db_table} WHERE coupon_id IN "
                    f"({marks})",
                    ids,
                )
        Coupon.objects.filter(pk__in=ids).delete()
        if self.user is not None:
            self.user.delete()
        client, batch = get_redis(), []
        for key in client.scan_iter(match=f"{self.tag}:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                client.delete(*batch)
                batch = []
        if batch:
            client.delete(*batch)
        settings.REDIS_KEY_PREFIX = self.prefix_before


class _NullBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass
