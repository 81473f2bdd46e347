"""Reminders and timeout jobs: the database side (the source of truth).

PostgreSQL holds every job and subscription with its status; Redis holds only the schedule (which id
is due when, and which are in flight). A write commits here first and is indexed in Redis on commit;
``rebuild_reminder_queues`` and the worker's reconcile rebuild from these tables.
"""

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from couponcenter.core.durations import MaxDurationValidator, MinDurationValidator
from couponcenter.core.live_settings import LiveSettings
from reminders.engine import knobs
from reminders.engine.knobs import Knob, is_power_of_two
from reminders.engine.topic_model import TopicSettings
from reminders.timeout_topic_rules import (
    CONCURRENCY,
    RATE_LIMIT_PER_S,
    TIMEOUT_MS,
    spec_from_topic,
    spec_problems,
)

# A failed reminder's retries wait at most this long (or the base backoff, if that is longer).
BACKOFF_CAP_MS = 300_000
# Reminders are pre-staged at most this far ahead of their due time.
MAX_PRESTAGE_MS = 600_000
# The "drop" late policy's limit: past a week a reminder helps nobody (and "now - limit" must
# stay a valid time).
MAX_LATE_LIMIT = timedelta(days=7)


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


def _power_of_two(value: int) -> None:
    if not is_power_of_two(value):
        raise ValidationError(f"{value} is not a power of two (1, 2, 4, 8, ...).")


def _knob_field(knob: Knob) -> models.PositiveIntegerField:
    """A topic's knob as a model field: its default, its range and its help text."""
    validators = [MinValueValidator(knob.low), MaxValueValidator(knob.high)]
    if knob.power_of_two:
        validators.append(_power_of_two)
    return models.PositiveIntegerField(
        default=knob.default, validators=validators, help_text=knob.help
    )


def _within_attribute_max(value: int) -> None:
    if value > settings.TIMEOUT_ATTRIBUTE_MAX_BYTES:
        raise ValidationError(
            f"At most {settings.TIMEOUT_ATTRIBUTE_MAX_BYTES:,}, the service's hard limit "
            "(TIMEOUT_ATTRIBUTE_MAX_BYTES)."
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
        max_length=256, blank=True, help_text="http: the HMAC signing key, at least 32 bytes."
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
    """The inbox, and the ledger that makes delivery exactly-once for the user."""

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


class ReminderSettings(LiveSettings):
    """Live configuration of the reminder workers: one row, edited in the admin.

    Workers poll ``version`` every tick and pick a change up without a restart; every save bumps it
    (``couponcenter.core.live_settings``; ``queryset.update()`` callers must bump it explicitly, as
    django-celery-beat does).
    """

    class LatePolicy(models.TextChoices):
        SEND = "send", "Send however late"
        DROP = "drop", "Drop when later than the late limit"

    class OverCap(models.TextChoices):
        DIGEST = "digest", "Inbox now, folded into the next allowed push as a digest"
        INBOX = "inbox", "Inbox only"

    class Gateway(models.TextChoices):
        INBOX = "inbox", "Inbox (Notification rows)"
        WEBHOOK = "webhook", "Webhook (signed HTTP POST)"
        LOG = "log", "Log only"

    slots = models.PositiveIntegerField(
        default=16,
        validators=[_power_of_two, MaxValueValidator(4096)],
        help_text="Shards per reminder topic, a power of two; workers share them. A change moves "
        "the scheduled reminders to the new layout, losing none.",
    )
    batch_size = models.PositiveIntegerField(
        default=2000,
        validators=[MinValueValidator(1), MaxValueValidator(50_000)],
        help_text="Most reminders one claim takes from a slot (and one delivery task carries).",
    )
    tick_interval_ms = models.PositiveIntegerField(
        default=1000,
        validators=[MinValueValidator(10), MaxValueValidator(60_000)],
        help_text="Longest a worker sleeps between claims when nothing is due sooner (ms); it "
        "wakes earlier for the next due reminder.",
    )
    visibility_timeout_ms = models.PositiveIntegerField(
        default=60_000,
        validators=[MinValueValidator(1000), MaxValueValidator(3_600_000)],
        help_text="How long a claimed reminder may stay unacknowledged before it is claimed "
        "again (ms): a worker or Celery process that died loses nothing.",
    )
    max_attempts = models.PositiveIntegerField(
        default=3,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Delivery attempts before a reminder goes to the dead letters (and an alert).",
    )
    backoff_ms = models.PositiveIntegerField(
        default=2000,
        validators=[MinValueValidator(0), MaxValueValidator(3_600_000)],
        help_text="Wait before the first retry (ms); it doubles with each attempt, with jitter.",
    )
    merge_window_ms = models.PositiveIntegerField(
        default=1000,
        validators=[MaxValueValidator(3_600_000)],
        help_text="A user's reminders due within this window become one notification (ms); 0 "
        "sends each alone.",
    )
    late_policy = models.CharField(
        max_length=8,
        choices=LatePolicy.choices,
        default="send",
        help_text="What happens to a reminder later than the late limit (after an outage).",
    )
    late_limit = models.DurationField(
        default=timedelta(minutes=5),
        validators=[MinDurationValidator(timedelta(0)), MaxDurationValidator(MAX_LATE_LIMIT)],
        help_text="With the drop policy: reminders later than this are dropped, not sent.",
    )
    paused = models.BooleanField(
        default=False,
        help_text="Stop claiming reminders (they wait, due, in Redis; nothing is lost).",
    )
    gateway = models.CharField(
        max_length=10,
        choices=Gateway.choices,
        default="inbox",
        help_text="Where reminders go: the inbox table, a signed webhook, or the log only.",
    )
    prestage_ms = models.PositiveIntegerField(
        "pre-stage window (ms)",
        default=30_000,
        validators=[MaxValueValidator(MAX_PRESTAGE_MS)],
        help_text=(
            "Inbox gateway only: reminders due within this window are delivered ahead of time "
            "into inbox rows that stay hidden until their due moment, so a burst of 200,000 "
            "due in one second is on time. A cancel, an unsubscribe or a coupon that can no "
            "longer be claimed before the due moment withdraws them. 0 turns it off."
        ),
    )
    # The per-user push cap (docs/reminders.md, Push cap).
    push_cap_per_day = models.PositiveIntegerField(
        "pushes per user per day",
        default=0,
        validators=[MaxValueValidator(1000)],
        help_text="At most this many pushed notifications per user in any rolling 24 hours "
        "(0: no cap). Reminders over the cap still land in the inbox, unpushed. Inbox gateway.",
    )
    over_cap = models.CharField(
        "over the cap",
        max_length=8,
        choices=OverCap.choices,
        default=OverCap.DIGEST,
        help_text="What a reminder over the cap becomes besides its inbox entry.",
    )
    # Backpressure: claiming slows when the Celery delivery queue is deeper than this.
    max_delivery_queue = models.PositiveIntegerField(
        default=200,
        validators=[MaxValueValidator(1_000_000)],
        help_text="Backpressure: workers claim less while more delivery tasks than this wait "
        "in the Celery queue.",
    )
    # Console warnings.
    backlog_warning = models.PositiveIntegerField(
        default=10_000,
        validators=[MaxValueValidator(1_000_000_000)],
        help_text="The console warns when more reminders than this are overdue.",
    )
    lateness_warning_ms = models.PositiveIntegerField(
        default=1000,
        validators=[MaxValueValidator(86_400_000)],
        help_text="The console warns when the p99 lateness of the last 5 minutes is over this "
        "(ms).",
    )
    # Tenant quotas: each API account that is not staff ("owner"), checked when it creates
    # timeout jobs (one or in bulk). Staff, and the services called from code, are not bounded.
    quota_pending_per_topic = models.PositiveIntegerField(
        "pending jobs per topic",
        default=100_000,
        validators=[MaxValueValidator(10_000_000)],
        help_text="Most pending jobs a topic may hold when its owner creates more (0: no limit); "
        "jobs that fired or were cancelled make room within seconds. The console lists topics "
        "past 80 %.",
    )
    quota_creations_per_s = models.PositiveIntegerField(
        "creations per second",
        default=2_000,
        validators=[MaxValueValidator(1_000_000)],
        help_text="Jobs each owner may create per second, on average (0: no limit). A bulk larger "
        "than a second's worth is admitted once the owner has created nothing for a while, "
        "and the owner's next creations wait until it has drained.",
    )
    quota_attribute_bytes = models.PositiveIntegerField(
        "attribute size (bytes)",
        default=8_000,
        validators=[_within_attribute_max],
        help_text="Largest attribute an owner may give a job, in bytes of its JSON (0: only the "
        "service's hard limit).",
    )

    class Meta:
        verbose_name = "reminder settings"
        verbose_name_plural = "reminder settings"

    def __str__(self) -> str:
        return f"Reminder settings v{self.version}"

    def clean(self) -> None:
        if self.gateway == self.Gateway.WEBHOOK and not settings.NOTIFY_WEBHOOK_URL:
            raise ValidationError(
                {"gateway": "The webhook gateway needs NOTIFY_WEBHOOK_URL in the environment."}
            )

    def topic_settings(self) -> TopicSettings:
        """What the engine takes from this row for each reminder topic: the one mapping from live
        settings to engine numbers (the dispatcher's config, the topics, delivery's retries)."""
        return TopicSettings(
            slots=self.slots,
            batch_size=self.batch_size,
            visibility_ms=self.visibility_timeout_ms,
            max_attempts=self.max_attempts,
            backoff_base_ms=self.backoff_ms,
            backoff_cap_ms=max(self.backoff_ms, BACKOFF_CAP_MS),
            paused=self.paused,
            lookahead_ms=self.prestage_ms if self.gateway == self.Gateway.INBOX else 0,
        )


class DeadLetter(models.Model):
    """A job in an engine dead queue: lives in Redis, not in a table (``managed = False``).

    As django-rq does for its queues, the model only gives the admin a name, permissions and log
    entries; rows are built by ``reminders.selectors.dead_letters`` from the dead sorted sets, never
    queried.
    The primary key is ``"<topic>|<slot>|<job id>"``.
    """

    key = models.CharField(max_length=300, primary_key=True)
    topic = models.CharField(max_length=100)
    slot = models.PositiveIntegerField()
    job_id = models.CharField(max_length=200)
    user_id = models.BigIntegerField(null=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    died_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"

    def __str__(self) -> str:
        return f"{self.topic} slot {self.slot}: {self.job_id}"
