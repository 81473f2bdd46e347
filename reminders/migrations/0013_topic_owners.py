# Topic ownership: an ownerless topic never becomes public (issue 25 item 3 / 5).

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("reminders", "0012_notification_staged"),
    ]

    operations = [
        migrations.AlterField(
            model_name="timeouttopic",
            name="owner_user",
            field=models.ForeignKey(
                blank=True,
                help_text="Who may use the topic through the API (staff always may).",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="timeouttopic",
            name="owner_group",
            field=models.ForeignKey(
                blank=True,
                help_text="Or every member of this group. No owner: staff only.",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="auth.group",
            ),
        ),
    ]
