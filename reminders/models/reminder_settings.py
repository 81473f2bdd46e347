"""The reminder workers' live settings (``ReminderSettings``, one row; docs/operations.md) and the
bounds its fields share with the code that reads them."""

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from couponcenter.core.durations import MaxDurationValidator, MinDurationValidator
from couponcenter.core.live_settings import LiveSettings
from couponcenter.core.retention import retention_field
from reminders.engine.topic_model import TopicSettings
from reminders.models.validators import _power_of_two, _within_attribute_max

# A failed reminder's retries wait at most this long (or the base backoff, if that is longer).
BACKOFF_CAP_MS = 300_000
# Reminders are pre-staged at most this far ahead of their due time.
MAX_PRESTAGE_MS = 600_000
# The "drop" late policy's limit: past a week a reminder helps nobody (and "now - limit" must
# stay a valid time).
MAX_LATE_LIMIT = timedelta(days=7)


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
    # Retentions (docs/retention.md): how long finished rows are kept before the reminder
    # worker's housekeeping deletes them; 0 keeps them forever.
    timeout_job_retention = retention_field(
        days=7,
        help_text="Processed and cancelled timeout jobs (with their history) are deleted this "
        "long after they finished; dead ones are kept as long as their dead letter too.",
    )
    notification_read_retention = retention_field(
        days=30, help_text="Notifications are deleted this long after the user read them."
    )
    notification_unread_retention = retention_field(
        days=90,
        help_text="Notifications never read are deleted this long after they were shown.",
    )
    subscription_retention = retention_field(
        days=30,
        help_text="Sent, dropped and cancelled reminder subscriptions are deleted this long "
        "after they finished; failed ones are kept as long as their dead letter too.",
    )
    dead_letter_retention = retention_field(
        days=30,
        help_text="Dead letters (jobs and reminders past their attempts, in Redis) are deleted "
        "this long after they died, unless requeued before.",
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
