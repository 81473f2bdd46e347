# API tokens: lifetime and revocation (issue 25 item 5).

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("couponcenter", "0005_alter_coupon_reminder_lead_alter_coupon_valid_for"),
    ]

    operations = []
