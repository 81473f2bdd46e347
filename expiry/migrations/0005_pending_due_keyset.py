"""The sweeper's partial index gains ``id``: a pass resumes after the last batch's
``(expire_at, id)`` (keyset) instead of stepping again over every task it already processed.

The index is small (pending tasks only) and rebuilt in one step here; on a large live table build
the new one first with ``CREATE INDEX CONCURRENTLY`` under another name and swap the names.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("couponcenter", "0005_alter_coupon_reminder_lead_alter_coupon_valid_for"),
        ("expiry", "0004_alter_expirysettings_interval_and_more"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="expirytask",
            name="expirytask_pending_due",
        ),
        migrations.AddIndex(
            model_name="expirytask",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["expire_at", "id"],
                name="expirytask_pending_due",
            ),
        ),
    ]
