# Per-owner quotas as live settings (issue 25 item 6).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0013_topic_owners"),
    ]

    operations = []
