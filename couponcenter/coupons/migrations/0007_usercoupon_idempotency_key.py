"""UserCoupon.idempotency_key: the claim's Idempotency-Key, unique per (coupon, user) when set.

A retried claim whose first answer Redis no longer holds (a flush, a lost instance) finds its first
user coupon by this key instead of being refused ``limit_reached`` or claiming twice.

What a large table pays:
- The column: a nullable column with no default is a catalog change in PostgreSQL (no table
  rewrite), and NULL costs a row nothing beyond its null bitmap. ``ALTER TABLE`` still takes an
  ACCESS EXCLUSIVE lock for that moment, and it waits behind every open transaction on the table
  while claims queue behind it: run the migration outside a sale, with a ``lock_timeout``.
- The index: partial (``WHERE idempotency_key IS NOT NULL``), so the existing rows and every claim
  sent without a key add no entry; a claim with a key adds one entry of up to ~300 bytes. It does
  not contain ``status``, so the sweeper's and redeem's status changes stay HOT updates (0004). On
  PostgreSQL it is built ``CONCURRENTLY``: no lock that stops claims, at the price of two scans of
  the table (hence ``atomic = False``). A concurrent build that fails leaves an INVALID index
  behind: ``DROP INDEX CONCURRENTLY usercoupon_one_per_idempotency_key`` and migrate again.
"""

from django.db import migrations, models

TABLE = "couponcenter_usercoupon"
NAME = "usercoupon_one_per_idempotency_key"

CONSTRAINT = models.UniqueConstraint(
    condition=models.Q(("idempotency_key__isnull", False)),
    fields=("coupon", "user_id", "idempotency_key"),
    name=NAME,
)


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {NAME} ON {TABLE} "
            "(coupon_id, user_id, idempotency_key) WHERE idempotency_key IS NOT NULL"
        )
    else:
        schema_editor.add_constraint(apps.get_model("couponcenter", "UserCoupon"), CONSTRAINT)


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
    else:
        schema_editor.remove_constraint(apps.get_model("couponcenter", "UserCoupon"), CONSTRAINT)


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("couponcenter", "0006_token_lifetime"),
    ]

    operations = [
        migrations.AddField(
            model_name="usercoupon",
            name="idempotency_key",
            field=models.CharField(blank=True, editable=False, max_length=275, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(model_name="usercoupon", constraint=CONSTRAINT)
            ],
            database_operations=[migrations.RunPython(create_index, drop_index, elidable=False)],
        ),
    ]
