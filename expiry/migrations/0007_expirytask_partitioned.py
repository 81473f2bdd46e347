"""Expiry tasks partitioned on PostgreSQL (``expiry.partitioning``, docs/partitioning.md): a
pending leaf and processed tasks by day, swapped in online. Nothing changes on SQLite, nor in the
model state: the ORM reads and writes the parent table as before.

Going back leaves the partitioned layout in place (the ORM works on it either way; a plain table
again would mean copying every task); going forward again finds it partitioned and does nothing.
"""

from django.db import migrations

from expiry.partitioning import partition_expirytask


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    user_coupon = apps.get_model("couponcenter", "UserCoupon")._meta.db_table
    partition_expirytask(user_coupon_table=user_coupon)


class Migration(migrations.Migration):
    # Each step commits on its own: the swap holds its lock for milliseconds, the moves are
    # batches of their own.
    atomic = False

    dependencies = [
        ("expiry", "0005_pending_due_keyset"),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False),
    ]
