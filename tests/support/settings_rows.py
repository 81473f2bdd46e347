"""The live settings row as the tests change it: through the service, as the admin does."""

from __future__ import annotations

from reminders.models import ReminderSettings
from reminders.services import reminder_settings_save


def reminder_settings_row() -> ReminderSettings:
    """The row, with ``row.change(**fields)`` saving it through ``reminder_settings_save``."""
    row, _ = ReminderSettings.objects.get_or_create(pk=1)

    def change(**fields):
        for name, value in fields.items():
            setattr(row, name, value)
        return reminder_settings_save(instance=row)

    row.change = change
    return row
