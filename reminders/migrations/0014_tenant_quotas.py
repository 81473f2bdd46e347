# Per-owner quotas as live settings (issue 25 item 6).

import django.core.validators
import reminders.models
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0013_topic_owners"),
    ]

    operations = [
        migrations.AddField(
            model_name="remindersettings",
            name="quota_pending_per_topic",
            field=models.PositiveIntegerField(
                default=100000,
                help_text="Most pending jobs a topic may hold when its owner creates more (0: no limit); jobs that fired or were cancelled make room within seconds. The console lists topics past 80 %.",
                validators=[django.core.validators.MaxValueValidator(10000000)],
                verbose_name="pending jobs per topic",
            ),
        ),
        migrations.AddField(
            model_name="remindersettings",
            name="quota_creations_per_s",
            field=models.PositiveIntegerField(
                default=2000,
                help_text="Jobs each owner may create per second, on average (0: no limit). A bulk larger than a second's worth is admitted once the owner has created nothing for a while, and the owner's next creations wait until it has drained.",
                validators=[django.core.validators.MaxValueValidator(1000000)],
                verbose_name="creations per second",
            ),
        ),
        migrations.AddField(
            model_name="remindersettings",
            name="quota_attribute_bytes",
            field=models.PositiveIntegerField(
                default=8000,
                help_text="Largest attribute an owner may give a job, in bytes of its JSON (0: only the service's hard limit).",
                validators=[reminders.models._within_attribute_max],
                verbose_name="attribute size (bytes)",
            ),
        ),
    ]
