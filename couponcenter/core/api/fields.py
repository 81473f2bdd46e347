"""Serializer fields for the API's wire formats: ISO 8601 durations and time-zone-aware times."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils.dateparse import iso8601_duration_re, parse_datetime
from django.utils.duration import duration_iso_string
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from couponcenter.core.time import EARLIEST_TIME, LATEST_TIME


@extend_schema_field(OpenApiTypes.DURATION)
class IsoDurationField(serializers.DurationField):
    """An ISO 8601 duration (``"P1D"``, ``"PT60S"``) in and out, never negative.

    DRF's own field also accepts Django's ``"1 00:00:00"`` and emits it; the API speaks ISO 8601
    only.
    """

    default_error_messages = {
        "invalid": 'Use an ISO 8601 duration such as "P1D", "PT60S" or "P1DT2H30M".',
        "negative": "Must not be negative.",
    }

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("min_value", timedelta(0))
        super().__init__(**kwargs)

    def to_internal_value(self, value) -> timedelta:
        if not isinstance(value, str) or not _is_iso_duration(value.strip()):
            self.fail("invalid")
        parsed = super().to_internal_value(value.strip())
        if parsed < timedelta(0):
            self.fail("negative")
        return parsed

    def to_representation(self, value: timedelta) -> str:
        return duration_iso_string(value)


def _is_iso_duration(value: str) -> bool:
    # Django's pattern also matches a bare "P" or "PT": ISO 8601 needs at least one component.
    return (
        bool(iso8601_duration_re.match(value))
        and value.lstrip("+-") not in {"P", "PT"}
        and (not value.endswith("T"))
    )


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 time with a UTC offset (``"2030-01-01T09:00:00+08:00"`` or ``...Z``).

    A naive time is refused instead of being read in the server's zone: a client that forgets the
    offset would otherwise open a coupon hours off. Times are bounded so that arithmetic on them
    (reminder lead, validity) never overflows.
    """

    default_error_messages = {
        "naive": "Give a time zone offset (e.g. 2030-01-01T09:00:00Z or +08:00).",
        "range": f"Must be between {EARLIEST_TIME:%Y-%m-%d} and {LATEST_TIME:%Y-%m-%d}.",
    }

    def to_internal_value(self, value) -> datetime:
        if isinstance(value, str):
            try:
                parsed = parse_datetime(value.strip())
            except ValueError:
                parsed = None
            if parsed is not None and parsed.tzinfo is None:
                self.fail("naive")
        result = super().to_internal_value(value)
        if not EARLIEST_TIME <= result < LATEST_TIME:
            self.fail("range")
        return result
