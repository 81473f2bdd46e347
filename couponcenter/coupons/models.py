"""The coupon domain: coupons, the coupons users claimed, and API accounts.

End users are external integer ``user_id``s, not Django accounts. An ``Account`` links a Django user
(an API caller) to the one end user it may act for; callers with the ``act_for_any_user`` permission
(service accounts) may act for anyone.
"""

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from couponcenter.core.durations import MaxDurationValidator, MinDurationValidator
from couponcenter.core.time import EARLIEST_TIME, LATEST_TIME

# Bounds that keep every value storable (a PostgreSQL integer, SQLite's 64-bit microseconds) and
# every sum of them (opening time minus reminder lead, claim time plus validity) far from overflow.
MAX_TOTAL_STOCK = 2_000_000_000
MAX_PER_USER_LIMIT = 1000
MAX_VALID_FOR = timedelta(days=3660)
MAX_REMINDER_LEAD = timedelta(days=7)
# A client's Idempotency-Key: 1 to this many printable ASCII characters. The column stores it
# behind the API caller's account id and a colon, so it needs room for that (a BIGINT's digits).
IDEMPOTENCY_KEY_MAX_LENGTH = 255
IDEMPOTENCY_KEY_COLUMN_LENGTH = 19 + 1 + IDEMPOTENCY_KEY_MAX_LENGTH


class Coupon(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        CANCELLED = "cancelled", "Cancelled"

    class Priority(models.TextChoices):
        NORMAL = "normal", "Normal"
        HIGH = "high", "High"

    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    claim_opens_at = models.DateTimeField(db_index=True)
    claim_closes_at = models.DateTimeField(null=True, blank=True)
    total_stock = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_TOTAL_STOCK)]
    )
    # Claims so far, folded from the coupon's stock shards (``couponcenter.coupons.stock``) by
    # each claim right after its commit and by stock changes and cancels. The shards, not this
    # column, are what a claim takes stock from, so claims never queue on this row.
    claimed_count = models.PositiveIntegerField(default=0, editable=False)
    per_user_limit = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(MAX_PER_USER_LIMIT)]
    )
    # Validity of a claimed coupon: a fixed end, or a duration counted from the claim.
    expires_at = models.DateTimeField(null=True, blank=True)
    valid_for = models.DurationField(
        null=True,
        blank=True,
        validators=[
            MinDurationValidator(timedelta(seconds=1)),
            MaxDurationValidator(MAX_VALID_FOR),
        ],
    )
    reminder_lead = models.DurationField(
        default=timedelta(seconds=60),
        validators=[MinDurationValidator(timedelta(0)), MaxDurationValidator(MAX_REMINDER_LEAD)],
    )
    reminder_priority = models.CharField(
        max_length=10, choices=Priority.choices, default=Priority.NORMAL
    )
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.ACTIVE, db_index=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["claim_opens_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(claimed_count__lte=F("total_stock")), name="coupon_no_oversell"
            ),
            models.CheckConstraint(
                condition=Q(expires_at__isnull=False) | Q(valid_for__isnull=False),
                name="coupon_has_validity",
            ),
            models.CheckConstraint(
                condition=Q(claim_closes_at__isnull=True)
                | Q(claim_closes_at__gt=F("claim_opens_at")),
                name="coupon_window_ordered",
            ),
        ]
        permissions = [("manage_coupons", "Can create, change and cancel coupons over the API")]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @property
    def remaining_stock(self) -> int:
        return self.total_stock - self.claimed_count

    def clean(self) -> None:
        """Rules across fields; the services call ``full_clean()`` and so does the admin form."""
        errors: dict[str, list[str]] = {}
        for name in ("claim_opens_at", "claim_closes_at", "expires_at"):
            value = getattr(self, name)
            if value is not None and not EARLIEST_TIME <= value < LATEST_TIME:
                errors.setdefault(name, []).append(
                    f"Must be between {EARLIEST_TIME:%Y-%m-%d} and {LATEST_TIME:%Y-%m-%d}."
                )
        if errors:
            raise ValidationError(errors)
        if self.expires_at is None and self.valid_for is None:
            errors["valid_for"] = ["Give either expires_at or valid_for."]
        elif self.expires_at is not None and self.valid_for is not None:
            errors["valid_for"] = ["Give expires_at or valid_for, not both."]
        opens = self.claim_opens_at
        if opens and self.claim_closes_at and self.claim_closes_at <= opens:
            errors["claim_closes_at"] = ["Must be after claim_opens_at."]
        if opens and self.expires_at and self.expires_at <= opens:
            errors["expires_at"] = ["Must be after claim_opens_at."]
        if self.total_stock is not None and self.total_stock < self.claimed_count:
            errors["total_stock"] = [
                f"Cannot go below the {self.claimed_count} coupons already claimed."
            ]
        if errors:
            raise ValidationError(errors)


class UserCoupon(models.Model):
    class Status(models.TextChoices):
        UNUSED = "unused", "Unused"
        USED = "used", "Used"
        EXPIRED = "expired", "Expired"

    # No index of its own: the unique (coupon, user_id, seq) constraint leads with it.
    coupon = models.ForeignKey(
        Coupon, on_delete=models.PROTECT, related_name="claims", db_index=False
    )
    user_id = models.BigIntegerField()
    # 1..per_user_limit, unique per (coupon, user): the database itself refuses a claim over the
    # limit.
    seq = models.PositiveSmallIntegerField(default=1, editable=False)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.UNUSED)
    claimed_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    # The Idempotency-Key the claim was sent with, as "<caller's account id>:<key>" (so one
    # caller's key never answers for another's); NULL without one. A retried claim whose first
    # answer Redis no longer holds finds its user coupon here (couponcenter/coupons/api/claims.py).
    idempotency_key = models.CharField(
        max_length=IDEMPOTENCY_KEY_COLUMN_LENGTH, null=True, blank=True, editable=False
    )

    class Meta:
        ordering = ["-claimed_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["coupon", "user_id", "seq"], name="usercoupon_one_per_seq"
            ),
            # Partial: claims without a key (most) add no index entry. A retry that lost its
            # Redis record cannot claim a second time with the same key.
            models.UniqueConstraint(
                fields=["coupon", "user_id", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="usercoupon_one_per_idempotency_key",
            ),
            models.CheckConstraint(
                condition=~Q(status="used") | Q(used_at__isnull=False),
                name="usercoupon_used_has_time",
            ),
        ]
        # No index contains ``status`` (nor may one name it in a partial-index condition): then
        # the sweeper's ``unused -> expired`` and a redeem's ``unused -> used`` are HOT updates,
        # a new row version on the same heap page and no index entry written, which halves the
        # cost of mass expiry (BENCHMARKS.md). The page needs room for that new version, so on
        # PostgreSQL the table is created with ``fillfactor = 50`` (migration 0004): rows are
        # updated about once in their life, and the coupons on one page expire in one batch.
        # A user's coupons are few, so filtering them by status after the user_id index is cheap.
        indexes = [
            models.Index(fields=["user_id"], name="usercoupon_user"),
        ]

    def __str__(self) -> str:
        return f"user {self.user_id}: {self.coupon_id} ({self.status})"


class CouponStockShard(models.Model):
    """One slice of a coupon's stock: claims take a unit from a random shard with stock left.

    Splitting the stock keeps concurrent claims of one coupon off a single hot row (each claim
    holds its shard's row lock until its commit is durable). ``sum(stock) == total_stock`` and
    ``sum(claimed)`` is the number of claims, so ``claimed <= stock`` on every shard means never
    more claims than stock. A cancelled coupon's shards are closed (``stock = claimed``).
    """

    # No index of its own: the unique (coupon, shard) constraint leads with it.
    coupon = models.ForeignKey(
        Coupon, on_delete=models.CASCADE, related_name="stock_shards", db_index=False
    )
    shard = models.PositiveSmallIntegerField()
    stock = models.PositiveIntegerField(default=0)
    claimed = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["coupon", "shard"], name="stockshard_one_per_number"),
            models.CheckConstraint(
                condition=Q(claimed__lte=F("stock")), name="stockshard_no_oversell"
            ),
        ]

    def __str__(self) -> str:
        return f"coupon {self.coupon_id} shard {self.shard}: {self.claimed}/{self.stock}"


class Account(models.Model):
    """Links an API caller (a Django user) to the end user it acts for."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="coupon_account"
    )
    # The end user this caller may act for (None for service accounts).
    end_user_id = models.BigIntegerField(null=True, blank=True, db_index=True)

    class Meta:
        permissions = [
            ("act_for_any_user", "Can act for any end user (service account)"),
            ("manage_accounts", "Can create and change API accounts and hand out their tokens"),
        ]

    def __str__(self) -> str:
        return f"{self.user} -> {self.end_user_id}"
