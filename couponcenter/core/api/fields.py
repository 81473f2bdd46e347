"""Serializer fields for the API's wire formats: ISO 8601 durations and time-zone-aware times."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.dateparse import iso8601_duration_re, parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from couponcenter.core.durations import MaxDurationValidator, MinDurationValidator, iso_duration
from couponcenter.core.time import EARLIEST_TIME, LATEST_TIME


@extend_schema_field(OpenApiTypes.DURATION)
class IsoDurationField(serializers.DurationField):
    """An ISO 8601 duration (``"P1D"``, ``"PT60S"``) in and out, never negative; answered in its
    shortest form (``"PT30S"``, not Django's ``"P0DT00H00M30S"``), bounds in messages too.

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
        # DRF's bound validators write the bound as "3660 days, 0:00:00".
        self.validators = [
            v for v in self.validators if type(v) not in (MaxValueValidator, MinValueValidator)
        ]
        if self.max_value is not None:
            self.validators.append(MaxDurationValidator(self.max_value))
        if self.min_value is not None:
            self.validators.append(MinDurationValidator(self.min_value))

    def to_internal_value(self, value) -> timedelta:
        if not isinstance(value, str) or not _is_iso_duration(value.strip()):
            self.fail("invalid")
        parsed = super().to_internal_value(value.strip())
        if parsed < timedelta(0):
            self.fail("negative")
        return parsed

    def to_representation(self, value: timedelta) -> str:
        return iso_duration(value)


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
            text = value.strip()
            try:
                parsed = parse_datetime(text)
            except ValueError:
                parsed = None
            if parsed is not None and parsed.tzinfo is None:
                self.fail("naive")
            if parsed is not None and text == value:
                value = parsed  # DRF would parse the same ISO 8601 text again, to the same time
        result = super().to_internal_value(value)
        if not EARLIEST_TIME <= result < LATEST_TIME:
            self.fail("range")
        return result


class IsoDurationModelSerializer(serializers.ModelSerializer):
    """A model serializer whose duration fields speak ISO 8601 (``IsoDurationField``)."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.DurationField: IsoDurationField,
    }
