"""Writes of the reminders app: generic timeout jobs and coupon reminder subscriptions."""

from .config import reminder_settings_save
from .notifications import notification_mark_read, notifications_mark_all_read
from .rebuild import queues_pending_counts, queues_rebuild
from .subscriptions import (
    SubscribeRefused,
    subscription_subscribe,
    subscription_unsubscribe,
    subscriptions_cancel_for_coupon,
    subscriptions_drop_for_coupon,
    subscriptions_rebuild,
    subscriptions_reschedule_for_coupon,
)
from .timeout_topics import TopicInUse, timeout_topic_delete, timeout_topic_save
from .timeouts import (
    TimeoutJobConflict,
    timeout_job_cancel,
    timeout_job_create,
    timeout_job_end,
    timeout_job_ensure,
    timeout_job_reschedule,
    timeout_jobs_rebuild,
)
from .timeouts_bulk import timeout_jobs_bulk_create

__all__ = [
    "SubscribeRefused",
    "TimeoutJobConflict",
    "TopicInUse",
    "notification_mark_read",
    "notifications_mark_all_read",
    "queues_pending_counts",
    "reminder_settings_save",
    "queues_rebuild",
    "subscription_subscribe",
    "subscription_unsubscribe",
    "subscriptions_cancel_for_coupon",
    "subscriptions_drop_for_coupon",
    "subscriptions_rebuild",
    "subscriptions_reschedule_for_coupon",
    "timeout_topic_delete",
    "timeout_topic_save",
    "timeout_job_cancel",
    "timeout_job_end",
    "timeout_job_create",
    "timeout_job_ensure",
    "timeout_job_reschedule",
    "timeout_jobs_bulk_create",
    "timeout_jobs_rebuild",
]
