# Topic ownership: an ownerless topic never becomes public (issue 25 item 3 / 5).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("reminders", "0012_notification_staged"),
    ]

    operations = []
