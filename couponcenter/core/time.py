"""Bounds on the times the service stores: arithmetic on them (reminder lead, validity) never
overflows a ``datetime``."""

from datetime import UTC, datetime

EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(9000, 1, 1, tzinfo=UTC)
