# Live settings share one change-marker scheme (couponcenter.core.live_settings): a version
# bumped on every save, as ReminderSettings already had.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("expiry", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="expirysettings",
            name="version",
            field=models.PositiveIntegerField(default=1, editable=False),
        ),
    ]
