"""Bounds on the times the service stores: arithmetic on them (reminder lead, validity) never
overflows a ``datetime``; and the one text of a moment the service hands out."""

from datetime import UTC, datetime

EARLIEST_TIME = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(9000, 1, 1, tzinfo=UTC)


def utc_text(moment: datetime) -> str:
    """``moment`` in UTC as the API's answers write it (DRF under ``TIME_ZONE = "UTC"``), ending
    in ``Z``: one format for answers, error details and webhook bodies."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
