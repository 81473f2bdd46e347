"""Coupon reminders' tables: a user's subscription to a coupon's opening
(``ReminderSubscription``) and the inbox its delivery writes (``Notification``);
docs/reminders.md."""

from django.db import models
from django.db.models import Q
from django.utils import timezone


class ReminderSubscription(models.Model):
    """A user asked to be reminded before ``coupon`` opens; unique per (user, coupon)."""

    class Status(models.TextChoices):
        SCHEDULED = "scheduled", "Scheduled"
        SENT = "sent", "Sent"
        CANCELLED = "cancelled", "Cancelled"
        DROPPED = "dropped", "Dropped"
        FAILED = "failed", "Failed"

    coupon = models.ForeignKey(
        "couponcenter.Coupon", on_delete=models.CASCADE, related_name="reminder_subscriptions"
    )
    user_id = models.BigIntegerField()
    remind_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.SCHEDULED)
    # The engine slot the entry was indexed in; kept so cancel finds it after a slot-count change.
    slot = models.PositiveIntegerField(default=0)
    # "normal" or "high", from the coupon at subscribe time: it picks the engine topic.
    priority = models.CharField(max_length=10, default="normal")
    drop_reason = models.CharField(max_length=32, blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)
    # The trace of the API call that scheduled it (W3C traceparent; only when tracing is on and
    # that call was sampled): its delivery is a span in the same trace (core.tracing).
    traceparent = models.CharField(max_length=64, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user_id", "coupon"], name="subscription_one_per_user")
        ]
        indexes = [
            # Partial, so a lookup by id and status never wanders into it (a status-led index
            # made PostgreSQL BitmapAnd it with the primary key on hot delivery updates).
            models.Index(
                fields=["remind_at"], condition=Q(status="scheduled"), name="subscription_due"
            ),
        ]

    def __str__(self) -> str:
        return f"user {self.user_id} -> coupon {self.coupon_id} at {self.remind_at:%H:%M:%S}"


class Notification(models.Model):
    """The inbox, and the ledger that makes delivery exactly-once for the user.

    On PostgreSQL the table is partitioned by day of ``visible_at`` and the ledger's unique key is
    ``(user_id, dedup_key, visible_at)`` (``reminders.services.notification_partitions``,
    docs/partitioning.md); the constraint and index below are the SQLite layout."""

    user_id = models.BigIntegerField()
    dedup_key = models.CharField(max_length=200)
    kind = models.CharField(max_length=32, default="coupon_reminder")
    title = models.CharField(max_length=200, blank=True, default="")
    body = models.TextField(blank=True, default="")
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Shown from this moment on: a reminder pre-staged ahead of its due time is written early
    # and stays out of the inbox until then (``ReminderSettings.prestage_ms``).
    visible_at = models.DateTimeField(default=timezone.now)
    read_at = models.DateTimeField(null=True, blank=True)
    # The per-user push cap (ReminderSettings.push_cap_per_day): whether this one is pushed to
    # the user's device, or only shown in the inbox; ``held``: over the cap, waiting to be folded
    # into the user's next allowed push as a digest (its ``payload["digest"]``).
    push = models.BooleanField(default=True, db_default=True)
    held = models.BooleanField(default=False, db_default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user_id", "dedup_key"], name="notification_once")
        ]
        # No separate inbox index: the unique (user_id, dedup_key) index finds a user's rows, and
        # every index costs each of the 200,000 inserts of a burst. Only the staged rows (written
        # before they show) are indexed apart: delivery looks up a batch's users' staged rows,
        # and for a burst that was not pre-staged there are none, so that lookup is an empty
        # index instead of 2,000 probes of the unique one (a tenth of a delivery's time).
        indexes = [
            models.Index(
                fields=["user_id"],
                condition=models.Q(visible_at__gt=models.F("created_at")),
                name="notification_staged",
            )
        ]

    def __str__(self) -> str:
        return f"to {self.user_id}: {self.title or self.kind}"
