"""ReminderSubscription partitioned on PostgreSQL: LIST by status, the finished rows by day
(reminders/partition_layout.py; docs/timeouts.md, "Partitioned tables"). Online: the hot paths
wait only while the live rows are copied; the finished rows are attached, not copied. SQLite
keeps the plain table. Unapplied, every row is copied back into one plain table."""

from django.db import migrations

from reminders.partition_layout import subscription_layout, partition_online, partition_undo


def forwards(apps, schema_editor):
    partition_online(schema_editor.connection, subscription_layout())


def backwards(apps, schema_editor):
    partition_undo(schema_editor.connection, subscription_layout())


class Migration(migrations.Migration):
    atomic = False  # each step commits on its own (partition_online)

    dependencies = [
        ("reminders", "0019_timeoutjob_partitioned"),
    ]

    operations = [migrations.RunPython(forwards, backwards, atomic=False)]
