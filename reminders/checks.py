"""Configuration that must stop a process from starting: outbound calls signed with a guessable key.

``config_errors`` is run by ``RemindersConfig.ready()``: every process (web, workers, any command,
``manage.py check --deploy`` included) refuses to start with the reason.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from reminders.gateways import gateway_secrets
from reminders.selectors.timeout_topics import settings_topic_specs


def config_errors() -> list[str]:
    errors = []
    if settings.NOTIFY_WEBHOOK_URL:
        try:
            gateway_secrets(settings.NOTIFY_WEBHOOK_SECRET, settings.NOTIFY_WEBHOOK_PREVIOUS_SECRET)
        except ValueError as problem:
            errors.append(f"NOTIFY_WEBHOOK_URL is set but {problem}")
    try:
        settings_topic_specs()  # the rows are checked when saved
    except ImproperlyConfigured as exc:
        errors.append(str(exc))
    return errors
