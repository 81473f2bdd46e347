"""The expiry-task table (docs/expiry.md): one small row per claimed coupon, swept in batches.

The indexes below are the SQLite layout. On PostgreSQL the table is partitioned (pending leaf,
processed tasks by day: ``expiry.partitioning``, docs/partitioning.md) with indexes of its own.

The sweeper never scans ``couponcenter_usercoupon``; it reads due pending rows of this table through
the partial index over pending rows, ``expirytask_pending_due``. The composite
``(expire_at, status)`` cannot replace it: it leads with ``expire_at``, so a sweep through it would
step over every processed task still kept for the retention (days of them) before reaching a
pending one. Marking a task processed writes no entry into the pending index (the new row is not
pending) and one into each of the others: the composite, ``expirytask_processed_age`` (the
cleanup's), the primary key and the ``user_coupon`` unique key.
"""

from datetime import timedelta

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from couponcenter.core.durations import MaxDurationValidator, MinDurationValidator
from couponcenter.core.live_settings import LiveSettings


class ExpiryTask(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        PROCESSED = "processed", "Processed"

    user_coupon = models.OneToOneField(
        "couponcenter.UserCoupon", on_delete=models.CASCADE, related_name="expiry_task"
    )
    expire_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(fields=["expire_at", "status"], name="expirytask_due"),
            # (expire_at, id): a pass resumes each batch after the last one's key instead of
            # stepping again over the entries of every task it processed (and, among tasks due
            # at the same moment, the id orders them).
            models.Index(
                fields=["expire_at", "id"],
                condition=Q(status="pending"),
                name="expirytask_pending_due",
            ),
            models.Index(
                fields=["updated_at"],
                condition=Q(status="processed"),
                name="expirytask_processed_age",
            ),
        ]

    def __str__(self) -> str:
        return f"expire user coupon {self.user_coupon_id} at {self.expire_at:%Y-%m-%d %H:%M}"


class ExpirySettings(LiveSettings):
    """The sweeper's live configuration: a single row, edited in the admin, read every pass
    (its change marker, ``version``, as every live settings row:
    ``couponcenter.core.live_settings``)."""

    batch_size = models.PositiveIntegerField(
        default=2000, validators=[MinValueValidator(1), MaxValueValidator(100_000)]
    )
    interval = models.DurationField(
        default=timedelta(seconds=60),
        validators=[
            MinDurationValidator(timedelta(seconds=1)),
            MaxDurationValidator(timedelta(days=1)),
        ],
    )
    retention = models.DurationField(
        default=timedelta(days=7),
        validators=[MinDurationValidator(timedelta(0)), MaxDurationValidator(timedelta(days=3650))],
    )

    class Meta:
        verbose_name = "expiry settings"
        verbose_name_plural = "expiry settings"

    def __str__(self) -> str:
        return "Expiry settings"
