"""Notifications partitioned by day of ``visible_at`` on PostgreSQL
(``reminders.services.notification_partitions``, docs/partitioning.md): the old table attached
whole as the first partition, online. Nothing changes on SQLite, nor in the model state.

Going back leaves the partitioned layout in place (the ORM works on it either way); going forward
again finds it partitioned and does nothing.
"""

from django.db import migrations
from django.utils import timezone

from reminders.services.notification_partitions import partition_notifications


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        partition_notifications(now=timezone.now())


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY, and a swap that commits on its own.
    atomic = False

    dependencies = [
        ("reminders", "0016_topic_standard_webhooks"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False),
    ]
