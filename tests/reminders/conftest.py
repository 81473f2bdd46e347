import pytest

from couponcenter.celery import app as celery_app
from reminders.models import ReminderSettings
from reminders.services import reminder_settings_save


@pytest.fixture
def eager_celery():
    """Run Celery tasks in-process (the real task code, without a broker round trip)."""
    before = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield celery_app
    celery_app.conf.task_always_eager = before


@pytest.fixture
def reminder_settings(db):
    """The live settings row, with a helper to change it the way the admin does."""
    row, _ = ReminderSettings.objects.get_or_create(pk=1)

    def change(**fields):
        for name, value in fields.items():
            setattr(row, name, value)
        return reminder_settings_save(instance=row)

    row.change = change
    return row
