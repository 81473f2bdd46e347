"""Retention across the apps (docs/retention.md), on a real database and a real Redis.

- Nothing a user or a client can still see or act on is removed: every such kind of row is
  enumerated, aged far past aggressive retentions where its kind allows it, and survives the
  passes of both apps; the aged-out rows of every kind beside it are removed.
- A retention changed in the live settings applies from the next pass.
- Retention racing the hot paths (PostgreSQL, threads holding real transactions open): a job
  fired, a dead job requeued, a notification read, a coupon redeemed while the pass runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from couponcenter.coupons.models import Coupon, UserCoupon
from couponcenter.coupons.services import coupon_redeem
from expiry import services as expiry_services
from expiry.models import ExpirySettings, ExpiryTask
from expiry.retention import expiry_retention
from reminders.engine import connection as engine_connection
from reminders.engine import keys, queue
from reminders.engine.clock import epoch_ms
from reminders.members import REMINDER_TOPIC
from reminders.models import Notification, ReminderSettings, ReminderSubscription, TimeoutJob
from reminders.services import notification_mark_read
from reminders.services.dead_letters import dead_letters_requeue
from reminders.services.retention import reminders_retention
from tests.support.factories import CouponFactory, UserCouponFactory
from tests.support.settings_rows import reminder_settings_row

DAY = timedelta(days=1)
LONG_AGO = timedelta(days=400)  # far past every retention below
Job, Sub, UC = TimeoutJob.Status, ReminderSubscription.Status, UserCoupon.Status
TOPIC = "timeout.default"


# --- rows of every kind, at a given age ----------------------------------------------------------


def aggressive() -> None:
    """Every retention one day."""
    reminder_settings_row().change(
        timeout_job_retention=DAY,
        notification_read_retention=DAY,
        notification_unread_retention=DAY,
        subscription_retention=DAY,
        dead_letter_retention=DAY,
    )
    config = expiry_services.expiry_settings_get(max_age_s=0)
    config.retention = DAY
    config.user_coupon_retention = DAY
    expiry_services.expiry_settings_save(instance=config)


def job(label: str, status: int, age: timedelta) -> TimeoutJob:
    row = TimeoutJob.objects.create(
        topic=TOPIC,
        biz_type="order",
        biz_id=label,
        status=status,
        action_time=timezone.now() - age,
    )
    TimeoutJob.objects.filter(pk=row.pk).update(gmt_modified=timezone.now() - age)
    return row


def note(label: str, *, shown_ago: timedelta, read_ago: timedelta | None = None, **kw):
    now = timezone.now()
    return Notification.objects.create(
        user_id=7,
        dedup_key=label,
        visible_at=now - shown_ago,
        read_at=None if read_ago is None else now - read_ago,
        **kw,
    )


def subscription(coupon: Coupon, user_id: int, status: str, age: timedelta):
    row = ReminderSubscription.objects.create(
        coupon=coupon, user_id=user_id, remind_at=timezone.now() - age, status=status
    )
    ReminderSubscription.objects.filter(pk=row.pk).update(updated_at=timezone.now() - age)
    return row


def dead_letter(topic: str, slot: int, job_id: str, died_ago: timedelta) -> None:
    """An entry of a dead set as a worker leaves it (score: when it died), with its meta."""
    k = keys.slot_keys(topic, slot)
    client = queue_client()
    client.zadd(k.dead, {job_id: epoch_ms(timezone.now() - died_ago)})
    client.hset(k.meta, mapping={f"a:{job_id}": 3, f"e:{job_id}": "HTTP 503"})


def queue_client():
    return engine_connection.client(None)


def dead_ids(topic: str, slot: int) -> set[str]:
    return {d.job_id for d in queue.list_dead(topic, slot, limit=1000)}


def user_coupon(coupon: Coupon, status: str, age: timedelta, **kw) -> UserCoupon:
    """A user coupon claimed ``age`` ago and used or ended then (``status``), with its task."""
    at = timezone.now() - age
    row = UserCouponFactory(
        coupon=coupon,
        status=status,
        claimed_at=at - DAY,
        expires_at=kw.pop("expires_at", at),
        used_at=at if status == UC.USED else None,
        **kw,
    )
    done = status != UC.UNUSED
    task = ExpiryTask.objects.create(
        user_coupon=row,
        expire_at=row.expires_at,
        status=ExpiryTask.Status.PROCESSED if done else ExpiryTask.Status.PENDING,
    )
    if done:  # processed when it was used or ended
        ExpiryTask.objects.filter(pk=task.pk).update(updated_at=at)
    return row


def ids(model) -> set[int]:
    return set(model.objects.values_list("pk", flat=True))


def run_passes() -> None:
    expiry_retention()
    reminders_retention(batch_size=2)  # several batches per table


# --- nothing visible is lost ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_nothing_a_user_or_client_can_see_or_act_on_is_removed(reminder_settings):
    aggressive()
    now = timezone.now()
    # Coupons: one on sale, one whose claims closed long ago, one cancelled long ago, one whose
    # claims closed only an hour ago (its claims still count for the per-user limit).
    on_sale = CouponFactory(claim_opens_at=now - LONG_AGO - DAY)
    closed = CouponFactory(claim_opens_at=now - LONG_AGO - 2 * DAY, claim_closes_at=now - LONG_AGO)
    cancelled = CouponFactory(claim_opens_at=now - LONG_AGO - 2 * DAY)
    Coupon.objects.filter(pk=cancelled.pk).update(status="cancelled", updated_at=now - 3 * DAY)
    just_closed = CouponFactory(claim_opens_at=now - LONG_AGO, claim_closes_at=now - DAY / 24)
    future = CouponFactory(claim_opens_at=now + DAY)

    kept = {
        TimeoutJob: {
            job("pending", Job.PENDING, LONG_AGO).pk,  # overdue for a year: still to fire
            job("running", Job.RUNNING, LONG_AGO).pk,  # being fired
            job("processed-recent", Job.PROCESSED, DAY / 24).pk,  # inside its retention
            job("cancelled-recent", Job.CANCELLED, DAY / 24).pk,
        },
        Notification: {
            note("unread-inside", shown_ago=DAY / 2).pk,  # unread, inside the unread retention
            note("read-recently", shown_ago=LONG_AGO, read_ago=DAY / 2).pk,  # read an hour ago
            note("staged", shown_ago=-DAY).pk,  # pre-staged, not shown yet
            note("held", shown_ago=LONG_AGO, held=True, push=False).pk,  # waits for a digest
        },
        ReminderSubscription: {
            subscription(future, 1, Sub.SCHEDULED, LONG_AGO).pk,  # still to remind
            subscription(future, 2, Sub.SENT, DAY / 24).pk,  # inside its retention
            subscription(future, 3, Sub.CANCELLED, DAY / 24).pk,
        },
        UserCoupon: {
            user_coupon(closed, UC.UNUSED, -DAY).pk,  # unused: the user may still redeem it
            user_coupon(cancelled, UC.UNUSED, LONG_AGO).pk,  # unused, never removed
            user_coupon(on_sale, UC.USED, LONG_AGO).pk,  # counts for the per-user limit
            user_coupon(on_sale, UC.EXPIRED, LONG_AGO).pk,
            user_coupon(just_closed, UC.USED, LONG_AGO).pk,  # closed, but not for a day yet
            user_coupon(closed, UC.USED, DAY / 24).pk,  # used inside its retention
        },
    }
    # A dead timeout job and a failed reminder whose dead letters are inside their retention
    # (the rows are older than their own retention: still requeueable, so kept).
    dead_job = job("dead-requeueable", Job.DEAD, 2 * DAY)
    failed = subscription(future, 4, Sub.FAILED, 2 * DAY)
    kept[TimeoutJob].add(dead_job.pk)
    kept[ReminderSubscription].add(failed.pk)
    reminder_settings_row().change(dead_letter_retention=3 * DAY)
    dead_letter(TOPIC, 0, str(dead_job.pk), 2 * DAY)
    dead_letter(REMINDER_TOPIC, 0, f"s:{failed.pk}", 2 * DAY)
    # Of the user coupons kept above: the pending tasks and those processed inside the retention.
    tasks_kept = set(
        ExpiryTask.objects.filter(
            Q(status=ExpiryTask.Status.PENDING) | Q(updated_at__gt=now - DAY)
        ).values_list("pk", flat=True)
    )

    gone = {
        TimeoutJob: {
            job("processed-old", Job.PROCESSED, 2 * DAY).pk,
            job("cancelled-old", Job.CANCELLED, 2 * DAY).pk,
            job("dead-old", Job.DEAD, 4 * DAY).pk,  # past both retentions
        },
        Notification: {
            note("read-old", shown_ago=LONG_AGO, read_ago=2 * DAY).pk,
            note("unread-old", shown_ago=2 * DAY).pk,
        },
        ReminderSubscription: {
            subscription(future, 5, Sub.SENT, 2 * DAY).pk,
            subscription(future, 6, Sub.DROPPED, 2 * DAY).pk,
            subscription(future, 7, Sub.CANCELLED, 2 * DAY).pk,
            subscription(future, 8, Sub.FAILED, 4 * DAY).pk,
        },
        UserCoupon: {
            user_coupon(closed, UC.USED, 2 * DAY).pk,
            user_coupon(closed, UC.EXPIRED, 2 * DAY).pk,
            user_coupon(cancelled, UC.USED, 2 * DAY).pk,
            user_coupon(cancelled, UC.EXPIRED, 2 * DAY).pk,
        },
    }
    old_task = ExpiryTask.objects.create(
        user_coupon=UserCouponFactory(coupon=on_sale, expires_at=now + DAY),
        expire_at=now - 3 * DAY,
        status=ExpiryTask.Status.PROCESSED,
    )
    ExpiryTask.objects.filter(pk=old_task.pk).update(updated_at=now - 2 * DAY)
    kept[UserCoupon].add(old_task.user_coupon_id)  # unused: only its processed task goes
    dead_letter(TOPIC, 1, "old", 2 * DAY)
    dead_letter(TOPIC, 1, "recent", DAY)

    run_passes()

    for model in kept:
        assert ids(model) == kept[model], model.__name__
        assert not gone[model] & ids(model)
    assert ids(ExpiryTask) == tasks_kept  # the others went, before their user coupons
    assert dead_ids(TOPIC, 0) == {str(dead_job.pk)}
    assert dead_ids(REMINDER_TOPIC, 0) == {f"s:{failed.pk}"}
    assert dead_ids(TOPIC, 1) == {"old", "recent"}  # 2 days and 1 day dead, retention 3 days
    # Shorter: the 2-day-old dead letters go, and the dead job's row with its letter (past the
    # longer of its two retentions); the failed subscription too.
    reminder_settings_row().change(dead_letter_retention=DAY + DAY / 2)
    run_passes()
    assert dead_ids(TOPIC, 1) == {"recent"}
    assert not dead_ids(TOPIC, 0) and not dead_ids(REMINDER_TOPIC, 0)
    # The meta of a purged dead letter went with it; that of the one kept stays.
    meta = queue_client().hgetall(keys.slot_keys(TOPIC, 1).meta)
    assert set(meta) == {b"a:recent", b"e:recent"}
    assert not TimeoutJob.objects.filter(pk=dead_job.pk).exists()
    assert not ReminderSubscription.objects.filter(pk=failed.pk).exists()


# --- live changes --------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_retention_change_applies_from_the_next_pass(reminder_settings):
    row = reminder_settings_row()
    read = note("read-2d", shown_ago=3 * DAY, read_ago=2 * DAY)
    reminders_retention()
    assert Notification.objects.filter(pk=read.pk).exists()  # default 30 days

    row.change(notification_read_retention=timedelta(0))  # keep forever
    runs = {r.name: r for r in reminders_retention()}
    assert runs["reminders_notification:read"].way == "kept"
    assert Notification.objects.filter(pk=read.pk).exists()

    row.change(notification_read_retention=DAY)  # the admin's save; nothing else
    reminders_retention()
    assert not Notification.objects.filter(pk=read.pk).exists()

    coupon = CouponFactory(
        claim_opens_at=timezone.now() - 4 * DAY, claim_closes_at=timezone.now() - 3 * DAY
    )
    used = user_coupon(coupon, UC.USED, 2 * DAY)
    expiry_retention()
    assert UserCoupon.objects.filter(pk=used.pk).exists()  # default 180 days
    config = ExpirySettings.objects.get()
    config.user_coupon_retention = DAY
    config.retention = DAY  # on PostgreSQL a user coupon waits for its task's day to go
    expiry_services.expiry_settings_save(instance=config)
    expiry_retention()
    assert not UserCoupon.objects.filter(pk=used.pk).exists()
    assert not ExpiryTask.objects.filter(user_coupon_id=used.pk).exists()


def test_retention_bounds_are_the_models():
    row = ReminderSettings(notification_unread_retention=timedelta(days=3651))
    with pytest.raises(ValidationError) as caught:
        row.full_clean()
    assert "notification_unread_retention" in caught.value.message_dict
    row = ExpirySettings(user_coupon_retention=-DAY)
    with pytest.raises(ValidationError) as caught:
        row.full_clean()
    assert "user_coupon_retention" in caught.value.message_dict


# --- racing the hot paths ------------------------------------------------------------------------


class HeldOpen:
    """``action`` run in a transaction of its own, in a thread, held open until ``commit()``."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.action, self.error = action, None
        self.done, self.go, self.released = threading.Event(), threading.Event(), None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HeldOpen:
        self.thread.start()
        assert self.done.wait(30), "the hot path never ran"
        assert self.error is None, self.error
        return self

    def _run(self) -> None:
        try:
            with transaction.atomic():
                self.action()
                self.done.set()
                # A deadline, not a pause: a pass that waited for this row would make it lapse.
                self.released = self.go.wait(30)
        except Exception as exc:
            self.error = exc
            self.done.set()
        finally:
            connection.close()

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        self.thread.join(30)
        assert self.released, "the pass waited for the hot path's row lock"
        assert self.error is None, self.error


@pytest.mark.postgres  # row locks held by another connection
@pytest.mark.django_db(transaction=True)
def test_retention_racing_the_hot_paths_removes_nothing_they_touch(reminder_settings):
    aggressive()
    now = timezone.now()
    # Rows that are past their retention as committed, each being changed by a hot path while
    # the pass runs into a state that must be kept.
    firing = job("firing", Job.RUNNING, LONG_AGO)
    dead = job("requeued", Job.DEAD, 4 * DAY)
    dead_letter(TOPIC, dead.slot, str(dead.pk), 4 * DAY)
    unread = note("read-now", shown_ago=2 * DAY)
    closed = CouponFactory(claim_opens_at=now - LONG_AGO, claim_closes_at=now - 3 * DAY)
    unused = user_coupon(closed, UC.UNUSED, -DAY)  # still valid for a day
    aged = [note(f"aged-{i}", shown_ago=2 * DAY) for i in range(5)]  # beside them: removed

    def fire():
        TimeoutJob.objects.filter(pk=firing.pk, status=Job.RUNNING).update(
            status=Job.PROCESSED, gmt_modified=timezone.now()
        )

    def requeue():
        # The row half of a requeue (its Redis move runs on commit).
        TimeoutJob.objects.filter(pk=dead.pk, status=Job.DEAD).update(
            status=Job.PENDING, attempts=0, gmt_modified=dead.gmt_modified
        )

    def read():
        notification_mark_read(user_id=7, notification_id=unread.pk)

    def redeem():
        coupon_redeem(user_coupon_id=unused.pk, user_id=unused.user_id)

    with HeldOpen(fire), HeldOpen(requeue), HeldOpen(read), HeldOpen(redeem):
        run_passes()

    assert TimeoutJob.objects.get(pk=firing.pk).status == Job.PROCESSED
    assert TimeoutJob.objects.get(pk=dead.pk).status == Job.PENDING
    assert Notification.objects.get(pk=unread.pk).read_at is not None
    assert UserCoupon.objects.get(pk=unused.pk).status == UC.USED
    assert not Notification.objects.filter(pk__in=[n.pk for n in aged]).exists()
    run_passes()  # and in their new state, the next pass keeps them too
    assert TimeoutJob.objects.filter(pk__in=[firing.pk, dead.pk]).count() == 2
    assert Notification.objects.filter(pk=unread.pk).exists()
    assert UserCoupon.objects.filter(pk=unused.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_a_dead_letter_requeued_is_not_purged(reminder_settings):
    aggressive()
    dead = job("requeue-me", Job.DEAD, 4 * DAY)
    dead_letter(TOPIC, dead.slot, str(dead.pk), 4 * DAY)
    result = dead_letters_requeue(topic=TOPIC, slot=dead.slot, job_ids=[str(dead.pk)])
    assert result.requeued == 1
    run_passes()
    assert TimeoutJob.objects.get(pk=dead.pk).status == Job.PENDING
    store = queue_client().zscore(keys.slot_keys(TOPIC, dead.slot).store, str(dead.pk))
    assert store is not None  # back in the schedule, untouched by the dead letters' purge
