"""The timeout center's tables: the generic jobs (``TimeoutJob``) and the topics kept as data
(``TimeoutTopic``); docs/timeouts.md."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from reminders.engine import knobs
from reminders.engine.knobs import Knob
from reminders.models.validators import _power_of_two
from reminders.timeout_topic_rules import (
    CONCURRENCY,
    RATE_LIMIT_PER_S,
    TIMEOUT_MS,
    spec_from_topic,
    spec_problems,
)


class TimeoutJob(models.Model):
    """A generic "do X at time T" job (docs/timeouts.md)."""

    class Status(models.IntegerChoices):
        PENDING = 0, "Pending"
        # Taken by a worker to fire: no longer cancellable or movable (exactly one outcome).
        RUNNING = 1, "Running"
        PROCESSED = 2, "Processed"
        CANCELLED = 3, "Cancelled"
        # Past its attempt limit: it sits in the topic's dead queue until requeued or purged.
        DEAD = 4, "Dead"

    job_id = models.BigAutoField(primary_key=True)
    topic = models.CharField(max_length=64)
    biz_type = models.CharField(max_length=64)
    biz_id = models.CharField(max_length=128)
    status = models.PositiveSmallIntegerField(choices=Status.choices, default=Status.PENDING)
    action_time = models.DateTimeField()
    attribute = models.JSONField(default=dict, blank=True)
    slot = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Each settled attempt, oldest first: {"attempt", "at", "outcome", "error"} (appended by the
    # settle's own UPDATE, no extra query; shown on the job's admin page).
    history = models.JSONField(null=True, blank=True, editable=False)
    # The trace of the call that scheduled it (see ReminderSubscription.traceparent).
    traceparent = models.CharField(max_length=64, blank=True, default="", db_default="")
    # Recurring jobs (``reminders.recurrence``): an RRULE or a cron expression; the next
    # occurrence is created when this one is settled. ``series_start``: the start the series was
    # given (its rule counts from it; a start already past begins the series later).
    recurrence = models.CharField(max_length=500, blank=True, default="")
    series_start = models.DateTimeField(null=True, blank=True)
    gmt_create = models.DateTimeField(auto_now_add=True)
    gmt_modified = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["topic", "biz_type", "biz_id"],
                condition=Q(status=0),
                name="timeoutjob_one_pending_per_biz",
            )
        ]
        permissions = [("manage_timeouts", "Can create, read and cancel timeout jobs over the API")]
        indexes = [
            models.Index(fields=["action_time"], condition=Q(status=0), name="timeoutjob_due"),
            models.Index(fields=["biz_type", "biz_id"], name="timeoutjob_biz"),
        ]

    def __str__(self) -> str:
        return f"{self.topic} job {self.job_id} ({self.biz_type}:{self.biz_id})"


def _knob_field(knob: Knob) -> models.PositiveIntegerField:
    """A topic's knob as a model field: its default, its range and its help text."""
    validators = [MinValueValidator(knob.low), MaxValueValidator(knob.high)]
    if knob.power_of_two:
        validators.append(_power_of_two)
    return models.PositiveIntegerField(
        default=knob.default, validators=validators, help_text=knob.help
    )


class TimeoutTopic(models.Model):
    """A generic timeout topic kept as data: workers and the API pick up a new or changed row
    while they run (``selectors.timeout_topics``). Topics in ``settings.TIMEOUT_TOPICS`` are
    read-only and win a name clash.

    The bounds live here, so the admin and the staff API refuse the same values; the knobs'
    fields are derived from their one definition (``timeout_topic_rules.TIMEOUT_TOPIC_KNOBS``).
    """

    class Type(models.TextChoices):
        HTTP = "http", "HTTP (signed POST)"
        CELERY = "celery", "Celery task (one per batch)"
        CALLABLE = "callable", "Python callable (called with the batch)"
        LOG = "log", "Log only (tests)"

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[
            RegexValidator(r"^[a-z0-9][a-z0-9._-]{0,63}$", "lower-case letters, digits, . _ -")
        ],
    )
    type = models.CharField(max_length=10, choices=Type.choices)
    target = models.CharField(
        max_length=500,
        blank=True,
        help_text="http: the URL; celery: the task name; callable: the dotted path.",
    )
    secret = models.CharField(
        max_length=256,
        blank=True,
        help_text="http: the signing secret, whsec_<base64> (a key of 24 bytes or more), or "
        "text of at least 32 bytes used as the key itself.",
    )
    # Set by ``services.timeout_topic_save`` when the secret changes: the old one keeps signing
    # beside the new one until then (settings.WEBHOOK_SECRET_OVERLAP_S).
    previous_secret = models.CharField(max_length=256, blank=True, editable=False)
    previous_secret_until = models.DateTimeField(null=True, blank=True, editable=False)
    legacy_signature = models.BooleanField(
        default=False,
        help_text="Also send the X-Coupon-Center-Signature and -Timestamp headers, for "
        "receivers that do not verify Standard Webhooks yet.",
    )
    allow_http = models.BooleanField(
        default=False, help_text="Allow a plain-HTTP URL (https only otherwise)."
    )
    slots = _knob_field(knobs.SLOTS)
    max_attempts = _knob_field(knobs.MAX_ATTEMPTS)
    backoff_base_ms = _knob_field(knobs.BACKOFF_BASE_MS)
    backoff_cap_ms = _knob_field(knobs.BACKOFF_CAP_MS)
    visibility_ms = _knob_field(knobs.VISIBILITY_MS)
    concurrency = _knob_field(CONCURRENCY)
    timeout_ms = _knob_field(TIMEOUT_MS)
    rate_limit_per_s = _knob_field(RATE_LIMIT_PER_S)
    fair_key = models.CharField(
        max_length=70,
        blank=True,
        validators=[
            RegexValidator(
                r"^(biz_type|attribute\.[A-Za-z0-9_]{1,60})?$",
                "empty, biz_type or attribute.<name>",
            )
        ],
        help_text="Share each claim fairly between the values of this key (biz_type or "
        "attribute.<name>), so one flooding key does not starve the others.",
    )
    paused = models.BooleanField(default=False, help_text="Due jobs wait in Redis while paused.")
    # An owner is protected: a topic whose owner went would be staff-only, and its callers
    # would lose it without a word (``selectors.timeout_topics.topic_usable_by``).
    owner_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Who may use the topic through the API (staff always may).",
    )
    owner_group = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Or every member of this group. No owner: staff only.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.name and self.name in settings.TIMEOUT_TOPICS:
            raise ValidationError({"name": "this topic is defined in settings.TIMEOUT_TOPICS"})
        problems = spec_problems(spec_from_topic(self))
        if problems:
            raise ValidationError(problems)
