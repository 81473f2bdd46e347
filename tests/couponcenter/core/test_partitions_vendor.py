"""The partition kernel on a table that is not partitioned, as every table is on SQLite: it does
nothing, and ``partitioned`` says so (callers then run a batched DELETE)."""

from datetime import UTC, datetime, timedelta

import pytest

from couponcenter.core.db.partitions import (
    Partitioned,
    partitioned,
    partitions_drop_expired,
    partitions_ensure,
    partitions_list,
)

NOW = datetime(2026, 11, 27, tzinfo=UTC)


@pytest.mark.django_db
def test_a_plain_table_is_left_alone():
    spec = Partitioned(table="couponcenter_coupon", column="claim_opens_at")

    assert not partitioned(spec.table)
    assert partitions_ensure(spec, now=NOW) == []
    report = partitions_drop_expired(spec, retention=timedelta(days=1), now=NOW)
    assert report.dropped == report.kept == report.busy == []
    assert partitions_list(spec.table) == []
