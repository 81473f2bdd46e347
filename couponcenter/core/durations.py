"""One duration format everywhere the service speaks: ISO 8601, in its shortest form.

``PT30S``, ``PT5M``, ``P7D``, ``P1DT2H30M``, ``PT0.5S``: in the API's answers, the live config
and validation messages alike (Django's own ``"P0DT00H00M30S"``, ``"00:05:00"`` or
``"3660 days, 0:00:00"`` are each right somewhere and confusing together).
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.deconstruct import deconstructible


def iso_duration(value: timedelta) -> str:
    """``timedelta`` as the shortest ISO 8601 duration: ``PT0S`` for zero, ``-PT5M`` below."""
    sign = "-" if value < timedelta(0) else ""
    value = abs(value)
    days = value.days
    seconds, micro = value.seconds, value.microseconds
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = f"{days}D" if days else ""
    clock = ""
    if hours:
        clock += f"{hours}H"
    # RFC 3339's duration grammar (the schema's ``format: duration``) reaches seconds from hours
    # only through minutes: "PT1H0M5S", never "PT1H5S".
    if minutes or (hours and (secs or micro)):
        clock += f"{minutes}M"
    if secs or micro:
        clock += f"{secs}.{micro:06d}".rstrip("0") + "S" if micro else f"{secs}S"
    if clock:
        out += "T" + clock
    return f"{sign}P{out or 'T0S'}"


class _IsoMessage:
    """Django's bound validators, with the bound and the value written as ISO 8601 durations."""

    def __call__(self, value: timedelta) -> None:
        limit = self.limit_value() if callable(self.limit_value) else self.limit_value
        if self.compare(value, limit):
            params = {
                "limit_value": iso_duration(limit),
                "show_value": iso_duration(value),
                "value": value,
            }
            raise ValidationError(self.message, code=self.code, params=params)


@deconstructible(path="couponcenter.core.durations.MaxDurationValidator")
class MaxDurationValidator(_IsoMessage, MaxValueValidator):
    pass


@deconstructible(path="couponcenter.core.durations.MinDurationValidator")
class MinDurationValidator(_IsoMessage, MinValueValidator):
    pass


class IsoDurationFormField(forms.DurationField):
    """The admin's duration input: shown as ISO 8601 (``PT5M``); reads ISO 8601 or Django's
    ``"00:05:00"`` alike."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("help_text", "")
        super().__init__(**kwargs)
        hint = 'ISO 8601, e.g. "PT30S", "PT5M", "P7D".'
        self.help_text = f"{self.help_text} {hint}".strip()

    def prepare_value(self, value):
        if isinstance(value, timedelta):
            return iso_duration(value)
        return value


# For ModelAdmin.formfield_overrides.
ISO_DURATION_ADMIN = {models.DurationField: {"form_class": IsoDurationFormField}}
