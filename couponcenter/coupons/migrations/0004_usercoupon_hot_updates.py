"""UserCoupon: no index over ``status``, and room on each page, so status changes are HOT updates.

The sweeper's ``unused -> expired`` used to write a new entry into every index of the table (four);
with no index containing ``status`` and free space on the page, PostgreSQL updates the row in
place on its page (a heap-only tuple) and writes no index entry at all.

- ``(user_id, status)`` becomes ``(user_id)``: a user's coupons are few, filtering them by status
  afterwards is cheap.
- ``(coupon, status)`` goes: coupon lookups use the unique ``(coupon, user_id, seq)``.
- ``fillfactor = 50`` on PostgreSQL: inserts leave half of each page free, so every coupon on a
  page can get its new version on that page in the same batch. Pages written before this
  migration keep their layout until the table is rewritten (``VACUUM FULL`` or pg_repack).

The SQL is ``IF [NOT] EXISTS`` so that on a large live table an operator can first run
``CREATE INDEX CONCURRENTLY usercoupon_user ON couponcenter_usercoupon (user_id)`` and
``DROP INDEX CONCURRENTLY`` the two old ones; this migration then only records the state.
"""

from django.db import migrations, models

TABLE = "couponcenter_usercoupon"


def set_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} SET (fillfactor = 50)")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("couponcenter", "0003_coupon_stock_shards"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="usercoupon",
                    index=models.Index(fields=["user_id"], name="usercoupon_user"),
                ),
                migrations.RemoveIndex(model_name="usercoupon", name="usercoupon_user_status"),
                migrations.RemoveIndex(model_name="usercoupon", name="usercoupon_coupon_status"),
            ],
            database_operations=[
                migrations.RunSQL(
                    f"CREATE INDEX IF NOT EXISTS usercoupon_user ON {TABLE} (user_id)",
                    "DROP INDEX IF EXISTS usercoupon_user",
                ),
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS usercoupon_user_status",
                    f"CREATE INDEX IF NOT EXISTS usercoupon_user_status ON {TABLE} "
                    "(user_id, status)",
                ),
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS usercoupon_coupon_status",
                    f"CREATE INDEX IF NOT EXISTS usercoupon_coupon_status ON {TABLE} "
                    "(coupon_id, status)",
                ),
            ],
        ),
        migrations.RunPython(set_fillfactor, reset_fillfactor, elidable=False),
    ]
