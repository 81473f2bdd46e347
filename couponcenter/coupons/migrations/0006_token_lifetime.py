# API tokens (issue 25 item 5): the permission to hand out and revoke API accounts' tokens. A
# token's lifetime needs no column: it runs from the token's own creation time.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("couponcenter", "0005_alter_coupon_reminder_lead_alter_coupon_valid_for"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="account",
            options={
                "permissions": [
                    ("act_for_any_user", "Can act for any end user (service account)"),
                    (
                        "manage_accounts",
                        "Can create and change API accounts and hand out their tokens",
                    ),
                ]
            },
        ),
    ]
