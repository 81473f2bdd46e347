"""Reminders and timeout jobs: the database side (the source of truth).

PostgreSQL holds every job and subscription with its status; Redis holds only the schedule (which id
is due when, and which are in flight). A write commits here first and is indexed in Redis on commit;
``rebuild_reminder_queues`` and the worker's reconcile rebuild from these tables.

One module per part: ``subscriptions`` (coupon reminders and the inbox), ``timeouts`` (the timeout
center's jobs and topics), ``reminder_settings`` (the workers' live settings), ``dead_letters``
(the admin's view of the engine's dead queues). Django finds the models through this package, and
the migrations name the shared validators by their path here.
"""

from reminders.models.dead_letters import DeadLetter
from reminders.models.reminder_settings import ReminderSettings
from reminders.models.subscriptions import Notification, ReminderSubscription
from reminders.models.timeouts import TimeoutJob, TimeoutTopic
from reminders.models.validators import _power_of_two, _within_attribute_max

__all__ = [
    "DeadLetter",
    "Notification",
    "ReminderSettings",
    "ReminderSubscription",
    "TimeoutJob",
    "TimeoutTopic",
    "_power_of_two",
    "_within_attribute_max",
]
