"""UserCoupon: autovacuum looks at the table once 2 % of its rows are dead, not PostgreSQL's 20 %.

The retention deletes used and expired coupons in batches (docs/retention.md): the table is not
partitioned, so the space they leave is reused only once a vacuum has recorded it free. With a
retention of R days it deletes about 1 / (R + 1) of the table a day, a fifth at R = 4: exactly
PostgreSQL's default threshold (50 rows + ``autovacuum_vacuum_scale_factor`` 0.2 of them), so on
many days no vacuum ran before the next day's claims, which then went into new pages instead, and
the table grew by a day's claims every few days (BENCHMARKS.md, session 29). At 0.02 a vacuum
follows every night's expiry and every retention pass of a table this size.

``ALTER TABLE ... SET (...)`` takes a SHARE UPDATE EXCLUSIVE lock, which neither reads nor writes
wait for; it waits only for a vacuum or an index build running on the table.
"""

from django.db import migrations

TABLE = "couponcenter_usercoupon"
SCALE_FACTOR = 0.02


def set_scale_factor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"ALTER TABLE {TABLE} SET (autovacuum_vacuum_scale_factor = {SCALE_FACTOR})"
        )


def reset_scale_factor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_vacuum_scale_factor)")


class Migration(migrations.Migration):
    dependencies = [
        ("couponcenter", "0007_usercoupon_idempotency_key"),
    ]

    operations = [
        migrations.RunPython(set_scale_factor, reset_scale_factor, elidable=False),
    ]
