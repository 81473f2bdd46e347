# Recurring jobs: series ended by the time budget (issue 25 items 1-2).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0014_tenant_quotas"),
    ]

    operations = []
