# The index of staged notifications, built without blocking the inbox's writes on PostgreSQL.

from django.db import migrations, models

from couponcenter.core.db.operations import AddIndexConcurrentlyOnPostgres


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("reminders", "0011_timeoutjob_history"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgres(
            model_name="notification",
            index=models.Index(
                condition=models.Q(("visible_at__gt", models.F("created_at"))),
                fields=["user_id"],
                name="notification_staged",
            ),
        ),
    ]
